"""Linear layers by weight format, each reporting its format in the analyzer's vocabulary (roofline.precision):
float (fp32, bf16 or fp16: `F.linear`, or oneDNN's matmul for fp32 on AMD CPUs), int8 and int4. `linear_kind` is the one place that decides which class a
weight becomes: on rooftop's CPU kernels int8 is GGUF Q8_0 (a scale per group of 32) and int4 GGUF Q4_1 (a scale
and a minimum per group of 32); without them int8 has one scale per row and int4 a scale and zero per 32.

Decode is matrix-vector work that streams every weight once per step, so its time follows the weight bytes:
int8 reads about a quarter of float32, int4 an eighth. Where rooftop's CPU kernels build (kernels/tiles.cpp),
`Q4Linear`, `Q8Linear` and `BlockLinear` dot the weights with int8-quantized activations as llama.cpp does (GGUF
Q4_1 and Q8_0 groups and the file's other block formats, Q4_0 to Q6_K, their values repacked in tiles of 16 output
rows, quant/tiles.py). Elsewhere `Int4Linear` and `Int8Linear` run PyTorch's CPU weight-only
kernels, which take bfloat16 activations and compute (q - 8)·s + z, so GGUF Q4_1 blocks (x = d·q + m) load as
s = d, z = m + 8d and Q4_0 (x = d·(q - 8)) as s = d, z = 0.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from rooftop.errors import InvalidRequestError, UnsupportedModelError
from rooftop.kernels import cpu
from rooftop.quant.cuda_linear import CudaInt4Linear, CudaInt8Linear, runs_tinygemm
from rooftop.quant.gguf_blocks import q4_0_as_int4
from rooftop.quant.rows import NARROW, WIDEN_ROWS, RowPlan, by_plan, with_residual
from rooftop.quant.tiles import SUPER_BLOCK_FORMATS, TILE_FORMATS, tile_blocks, tile_bytes, tile_nibbles, tile_scales
from rooftop.quant.weights import (
    BLOCK_FORMATS,
    GROUP,
    BlockWeight,
    Int4Weight,
    Int8GroupWeight,
    Weight,
    quantize_int4,
    quantize_int8,
    quantize_int8_groups,
    to_float,
)
from rooftop.roofline.precision import WEIGHT_POLICIES, check_weight_choice

FLOAT_FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@functools.cache
def widen_dtype() -> torch.dtype | None:
    """What rooftop's kernel linears widen a prefill chunk's weights to, or None where they do not widen. bfloat16
    where the CPU has AMX: its tile multiplies run oneDNN's bf16 matmul several times faster than the int8 kernels'
    dots, which pays for widening each chunk's weights; bfloat16 rounds the chunk's activations to 8 bits of
    mantissa, about what the int8 kernels' groups keep. Elsewhere every row runs the kernels: on AVX2 hosts the
    alternative is float32 sgemm, and with AVX512-BF16 alone (no AMX) a 512-bit VNNI dot does twice the multiplies
    of a bfloat16 one and needs no widening; the kernels outran both paths at every prefill size measured
    (docs/PERFORMANCE.md)."""
    return torch.bfloat16 if "amx_bf16" in _cpuinfo() else None


@functools.cache
def _cpuinfo() -> frozenset[str]:
    """The words of /proc/cpuinfo (its flags, its vendor), empty where there is none."""
    try:
        return frozenset(open("/proc/cpuinfo").read().split())
    except OSError:
        return frozenset()


@functools.cache
def packs_float32() -> bool:
    """Whether float32 linears on the CPU run oneDNN's matmul on weights it packed once (`torch.ops.mkldnn`) instead
    of `F.linear`, which runs MKL's sgemm. On AMD CPUs MKL's sgemm takes a slow path: on Zen 3 and Zen 5 hosts
    oneDNN multiplied a decode's few rows several times faster, and prefill's hundreds as fast or faster
    (docs/PERFORMANCE.md). Intel CPUs, MKL's own, keep it. oneDNN builds its kernel for each new row count once (a
    fraction of a millisecond per shape), then caches it."""
    return torch.backends.mkldnn.is_available() and "AuthenticAMD" in _cpuinfo()


def widen_compute(linear, dtype: torch.dtype) -> str | None:
    """The analyzer's compute name for a linear's widened prefill chunks: rooftop's kernel linears widen to
    `widen_dtype()`, the others to the activations' dtype (None: the default)."""
    parts = getattr(linear, "parts", [linear])
    if all(isinstance(p, _KernelLinear) for p in parts) and widen_dtype() not in (None, dtype):
        return FLOAT_FORMATS[widen_dtype()]
    return None


