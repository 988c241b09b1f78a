"""One rank's part of a weight under tensor parallelism: a range of its rows (output features) or of its columns
(input features), taken as the tensor is read.

From a GGUF the range is cut out of the memory-mapped bytes before anything is decoded (`shard_tensor`), so a rank
reads only its part of the file; a quantized matrix splits its columns along whole blocks (32 weights for Q4/Q5/Q8,
256 for the K-quants), never inside one. Weights already in memory (dummy weights, other mappings) are cut the same
way (`shard_weight`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gguf
import torch
from gguf import GGMLQuantizationType as QType

from rooftop.errors import InvalidRequestError, ModelLoadError
from rooftop.loading.gguf_file import TensorInfo
from rooftop.quant.weights import BlockWeight, Int4Weight, Int8GroupWeight, Weight


@dataclass(frozen=True)
class Shard:
    """Rows (dim 0) or columns (dim 1) start:stop of a tensor whose size along that dimension is `total`."""

    dim: int
    start: int
    stop: int
    total: int


class ShardError(InvalidRequestError):
    """A split that would cut a quantized block in two: `block` weights per block, `size` along the split."""

    def __init__(self, message: str, block: int, size: int):
        super().__init__(message, "tensor_parallel_size")
        self.block, self.size = block, size


def _check_total(name: str, size: int, shard: Shard) -> None:
    if size != shard.total:
        what = "rows" if shard.dim == 0 else "columns"
        raise ModelLoadError(f"tensor {name} has {size} {what}, the config implies {shard.total}")


def _blocks(name: str, kind: str, block: int, shard: Shard) -> tuple[int, int]:
    """The blocks start:stop of a column shard; a boundary inside a block is refused."""
    if shard.start % block or shard.stop % block:
        raise ShardError(
            f"{name} holds its {shard.total} input features in {kind} blocks of {block} weights; columns "
            f"{shard.start}:{shard.stop} are not whole blocks",
            block,
            shard.total,
        )
    return shard.start // block, shard.stop // block


def shard_tensor(t: TensorInfo, shard: Shard | None) -> TensorInfo:
    """A GGUF tensor's part as a tensor of its own: a view of the file's bytes, nothing read yet."""
    if shard is None:
        return t
    block, block_bytes = gguf.GGML_QUANT_SIZES[t.qtype]
    rows = t.shape[0] if len(t.shape) == 2 else 1
    row_bytes = t.data.size // rows
    _check_total(t.name, t.shape[shard.dim], shard)
    if shard.dim == 0 and len(t.shape) == 2:
        data = t.data[shard.start * row_bytes : shard.stop * row_bytes]
        return replace(t, shape=(shard.stop - shard.start, t.shape[1]), data=data)
    first, last = _blocks(t.name, t.qtype.name, block, shard)
    if len(t.shape) == 1:
        return replace(t, shape=(shard.stop - shard.start,), data=t.data[first * block_bytes : last * block_bytes])
    data = t.data.reshape(rows, row_bytes)[:, first * block_bytes : last * block_bytes]
    return replace(t, shape=(rows, shard.stop - shard.start), data=data)


def shard_weight(w: Weight, shard: Shard | None, name: str) -> Weight:
    """A weight already in memory, cut to its part: a copy, so the whole can be freed; a BlockWeight's rows stay
    where they are (the file's mapping), its part noted as a row order or viewed as its columns' blocks."""
    if shard is None:
        return w
    _check_total(name, w.shape[shard.dim], shard)
    n = shard.stop - shard.start
    if isinstance(w, torch.Tensor):
        return w.narrow(shard.dim, shard.start, n).contiguous()
    if shard.dim == 0:
        return w.rows(torch.arange(shard.start, shard.stop))
    if isinstance(w, BlockWeight):
        block, block_bytes = gguf.GGML_QUANT_SIZES[QType[w.format.upper()]]
        first, last = _blocks(name, w.format.upper(), block, shard)
        return BlockWeight((w.q[:, first * block_bytes : last * block_bytes],), w.format, n)  # rows stay strided
    first, last = _blocks(name, type(w).__name__, 32, shard)
    cols = slice(shard.start, shard.stop)
    groups = slice(first, last)
    if isinstance(w, Int4Weight):
        return Int4Weight(w.q[:, cols].contiguous(), w.scale[:, groups].contiguous(), w.zero[:, groups].contiguous())
    if isinstance(w, Int8GroupWeight):
        return Int8GroupWeight(w.q[:, cols].contiguous(), w.scale[:, groups].contiguous())
    raise InvalidRequestError(f"{name}: a {type(w).__name__} cannot be split by columns")
