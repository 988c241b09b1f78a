"""The load run's pictures: TTFT, TPOT and throughput against concurrency for a sweep; latency CDFs and
output tokens per second over time for one run."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rooftop.bench.plots import save_figure  # noqa: E402
from rooftop.bench.serve.metrics import RequestRecord, output_tokens_per_second  # noqa: E402


def concurrency_plot(levels: list[int], summaries: list[dict], path: Path) -> Path:
    fig, (ttft, tpot, tput) = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in ((ttft, "ttft", "TTFT (ms)"), (tpot, "tpot", "TPOT (ms)")):
        for stat, style in (("median", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(levels, [s[f"{key}_ms_{stat}"] for s in summaries], style, label=stat)
        ax.set(ylabel=label, title=f"{label.split()[0]} against concurrency")
    tput.plot(levels, [s["output_throughput_tok_per_s"] for s in summaries], "o-", label="output tok/s")
    tput.plot(levels, [s["total_token_throughput_tok_per_s"] for s in summaries], "s--", label="input + output tok/s")
    tput.set(ylabel="tokens / s", title="Throughput against concurrency")
    for ax in (ttft, tpot, tput):
        ax.set(xscale="log", xlabel="max concurrency")
        ax.minorticks_off()
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.grid(True, alpha=0.25)
        ax.legend()
    return save_figure(fig, path)


def latency_plot(records: list[RequestRecord], path: Path) -> Path:
    done = [r for r in records if r.ok]
    fig, (cdf, timeline) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {
        "TTFT": [r.ttft_s for r in done],
        "TPOT": [r.tpot_s for r in done if r.tpot_s is not None],
        "ITL": [gap for r in done for gap in r.itl_s],
        "E2E latency": [r.e2el_s for r in done],
    }
    for label, values in series.items():
        if values:
            xs = np.sort(np.asarray(values) * 1e3)
            cdf.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
    cdf.set(xscale="log", xlabel="ms", ylabel="fraction of requests (ITL: of gaps)", title="Latency CDFs")
    counts = output_tokens_per_second(records)
    seconds = range(max(counts, default=0) + 1)
    timeline.bar(seconds, [counts.get(s, 0.0) for s in seconds], width=0.9, align="edge")
    timeline.set(xlabel="seconds from the first send", ylabel="output tokens", title="Output tokens per second")
    for ax in (cdf, timeline):
        ax.grid(True, which="both", alpha=0.25)
    cdf.legend()
    return save_figure(fig, path)
