"""Request records and the pure functions that turn them into the summary (the README's Metrics definitions,
computed the way `vllm bench serve` computes them)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from itertools import accumulate

import numpy as np

from rooftop.errors import InvalidRequestError

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p90", "p99")


@dataclass
class RequestRecord:
    """One request as the client saw it. Times in seconds: `send_time_s` from the run's start, the rest from
    the send (TTFT, E2E) or between token-carrying chunks (ITL)."""

    index: int
    prompt_len: int  # the dataset's count, with the bench's tokenizer
    max_tokens: int
    send_time_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float | None = None
    output_tokens: int | None = None
    output_tokens_from: str | None = None  # "usage" (the server's count) or "tokenizer" (the text re-tokenized)
    server_prompt_tokens: int | None = None
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (n - 1), defined for n >= 2 output tokens."""
        if not self.ok or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def parse_goodput(items: list[str]) -> dict[str, float]:
    """vLLM's `--goodput ttft:500 tpot:50 e2el:2000` (milliseconds) as {"ttft": 500.0, ...}."""
    slos = {}
    for item in (part for text in items for part in text.replace(",", " ").split()):
        name, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if name not in ("ttft", "tpot", "e2el") or not ms > 0 or math.isinf(ms):
            raise InvalidRequestError(f"--goodput takes NAME:MS with NAME ttft, tpot or e2el and MS > 0, got {item!r}")
        slos[name] = ms
    return slos


def stats_ms(values_s: list[float]) -> dict[str, float | None]:
    """Mean, median, std, p90 and p99 in milliseconds (numpy's linear percentiles, as vLLM); None when empty."""
    if not values_s:
        return dict.fromkeys(STATS)
    a = np.asarray(values_s, dtype=float) * 1e3
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "std": float(a.std()),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
    }


def meets_slos(r: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """vLLM's goodput rule: every given SLO met; a request with one output token has TPOT 0."""
    values = {"ttft": r.ttft_s, "tpot": r.tpot_s or 0.0, "e2el": r.e2el_s}
    return all(values[name] * 1e3 <= limit for name, limit in slos_ms.items())


def output_tokens_per_second(records: list[RequestRecord]) -> dict[int, float]:
    """Output tokens in each one-second bin from the first send, as vLLM bins them; a chunk carrying several
    tokens counts each (output tokens / chunks), which is vLLM's count when every chunk carries one."""
    done = [r for r in records if r.ok]
    start = min((r.send_time_s for r in done), default=0.0)
    bins: dict[int, float] = {}
    for r in done:
        times = list(accumulate(r.itl_s, initial=r.send_time_s + r.ttft_s))
        for t in times:
            bins[int(t - start)] = bins.get(int(t - start), 0.0) + r.output_tokens / len(times)
    return bins


def peak_output_throughput(records: list[RequestRecord]) -> float:
    """Most output tokens in any one-second bin (vLLM's peak output token throughput)."""
    return max(output_tokens_per_second(records).values(), default=0.0)


def peak_concurrency(records: list[RequestRecord]) -> int:
    """Most completed requests in flight at once (send to last token): shows what --max-concurrency allowed."""
    events = []
    for r in records:
        if r.ok:
            events += [(r.send_time_s, 1), (r.send_time_s + r.e2el_s, -1)]
    level = peak = 0
    for _, step in sorted(events):  # at equal times an end (-1) sorts before a start
        level += step
        peak = max(peak, level)
    return peak


def summarize(records: list[RequestRecord], duration_s: float, slos_ms: dict[str, float] | None = None) -> dict:
    """The run's summary: counts, throughputs, and each latency's stats under keys like `ttft_ms_p99`.
    Failed requests count only in `failed`: their tokens and times are left out of every other number."""
    done = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_len for r in done)
    summary = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration_s,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput_req_per_s": len(done) / duration_s,
        "output_throughput_tok_per_s": output / duration_s,
        "total_token_throughput_tok_per_s": (prompt + output) / duration_s,
        "peak_output_throughput_tok_per_s": peak_output_throughput(records),
        "peak_concurrent_requests": peak_concurrency(records),
        "goodput_req_per_s": sum(meets_slos(r, slos_ms) for r in done) / duration_s if slos_ms else None,
        "goodput_slos_ms": slos_ms or None,
    }
    values = {
        "ttft": [r.ttft_s for r in done],
        "tpot": [r.tpot_s for r in done if r.tpot_s is not None],
        "itl": [gap for r in done for gap in r.itl_s],
        "e2el": [r.e2el_s for r in done],
    }
    for name in LATENCIES:
        for stat, value in stats_ms(values[name]).items():
            summary[f"{name}_ms_{stat}"] = value
    summary["errors"] = dict(Counter(r.error for r in records if not r.ok))
    return summary
