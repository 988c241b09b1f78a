"""The tiled weights in 2 MiB pages (kernels/pages.py): same values, aligned, madvised; ordinary copies where the
kernel gives none; the linears' outputs those of their copies in 4 KiB pages; the load's freed heap handed back; a
KV pool's memory taken as its tokens are written; the steps' large activations in pages freed before them."""

from __future__ import annotations

import ctypes
import os
import platform
import resource

import pytest
import torch
from gguf import GGMLQuantizationType as QType

from rooftop.config import ModelConfig
from rooftop.kernels import cpu, pages
from rooftop.models.kv_cache import KVPool
from rooftop.quant.gguf_blocks import stored_blocks
from rooftop.quant.gguf_quantize import quantize
from rooftop.quant.linear import BlockLinear, Q8Linear

needs_huge_pages = pytest.mark.skipif(not pages.available(), reason="no transparent huge pages to ask for here")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps), and "private" where its
    permissions say so (a shared anonymous mapping is shmem, whose huge pages another setting governs)."""
    inside, private = False, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(part, 16) for part in head.split("-"))
                inside, private = low <= address < high, line.split()[1].endswith("p")
            elif inside and head == "VmFlags:":
                return line.split()[1:] + (["private"] if private else [])
    raise AssertionError(f"no mapping holds {address:#x}")


def in_huge_pages(t: torch.Tensor) -> bool:
    """On a 2 MiB boundary, in a private mapping madvised for huge pages (which the kernel gives where it can)."""
    return t.data_ptr() % pages.HUGE_PAGE == 0 and {"hg", "private"} <= set(vm_flags(t.data_ptr()))


@needs_huge_pages
def test_copies_and_concatenations_of_a_huge_page_or_more_are_put_in_huge_pages_with_their_values():
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(pages.HUGE_PAGE // 4 + 5, 3, generator=gen)
    view = t.t()  # any strides: a permuted view is what the tiles copy
    copied = pages.copy(view)
    assert copied.is_contiguous() and copied.shape == view.shape and torch.equal(copied, view)
    assert in_huge_pages(copied) and not in_huge_pages(t)
    parts = [t[:5], torch.randn(pages.HUGE_PAGE // 12, 3, generator=gen)]
    joined = pages.cat(parts)
    assert in_huge_pages(joined) and torch.equal(joined, torch.cat(parts))


def test_below_a_huge_page_off_the_cpu_or_without_huge_pages_a_copy_is_an_ordinary_one(monkeypatch):
    small = torch.ones(pages.HUGE_PAGE // 4 - 1)
    lazy = torch.empty(1 << 30, device="meta")
    for t in (small, lazy):
        copied = pages.copy(t)
        assert copied.data_ptr() != t.data_ptr() or t.is_meta
        assert copied.device == t.device and copied.shape == t.shape
    assert not in_huge_pages(pages.copy(small))
    monkeypatch.setattr(pages, "available", lambda: False)  # not Linux, or transparent_hugepage set to never
    big = torch.arange(pages.HUGE_PAGE, dtype=torch.float32)
    assert torch.equal(pages.copy(big), big) and torch.equal(pages.cat([big, big]), torch.cat([big, big]))
    assert not in_huge_pages(pages.copy(big)) and not in_huge_pages(pages.cat([big, big]))
    assert pages.label() == "4 KiB pages"
    assert pages.empty(100).shape == (100,)


def test_the_kernels_transparent_huge_page_mode_is_the_bracketed_word(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(pages, "THP_SETTING", setting)
    assert pages.thp_setting() == "madvise"
    setting.write_text("always madvise [never]\n")
    assert pages.thp_setting() == "never"
    monkeypatch.setattr(pages, "THP_SETTING", tmp_path / "absent")
    assert pages.thp_setting() is None


@needs_huge_pages
@pytest.mark.skipif(cpu.ops() is None, reason="rooftop's CPU kernels are not built here")
@pytest.mark.parametrize("fmt", ["q8_0", "q4_k"])
def test_a_tiled_linear_is_built_in_huge_pages_with_the_outputs_of_its_copy_in_4kib_pages(fmt):
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(4096, 1024, generator=gen) * 0.02  # 2 MiB of Q4_K levels, 4 of Q8_0
    if fmt == "q8_0":
        linear = Q8Linear.from_weight(values, None)
    else:
        linear = BlockLinear.from_weight(
            stored_blocks(quantize(values.numpy(), QType.Q4_K), QType.Q4_K, (4096, 1024)), None
        )
    assert in_huge_pages(linear.q)
    x = torch.randn(3, 1024, generator=gen)
    q_4k = linear.q.clone()
    assert not in_huge_pages(q_4k)
    in_4k = cpu.ops().tiled_linear(x, q_4k, linear.dm.clone(), linear.kernel_format, 4096, None, None)
    assert torch.equal(linear(x), in_4k)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="not glibc")
def test_the_heap_pages_a_load_freed_go_back_to_the_kernel():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_size_t],
        [ctypes.c_void_p],
    )
    chunks = [libc.malloc(100_000) for _ in range(400)]  # below glibc's mmap threshold: on the heap
    for chunk in chunks:
        ctypes.memset(chunk, 1, 100_000)
    for chunk in chunks[:-1]:  # the last one pins the heap's top: free alone returns nothing
        libc.free(chunk)
    before = resident_bytes()
    pages.release_freed()
    assert before - resident_bytes() > 20_000_000
    libc.free(chunks[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_a_kv_pool_takes_memory_as_its_tokens_are_written_not_at_the_start(dtype):
    config = ModelConfig(
        "llama", 8, 1024, 8, num_layers=8, num_heads=8, num_kv_heads=8, head_dim=128, max_position_embeddings=4096
    )
    before = resident_bytes()
    pool = KVPool(config, 2048, 16, dtype, torch.device("cpu"))  # 32768 tokens: 512 MiB of float32 K and V
    assert pool.nbytes >= 256 << 20
    assert resident_bytes() - before < 16 << 20  # torch.zeros wrote all of it
    one_block = torch.ones(16, 8, 128).to(dtype)
    pool.k[3, 160:176] = one_block  # a block of one layer's keys: its pages, not the pool's
    assert resident_bytes() - before < 16 << 20
    assert torch.equal(pool.k[3, 160:176], one_block)
    assert pool.k[3, :160].count_nonzero() == 0 and pool.v[3, 160:176].count_nonzero() == 0
    if pool.k_scale is not None:
        assert pool.k_scale.count_nonzero() == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_once_an_engine_runs_on_the_cpu_a_large_block_lands_in_pages_freed_before(tiny_llm):
    """glibc maps a block over 32 MiB afresh and unmaps it when freed: each of a long prefill's large activations
    was new pages faulted in one by one (16,384 for 64 MiB). With an engine on the CPU (`tiny_llm`'s) the heap keeps
    them."""
    assert tiny_llm.device.type == "cpu"
    assert pages.keep_freed_memory.cache_info().currsize == 1  # asked for by the engine (with huge pages a fresh
    # mapping of 64 MiB faults in 32 pages, so the count below alone would not show it)

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    block = 64 << 20
    for _ in range(3):  # taken and freed: the heap now holds its pages (wherever in it a load's trim left holes)
        torch.ones(block, dtype=torch.uint8)
    before = faults()
    again = torch.ones(block, dtype=torch.uint8)
    assert faults() - before < 1000
    assert again[0] == again[-1] == 1
