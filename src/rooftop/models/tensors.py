"""The file's tensors as a model takes them while it is built: each in the form its linear keeps, and under tensor
parallelism only the part of it this rank holds."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rooftop.errors import ModelLoadError
from rooftop.loading.loaded import LazyWeights
from rooftop.loading.shard import Shard, shard_weight
from rooftop.models.parallel import RowParallel, TPGroup, split
from rooftop.quant.linear import Linear, as_stored, make_linear, runs_bf16
from rooftop.quant.weights import Int4Weight, Weight, quantize_int4, quantize_int8_groups, to_float
from rooftop.roofline.precision import CONVERTED_TO

# The groups a quantized policy holds a matrix of a type the kernels do not run as (GGUF's names): `auto` on such a
# file is int4, so its matrices are CONVERTED_TO, which the analyzer costs them as.
CONVERTED_UNDER = {"int4": CONVERTED_TO.upper(), "int8": "Q8_0"}

Part = tuple[int, int] | None  # rows or columns start:stop of a tensor one rank reads; None: all of them


class Tensors:
    """The file's tensors in the form the model keeps: float tensors in its dtype on its device, quantized groups and
    blocks as they are under a quantized policy (the linears repack them: on the CPU for its kernels, on CUDA for
    tinygemm and the Q8_0 kernel), dequantized for float linears.
    `stored` (the `auto` weight choice): each quantized matrix runs in the format the file holds it in. A matrix of a
    type the kernels do not run (`converted_types`: HF name -> its GGUF type, Q3_K, IQ2_XXS, ...) comes as its float
    values: a float policy keeps them, a quantized one makes them its groups (CONVERTED_UNDER), each rounded once
    from the file's values. Under tensor parallelism (`tp`) each tensor is read in the part this rank holds."""

    def __init__(
        self,
        weights: Mapping[str, Weight],
        dtype: torch.dtype,
        device: torch.device,
        policy: str,
        stored: bool,
        tp: TPGroup | None = None,
        converted_types: Mapping[str, str] | None = None,
    ):
        self.weights, self.dtype, self.device, self.policy, self.stored = weights, dtype, device, policy, stored
        self.keep_groups = policy != "float"
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.converted_types = converted_types or {}

    @property
    def conversions(self) -> dict[str, str]:
        """HF name -> "Q3_K -> Q4_1": each matrix made the policy's groups from a type the kernels do not run (what
        the run reports beside its formats); none under a float policy, which holds their values."""
        if not self.keep_groups:
            return {}
        return {name: f"{qtype} -> {CONVERTED_UNDER[self.policy]}" for name, qtype in self.converted_types.items()}

    def linear(self, weight: Weight | list[Weight], bias: torch.Tensor | None, lm_head: bool = False) -> Linear:
        return make_linear(weight, bias, self.policy, lm_head, self.stored, self.device)

    def row_parallel(self, weight: Weight, bias: torch.Tensor | None) -> Linear | RowParallel:
        """A linear whose input features are split over the ranks: each rank's partial sum all-reduced, the bias
        added once after."""
        if self.tp is None:
            return self.linear(weight, bias)
        return RowParallel(self.linear(weight, None), self.tp, bias)

    def part(self, n: int) -> Part:
        """This rank's even share of n rows or columns."""
        return None if self.tp is None else split(n, self.tp.rank, self.tp.size)

    def take(
        self,
        name: str,
        shape: tuple[int, ...] | None,
        required: bool = True,
        rows: Part = None,
        columns: Part = None,
    ) -> Weight | None:
        """Tensor `name` of the given (whole) shape, or only its `rows` or `columns` start:stop."""
        if name not in self.weights:
            if required:
                raise ModelLoadError(f"the model file has no tensor {name}")
            return None
        shard = None
        if rows is not None or columns is not None:
            dim, (start, stop) = (0, rows) if rows is not None else (1, columns)
            shard = Shard(dim, start, stop, shape[dim])
            shape = (*shape[:dim], stop - start, *shape[dim + 1 :])
        if isinstance(self.weights, LazyWeights):
            w = self.weights.read(name, shard)
        else:
            w = shard_weight(self.weights[name], shard, name)
        if shape is not None and tuple(w.shape) != shape:
            where = self.weights.described(name) if isinstance(self.weights, LazyWeights) else name
            raise ModelLoadError(f"tensor {where} has shape {tuple(w.shape)}, the config implies {shape}")
        if name in self.converted_types and self.keep_groups:
            w = self.policy_groups(w)
        if not isinstance(w, torch.Tensor) and not self.keep_groups:
            w = w.dequantize()
        if not isinstance(w, torch.Tensor):
            return w
        return w.contiguous() if self.keeps_bf16(w) else w.to(device=self.device, dtype=self.dtype).contiguous()

    def policy_groups(self, w: Weight) -> Weight:
        """A matrix of a type the kernels do not run (its float values; a dummy's made as `auto` holds it, Q4_1) as
        the quantized policy's groups."""
        if self.policy == "int4":
            return w if isinstance(w, Int4Weight) else quantize_int4(to_float(w))
        return quantize_int8_groups(to_float(w))

    def keeps_bf16(self, w: torch.Tensor) -> bool:
        """Whether a bf16 checkpoint's matrix stays bfloat16 as it was read: where `auto` holds it as a bf16-fp32
        linear (`runs_bf16`), or as the lookup table of a float32 model (rows widened as they are looked up). Widened
        to float32 here, each such matrix was checked value by value and narrowed again: most of a bf16 file's load."""
        return (
            self.stored
            and self.policy == "float"
            and self.dtype == torch.float32
            and self.device.type == "cpu"
            and w.dtype == torch.bfloat16
            and runs_bf16(w)
        )

    def cat(self, *parts: Weight | None) -> Weight | list[Weight] | None:
        """Fused projections: one matrix from several, kept in their common form when they share one; the parts
        themselves when each runs as stored in a different format."""
        if any(t is None for t in parts):
            return None
        form = {(type(t), getattr(t, "format", None)) for t in parts}
        if len(form) == 1 and not isinstance(parts[0], torch.Tensor):
            return type(parts[0]).cat(list(parts))
        if self.stored and any(as_stored(t, self.policy, self.device) for t in parts):
            return list(parts)
        if all(isinstance(t, torch.Tensor) and self.keeps_bf16(t) for t in parts):
            return torch.cat(parts, dim=0)
        return torch.cat([to_float(t).to(device=self.device, dtype=self.dtype) for t in parts], dim=0).contiguous()
