"""Linear layers by weight format: float weights (`F.linear`) or int8 weight-only (one scale per output row).

Decode is matrix-vector work that streams every weight once per step, so its time follows the weight bytes:
int8 reads a quarter of float32. The int8 path runs PyTorch's `_weight_int8pack_mm`, which takes bfloat16
activations; its output is cast back to the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

WEIGHT_FORMATS = ("float", "int8")


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


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> FloatLinear | Int8Linear:
    """A linear in `fmt` from a float weight already on its device and in the model's dtype."""
    if fmt == "int8":
        q, scales = quantize_int8(weight)
        return Int8Linear(q, scales, bias)
    assert fmt == "float", fmt
    return FloatLinear(weight, bias)
