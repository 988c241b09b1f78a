"""Linear layers by weight format: float (`F.linear`), int8 weight-only (one scale per output row) and int4
weight-only (a scale and a zero per group of 32 weights along each row).

Decode is matrix-vector work that streams every weight once per step, so its time follows the weight bytes:
int8 reads a quarter of float32, int4 an eighth. Both run PyTorch's CPU weight-only kernels, which take
bfloat16 activations; outputs are cast back to the model's dtype. The int4 kernel computes (q - 8)·s + z, so
GGUF Q4_1 blocks (x = d·q + m) load as s = d, z = m + 8d and Q4_0 (x = d·(q - 8)) as s = d, z = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

WEIGHT_FORMATS = ("float", "int8", "int4")
INT4_GROUP = 32


@dataclass
class Int4Weight:
    """A weight matrix kept as 4-bit integers: w[n, k] = (q[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32]."""

    q: torch.Tensor  # (N, K) uint8, values 0..15
    scale: torch.Tensor  # (N, K / 32) float32
    zero: torch.Tensor  # (N, K / 32) float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> torch.Tensor:
        expand = lambda t: t.repeat_interleave(INT4_GROUP, dim=1)  # noqa: E731
        return (self.q.float() - 8) * expand(self.scale) + expand(self.zero)

    def rows(self, order: torch.Tensor) -> Int4Weight:
        return Int4Weight(self.q[order], self.scale[order], self.zero[order])

    @staticmethod
    def cat(weights: list[Int4Weight]) -> Int4Weight:
        return Int4Weight(*(torch.cat([getattr(w, f) for w in weights]) for f in ("q", "scale", "zero")))


@dataclass
class FloatLinear:
    weight: torch.Tensor  # (N, K)
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


@dataclass
class Int8Linear:
    qweight: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N,) bfloat16: w ≈ qweight * scales[:, None]
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(flat, self.qweight, self.scales).to(x.dtype)
        y = y.reshape(*x.shape[:-1], self.qweight.shape[0])
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-row int8: scale = max|w| / 127 per row (rounded to bfloat16, the kernel's type)."""
    scales = (weight.float().abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(torch.bfloat16)
    q = torch.round(weight.float() / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


@dataclass
class Int4Linear:
    packed: torch.Tensor  # (N, K / 2) uint8, the CPU kernel's layout
    scales_zeros: torch.Tensor  # (K / 32, N, 2) bfloat16
    out_features: int
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, INT4_GROUP, self.scales_zeros).to(x.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    @classmethod
    def from_weight(cls, w: Int4Weight, bias: torch.Tensor | None) -> Int4Linear:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.q.to(torch.int32), 1)
        scales_zeros = torch.stack([w.scale.t(), w.zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        return cls(packed, scales_zeros, w.q.shape[0], bias)


Weight = torch.Tensor | Int4Weight


def make_linear(weight: Weight, bias: torch.Tensor | None, fmt: str) -> FloatLinear | Int8Linear | Int4Linear:
    """A linear in `fmt` from a float weight on its device, or (int4 only) a GGUF 4-bit weight used as is.

    In int4 mode a weight the file holds at more than 4 bits (e.g. the bundled model's Q8_0 embedding, which
    is also its lm_head) becomes int8, the closest format the kernels have: 4 bits would cost accuracy.
    """
    if fmt == "int4" and isinstance(weight, Int4Weight):
        return Int4Linear.from_weight(weight, bias)
    assert isinstance(weight, torch.Tensor), "4-bit weights are dequantized before a float or int8 linear"
    if fmt in ("int8", "int4"):
        q, scales = quantize_int8(weight)
        return Int8Linear(q, scales, bias)
    assert fmt == "float", fmt
    return FloatLinear(weight, bias)
