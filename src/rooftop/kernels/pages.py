"""Host memory for what the engine holds large: 2 MiB pages for what a CPU decode step streams (the tiled weights,
and the probe's read of memory), zeros given page by page as they are first written (the KV pool), and a malloc
that keeps the steps' activations' pages once it has them (`keep_freed_memory`).

A decode step reads every weight once, front to back. In 4 KiB pages that stream crosses a page every 64 cache
lines, each crossing a TLB miss whose walk, in a virtual machine, goes through the guest's and the host's page
tables; the hardware prefetchers stop at page boundaries too. In 2 MiB pages (Linux's transparent huge pages, asked
for with madvise) the same weights read faster (docs/PERFORMANCE.md). PyTorch's allocator asks for them only under
THP_MEM_ALLOC_ENABLE=1, for every allocation, and only where that variable is set before its first one; rooftop asks
for these alone, whatever the process was started with. oneDNN's packed float32 weights are allocated inside
PyTorch, out of reach; the KV cache stays in 4 KiB pages, where a long context's decode measured faster.

Where the kernel gives no huge pages (not Linux, or `transparent_hugepage` set to never) these are PyTorch's own
allocations. The kernel may still back some of a region with 4 KiB pages when it has no free 2 MiB ones: the values
are the same either way.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import platform
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def thp_setting() -> str | None:
    """The kernel's transparent huge page mode, the bracketed word of THP_SETTING ("always", "madvise" or "never");
    None where there is no such file."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return None
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else None


@functools.cache
def available() -> bool:
    """Whether madvise can ask this kernel for huge pages."""
    return hasattr(mmap, "MADV_HUGEPAGE") and thp_setting() in ("always", "madvise")


def label() -> str:
    """The pages weights are put in here, for reports and for the cache keys of what was measured on them."""
    return "2 MiB pages" if available() else "4 KiB pages"


def empty(nbytes: int) -> torch.Tensor:
    """`nbytes` uninitialized uint8 starting on a 2 MiB boundary, in an anonymous mapping madvised for huge pages
    (its pages are given on first touch), where `available`; PyTorch's own allocation elsewhere. Only the whole
    2 MiB pages are madvised; the last part stays in 4 KiB pages. The mapping lives as long as the tensor or a view
    of it; the slack around it is never touched, so it takes no memory."""
    if not available():
        return torch.empty(nbytes, dtype=torch.uint8)
    # private: a shared anonymous mapping is shmem, whose huge pages a separate setting (shmem_enabled) governs
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    if whole := nbytes // HUGE_PAGE * HUGE_PAGE:  # not the tail: its first touch would take a whole 2 MiB page
        region.madvise(mmap.MADV_HUGEPAGE, start, whole)
    return raw[start : start + nbytes]


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros(shape) whose memory the OS gives on first touch, on the CPU: an anonymous mapping reads as zeros
    until written, so a KV pool reserved for many tokens holds memory only for the pages its tokens have been
    written to, and a start does not write zeros over all of it first (torch.zeros does, and a process then held
    its whole pool from the start). The pages are the kernel's default size (THP_SETTING decides). Elsewhere (CUDA,
    where memory is not given lazily) torch.zeros."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)


def _fits(nbytes: int, device: torch.device) -> bool:
    return device.type == "cpu" and nbytes >= HUGE_PAGE and available()


def copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `t` (any strides: a permuted view is the tiles' case), in 2 MiB pages where `available`,
    on the CPU, from one huge page up; in PyTorch's allocation elsewhere."""
    if not _fits(t.nbytes, t.device):
        return t.clone(memory_format=torch.contiguous_format)
    return empty(t.nbytes).view(t.dtype).view(t.shape).copy_(t)


def cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat of `parts` along their first dimension, written straight into 2 MiB pages where `copy` would put
    its result: a matrix assembled at load is not copied once more."""
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    nbytes = math.prod(shape) * parts[0].dtype.itemsize
    if not _fits(nbytes, parts[0].device):
        return torch.cat(parts)
    return torch.cat(parts, out=empty(nbytes).view(parts[0].dtype).view(shape))


def release_freed() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's malloc_trim; nothing elsewhere). A model's load
    frees its intermediates into the heap, where the process keeps counting them until then: the tiles themselves
    are in their own mappings, so nothing the model holds is left there to pin them."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc's malloc serve allocations from its heaps instead of a mapping per large block, and keep up to 2
    GiB freed at the main heap's top, where the process runs on glibc; whether it does. PyTorch's CPU allocator is
    malloc, and glibc maps each block over 32 MiB afresh and unmaps it when freed, so every large activation of a
    prefill (a 2,048-token chunk of a 1B's gate and up projections is 134 MB) was new pages that the kernel faulted
    in one by one and zeroed, at every layer of every step (what that cost: docs/PERFORMANCE.md). Kept in the heap,
    a step's activations land in the pages the step before freed. A thread other than the main one allocates from
    an arena of 64 MiB heaps, which glibc gives back as blocks of tens of MiB are freed: there they still fault in
    again (docs/PERFORMANCE.md). llama.cpp allocates its
    compute buffers once; vLLM's CPU backend asks for tcmalloc. The cost: the process keeps the memory of its
    largest step's activations after it."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and bool(libc.mallopt(M_MMAP_MAX, 0))