def row_plan(chunks: list[int], rows: int, dtype: torch.dtype, batch_invariant: bool) -> RowPlan:
    """The plan of a step of `rows` rows whose leading rows are prefill chunks of the given lengths, those of
    WIDEN_ROWS or more first. Batch-invariant: each of those chunks widens on its own, so a row's path depends only
    on its own sequence's chunk. Otherwise the whole step widens from WIDEN_ROWS rows on (one sgemm, the fastest)."""
    if not batch_invariant:
        return RowPlan((rows,) if rows >= WIDEN_ROWS else ())
    return RowPlan(tuple(itertools.takewhile(lambda n: n >= WIDEN_ROWS, chunks)), float_min_rows(dtype))


# The reduction widths float_min_rows probes: BLAS kernels are picked by the width too, e.g. oneDNN's float32 matmul
# on a Zen 4 host runs a single row of more than 1024 inputs on a kernel of its own, which rounds differently.
PROBE_WIDTHS = (512, 2048, 8192)


@functools.cache
def float_min_rows(dtype: torch.dtype) -> int:
    """The row tile P of the CPU's float linears (`FloatLinear.product`) on this machine: in a call of a multiple of
    P rows, a row's result is the same at any index and whatever the other rows are, so narrow float matmuls are
    padded to a multiple of it. Probed once per dtype, at each of PROBE_WIDTHS, because BLAS libraries pick kernels
    by the call's shape: MKL runs 1 row as a matrix-vector product, 2-3 rows on another kernel, and the rows of a
    call that are left over after its tiles of 4 (5 rows: the fifth) like a call of that many rows, each rounding
    differently (float32 on Intel); on a Zen 4 host oneDNN (float32 through `packs_float32`, and bfloat16) runs a
    row alone apart from 2 or more once the rows are over 1024 inputs wide, where on a Zen 3 one float32 gave every
    row the same bits alone."""
    gen = torch.Generator().manual_seed(0)
    probes = [
        (
            FloatLinear(torch.randn(256, k, generator=gen).to(dtype), narrow_rows=1),
            torch.randn(64, k, generator=gen).to(dtype),
        )
        for k in PROBE_WIDTHS
    ]
    for tile in (1, 2, 4, 8, 16):
        if all(_rows_agree(linear, x, tile) for linear, x in probes):
            return tile
    return 32  # no tile agreed up to 64 rows: pad to half of them (the batched == alone tests say if it holds)


# The weights float_narrow_rows times: a 1B-class model's gate-up and down shapes, 64 MiB each in float32, so that a
# call streams them from memory as a decode does and not from a last-level cache.
NARROW_PROBE_SHAPES = ((8192, 2048), (2048, 8192))


@functools.cache
def float_narrow_rows(dtype: torch.dtype) -> int:
    """The fewest rows a narrow float matmul on the CPU runs: a call of fewer rows (a decode of one or two
    sequences) is padded up to it. BLAS libraries pick their kernel by the call's row count, and the one they pick
    for the tile a lone row is padded to (`float_min_rows`) is not always the one that streams the weights
    fastest: on a Zen 4 host oneDNN's float32 matmul reads them far faster at 4 rows than at 2 (docs/PERFORMANCE.md),
    where a Zen 3 host's was fastest at 1. So it is timed, once per process and dtype, over the tile's multiples up
    to 8 rows (any of them gives each row the tile's bits), and a larger count is taken only where it is at least
    15% faster than the tile (`fastest_rows`): a host where they are near each other keeps the tile whatever the
    noise."""
    tile = float_min_rows(dtype)
    counts = [r for r in (tile, 2 * tile, 4 * tile) if r <= 8]
    linears = [(FloatLinear(torch.full(s, 0.01, dtype=dtype), narrow_rows=1), s[1]) for s in NARROW_PROBE_SHAPES]
    calls = {r: [(linear, torch.full((r, k), 0.5, dtype=dtype)) for linear, k in linears] for r in counts}

    def once(rows: int) -> float:
        start = time.perf_counter()
        for linear, x in calls[rows]:
            linear.product(x)
        return time.perf_counter() - start

    for rows in counts:  # oneDNN builds a kernel per new row count on its first call
        once(rows)
    times: dict[int, list[float]] = {r: [] for r in counts}
    for _ in range(5):  # the counts alternate in every round, so that each sees the host as the others do
        for rows in counts:
            times[rows].append(once(rows))
    return fastest_rows({r: statistics.median(t) for r, t in times.items()}, tile)


def fastest_rows(seconds: dict[int, float], tile: int) -> int:
    """The row count of the fastest call among `seconds` (per count), where it is at least 15% faster than the
    tile's; else the tile."""
    best = min(seconds, key=seconds.__getitem__)
    return best if seconds[best] <= 0.85 * seconds[tile] else tile


def _rows_agree(linear: FloatLinear, x: torch.Tensor, tile: int) -> bool:
    """Whether each row of x, padded alone to `tile` rows, gives the bits it gets in every call of a multiple of
    `tile` of x's leading rows."""
    alone = torch.cat([_padded_to(x[i : i + 1], tile, linear.product) for i in range(x.shape[0])])
    return all(torch.equal(linear.product(x[:m]), alone[:m]) for m in range(tile, x.shape[0] + 1, tile))


