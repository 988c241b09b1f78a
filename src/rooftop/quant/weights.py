"""Weights as a file holds them: 4-bit and 8-bit integers with one scale (and zero) per group of 32 weights, or
GGUF's other block formats byte for byte.

GGUF Q4_1 loads as `Int4Weight`, Q8_0 as `Int8GroupWeight`, and Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K as `BlockWeight`
(the file's rows of blocks, which rooftop's kernels read as they are), never widened to float32 as a whole model;
a linear layer or the embedding then takes the form it runs in (see quant/linear.py), one tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import gguf
import numpy as np
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


# The GGUF block formats rooftop's kernels run as stored (kernels/tiles.cpp, repacked in tiles of 16 rows at load).
BLOCK_FORMATS = ("q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")


@dataclass
class BlockWeight(_Groups):
    """A matrix in one of BLOCK_FORMATS: each row is the file's row of blocks (super-blocks of 256 weights with
    their packed sub-block scales for the K-quants, blocks of 32 for Q4_0/Q5_0/Q5_1), unchanged. The float values come
    from gguf's own dequantizer.

    The rows stay where they are, in the file's mapping: a row order (`rows`) and a fusion (`cat`) are noted, not
    made, and the tiles are then made from the file's rows in that order (quant/tiles.py). An 8B's rows were copied
    out of the file, reordered and concatenated on the way to the tiles, 4.5 GB written twice at load."""

    parts: tuple[torch.Tensor, ...]  # (N_i, bytes per row) uint8 each, any row stride: the matrix's rows, stacked
    format: str  # one of BLOCK_FORMATS
    k: int  # weights per row
    order: torch.Tensor | None = None  # int64: row r of the matrix is row order[r] of the stack; None: in order

    @property
    def q(self) -> torch.Tensor:
        """(N, bytes per row) uint8, the matrix's rows in order: a view where it is one part in order, else a copy."""
        if len(self.parts) == 1 and self.order is None:
            return self.parts[0]
        stacked = torch.cat(self.parts)
        return stacked if self.order is None else stacked[self.order]

    def _rows(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """Rows `rows` of the matrix: through the order and from the one part they lie in, where there is one part
        (an embedding's lookup, a shard's rows), never a copy of the whole."""
        if self.order is None and len(self.parts) == 1:
            return self.parts[0][rows]
        if len(self.parts) == 1:
            return self.parts[0][self.order[rows]]
        return self.q[rows]

    @property
    def shape(self) -> tuple[int, int]:
        rows = sum(p.shape[0] for p in self.parts) if self.order is None else self.order.shape[0]
        return (rows, self.k)

    def lookup(self, rows: torch.Tensor | slice) -> torch.Tensor:
        raw = self._rows(rows).numpy()
        values = gguf.quants.dequantize(raw.reshape(-1, raw.shape[-1]), gguf.GGMLQuantizationType[self.format.upper()])
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(*raw.shape[:-1], self.k)

    def rows(self, order: torch.Tensor) -> BlockWeight:
        return BlockWeight(self.parts, self.format, self.k, order if self.order is None else self.order[order])

    @classmethod
    def cat(cls, weights: list[BlockWeight]) -> BlockWeight:
        if len({(w.format, w.k) for w in weights}) != 1:
            raise ValueError("only matrices of one block format and width concatenate")
        orders, start = [], 0
        for w in weights:
            stacked = sum(p.shape[0] for p in w.parts)
            orders.append(start + (torch.arange(stacked) if w.order is None else w.order))
            start += stacked
        parts = tuple(p for w in weights for p in w.parts)
        ordered = all(w.order is None for w in weights)
        return cls(parts, weights[0].format, weights[0].k, None if ordered else torch.cat(orders))


GroupWeight = Int4Weight | Int8GroupWeight | BlockWeight
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
