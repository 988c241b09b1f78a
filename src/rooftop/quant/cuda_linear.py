"""Weight-only linears on CUDA. int4: PyTorch's tinygemm kernel (`torch._weight_int4pack_mm`: bfloat16 activations,
a bfloat16 scale and zero per 32 weights, w = (q - 8)·s + z, the same convention as the CPU's int4). int8: GGUF's
Q8_0 (a float16 scale per 32 weights) on rooftop's Triton kernel (kernels/weight_only.py), as PyTorch's CUDA int8
op takes one scale per row and reads each row strided.

Decode rows run the kernels, which read the packed weights once per step. Prefill chunks of WIDEN_ROWS rows or more
widen the weights to the activations' dtype and run cuBLAS (one bfloat16 matmul), as the CPU linears widen to
sgemm: tinygemm keeps only 16 rows per tile, so a long chunk would read the weights once per 16 rows.

Widening int4 reads tinygemm's packed layout back (`unpack_int4`): the inverse of PyTorch's packing
(`_convert_weight_to_int4pack`, aten/src/ATen/native/cuda/int4mm.cu), written out in `pack_int4`, and checked
against the op once per process and device, at load, before a widened matmul trusts it (`tinygemm_layout_matches`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from rooftop.errors import UnsupportedModelError
from rooftop.quant.rows import NARROW, WIDEN_ROWS, RowPlan, by_plan, with_residual
from rooftop.quant.weights import GROUP, Int4Weight, Int8GroupWeight, Weight, quantize_int8_groups, to_float


def inner_k_tiles(k: int) -> int | None:
    """tinygemm's k-tiles of 16 inputs packed per lane (2, 4 or 8): the most that divide K, or None."""
    return next((tiles for tiles in (8, 4, 2) if k % (tiles * 16) == 0), None)


def runs_tinygemm(n: int, k: int) -> bool:
    """Whether an (N, K) matrix fits tinygemm: output rows in tiles of 8, K in whole groups of 32 and k-tiles."""
    return n % 8 == 0 and k % GROUP == 0 and inner_k_tiles(k) is not None


