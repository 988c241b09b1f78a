"""The tiled weights in 2 MiB pages (kernels/pages.py): same values, aligned, madvised; left alone where the kernel
gives none."""

from __future__ import annotations

import pytest
import torch

from rooftop.kernels import cpu, pages
from rooftop.quant.linear import Q8Linear

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


@needs_huge_pages
def test_a_tensor_moves_into_madvised_2mib_pages_with_its_values():
    t = torch.randn(3, pages.HUGE_PAGE // 4 + 5, generator=torch.Generator().manual_seed(0))
    moved = pages.in_huge_pages(t)
    assert moved.data_ptr() != t.data_ptr() and moved.data_ptr() % pages.HUGE_PAGE == 0
    assert moved.dtype == t.dtype and moved.shape == t.shape and torch.equal(moved, t)
    assert {"hg", "private"} <= set(vm_flags(moved.data_ptr()))  # MADV_HUGEPAGE: 2 MiB pages where the kernel can
    assert "hg" not in vm_flags(t.data_ptr())


def test_what_gains_nothing_stays_as_it_is(monkeypatch):
    small = torch.ones(pages.HUGE_PAGE // 4 - 1)
    strided = torch.ones(1024, 1024)[:, ::2]
    lazy = torch.empty(1 << 30, device="meta")
    for t in (small, strided, lazy):
        assert pages.in_huge_pages(t) is t
    monkeypatch.setattr(pages, "available", lambda: False)  # not Linux, or transparent_hugepage set to never
    big = torch.ones(pages.HUGE_PAGE)
    assert pages.in_huge_pages(big) is big
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
def test_a_tiled_linear_keeps_its_weights_in_huge_pages_and_its_outputs():
    gen = torch.Generator().manual_seed(1)
    linear = Q8Linear.from_weight(torch.randn(2048, 1024, generator=gen) * 0.02, None)  # 2 MiB of levels
    assert linear.q.data_ptr() % pages.HUGE_PAGE == 0 and "hg" in vm_flags(linear.q.data_ptr())
    x = torch.randn(3, 1024, generator=gen)
    in_4k = cpu.ops().tiled_linear(x, linear.q.clone(), linear.dm.clone(), linear.kernel_format, 2048, None, None)
    assert torch.equal(linear(x), in_4k)
