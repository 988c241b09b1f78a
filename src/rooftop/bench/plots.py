"""The bench's pictures: measured steps on this machine's roofline, where each step's time went, TTFT against
prompt length, TPOT and throughput against batch size, each measured beside expected and the bound."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from rooftop.bench.sweep import SweepResult  # noqa: E402
from rooftop.roofline.hardware import Hardware  # noqa: E402

COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def roofline_plot(result: SweepResult, hw: Hardware, compute: str, path: Path) -> Path:
    peak, bw = hw.peak(compute), hw.memory_bandwidth
    xs_all = [p.intensity for p in result.points] + [peak / bw]
    lo, hi = min(xs_all) / 4, max(xs_all) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot(
        xs,
        [min(peak, x * bw) for x in xs],
        color="black",
        linewidth=2,
        label=f"this machine's {compute} roof (measured)",
    )
    for phase, color in COLORS.items():
        pts = [p for p in result.points if p.phase == phase]
        ax.scatter(
            [p.intensity for p in pts],
            [p.achieved_flops_per_s for p in pts],
            color=color,
            label=f"{phase} measured",
            zorder=3,
        )
        ax.scatter(
            [p.intensity for p in pts],
            [p.predicted_flops_per_s for p in pts],
            facecolors="none",
            edgecolors=color,
            label=f"{phase} predicted (roofline: each op at its roof)",
            zorder=3,
        )
        for p in pts:
            ax.annotate(
                p.label,
                (p.intensity, p.achieved_flops_per_s),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
                color=color,
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP / byte)",
        ylabel="FLOP/s",
        title=f"Measured steps on {hw.name}",
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, path)


def ttft_plot(result: SweepResult, path: Path) -> Path:
    S = [r["prompt_tokens"] for r in result.ttft]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(S, [r["measured_ttft_s"] * 1e3 for r in result.ttft], "o-", color=COLORS["prefill"], label="TTFT measured")
    expected = [r["expected_prefill_step_s"] * 1e3 for r in result.ttft]
    ax.plot(S, expected, "^:", color="black", label="prefill step expected")
    ax.plot(S, [r["bound_prefill_step_s"] * 1e3 for r in result.ttft], "s--", color="gray", label="prefill step bound")
    ax.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="ms", title="TTFT against prompt length")
    swept_ticks(ax, S)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend()
    return save_figure(fig, path)


def batch_plot(result: SweepResult, path: Path) -> Path:
    B = [r["batch"] for r in result.decode]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(B, [r["measured_tpot_s"] * 1e3 for r in result.decode], "o-", color=COLORS["decode"], label="measured")
    left.plot(B, [r["expected_tpot_s"] * 1e3 for r in result.decode], "^:", color="black", label="expected")
    left.plot(B, [r["bound_tpot_s"] * 1e3 for r in result.decode], "s--", color="gray", label="bound")
    left.set(xscale="log", xlabel="batch size", ylabel="TPOT (ms)", title="TPOT against batch size")
    right.plot(
        B, [r["measured_tokens_per_s_total"] for r in result.decode], "o-", color=COLORS["decode"], label="measured"
    )
    right.plot(B, [r["expected_tokens_per_s_total"] for r in result.decode], "^:", color="black", label="expected")
    right.plot(
        B, [r["batch"] / r["bound_tpot_s"] for r in result.decode], "s--", color="gray", label="bound (the most)"
    )
    right.set(
        xscale="log",
        yscale="log",
        xlabel="batch size",
        ylabel="decode tok/s (all sequences: batch / TPOT)",
        title="Decode throughput",
    )
    for ax in (left, right):
        swept_ticks(ax, B)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend()
    return save_figure(fig, path)


def swept_ticks(ax, values: list[int]) -> None:
    """The x axis ticked at the swept values, written as plain integers (a log axis otherwise ticks powers of ten,
    with none at 16 or 64)."""
    ax.set_xticks(values, [str(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def gap_plot(result: SweepResult, path: Path) -> Path:
    """Each measured step (a prefill of pp tokens, a decode step at batch b) as a stacked bar of its gap's parts:
    the bound at the bottom, then what the kernels, the host and the unexplained rest added, as a share of the
    measured time (the parts sum to it). A part below zero (a class faster than its roofline share, or a step
    faster than the calibration expected: unexplained < 0) is left out of the bar, which then passes 100%."""
    labels = [label for label, _ in result.gaps]
    parts = list(result.gaps[0][1]) if result.gaps else []
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels) + 3), 4.8))
    bottoms = [0.0] * len(labels)
    for i, part in enumerate(parts):
        shares = [max(0.0, gap[part]) / sum(gap.values()) * 100 for _, gap in result.gaps]
        ax.bar(labels, shares, bottom=bottoms, label=part, color=plt.cm.tab10(i))
        bottoms = [b + v for b, v in zip(bottoms, shares, strict=True)]
    ax.axhline(100, color="black", linewidth=0.8, linestyle="--", label="measured (above it: expected, not taken)")
    ax.set(ylabel="% of the measured step", title="Where each step's time went")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # a legend beside the axes stays in the picture
    plt.close(fig)
    return path
