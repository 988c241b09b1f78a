"""One load run: requests sent on their arrival schedule through one connection pool, at most
--max-concurrency in flight, while the client watches its own overhead."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

from rooftop.bench.serve.client import Target, send_request
from rooftop.bench.serve.datasets import SampleRequest, count_tokens
from rooftop.bench.serve.metrics import RequestRecord
from rooftop.loading.tokenizer import Tokenizer

LAG_TICK_S = 0.01


@dataclass
class RunOutput:
    records: list[RequestRecord]
    duration_s: float  # from the first scheduled send to the last request's end
    client: dict  # the client's own costs, to show they are small next to what it measures


async def run_load(
    target: Target,
    requests: list[SampleRequest],
    offsets: list[float],
    max_concurrency: int | None,
    tokenizer: Tokenizer,
    on_done: Callable[[RequestRecord], None] = lambda _: None,
) -> RunOutput:
    """Send `requests[i]` at `offsets[i]` seconds (waiting for a free slot under `max_concurrency`; the
    send time, TTFT's start, is taken once it has one, as vLLM does). Output tokens the server did not
    report are counted by re-tokenizing the text after the run, outside the timed path."""
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    overheads: list[float] = []
    lags: list[float] = []
    async with httpx.AsyncClient(
        limits=limits, timeout=httpx.Timeout(target.timeout_s), headers=target.headers
    ) as client:
        start = time.perf_counter()

        async def one(i: int, req: SampleRequest) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + offsets[i] - time.perf_counter()))
            async with slots or contextlib.nullcontext():
                record = await send_request(client, target, req, i, start, overheads)
            on_done(record)
            return record

        watcher = asyncio.create_task(_watch_loop(lags))
        records = await asyncio.gather(*(one(i, req) for i, req in enumerate(requests)))
        duration = time.perf_counter() - start
        watcher.cancel()
    for r in records:
        if r.ok and r.output_tokens is None:
            r.output_tokens, r.output_tokens_from = count_tokens(tokenizer, r.text), "tokenizer"
    return RunOutput(list(records), duration, client_costs(overheads, lags))


async def _watch_loop(lags: list[float]) -> None:
    """How late the event loop wakes a sleeper: the bound on how late a chunk can be timestamped."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        lags.append(time.perf_counter() - t - LAG_TICK_S)


def client_costs(overheads: list[float], lags: list[float]) -> dict:
    """Per network read: the client's parse and bookkeeping time; the event loop's wake-up lag."""
    o = np.asarray(overheads or [0.0]) * 1e6
    lag = np.asarray(lags or [0.0]) * 1e3
    return {
        "client_overhead_us_per_chunk_mean": float(o.mean()),
        "client_overhead_us_per_chunk_p99": float(np.percentile(o, 99)),
        "client_overhead_us_per_chunk_max": float(o.max()),
        "event_loop_lag_ms_p99": float(np.percentile(lag, 99)),
        "event_loop_lag_ms_max": float(lag.max()),
        "chunks": len(overheads),
    }
