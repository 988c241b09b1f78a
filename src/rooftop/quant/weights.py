"""Weights as a file holds them: 4-bit and 8-bit integers with one scale (and zero) per group of 32 weights.

GGUF Q4_0/Q4_1 load as `Int4Weight` and Q8_0 as `Int8GroupWeight`, never widened to float32 as a whole model;
a linear layer or the embedding then takes the form it runs in (see quant/linear.py), one tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

GROUP = 32


def expand_groups(t: torch.Tensor) -> torch.Tensor:
    """(..., K / 32) per-group values -> (..., K), each repeated over its 32 weights."""
    return t.repeat_interleave(GROUP, dim=-1)


class _Groups:
    """What both grouped formats share: row selection and concatenation apply to every field alike."""

    q: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> torch.Tensor:
        return self.lookup(slice(None))

    def rows(self, order: torch.Tensor):
        return type(self)(*(getattr(self, f.name)[order] for f in fields(self)))

    @classmethod
    def cat(cls, weights: list):
        return cls(*(torch.cat([getattr(w, f.name) for w in weights]) for f in fields(cls)))


@dataclass
class Int4Weight(_Groups):
    """w[n, k] = (q[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32]: the CPU int4 kernel's convention."""

    q: torch.Tensor  # (N, K) uint8, values 0..15
    scale: torch.Tensor  # (N, K / 32) float32
    zero: torch.Tensor  # (N, K / 32) float32

    def lookup(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """Float32 values of some rows (an embedding lookup reads only the rows it needs)."""
        return (self.q[rows].float() - 8) * expand_groups(self.scale[rows]) + expand_groups(self.zero[rows])


@dataclass
class Int8GroupWeight(_Groups):
    """w[n, k] = q[n, k] * scale[n, k // 32]: GGUF's Q8_0, kept at 8 bits."""

    q: torch.Tensor  # (N, K) int8
    scale: torch.Tensor  # (N, K / 32) float32

    def lookup(self, rows: torch.Tensor | slice) -> torch.Tensor:
        return self.q[rows].float() * expand_groups(self.scale[rows])


GroupWeight = Int4Weight | Int8GroupWeight
Weight = torch.Tensor | GroupWeight


def to_float(w: Weight) -> torch.Tensor:
    return w if isinstance(w, torch.Tensor) else w.dequantize()


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-row int8: scale = max|w| / 127 per row (rounded to bfloat16, the kernel's type)."""
    scales = (weight.float().abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(torch.bfloat16)
    q = torch.round(weight.float() / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int8_groups(weight: torch.Tensor) -> Int8GroupWeight:
    """Symmetric group-32 int8, as GGUF's Q8_0: scale = max|w| / 127 per group of 32, rounded to float16 as the
    file stores it."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // GROUP, GROUP)
    scale = (groups.abs().amax(-1) / 127.0).half().float().clamp(min=2.0**-14)
    q = torch.round(groups / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return Int8GroupWeight(q.reshape(n, k), scale)


def quantize_int4(weight: torch.Tensor) -> Int4Weight:
    """Asymmetric group-32 int4 as GGUF's Q4_1 makes it: min/max per group, the scale d and the min rounded to
    float16 (as the file stores them), then w ≈ q·d + min = (q - 8)·d + (min + 8d)."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // GROUP, GROUP)
    low = groups.amin(-1).half().float()
    scale = ((groups.amax(-1) - low) / 15).half().float().clamp(min=2.0**-14)  # the smallest normal float16
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return Int4Weight(q.reshape(n, k), scale, low + 8 * scale)