def _padded_to(x: torch.Tensor, tile: int, fn: Callable[[torch.Tensor], torch.Tensor], least: int = 1) -> torch.Tensor:
    """`fn` on rows (T, K) with zero rows appended up to a multiple of `tile`, and to at least `least` rows (itself a
    multiple of `tile`); their outputs dropped."""
    rows = x.shape[0]
    pad = max(-rows % tile, least - rows)
    return fn(x) if pad == 0 else fn(torch.cat([x, x.new_zeros(pad, x.shape[1])]))[:rows]


def _padded_matmul(
    x: torch.Tensor, tile: int, fn: Callable[[torch.Tensor], torch.Tensor], n: int, least: int = 1
) -> torch.Tensor:
    """`fn` (rows (T, K) -> (T, n)) on x's rows (..., K) padded as `_padded_to` pads them, in x's shape."""
    return _padded_to(x.reshape(-1, x.shape[-1]), tile, fn, least).reshape(*x.shape[:-1], n)


def unpack_int4(packed: torch.Tensor, n: int, k: int, block_rows: int) -> torch.Tensor:
    """The CPU kernel's layout: per block of `block_rows` output rows and per input column, block_rows / 2
    bytes whose low nibbles are the block's first half of rows and high nibbles its second half."""
    b = packed.reshape(n // block_rows, k, block_rows // 2)
    return torch.cat([b & 15, b >> 4], dim=-1).transpose(1, 2).reshape(n, k)


@functools.cache
def int4_block_rows() -> int | None:
    """Rows per block of `_convert_weight_to_int4pack_for_cpu`'s layout on this build (it depends on the CPU's
    vector width), found by packing a known matrix; None if the layout is not one we can read."""
    q = torch.randint(0, 16, (128, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    for rows in (16, 32, 64, 128):
        if torch.equal(unpack_int4(packed, 128, 64, rows).int(), q):
            return rows
    return None


@dataclass
class FloatLinear:
    """Float weights. float32 on a CPU that `packs_float32` picks is held as oneDNN's packed copy (an opaque
    `torch._mkldnn` tensor, reordered once for its matmul), the given tensor then let go; else as given, for
    `F.linear`. Every float32 linear of a process takes the same path, as `float_min_rows` probed one: a tied
    lm_head too, so there it is a copy of its own beside the embedding table, which looks rows up in the tensor.
    On the CPU a narrow call of fewer than `narrow_rows` rows is padded up to them (`float_narrow_rows`)."""

    weight: torch.Tensor  # (N, K)
    bias: torch.Tensor | None = None
    narrow_rows: int | None = None  # None: float_narrow_rows of the weight's dtype on the CPU, 1 elsewhere
    widen_rows: ClassVar[int | None] = None  # float weights never widen

    def __post_init__(self) -> None:
        w = self.weight
        if self.narrow_rows is None:
            self.narrow_rows = float_narrow_rows(w.dtype) if w.device.type == "cpu" else 1
        if w.dtype == torch.float32 and w.device.type == "cpu" and w.layout == torch.strided and packs_float32():
            self.weight = torch.ops.mkldnn._reorder_linear_weight(w, None)

    @property
    def format(self) -> str:
        return FLOAT_FORMATS[self.weight.dtype]

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, K) times the weights (+ bias): oneDNN's matmul on the packed copy, or `F.linear`."""
        return float_product(x, self.weight, self.bias)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        n = self.weight.shape[0]
        return by_plan(
            x,
            residual,
            plan,
            lambda rows, res: with_residual(self.product(rows), res),
            lambda rows, res: with_residual(
                _padded_matmul(rows, plan.min_rows, self.product, n, self.narrow_rows), res
            ),
        )

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


@dataclass
class Bf16Linear:
    """bfloat16 weights with float32 activations and math: a bf16 checkpoint's own values (most Hugging Face models
    ship in bf16) at half float32's bytes, so a decode step, which streams every weight once, reads half as much.
    Narrow rows run rooftop's CPU kernel (kernels/bf16.cpp: each weight widened exactly in a register, float32
    multiply-adds in one fixed order, so a row's result never depends on the other rows); a widened group (a prefill
    chunk of WIDEN_ROWS or more) widens the weights to float32 once per call and runs the float32 matmul, as
    `FloatLinear` does, in a buffer kept for it (`_widened`)."""

    weight: torch.Tensor  # (N, K) bfloat16
    bias: torch.Tensor | None = None  # float32
    format: ClassVar[str] = "bf16-fp32"
    widen_rows: ClassVar[int | None] = WIDEN_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        if not plan.widen:
            return self.narrow(x, residual)
        wide = _widened(self.weight)

        def widened(rows: torch.Tensor, res: torch.Tensor | None) -> torch.Tensor:
            return with_residual(_like(float_product(_float_rows(rows), wide, self.bias), rows), res)

        return by_plan(x, residual, plan, widened, self.narrow)

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        res = None if residual is None else _float_rows(residual)
        return _like(cpu.ops().bf16_linear(_float_rows(x), self.weight, self.bias, res), x)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    @classmethod
    def from_weight(cls, w: torch.Tensor, bias: torch.Tensor | None) -> Bf16Linear:
        return cls(w.to(torch.bfloat16).contiguous(), _bias(bias))


@dataclass
class RouterLinear:
    """A mixture of experts' float32 router (and Qwen3-Next's shared-expert gate): a small matrix (128 x 2048)
    whose logits pick a layer's experts. oneDNN's matmul on its packed copy read one at ~9 GB/s in a decode step,
    where the experts' tiles streamed at the memory's rate (docs/PERFORMANCE.md). Narrow rows run rooftop's
    fixed-order kernel on the weights as they are (kernels/bf16.cpp's loops with float32 loads: a row's logits
    never depend on the other rows); a widened group (a prefill chunk) runs the float32 matmul on the same weights,
    as `Bf16Linear`'s widened groups do."""

    weight: torch.Tensor  # (N, K) float32
    format: ClassVar[str] = "fp32"
    widen_rows: ClassVar[int | None] = None  # float weights: nothing to widen

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        def wide(rows: torch.Tensor, res: torch.Tensor | None) -> torch.Tensor:
            return with_residual(_like(float_product(_float_rows(rows), self.weight, None), rows), res)

        return by_plan(x, residual, plan, wide, self.narrow)

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        res = None if residual is None else _float_rows(residual)
        return _like(cpu.ops().f32_linear(_float_rows(x), self.weight, None, res), x)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


def router_linear(w: torch.Tensor) -> RouterLinear | FloatLinear:
    """An MoE layer's router in float32: on rooftop's kernel where it runs (the CPU, inputs a multiple of 32),
    else a `FloatLinear`."""
    w = w.float().contiguous()
    if w.device.type == "cpu" and w.shape[1] % GROUP == 0 and cpu.ops() is not None:
        return RouterLinear(w)
    return FloatLinear(w)


def runs_bf16(w: torch.Tensor) -> bool:
    """Whether `auto` holds a float linear as `Bf16Linear`: on the CPU with rooftop's kernels, a matrix (inputs a
    multiple of 32) in bfloat16, as a bf16 checkpoint's are read, or in float32 with every value a bfloat16."""
    return (
        w.device.type == "cpu"
        and w.dim() == 2
        and w.shape[1] % GROUP == 0
        and cpu.ops() is not None
        and (w.dtype == torch.bfloat16 or (w.dtype == torch.float32 and holds_bf16(w)))
    )


def holds_bf16(w: torch.Tensor) -> bool:
    """Whether the low 16 bits of every float32 are zero, checked a slice of rows at a time (a whole 1 GB lm_head's
    test would allocate as much again)."""
    bits = w.reshape(-1, w.shape[-1]).view(torch.int32)
    step = max(1, (1 << 22) // bits.shape[1])
    return not any(bool((bits[i : i + step] & 0xFFFF).any()) for i in range(0, bits.shape[0], step))


_widen_buffer: list[torch.Tensor] = []


def _widened(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 weight as float32, in one buffer that every call reuses (grown to the largest weight seen): a
    fresh 64 MiB tensor took 19 ms to widen into, its pages faulted in one by one, a warm buffer 2.9 ms. The engine
    runs one step at a time, and each call's matmul is done with it before the next widens."""
    if not _widen_buffer or _widen_buffer[0].numel() < weight.numel():
        _widen_buffer[:] = [torch.empty(weight.numel(), dtype=torch.float32)]
    return _widen_buffer[0][: weight.numel()].view(weight.shape).copy_(weight)


def float_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (T, K) times a float weight (N, K) (+ bias): oneDNN's matmul on a copy it packed (`FloatLinear`'s), or on
    a float32 CPU matrix where `packs_float32` picks oneDNN (`Bf16Linear`'s widened weights); else `F.linear`."""
    if w.is_mkldnn or (w.device.type == "cpu" and w.dtype == torch.float32 and packs_float32()):
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    return F.linear(x, w, bias)


@functools.cache
def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


@dataclass
class Fp16Linear:
    """float16 weights, float32 activations and outputs (fbgemm's `linear_dynamic_fp16`): the lm_head of the
    quantized formats. The weight-only kernels return bfloat16, and bfloat16 logits step by 1/8 at the bundled
    model's typical 16-32: near-ties flip (measured: "What is the capital of France?" answered "L'Étoile, ..."
    instead of "The capital of France is Paris."). This head also ran faster than int8's here (3.7 vs 4.6 ms)."""

    packed: torch.Tensor  # fbgemm's packed float16 matrix (opaque)
    out_features: int
    nbytes: int
    format: ClassVar[str] = "fp16-fp32"
    widen_rows: ClassVar[int | None] = None  # float16 weights, float32 math at every size

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        """Every row the same way (fbgemm's result for a row does not depend on the row count)."""
        flat = x.reshape(-1, x.shape[-1]).float()
        y = torch.ops.quantized.linear_dynamic_fp16(flat, self.packed)
        return with_residual(y.reshape(*x.shape[:-1], self.out_features), residual)

    @classmethod
    def from_weight(cls, w: torch.Tensor, bias: torch.Tensor | None) -> Fp16Linear:
        packed = torch.ops.quantized.linear_prepack_fp16(w.float().contiguous(), None if bias is None else bias.float())
        return cls(packed, w.shape[0], w.numel() * 2)


@dataclass
class Int8Linear:
    """int8 weights with one bfloat16 scale per output row on PyTorch's weight-only kernel (bf16 activations)."""

    qweight: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N,) bfloat16: w ≈ qweight * scales[:, None]
    bias: torch.Tensor | None = None
    format: ClassVar[str] = "int8"
    widen_rows: ClassVar[int | None] = WIDEN_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        wide = self.dequantize().to(x.dtype) if plan.widen else None
        return by_plan(
            x, residual, plan, lambda rows, res: with_residual(F.linear(rows, wide, self.bias), res), self.narrow
        )

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = torch._weight_int8pack_mm(flat.to(torch.bfloat16), self.qweight, self.scales).to(x.dtype)
        y = y.reshape(*x.shape[:-1], self.qweight.shape[0])
        return with_residual(y if self.bias is None else y + self.bias, residual)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes


@dataclass
class Int4Linear:
    """int4 weights with a bfloat16 scale and zero per group of 32 on PyTorch's weight-only CPU kernel."""

    packed: torch.Tensor  # (N, K / 2) uint8, the CPU kernel's layout
    scales_zeros: torch.Tensor  # (K / 32, N, 2) bfloat16
    out_features: int
    bias: torch.Tensor | None = None
    format: ClassVar[str] = "int4-g32"
    widen_rows: ClassVar[int | None] = WIDEN_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        block = int4_block_rows()
        if block is None or self.out_features % block:  # a packing we cannot unpack: every row on the kernel
            plan = NARROW
        wide = self.dequantize().to(x.dtype) if plan.widen else None
        return by_plan(
            x, residual, plan, lambda rows, res: with_residual(F.linear(rows, wide, self.bias), res), self.narrow
        )

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return with_residual(y if self.bias is None else y + self.bias, residual)

    def dequantize(self) -> torch.Tensor:
        """Float32 (N, K) straight from the kernel's packed nibbles (no second copy of the weights is kept)."""
        n, k = self.out_features, self.packed.shape[1] * 2
        q = unpack_int4(self.packed, n, k, int4_block_rows()).view(n, k // GROUP, GROUP)
        scale, zero = (t.t().float().contiguous()[..., None] for t in self.scales_zeros.unbind(-1))  # (N, K / 32, 1)
        return torch.addcmul(zero - 8 * scale, q.float(), scale).view(n, k)  # (q - 8)·s + z in one pass

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    @classmethod
    def from_weight(cls, w: Int4Weight, bias: torch.Tensor | None) -> Int4Linear:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.q.to(torch.int32), 1)
        scales_zeros = torch.stack([w.scale.t(), w.zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        return cls(packed, scales_zeros, w.q.shape[0], bias)


def _float_rows(t: torch.Tensor) -> torch.Tensor:
    """(rows, features) float32 contiguous, as rooftop's kernels take it (a no-op for the engine's activations)."""
    return (
        t
        if t.dim() == 2 and t.dtype == torch.float32 and t.is_contiguous()
        else t.reshape(-1, t.shape[-1]).float().contiguous()
    )


def _like(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return y if x.dim() == 2 and x.dtype == y.dtype else y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])


class _KernelLinear:
    """What the kernel linears share: the narrow rows run the kernel, widened groups (a `RowPlan`) one matmul in
    `widen_dtype` where the host widens; where it does not, every row runs the kernel, a widened group (a prefill
    chunk) in the kernel's form for chunks (`kernel`'s chunk)."""

    bias: torch.Tensor | None

    @property
    def widen_rows(self) -> int | None:
        return None if widen_dtype() is None else WIDEN_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        if not plan.widen:
            return self.narrow(x, residual)
        if widen_dtype() is None:
            return by_plan(x, residual, plan, functools.partial(self.narrow, chunk=True), self.narrow)
        wide = self.dequantize(widen_dtype())

        def widened(rows: torch.Tensor, res: torch.Tensor | None) -> torch.Tensor:
            y = F.linear(rows.to(wide.dtype), wide).to(x.dtype)
            return with_residual(y if self.bias is None else y + self.bias.to(x.dtype), res)

        return by_plan(x, residual, plan, widened, self.narrow)

    def narrow(self, x: torch.Tensor, residual: torch.Tensor | None, chunk: bool = False) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():
            return self.kernel(x, residual, chunk)  # the engine's activations
        res = None if residual is None else _float_rows(residual)
        return _like(self.kernel(_float_rows(x), res, chunk), x)


@dataclass
class TiledLinear(_KernelLinear):
    """A GGUF block format in tiles of 16 output rows (kernels/tiles.cpp, quant/tiles.py), run by rooftop's CPU kernel
    against int8-quantized activations: a tile's unpacked weights serve up to 8 activation rows, so a batch's or a
    verify step's extra rows cost little more than the first. Prefill-sized chunks widen to one matmul where the
    host has AMX (`widen_dtype`)."""

    q: torch.Tensor  # (ceil(N / 16), K / 32, group bytes) uint8: levels, bit planes and sub-block scales per group
    dm: torch.Tensor  # (ceil(N / 16), scale blocks, parts, 16) float16, as in the GGUF: d, then m or dmin
    out_features: int
    bias: torch.Tensor | None = None
    format: ClassVar[str]  # one of TILE_FORMATS

    @property
    def kernel_format(self) -> int:
        return TILE_FORMATS.index(self.format)

    def kernel(self, x: torch.Tensor, residual: torch.Tensor | None, chunk: bool = False) -> torch.Tensor:
        """x @ W^T (+ bias) (+ residual) on the kernel. A prefill chunk's rows of a K-quant take one activation
        scale per 256 and sum each super-block in integers (tiles.cpp's super_blocks): the faster form for many
        rows; a decode's rows keep scales per 32, which streamed the weights faster."""
        fmt, super_blocks = self.kernel_format, chunk and self.format in SUPER_BLOCK_FORMATS
        return cpu.ops().tiled_linear(x, self.q, self.dm, fmt, self.out_features, self.bias, residual, super_blocks)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Float32 rows `ids` of the weight, decoded as `dequantize` decodes them: an embedding table's lookup."""
        flat = ids.reshape(-1).long().contiguous()
        rows = cpu.ops().tiled_rows(self.q, self.dm, self.kernel_format, self.out_features, flat)
        return rows.reshape(*ids.shape, rows.shape[-1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        wide = cpu.ops().tiled_dequantize(
            self.q, self.dm, self.kernel_format, self.out_features, dtype == torch.bfloat16
        )
        return wide.to(dtype)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.dm.nbytes


def _bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.float().contiguous()


@dataclass
class Q4Linear(TiledLinear):
    """GGUF Q4_1 groups: w = d·q + m per 32 weights."""

    format: ClassVar[str] = "q4_1"

    @classmethod
    def from_weight(cls, w: Int4Weight, bias: torch.Tensor | None) -> Q4Linear:
        dm = tile_scales(w.scale, w.zero - 8 * w.scale)  # (q - 8)·s + z = s·q + (z - 8s)
        return cls(tile_nibbles(w.q), dm, w.q.shape[0], _bias(bias))


@dataclass
class Q8Linear(TiledLinear):
    """GGUF Q8_0 groups (w = d·q, 32 int8 weights per scale), with float32 outputs: the lm_head of the quantized
    formats and every linear of int8."""

    format: ClassVar[str] = "q8_0"

    @classmethod
    def from_weight(cls, w: Weight, bias: torch.Tensor | None) -> Q8Linear:
        groups = w if isinstance(w, Int8GroupWeight) else quantize_int8_groups(to_float(w))
        return cls(tile_bytes(groups.q), tile_scales(groups.scale), groups.q.shape[0], _bias(bias))


@dataclass
class BlockLinear(TiledLinear):
    """A stored GGUF block format (BLOCK_FORMATS: Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) at the file's own levels and
    scales, repacked in tiles at load."""

    format: str = field(kw_only=True)  # one of BLOCK_FORMATS

    @classmethod
    def from_weight(cls, w: BlockWeight, bias: torch.Tensor | None) -> BlockLinear:
        q, dm = tile_blocks(w)
        return cls(q, dm, w.shape[0], _bias(bias), format=w.format)


@dataclass
class ConcatLinear:
    """Fused projections whose parts the file stores in different formats (a Q4_K_M file's Q and K in Q4_K, its V
    in Q6_K): each part runs as stored and the outputs are concatenated, instead of requantizing them to one."""

    parts: list

    @property
    def widen_rows(self) -> int | None:
        return self.parts[0].widen_rows

    @property
    def format(self) -> str:
        return "+".join(dict.fromkeys(p.format for p in self.parts))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        return with_residual(torch.cat([p(x, plan=plan) for p in self.parts], dim=-1), residual)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


Linear = (
    FloatLinear
    | Bf16Linear
    | RouterLinear
    | Int8Linear
    | Int4Linear
    | Fp16Linear
    | Q4Linear
    | Q8Linear
    | BlockLinear
    | ConcatLinear
    | CudaInt4Linear
    | CudaInt8Linear
)


def embedding_table(weight: Weight, tied_head: Linear | None) -> Weight | TiledLinear:
    """The table a CPU model looks its tokens' rows up in. A file's block-format matrix (BLOCK_FORMATS) goes into
    tiles, where the kernels decode a row (gguf's numpy dequantizer took 0.23 ms of a 1B's 15 ms decode step). An
    lm_head tied to it that holds the same values in tiles (a block format as stored, or Q8_0's groups as stored)
    is that table, so the matrix is held once. The values are the file's either way (tests/test_block_formats.py,
    tests/test_kernels.py). An lm_head tied to it in bf16-fp32 holds the same values in bfloat16: that tensor is the
    table (a row looked up and widened exactly), not a float32 copy twice its size. Other forms look rows up in
    PyTorch as they are."""
    if cpu.ops() is None:
        return weight
    if isinstance(tied_head, Bf16Linear):
        return tied_head.weight
    if isinstance(weight, Int8GroupWeight) and isinstance(tied_head, Q8Linear):
        return tied_head  # Q8Linear keeps a file's Q8_0 groups as they are
    if not isinstance(weight, BlockWeight):
        return weight
    if isinstance(tied_head, BlockLinear) and tied_head.format == weight.format:
        return tied_head
    return BlockLinear.from_weight(weight, None)


def linear_kind(policy: str, device: torch.device, lm_head: bool = False) -> type[Linear]:
    """The class a weight becomes under `policy` ("float", "int8", "int4") on `device`: on CUDA int4 is tinygemm's
    CudaInt4Linear and int8 and the lm_head of both Q8_0 groups on rooftop's Triton kernel (CudaInt8Linear); on the
    CPU with rooftop's kernels int4 is Q4Linear and int8 and the lm_head of both Q8Linear (group-32); without them
    the lm_head is float16 with float32 logits where fbgemm exists (x86), else per-row int8 (measured on the bundled
    model: a 4-bit lm_head drops top-1 agreement with float32 from 99% to 89%), and the other linears Int4Linear /
    Int8Linear."""
    if policy not in WEIGHT_POLICIES:
        raise InvalidRequestError(f"a linear's weights are one of {', '.join(WEIGHT_POLICIES)}; got {policy!r}")
    if policy == "float":
        return FloatLinear
    if device.type == "cuda":
        return CudaInt4Linear if policy == "int4" and not lm_head else CudaInt8Linear
    if cpu.ops() is not None and device.type == "cpu":
        return Q4Linear if policy == "int4" and not lm_head else Q8Linear
    if lm_head and fbgemm_available():
        return Fp16Linear
    return Int4Linear if policy == "int4" and not lm_head else Int8Linear


def linear_format(policy: str, device: torch.device, dtype: torch.dtype, lm_head: bool = False) -> str:
    """The format (analyzer's vocabulary) of the linears `policy` builds on `device` with activations in `dtype`."""
    kind = linear_kind(policy, device, lm_head)
    return FLOAT_FORMATS[dtype] if kind is FloatLinear else kind.format


def as_file_choice(choice: str, file_format: str | None, device: torch.device) -> str:
    """A `--weights` choice that names the one format a file's blocks hold and `auto` runs as stored (q4_k for a
    Q4_K file, q8_0 for a Q8_0 one; bf16-fp32 for a bf16 checkpoint on the CPU) is `auto`; any other as given."""
    if file_format in (*BLOCK_FORMATS, "q8_0", "q4_1") and choice == file_format:
        return "auto"
    if file_format == "bf16" and choice == Bf16Linear.format and device.type == "cpu" and cpu.ops() is not None:
        return "auto"
    return choice


def weight_policy(choice: str, native: str, device: torch.device, dtype: torch.dtype) -> str:
    """The policy that runs a `--weights` choice here: "auto" is the file's closest format (`native`: float, int8 or
    int4, each of which runs on the CPU and on CUDA); an exact format only where one policy's block linears are that
    format."""
    check_weight_choice(choice)
    if choice == "auto":
        return native
    if choice in WEIGHT_POLICIES:
        return choice
    runs = {policy: linear_format(policy, device, dtype) for policy in WEIGHT_POLICIES}
    for policy, fmt in runs.items():
        if fmt == choice:
            return policy
    here = ", ".join(f"{policy} as {fmt}" for policy, fmt in runs.items())
    if choice in BLOCK_FORMATS and device.type == "cpu" and cpu.ops() is not None:  # it runs them, from a file only
        raise UnsupportedModelError(
            f"rooftop's engine makes no {choice} weights out of others on {device.type} (it makes {here}); a "
            f"GGUF's own {choice} tensors run as stored with --weights auto (or {choice}, where they are all the "
            "file's blocks hold)"
        )
    floats = {name: str(t).removeprefix("torch.") for t, name in FLOAT_FORMATS.items()}
    if choice in floats:  # float weights are the model's dtype
        hint = f"; {choice} weights run with --dtype {floats[choice]}"
    elif choice == Bf16Linear.format:
        hint = "; a bf16 checkpoint's weights run as bf16-fp32 on the CPU with --weights auto or bf16-fp32"
    else:
        hint = ""
    raise UnsupportedModelError(f"rooftop's engine cannot run {choice} weights on {device.type} (it runs {here}){hint}")


def as_stored(weight: Weight, policy: str, device: torch.device) -> bool:
    """Whether a file's quantized matrix runs in its own format: the block formats and Q8_0 do on rooftop's CPU
    kernels under a quantized policy, so a mixed file (Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0) runs each tensor as it holds
    it. On CUDA a file's Q4 and Q8 groups are repacked for tinygemm and the Q8_0 kernel instead (make_linear)."""
    return (
        policy != "float"
        and device.type == "cpu"
        and cpu.ops() is not None
        and isinstance(weight, (BlockWeight, Int8GroupWeight, list))
    )


def _int4(weight: Weight) -> Int4Weight:
    if isinstance(weight, Int4Weight):
        return weight
    if isinstance(weight, BlockWeight) and weight.format == "q4_0":
        return q4_0_as_int4(weight)  # the same values
    return quantize_int4(to_float(weight))


def make_linear(
    weight: Weight | list[Weight],
    bias: torch.Tensor | None,
    policy: str,
    lm_head: bool = False,
    stored: bool = False,
    device: torch.device | None = None,
) -> Linear:
    """A linear of the class `linear_kind` picks on `device` (default: a float tensor's own, the CPU for a file's
    groups), from a weight in any form (float, or a file's quantized groups or blocks; a list: fused parts the file
    holds in different formats), one tensor at a time. With `stored` (the `auto` choice) a file's quantized matrices
    run in their own format where `as_stored` says they can. Otherwise int4 keeps a GGUF's Q4_1 weights as they are
    (and Q4_0's, as the same values) and quantizes any other block linear to group-32 int4; int8 keeps a GGUF's
    Q8_0 groups on rooftop's kernels."""
    if device is None:
        device = weight.device if isinstance(weight, torch.Tensor) else torch.device("cpu")
    if stored and as_stored(weight, policy, device):
        if isinstance(weight, list):
            biases = [None] * len(weight) if bias is None else torch.split(bias, [w.shape[0] for w in weight])
            return ConcatLinear(
                [make_linear(w, b, policy, lm_head, stored, device) for w, b in zip(weight, biases, strict=True)]
            )
        if isinstance(weight, BlockWeight):
            return BlockLinear.from_weight(weight, bias)
        return Q8Linear.from_weight(weight, bias)
    if isinstance(weight, list):
        weight = torch.cat([to_float(w).to(device) for w in weight])
    kind = linear_kind(policy, device, lm_head)
    rows, cols = weight.shape
    quantized = (Q4Linear, Q8Linear, Int4Linear, CudaInt4Linear, CudaInt8Linear)
    if kind in quantized and isinstance(weight, torch.Tensor) and cols % GROUP:
        kind = FloatLinear  # rows that are no whole groups of 32 stay float, as the run's format line then shows
    if kind is CudaInt4Linear and not runs_tinygemm(rows, cols):
        kind = CudaInt8Linear  # tinygemm takes output rows in tiles of 8: these run as Q8_0, as the format line shows
    if kind is FloatLinear:
        if not isinstance(weight, torch.Tensor):
            raise InvalidRequestError("float linears take float tensors: dequantize a file's groups first")
        if stored and runs_bf16(weight):
            return Bf16Linear.from_weight(weight, bias)
        return FloatLinear(weight, bias)
    if kind is Q4Linear:
        return Q4Linear.from_weight(_int4(weight), bias)
    if kind is Q8Linear:
        return Q8Linear.from_weight(weight, bias)
    if kind is Fp16Linear:
        return Fp16Linear.from_weight(to_float(weight), bias)
    if kind is Int4Linear:
        return Int4Linear.from_weight(_int4(weight), bias)
    if kind is CudaInt4Linear:
        return CudaInt4Linear.from_weight(_int4(weight), bias, device)
    if kind is CudaInt8Linear:
        return CudaInt8Linear.from_weight(weight, bias, device)
    q, scales = quantize_int8(to_float(weight))
    return Int8Linear(q, scales, bias)
