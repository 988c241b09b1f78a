"""The layout of kernels/tiles.h: a matrix's levels and scales repacked in tiles of 16 output rows, so that one
integer dot instruction multiplies four inputs of a row of activations with four weights of each of 16 output rows.

Every GGUF block format reads as w = a·(u - c) + m (kernels/tiles.h says a, c and m per format); a tile's group
of 32 inputs holds the 16 rows' levels u (4-bit two to a byte, 5- and 6-bit one to a byte with the spare bits
holding the rest) and the K-quants' sub-block scales; its float16 scales sit beside it. Nothing is requantized:
the file's levels and scales are rearranged, the K-quants' packed 6-bit scales widened to a byte each (Q4_K: 4.625
bits per weight instead of 4.5). A file's block formats are repacked by the kernels (`tile_blocks`, kernels/repack.cpp); the
groups rooftop quantizes itself (Q4_1's levels, Q8_0's bytes) here, in PyTorch's ops. The tiles are written into
2 MiB pages where the host gives them (kernels/pages.py): every decode step streams them.
"""

from __future__ import annotations

import math

import torch

from rooftop.kernels import cpu, pages
from rooftop.quant.weights import GROUP, BlockWeight

TILE = 16  # output rows per tile
TILE_FORMATS = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")  # tiles.cpp's Format ids
# The K-quants whose prefill chunks run with one activation scale per 256 (tiles.cpp's super_blocks): every one, since
# Q5_K's levels unpack one to a byte (before, its bit planes' unpacking left the form no faster; docs/PERFORMANCE.md).
SUPER_BLOCK_FORMATS = ("q4_k", "q5_k", "q6_k")


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


def tile_blocks(w: BlockWeight, ops=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A matrix in a GGUF block format as tiles.h's (q, dm), in the shapes the kernels give for it, written by them
    straight into their pages from the rows where they are, in the matrix's order. `ops`: a build other than the
    engine's (benchmarks/kernel_ab.py's, whose layout may differ)."""
    ops, fmt = ops or cpu.ops(), TILE_FORMATS.index(w.format)
    q_shape, dm_shape = ops.tiled_shapes(fmt, *w.shape)
    q = pages.empty(math.prod(q_shape)).view(q_shape)
    dm = pages.empty(2 * math.prod(dm_shape)).view(torch.float16).view(dm_shape)
    ops.tile_blocks(list(w.parts), w.order, fmt, w.k, q, dm)
    return q, dm
