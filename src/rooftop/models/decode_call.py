"""A step of decodes through a dense model's decoder layers in one call to rooftop's CPU kernels (kernels/decode.cpp).

Layer by layer, a decode step is some ten kernel calls a layer from Python, and between them the interpreter's code
and objects come back from memory cold: each linear's weights have just streamed through the caches. Where every
layer is the dense decoder block on the CPU kernels (`KernelOps`) and every linear runs in tiles (a GGUF's block
formats, `--weights int8` or `int4`) or in bfloat16 on rooftop's kernel (a bf16 checkpoint under `auto`), a step
whose rows are all decodes runs the same kernels in the same order with the same arguments from one C++ call, so
each row's result is the same bits either way (docs/PERFORMANCE.md has what it saves). Other models, prefill chunks
and widened rows go layer by layer. The calibration's op timer reads each op's time from the call's own clocks
(`seconds`). An MoE layer's experts are held the same way (`row_experts`), for a lone row's k experts in one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rooftop.models.blocks import DecoderBlock
from rooftop.models.kv_cache import AttentionMetadata, KVPool
from rooftop.models.mlp import DenseMLP, SparseMoE
from rooftop.models.ops import KernelOps, Ops
from rooftop.quant.linear import Bf16Linear, ConcatLinear, TiledLinear
from rooftop.quant.rows import RowPlan


@dataclass
class DecodeCall:
    """The model's layers as the kernels hold them, the op backend they were taken from (a model given other ops
    afterwards goes layer by layer), and while the calibration's op timer is installed the clocks it reads."""

    layers: Any  # the kernels' DecodeLayers
    ops: KernelOps
    seconds: torch.Tensor | None = None  # float64 (3,): where the kernels add each op's time, while timed

    def runs(self, ops: Ops, meta: AttentionMetadata, plan: RowPlan) -> bool:
        """A step it takes: decodes only, none widened, on the ops it was built from."""
        return ops is self.ops and not meta.prefills and meta.has_decodes and not plan.widen

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, pool: KVPool, meta: AttentionMetadata) -> torch.Tensor:
        """The final norm's hidden states of the step's rows (x: their embeddings); their K/V go into `pool`."""
        k_values, v_values, k_scales, v_scales = pool.kernel_layers
        return self.layers.run(
            x,
            positions,
            meta.slot_mapping,
            meta.decode_tables,
            meta.decode_lengths,
            meta.block_size,
            k_values,
            v_values,
            k_scales,
            v_scales,
            self.seconds,
        )


def kernel_part(linear: TiledLinear | Bf16Linear) -> tuple:
    """A linear as kernels/decode.cpp's LinearPart: tiled, or bfloat16 (no dm, format -1)."""
    if isinstance(linear, Bf16Linear):
        return linear.weight, None, -1, linear.weight.shape[0], linear.bias
    return linear.q, linear.dm, linear.kernel_format, linear.out_features, linear.bias


def row_experts(moe: SparseMoE, ops: Ops, split: bool) -> Any:
    """An MoE layer's experts as the kernels' RowExperts, for a lone row's experts in one call, or None: a model
    split over ranks, off the CPU kernels, or with an expert's linear in neither tiles nor bfloat16."""
    if split or not isinstance(ops, KernelOps):
        return None
    parts = [[lin.parts if isinstance(lin, ConcatLinear) else [lin] for lin in e.linears()] for e in moe.experts]
    if not all(isinstance(part, TiledLinear | Bf16Linear) for each in parts for lin in each for part in lin):
        return None
    gate_ups, downs = ([[kernel_part(part) for part in each[i]] for each in parts] for i in (0, 1))
    return ops.kernels.RowExperts(gate_ups, downs)


def decode_call(layers: list, norm: torch.Tensor, ops: Ops, split: bool) -> DecodeCall | None:
    """The one call for these layers, or None where a step goes layer by layer: a model split over ranks (`split`),
    off the CPU kernels, with another block than the dense decoder (mixture of experts, linear attention), or with a
    linear that runs neither in tiles nor in bfloat16 on rooftop's kernel, alone or as a part of a fused projection
    (float32 weights)."""
    if split or not isinstance(ops, KernelOps):
        return None
    if not all(type(layer) is DecoderBlock and type(layer.mlp) is DenseMLP for layer in layers):
        return None
    linears = [lin for layer in layers for lin in (layer.qkv, layer.o, layer.mlp.gate_up, layer.mlp.down)]
    parts = [lin.parts if isinstance(lin, ConcatLinear) else [lin] for lin in linears]
    if not all(isinstance(part, TiledLinear | Bf16Linear) for each in parts for part in each):
        return None
    c = ops.config
    return DecodeCall(
        ops.kernels.DecodeLayers(
            [[kernel_part(p) for p in each] for each in parts],
            [n for layer in layers for n in (layer.attn_norm, layer.mlp_norm)] + [norm],
            [layer.qk_norm for layer in layers],
            ops.cos,
            ops.sin,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.head_dim**-0.5,
            c.rms_norm_eps,
        ),
        ops,
    )