@functools.cache
def _tile_order(tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each nibble of one packed tile comes from. A tile is 8 output rows by 16·tiles inputs, held as 32 lanes
    of tiles/2 int32 of 8 nibbles each; nibble (lane t, word j, nibble s) is weight (row t // 4, column c) with
    c = (2j + i // 2)·16 + (i % 2)·8 + 2·(t % 4) + s // 4 and i = s % 4 (int4mm.cu's matrix_to_m16n8k16_Bint4_layout:
    byte i of a lane's word reads the byte pair at t % 4 (+4) of k-tile 2j (i < 2) or 2j + 1, high nibble first).
    Returns the rows and columns, each (32, tiles / 2, 8) long."""
    t = torch.arange(32)[:, None, None]
    j = torch.arange(tiles // 2)[None, :, None]
    s = torch.arange(8)[None, None, :]
    i = s % 4
    rows = (t // 4).expand(32, tiles // 2, 8)
    cols = (2 * j + i // 2) * 16 + (i % 2) * 8 + 2 * (t % 4) + s // 4
    return rows.contiguous(), cols.contiguous()


def pack_int4(q: torch.Tensor, tiles: int) -> torch.Tensor:
    """q (N, K) uint8 levels 0..15 in tinygemm's layout: int32 (N / 8, K / (16·tiles), 32, tiles / 2)."""
    n, k = q.shape
    rows, cols = (t.to(q.device) for t in _tile_order(tiles))
    blocks = q.reshape(n // 8, 8, k // (16 * tiles), 16 * tiles).transpose(1, 2)  # (N/8, K tiles, 8, 16·tiles)
    nibbles = blocks[:, :, rows, cols].to(torch.int32)  # (N/8, K tiles, 32, tiles/2, 8)
    shifts = 4 * torch.arange(8, device=q.device, dtype=torch.int32)
    return (nibbles << shifts).sum(-1, dtype=torch.int32)  # bit 31 wraps: the int32 holds the same bits


def unpack_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) uint8 levels of a tinygemm-packed matrix (the inverse of `pack_int4`)."""
    tiles = packed.shape[-1] * 2
    rows, cols = (t.to(packed.device) for t in _tile_order(tiles))
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    nibbles = ((packed[..., None] >> shifts) & 15).to(torch.uint8)  # (N/8, K tiles, 32, tiles/2, 8)
    blocks = torch.empty(n // 8, k // (16 * tiles), 8, 16 * tiles, dtype=torch.uint8, device=packed.device)
    blocks[:, :, rows, cols] = nibbles
    return blocks.transpose(1, 2).reshape(n, k)


def torch_pack_int4(q: torch.Tensor, tiles: int) -> torch.Tensor:
    """PyTorch's own packing on the device: two levels per byte, the even column in the high nibble."""
    return torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).contiguous(), tiles)


@functools.cache
def tinygemm_layout_matches(device: torch.device) -> bool:
    """Whether this PyTorch packs as `pack_int4` does (checked once on a seeded matrix of two tiles each way)."""
    q = torch.randint(0, 16, (16, 512), generator=torch.Generator().manual_seed(0), dtype=torch.uint8).to(device)
    return torch.equal(torch_pack_int4(q, 8), pack_int4(q, 8))


@functools.cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _with(y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    return with_residual(y if bias is None else y + bias, residual)


def _widened(x: torch.Tensor, weight: torch.Tensor, bias, residual, plan: RowPlan, narrow) -> torch.Tensor:
    """The rows of `plan`'s widened groups through one float matmul each, the rest through `narrow`."""
    return by_plan(x, residual, plan, lambda rows, res: with_residual(F.linear(rows, weight, bias), res), narrow)


@dataclass
class CudaInt4Linear:
    """int4 weights with a bfloat16 scale and zero per group of 32, on tinygemm (bfloat16 activations)."""

    packed: torch.Tensor  # int32 (N / 8, K / (16·tiles), 32, tiles / 2), tinygemm's layout
    scales_zeros: torch.Tensor  # (K / 32, N, 2) bfloat16
    out_features: int
    in_features: int
    bias: torch.Tensor | None = None
    widens: bool = True  # whether `unpack_int4` reads this PyTorch's packing (else every row runs on tinygemm)
    format: ClassVar[str] = "int4-g32"
    widen_rows: ClassVar[int | None] = WIDEN_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        if not plan.widen or not self.widens:
            return self.narrow(x, residual)
        return _widened(x, self.dequantize(x.dtype), self.bias, residual, plan, self.narrow)

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        y = torch.ops.aten._weight_int4pack_mm(flat, self.packed, GROUP, self.scales_zeros)
        return _with(y.to(x.dtype).reshape(*x.shape[:-1], self.out_features), self.bias, residual)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in `dtype`, from the packed levels: (q - 8)·s + z, group by group."""
        n, k = self.out_features, self.in_features
        q = unpack_int4(self.packed, n, k).view(n, k // GROUP, GROUP).to(dtype)
        scale, zero = (t.t().to(dtype)[..., None] for t in self.scales_zeros.unbind(-1))  # (N, K / 32, 1)
        return ((q - 8) * scale + zero).view(n, k)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    @classmethod
    def from_weight(cls, w: Int4Weight, bias: torch.Tensor | None, device: torch.device) -> CudaInt4Linear:
        n, k = w.q.shape
        q = w.q.to(device)
        packed = torch_pack_int4(q, inner_k_tiles(k))
        scales_zeros = torch.stack([w.scale.t(), w.zero.t()], dim=-1).to(device, torch.bfloat16).contiguous()
        bias = None if bias is None else bias.to(device)
        return cls(packed, scales_zeros, n, k, bias, widens=tinygemm_layout_matches(q.device))  # checked at load


@dataclass
class CudaInt8Linear:
    """GGUF Q8_0 groups (w = d·q, a float16 d per 32 int8 weights) on rooftop's Triton kernel."""

    q: torch.Tensor  # (N, K) int8
    d: torch.Tensor  # (N, K / 32) float16
    bias: torch.Tensor | None = None
    format: ClassVar[str] = "q8_0"
    widen_rows: ClassVar[int | None] = WIDEN_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        if not plan.widen:
            return self.narrow(x, residual)
        return _widened(x, self.dequantize(x.dtype), self.bias, residual, plan, self.narrow)

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        from rooftop.kernels.weight_only import q8_matmul

        flat = x.reshape(-1, x.shape[-1])
        y = q8_matmul(flat if flat.stride(-1) == 1 else flat.contiguous(), self.q, self.d, multiprocessors(x.device))
        return _with(y.reshape(*x.shape[:-1], self.q.shape[0]), self.bias, residual)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.q.shape
        return (self.q.view(n, k // GROUP, GROUP).to(dtype) * self.d.to(dtype)[..., None]).view(n, k)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.d.nbytes

    @classmethod
    def from_weight(cls, w: Weight, bias: torch.Tensor | None, device: torch.device) -> CudaInt8Linear:
        check_triton()
        groups = w if isinstance(w, Int8GroupWeight) else quantize_int8_groups(to_float(w).to(device))
        q = groups.q.to(device).contiguous()
        return cls(q, groups.scale.to(device, torch.float16), None if bias is None else bias.to(device))


def sources_version() -> str:
    """A hash of the CUDA kernels' sources (the Triton kernels and this file), for the probe's cache key: a probe
    that timed other kernels is stale."""
    kernels = Path(__file__).parent.parent / "kernels"
    paths = [kernels / "weight_only.py", kernels / "paged_attention.py", Path(__file__)]
    return hashlib.sha256(b"".join(path.read_bytes() for path in paths)).hexdigest()[:8]


def check_triton() -> None:
    """rooftop's CUDA kernels are Triton kernels: without Triton they cannot run, and the model is refused."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise UnsupportedModelError(
            "int8 weights and paged attention on CUDA run on Triton kernels: install triton (it comes with "
            "PyTorch's CUDA wheels)"
        ) from None
