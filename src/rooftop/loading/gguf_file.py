"""A fast GGUF header reader: metadata and tensor locations, with the tensor bytes memory-mapped.

gguf's own GGUFReader builds a numpy view per vocabulary string and takes ~6 s on the bundled file's 98k
strings; this reads the same header with `struct` in ~0.1 s. The format: magic, version, counts, key/value
metadata, tensor infos (name, dims, type, offset), then aligned tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from rooftop.errors import ModelLoadError, UnsupportedModelError

MAGIC = b"GGUF"
_LENGTH = struct.Struct("<Q")  # a string's length
# value type id -> struct format of a scalar (8 = string, 9 = array are handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: rows first (GGUF stores the fastest-varying dimension first)
    qtype: GGMLQuantizationType
    data: np.ndarray  # the raw bytes, memory-mapped

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class GGUFFile:
    metadata: dict
    tensors: list[TensorInfo]
    mapping: mmap.mmap  # the whole file, read-only: the tensors' bytes are views of it

    def release_pages(self) -> None:
        """Unmap every page of the file from this process, as `release_pages` does for one tensor's: a model's
        tiles are made from views of the file, whose pages then stay mapped (and counted) until let go."""
        _dont_need(self.mapping, 0, len(self.mapping))


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n > len(self.buf):  # a length no file this size could hold: the bytes it was read from are not a length
            raise ModelLoadError(
                f"{self.path}: corrupt GGUF header (it gives {n} bytes of data at byte {self.pos}, in a file of "
                f"{len(self.buf)} bytes)"
            )
        if self.pos + n > len(self.buf):
            raise ModelLoadError(
                f"{self.path}: truncated GGUF header (needs byte {self.pos + n}, file has {len(self.buf)})"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("Q")).decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """`count` strings read in one loop: a vocabulary and its merges are most of a header (Llama 3's: 408k
        strings), which `string` one call at a time read at a third of the speed."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        length = _LENGTH.unpack_from
        for _ in range(count):
            if pos + 8 <= end:
                (n,) = length(buf, pos)
                if pos + 8 + n <= end:
                    out.append(buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
                    pos += 8 + n
                    continue
            self.pos = pos
            self.string()  # past the end: raises the error that says how
        self.pos = pos
        return out

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype, count = self.scalar("I"), self.scalar("Q")
            if itype in _NUMPY:  # numeric arrays in one read
                dtype = np.dtype(_NUMPY[itype]).newbyteorder("<")
                return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).tolist()
            return self.strings(count) if itype == 8 else [self.value(itype) for _ in range(count)]
        raise ModelLoadError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")


def release_pages(t: TensorInfo) -> None:
    """Unmap the whole pages of `t`'s bytes from this process (MADV_DONTNEED) once the model has read them: what it
    keeps is a copy in the form it runs, while a page mapped stays resident until the file is closed, so a load
    held the file's pages beside the converted weights and its peak resident memory was both. A page read again is
    mapped again from the page cache, so nothing that still views the file sees other bytes."""
    buf = getattr(t.data.base, "obj", None)  # np.frombuffer over the mapping: a memoryview of it
    if isinstance(buf, mmap.mmap) and not buf.closed:
        _dont_need(buf, t.data.ctypes.data - np.frombuffer(buf, dtype=np.uint8).ctypes.data, t.data.nbytes)


def _dont_need(buf: mmap.mmap, start: int, nbytes: int) -> None:
    """MADV_DONTNEED on the whole pages of bytes start:start + nbytes of `buf` (where the OS has it)."""
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (start + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first and hasattr(mmap, "MADV_DONTNEED"):
        buf.madvise(mmap.MADV_DONTNEED, first, last - first)


def read_gguf(path: Path) -> GGUFFile:
    """Parse the header of `path`; raise ModelLoadError on anything that is not a whole GGUF v2/v3 file."""
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(f"{path}: cannot read as GGUF ({e})") from None
    cur = _Cursor(buf, path)
    if len(buf) < 24 or cur.take(4) != MAGIC:
        raise ModelLoadError(f"{path}: not a valid GGUF file (no GGUF magic)")
    version = cur.scalar("I")
    if version not in (2, 3):
        raise UnsupportedModelError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
        type_id, offset = cur.scalar("I"), cur.scalar("Q")
        infos.append((name, dims, type_id, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1:
        raise ModelLoadError(f"{path}: invalid general.alignment {alignment!r}")
    start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, dims, type_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise UnsupportedModelError(f"{path}: tensor {name} has unknown GGUF type id {type_id}") from None
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        numel = 1
        for n in dims:  # Python ints: a corrupt dimension cannot overflow into a small size
            numel *= n
        nbytes = numel // block * block_bytes
        begin = start + offset
        if begin + nbytes > len(buf):
            raise ModelLoadError(
                f"{path}: truncated: tensor {name} needs bytes {begin}..{begin + nbytes}, file has {len(buf)}"
            )
        data = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=begin)
        tensors.append(TensorInfo(name, tuple(reversed(dims)), qtype, data))
    return GGUFFile(metadata, tensors, buf)
