"""Linear layers by weight format: float (`F.linear`), int8 weight-only (one scale per output row) and int4
weight-only (a scale and a zero per group of 32 weights along each row).

Decode is matrix-vector work that streams every weight once per step, so its time follows the weight bytes:
int8 reads a quarter of float32, int4 an eighth. Both run PyTorch's CPU weight-only kernels, which take
bfloat16 activations; outputs are cast back to the model's dtype. The int4 kernel computes (q - 8)·s + z, so
GGUF Q4_1 blocks (x = d·q + m) load as s = d, z = m + 8d and Q4_0 (x = d·(q - 8)) as s = d, z = 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rooftop.quant.weights import GROUP, Int4Weight, Weight, quantize_int4, quantize_int8, to_float

WEIGHT_FORMATS = ("float", "int8", "int4")
# Prefill is matrix-matrix work: from this many rows on, widening the weights to float32 one linear at a time and
# running MKL's sgemm beats the weight-only kernels, which compute in emulated bfloat16 on CPUs without it
# (measured on the bundled model, docs/PERFORMANCE.md). Decode steps (one row per sequence) stay quantized.
WIDEN_ROWS = 96


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
    weight: torch.Tensor  # (N, K)
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        y = torch.ops.quantized.linear_dynamic_fp16(flat, self.packed)
        return y.reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def from_weight(cls, w: torch.Tensor, bias: torch.Tensor | None) -> Fp16Linear:
        packed = torch.ops.quantized.linear_prepack_fp16(w.float().contiguous(), None if bias is None else bias.float())
        return cls(packed, w.shape[0], w.numel() * 2)


@dataclass
class Int8Linear:
    qweight: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N,) bfloat16: w ≈ qweight * scales[:, None]
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] >= WIDEN_ROWS:
            return F.linear(x, self.dequantize().to(x.dtype), self.bias)
        y = torch._weight_int8pack_mm(flat.to(torch.bfloat16), self.qweight, self.scales).to(x.dtype)
        y = y.reshape(*x.shape[:-1], self.qweight.shape[0])
        return y if self.bias is None else y + self.bias

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes


@dataclass
class Int4Linear:
    packed: torch.Tensor  # (N, K / 2) uint8, the CPU kernel's layout
    scales_zeros: torch.Tensor  # (K / 32, N, 2) bfloat16
    out_features: int
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        rows = int4_block_rows()
        if flat.shape[0] >= WIDEN_ROWS and rows is not None and self.out_features % rows == 0:
            return F.linear(x, self.dequantize().to(x.dtype), self.bias)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

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


Linear = FloatLinear | Int8Linear | Int4Linear | Fp16Linear


def make_linear(weight: Weight, bias: torch.Tensor | None, fmt: str, lm_head: bool = False) -> Linear:
    """A linear in `fmt` from a weight in any form (float, or a file's 4-bit / 8-bit groups), one tensor at a time.

    int4 keeps a GGUF's Q4 weights as they are and quantizes any other block linear to group-32 int4. The
    lm_head of int8 and int4 is float16 with float32 logits where fbgemm exists (x86), else int8 (measured on
    the bundled model: a 4-bit lm_head drops top-1 agreement with float32 from 99% to 89%).
    """
    if lm_head and fmt in ("int8", "int4") and fbgemm_available():
        return Fp16Linear.from_weight(to_float(weight), bias)
    if fmt == "int4" and not lm_head:
        int4 = weight if isinstance(weight, Int4Weight) else quantize_int4(to_float(weight))
        return Int4Linear.from_weight(int4, bias)
    if fmt in ("int8", "int4"):
        q, scales = quantize_int8(to_float(weight))
        return Int8Linear(q, scales, bias)
    assert fmt == "float", fmt
    assert isinstance(weight, torch.Tensor), "the model casts file-quantized weights to its dtype for float linears"
    return FloatLinear(weight, bias)
