"""Host memory in 2 MiB pages for what a CPU decode step streams: the tiled weights, and the probe's read of memory.

A decode step reads every weight once, front to back. In 4 KiB pages that stream crosses a page every 64 cache
lines, each crossing a TLB miss whose walk, in a virtual machine, goes through the guest's and the host's page
tables; the hardware prefetchers stop at page boundaries too. In 2 MiB pages (Linux's transparent huge pages, asked
for with madvise) the same weights read faster (docs/PERFORMANCE.md). PyTorch's allocator asks for them only under
THP_MEM_ALLOC_ENABLE=1, for every allocation, and only where that variable is set before its first one; rooftop asks
for these alone, whatever the process was started with. oneDNN's packed float32 weights are allocated inside
PyTorch, out of reach; the KV cache stays in 4 KiB pages, where a long context's decode measured faster.

Where the kernel gives no huge pages (not Linux, or `transparent_hugepage` set to never) tensors stay as they are.
The kernel may still back some of a region with 4 KiB pages when it has no free 2 MiB ones: the values are the same
either way.
"""

from __future__ import annotations

import functools
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


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
    (its pages are given on first touch), where `available`; PyTorch's own allocation elsewhere. The mapping lives
    as long as the tensor or a view of it; the unaligned slack before it is never touched, so it takes no memory."""
    if not available():
        return torch.empty(nbytes, dtype=torch.uint8)
    # private: a shared anonymous mapping is shmem, whose huge pages a separate setting (shmem_enabled) governs
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + nbytes]


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in 2 MiB pages where `available`; `t` itself off the CPU, below one huge page, or where there
    are none to ask for."""
    if not available() or t.device.type != "cpu" or t.nbytes < HUGE_PAGE or not t.is_contiguous():
        return t
    return empty(t.nbytes).view(t.dtype).view(t.shape).copy_(t)
