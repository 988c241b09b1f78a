"""The layout of kernels/tiles.cpp: a matrix's levels and scales repacked in tiles of 16 output rows, so that one
integer dot instruction multiplies four inputs of a row of activations with four weights of each of 16 output rows.

Every GGUF block format reads as w = a·(u - c) + m (kernels/tiles.cpp says a, c and m per format); a tile's group
of 32 inputs holds the 16 rows' low four bits of u (`tile_nibbles`), the higher bits of the 5- and 6-bit formats as
bit planes (`tile_planes`) and the K-quants' sub-block scales (`tile_sub_scales`); its float16 scales sit beside it
(`tile_scales`). Nothing is requantized: the file's levels and scales are rearranged, the K-quants' packed 6-bit
scales widened to a byte each (Q4_K: 4.625 bits per weight instead of 4.5). The tiles are written into 2 MiB pages
where the host gives them (kernels/pages.py): every decode step streams them.
"""

from __future__ import annotations

import torch

from rooftop.kernels import pages
from rooftop.quant.gguf_blocks import block_levels
from rooftop.quant.weights import GROUP, BlockWeight

TILE = 16  # output rows per tile
TILE_FORMATS = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")  # tiles.cpp's Format ids
# The K-quants whose prefill chunks run with one activation scale per 256 (tiles.cpp's super_blocks). Not Q5_K: its
# bit planes' unpacking outweighs what the form saves, and it gained nothing to pay for the coarser rounding
# (docs/PERFORMANCE.md).
SUPER_BLOCK_FORMATS = ("q4_k", "q6_k")
PLANES = {"q5_0": 1, "q5_1": 1, "q5_k": 1, "q6_k": 2}  # bits of a level above its low four
ROWS_AT_ONCE = 4096  # rows repacked together: bounds the intermediate tensors of a large embedding


def _padded_rows(t: torch.Tensor) -> torch.Tensor:
    """(N, ...) with zero rows appended up to a multiple of TILE (their outputs are never stored)."""
    pad = -t.shape[0] % TILE
    return t if pad == 0 else torch.cat([t, t.new_zeros(pad, *t.shape[1:])])


def tile_nibbles(u: torch.Tensor) -> torch.Tensor:
    """(N, K) levels -> their low four bits as (ceil(N / 16), K / 32, 256) bytes: per tile and group, 4 chunks of
    64 bytes, byte 4o + i of chunk j holding row o's input 8j + i in its low nibble and 8j + 4 + i in its high one."""
    n, k = u.shape
    v = _padded_rows(u.to(torch.uint8) & 15).view(-1, TILE, k // GROUP, 4, 2, 4)  # tile, o, group, j, half, i
    v = v.permute(0, 2, 3, 1, 5, 4)  # tile, group, j, o, i, half
    return pages.copy((v[..., 0] | (v[..., 1] << 4)).reshape(-1, k // GROUP, 256))


def tile_planes(high: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, K) high bits of the levels (u >> 4, below 2**bits) -> (ceil(N / 16), K / 32, 64 * bits) bytes: per tile
    and group, `bits` planes of 64 bytes; byte 4o + i of plane p holds, `bits` bits each, vectors 8p / bits ..
    (the unpacked nibbles' vector v is inputs 4v..4v+3)."""
    n, k = high.shape
    per_plane = 8 // bits
    h = _padded_rows(high.to(torch.uint8)).view(-1, TILE, k // GROUP, bits, per_plane, 4)  # tile, o, g, p, v', i
    h = h.permute(0, 2, 3, 1, 5, 4)  # tile, group, plane, o, i, v'
    packed = h[..., 0].clone()
    for v in range(1, per_plane):  # in bytes: a wider sum's intermediates took several times the matrix
        packed |= h[..., v] << (bits * v)
    return packed.reshape(-1, k // GROUP, 64 * bits).contiguous()


def tile_bytes(q: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 -> Q8_0's (ceil(N / 16), K / 32, 512) bytes: per tile and group, 8 chunks of 64 bytes, byte 4o + i
    of chunk m holding row o's input 4m + i."""
    n, k = q.shape
    v = _padded_rows(q.contiguous().view(torch.uint8)).view(-1, TILE, k // GROUP, 8, 4)  # tile, o, group, m, i
    return pages.copy(v.permute(0, 2, 3, 1, 4).reshape(-1, k // GROUP, 512))


def tile_scales(*scales: torch.Tensor) -> torch.Tensor:
    """Per-block (N, blocks) scales (and minima) -> (ceil(N / 16), blocks, parts, 16) float16."""
    v = _padded_rows(torch.stack(scales, dim=1).half())  # (N', parts, blocks)
    return pages.copy(v.view(-1, TILE, len(scales), v.shape[-1]).permute(0, 3, 2, 1))


def tile_sub_scales(*per_group: torch.Tensor) -> torch.Tensor:
    """Per-group (N, K / 32) byte scales -> (ceil(N / 16), K / 32, 16 * parts) bytes: each part's 16 rows in turn."""
    v = _padded_rows(torch.stack([s.contiguous().view(torch.uint8) for s in per_group], dim=1))  # (N', parts, G)
    return (
        v.view(-1, TILE, len(per_group), v.shape[-1]).permute(0, 3, 2, 1).reshape(-1, v.shape[-1], 16 * len(per_group))
    )


def tile_blocks(w: BlockWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """A matrix in a GGUF block format as tiles.cpp's (q, dm), its rows decoded and repacked ROWS_AT_ONCE at a time."""
    qs, dms = [], []
    for start in range(0, w.shape[0], ROWS_AT_ONCE):
        levels = block_levels(BlockWeight(w.q[start : start + ROWS_AT_ONCE], w.format, w.k))
        parts = [tile_nibbles(levels.u)]
        if w.format in PLANES:
            parts.append(tile_planes(levels.u >> 4, PLANES[w.format]))
        if levels.sub:
            parts.append(tile_sub_scales(*levels.sub))
        qs.append(torch.cat(parts, dim=-1))
        dms.append(tile_scales(*levels.halves))
    return pages.cat(qs), pages.cat(dms)
