"""The tables a load run prints (vLLM's rows and names): counts and throughputs, latency percentiles, the
client's own costs, the errors; and one row per level for a concurrency sweep."""

from __future__ import annotations

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table

NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def config_line(config: dict) -> str:
    c = config
    concurrency = c["max_concurrency"] or "unlimited"
    return (
        f"{c['model']} at {c['url']} ({c['endpoint']}), {c['num_prompts']} {c['dataset']} prompts, "
        f"request rate {c['request_rate']}, burstiness {c['burstiness']:g}, max concurrency {concurrency}"
    )


def summary_tables(s: dict) -> Group:
    totals = Table(show_header=False, box=None, padding=(0, 2), title="Serving benchmark result", title_justify="left")
    rows = [
        ("Successful requests", f"{s['completed']}"),
        ("Failed requests", f"{s['failed']}"),
        ("Benchmark duration (s)", _num(s["duration_s"])),
        ("Total input tokens", f"{s['total_input_tokens']}"),
        ("Total generated tokens", f"{s['total_output_tokens']}"),
        ("Request throughput (req/s)", _num(s["request_throughput_req_per_s"])),
        ("Output token throughput (tok/s)", _num(s["output_throughput_tok_per_s"])),
        ("Peak output token throughput (tok/s)", _num(s["peak_output_throughput_tok_per_s"])),
        ("Peak concurrent requests", f"{s['peak_concurrent_requests']}"),
        ("Total token throughput (tok/s)", _num(s["total_token_throughput_tok_per_s"])),
    ]
    if s.get("goodput_slos_ms"):
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in s["goodput_slos_ms"].items())
        rows.insert(6, (f"Request goodput (req/s) [{slos}]", _num(s["goodput_req_per_s"])))
    for name, value in rows:
        totals.add_row(escape(name), value)
    latency = Table("latency (ms)", "mean", "median", "p90", "p99", box=None, padding=(0, 2))
    for key, label in NAMES.items():
        latency.add_row(label, *(_num(s[f"{key}_ms_{stat}"]) for stat in ("mean", "median", "p90", "p99")))
    parts = [totals, "", latency]
    if "chunks" in s:
        parts.append(
            f"[dim]client overhead per chunk: mean {s['client_overhead_us_per_chunk_mean']:.0f} µs, "
            f"p99 {s['client_overhead_us_per_chunk_p99']:.0f} µs over {s['chunks']} chunks; event-loop lag "
            f"p99 {s['event_loop_lag_ms_p99']:.2f} ms, max {s['event_loop_lag_ms_max']:.2f} ms[/]"
        )
    if s["errors"]:
        parts += ["", error_table(s["errors"])]
    return Group(*parts)


def error_table(errors: dict[str, int], title: str = "Failed requests") -> Table:
    table = Table("count", "error", box=None, padding=(0, 2), title=title, title_justify="left")
    for message, count in sorted(errors.items(), key=lambda e: -e[1]):
        table.add_row(str(count), escape(message))
    return table


def sweep_table(levels: list[int], summaries: list[dict]) -> Table:
    table = Table(
        "concurrency",
        "completed",
        "failed",
        "req/s",
        "output tok/s",
        "TTFT median",
        "TTFT p99",
        "TPOT median",
        "TPOT p99",
        "ITL p99",
        title="Concurrency sweep (latencies in ms)",
        title_justify="left",
    )
    for level, s in zip(levels, summaries, strict=False):
        table.add_row(
            str(level),
            str(s["completed"]),
            str(s["failed"]),
            _num(s["request_throughput_req_per_s"]),
            _num(s["output_throughput_tok_per_s"], 1),
            _num(s["ttft_ms_median"]),
            _num(s["ttft_ms_p99"]),
            _num(s["tpot_ms_median"]),
            _num(s["tpot_ms_p99"]),
            _num(s["itl_ms_p99"]),
        )
    return table


def print_result(console: Console, result: dict) -> None:
    """A run's tables; for a sweep, one row per level, then the errors of the levels that had any."""
    if "sweep_concurrency" not in result:
        console.print(escape(config_line(result["config"])), style="dim")
        console.print(summary_tables(result["summary"]))
        return
    runs = result["runs"]
    console.print(escape(config_line({**runs[0]["config"], "max_concurrency": "swept"})), style="dim")
    console.print(sweep_table(result["sweep_concurrency"], [r["summary"] for r in runs]))
    for level, run in zip(result["sweep_concurrency"], runs, strict=False):
        if run["summary"]["errors"]:
            console.print(error_table(run["summary"]["errors"], f"Failed requests at concurrency {level}"))
