"""Decoding GGUF tensor data into torch tensors: Q8_0 and Q4_1 into their integers and scales (vectorized here),
the block formats rooftop's kernels run as stored into their rows of blocks, and every type gguf's reader can
decode (the other K-quants, the IQ and ternary types, ...) into float32 through gguf's own dequantizer.

Q8_0 and Q4_1 store blocks of 32 weights along each row: a float16 scale `d` (Q4_1 also a float16 minimum `m`)
followed by the packed integers. Q4 packs two weights per byte: the low nibbles are weights 0..15 of the block
and the high nibbles weights 16..31.
"""

from __future__ import annotations

import functools
import math
import warnings

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType

from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.quant.weights import BLOCK_FORMATS, BlockWeight, Int4Weight

BLOCK = 32
_BLOCK_BYTES = {QType.Q8_0: 2 + 32, QType.Q4_0: 2 + 16, QType.Q4_1: 2 + 2 + 16}
STORED_TYPES = {QType[name.upper()]: name for name in BLOCK_FORMATS}  # run by the kernels as the file holds them


@functools.cache
def supported_types() -> tuple[QType, ...]:
    """Every type gguf's dequantizer decodes (it raises NotImplementedError for the rest), found by decoding one
    block of zeros of each, so a newer gguf brings its new types along."""
    decodable = []
    for qtype in QType:
        block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
        try:
            gguf.quants.dequantize(np.zeros(block_bytes, dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        decodable.append(qtype)
    return tuple(decodable)


def _blocks(raw: np.ndarray, qtype: QType, numel: int) -> np.ndarray:
    """The raw bytes as one row per block: (numel / 32, block bytes)."""
    nbytes = _BLOCK_BYTES[qtype]
    if numel % BLOCK:
        raise ModelLoadError(f"{qtype.name} tensor of {numel} elements is not a whole number of 32-blocks")
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.size != numel // BLOCK * nbytes:
        raise ModelLoadError(f"{qtype.name} tensor holds {flat.size} bytes, expected {numel // BLOCK * nbytes}")
    return flat.reshape(-1, nbytes)


def _scale(blocks: np.ndarray, offset: int) -> torch.Tensor:
    """The float16 at byte `offset` of each block, as a float32 column (nblocks, 1)."""
    half = np.ascontiguousarray(blocks[:, offset : offset + 2]).view(np.float16)
    return torch.from_numpy(half.astype(np.float32))


def _nibbles(packed: np.ndarray) -> torch.Tensor:
    """(nblocks, 16) bytes -> (nblocks, 32) values 0..15: low nibbles first, then high nibbles."""
    q = torch.from_numpy(np.ascontiguousarray(packed))
    return torch.cat([q & 0x0F, q >> 4], dim=1)


def q4_1_parts(raw: np.ndarray, numel: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1 as (d, m, q) with x = d * q + m: per-32 scale and minimum (nblocks, 1) and q (nblocks, 32) uint8."""
    blocks = _blocks(raw, QType.Q4_1, numel)
    return _scale(blocks, 0), _scale(blocks, 2), _nibbles(blocks[:, 4:])


def q4_0_parts(raw: np.ndarray, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0 as (d, q) with x = d * (q - 8): scale (nblocks, 1) and q (nblocks, 32) uint8."""
    blocks = _blocks(raw, QType.Q4_0, numel)
    return _scale(blocks, 0), _nibbles(blocks[:, 2:])


def q4_0_as_int4(w: BlockWeight) -> Int4Weight:
    """A stored Q4_0 matrix as the Int4Weight of the same values (x = d·(q - 8): scale d, zero 0), for the paths
    that run int4 as Q4_1-style groups (explicit `--weights int4`, PyTorch's kernels)."""
    rows, cols = w.shape
    d, q = q4_0_parts(w.q.numpy(), rows * cols)
    return Int4Weight(q.reshape(rows, cols), d.reshape(rows, cols // BLOCK), torch.zeros(rows, cols // BLOCK))


def q8_0_parts(raw: np.ndarray, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 as (d, q) with x = d * q: scale (nblocks, 1) and q (nblocks, 32) int8."""
    blocks = _blocks(raw, QType.Q8_0, numel)
    q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8)
    return _scale(blocks, 0), torch.from_numpy(q)


def stored_blocks(raw: np.ndarray, qtype: QType, shape: tuple[int, int], name: str = "tensor") -> BlockWeight:
    """A matrix of one of STORED_TYPES as its rows of blocks, unchanged, where they are: a view of the file's
    read-only mapping (nothing writes a BlockWeight's rows; the tiles are made from them), or a copy where the rows
    are not one after another (a column shard's)."""
    rows, cols = shape
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block_weights:
        raise ModelLoadError(f"{name}: {qtype.name} rows of {cols} weights are not whole {block_weights}-weight blocks")
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    row_bytes = cols // block_weights * block_bytes
    if flat.size != rows * row_bytes:
        raise ModelLoadError(f"{name}: {qtype.name} tensor holds {flat.size} bytes, expected {rows * row_bytes}")
    with warnings.catch_warnings():  # torch's warning that the view is of read-only memory
        warnings.simplefilter("ignore", UserWarning)
        return BlockWeight((torch.from_numpy(flat.reshape(rows, row_bytes)),), STORED_TYPES[qtype], cols)


def bf16_values(raw: np.ndarray, shape: tuple[int, ...], name: str = "tensor") -> torch.Tensor:
    """A BF16 tensor's values as they are (bfloat16, the given torch-order shape), copied out of the file once."""
    bits = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1).view(np.int16).copy())
    return _shaped(bits.view(torch.bfloat16), shape, name)


def _shaped(values: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    if values.numel() != math.prod(shape):
        raise ModelLoadError(
            f"{name}: holds {values.numel()} values, its shape {tuple(shape)} needs {math.prod(shape)}"
        )
    return values.reshape(shape)


def dequantize(raw: np.ndarray, qtype: QType, shape: tuple[int, ...], name: str = "tensor") -> torch.Tensor:
    """Decode one GGUF tensor to float32 (float16/bfloat16 are widened) with the given torch-order shape."""
    numel = int(np.prod(shape))
    if qtype == QType.F32:
        out = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1).view(np.float32).copy())
    elif qtype == QType.F16:
        out = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1).view(np.float16).astype(np.float32))
    elif qtype == QType.BF16:
        out = bf16_values(raw, shape, name).float()
    elif qtype == QType.Q8_0:
        d, q = q8_0_parts(raw, numel)
        out = d * q.float()
    elif qtype == QType.Q4_0:
        d, q = q4_0_parts(raw, numel)
        out = d * (q.float() - 8.0)
    elif qtype == QType.Q4_1:
        d, m, q = q4_1_parts(raw, numel)
        out = d * q.float() + m
    elif qtype in supported_types():
        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        if numel % block_weights or flat.size != numel // block_weights * block_bytes:
            raise ModelLoadError(
                f"{name}: {qtype.name} tensor holds {flat.size} bytes, its shape {tuple(shape)} needs "
                f"{numel // block_weights * block_bytes} in whole {block_weights}-weight blocks"
            )
        out = torch.from_numpy(gguf.quants.dequantize(flat, qtype).astype(np.float32, copy=False).reshape(-1))
    else:
        supported = ", ".join(t.name for t in supported_types())
        raise UnsupportedModelError(f"{name}: GGUF tensor type {qtype.name} is not supported (supported: {supported})")
    return _shaped(out, shape, name)
