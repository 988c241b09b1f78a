"""The roofline chart: arithmetic intensity against FLOP/s, the device's roofs, and each op as a point."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from rooftop.errors import InvalidRequestError  # noqa: E402
from rooftop.roofline.predict import Prediction  # noqa: E402


def plot_roofline(pred: Prediction, path: str | Path) -> Path:
    """Write a log-log roofline PNG with every op of the prefill and the decode step as a labeled point; a path
    that cannot be written is an InvalidRequestError naming it and why."""
    path = Path(path)
    if path.is_dir():  # matplotlib would write PATH.png beside it
        raise InvalidRequestError(f"cannot write the roofline chart to {path}: Is a directory")
    if not path.suffix:
        path = path.with_suffix(".png")  # what matplotlib writes for a name without one
    hw, compute = pred.hw, pred.prefill.ops[0].compute
    peak, bandwidth = hw.peak(compute), hw.memory_bandwidth
    points = [
        (phase, op)
        for phase, step in (("prefill", pred.prefill), ("decode", pred.decode_first))
        for op in step.ops
        if op.flops > 0 and op.bytes > 0
    ]
    intensities = [op.intensity for _, op in points] + [peak / bandwidth]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    fig, ax = plt.subplots(figsize=(10, 6.5))
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bandwidth) for x in xs], color="black", linewidth=2, label=f"{compute} roof")
    ax.axvline(peak / bandwidth, color="gray", linestyle=":", linewidth=1)
    ax.annotate(
        f"ridge {peak / bandwidth:.3g} FLOP/B",
        (peak / bandwidth, peak),
        textcoords="offset points",
        xytext=(4, -14),
        fontsize=8,
    )
    colors = {"prefill": "tab:orange", "decode": "tab:blue"}
    for phase, step, dy in (("prefill", pred.prefill, 10), ("decode", pred.decode_first, -14)):
        chosen = [op for ph, op in points if ph == phase]
        color = colors[phase]
        ax.scatter(
            [op.intensity for op in chosen],
            [op.flops / op.time(hw) for op in chosen],
            color=color,
            label=f"{phase} ops",
            zorder=3,
        )
        for names, x, y in _clusters(chosen, hw):
            ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(5, dy), fontsize=7, color=color)
        attained = step.flops / step.time_s
        ax.scatter(
            [step.intensity],
            [attained],
            marker="*",
            s=220,
            color=color,
            edgecolor="black",
            zorder=4,
            label=f"{phase} step",
        )
    ax.set_xlim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable FLOP/s")
    split = f" x{pred.tp} (tensor parallel; each device's ops)" if pred.tp > 1 else ""
    ax.set_title(
        f"{pred.model} on {hw.name}{split}: prefill of {pred.prompt_len} tokens, decode at batch {pred.batch} "
        f"({pred.weights_format})"
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="lower right")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as e:  # a missing or unwritable directory, a suffix matplotlib cannot write
        reason = getattr(e, "strerror", None) or e
        raise InvalidRequestError(f"cannot write the roofline chart to {path}: {reason}") from None
    finally:
        plt.close(fig)
    return path


def _clusters(ops: list, hw) -> list[tuple[list[str], float, float]]:
    """Ops within a factor 1.6 of intensity of each other share one label, so names do not overprint."""
    groups: list[tuple[list[str], float, float]] = []
    for op in sorted(ops, key=lambda o: o.intensity):
        if groups and op.intensity / groups[-1][1] < 1.6:
            groups[-1][0].append(op.name)
        else:
            groups.append(([op.name], op.intensity, op.flops / op.time(hw)))
    return groups
