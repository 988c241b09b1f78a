"""The reliability run of issue 14: `rooftop serve` processes on loopback ports, driven as real clients drive them.

    .venv/bin/python benchmarks/reliability.py --out reliability.json [--quick] [--model M]
        [--weights float,int8,int4] [--checks abcdefgh] [--seed 0] [--log-dir DIR]

Each check starts its own server (`python -m rooftop serve`, the bundled model unless --model; logs in --log-dir)
and talks to it with httpx, and with the openai client for half of the concurrent streams where it is installed:

  a  batch invariance, in every --weights format (FORMAT or FORMAT@DTYPE, e.g. float@bfloat16): 64 concurrent
     greedy streams (max_tokens 32, distinct prompts, logprobs), then 64 seeded ones (temperature 0.8, a seed per
     request), each compared with the same request sent alone: the same tokens, logprobs within 1e-4. Prefix
     caching is off (--prefix-caching turns it on) so that a difference is the batch's, not a reused block's.
  b  overload: capacity (req/s) from a short closed loop of 64 clients (a full batch), then 600 requests, streamed
     and not, with Poisson arrivals at 2.4x it: 429s are fine; 5xx, error events, resets, refused connections and
     hangs (past --deadline) are not; afterwards nothing runs and no KV block is held.
  c  140 clients that leave: mid-stream after 1-8 events, after the headers, or non-streamed (the socket closed);
     then running, waiting (/metrics, /dashboard/state) and KV blocks must fall back to 0, and a request works.
  d  preemption, in every --weights format: a tiny KV pool (--kv-blocks) and 32 concurrent requests against each
     alone, under near_ties.py's rule (a run may part from alone's only where alone's top two nearly tie; with
     batch invariance every one should be exact); no errors; the preemptions as /metrics counts them.
  e  SIGTERM under load with the default options: exit status 0 within 10 s, every stream ends with [DONE] (after
     an error event is fine). Also reported (issue 14, Must 5): a second SIGTERM, and a double SIGINT, exit at once
     with a non-zero status and without SIGABRT.
  f  5,000 seeded fuzzed bodies on the four POST routes (--max-model-len 128, so that a valid body without
     max_tokens stays short): no 5xx, every 4xx an OpenAI-style error body, every 2xx the route's body, no reset
     or hang, and a normal request works after. The report lists what each failure sent.
  g  raw HTTP over a socket: broken request lines and headers, pipelining, keep-alive reuse after a 400/404/405/413
     and after a 500 if the fuzz or a list of suspects provokes one; half-sent headers and bodies (others must still
     be served; whether the server times them out is reported, Must 5).
  h  --api-key: every route but /health and /metrics refuses a missing or wrong key; reported too (Must 6): a
     browser Origin and a foreign Host header are refused.

The summary table gives the counts and a pass/fail per issue target (0 differing outputs, 0 5xx, 0 resets, 0 hangs,
KV back to 0, exit 0 within 10 s on SIGTERM); the JSON report has the details. Exit status 0 only when every target
holds. --quick shrinks every count (a smoke run of minutes). Tokens are compared as the strings the API returns
(it exposes no token ids), logprobs numerically. The shared client code is tests/reliability_support.py, which the
suite's bounded runs (tests/test_reliability.py) use too. Loopback only; the counts, not the speeds, are the result:
on a shared or small host the capacity and timings say little.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from reliability_support import (  # noqa: E402
    BAD_REQUESTS,
    CHAT,
    COMPLETIONS,
    FAILURES,
    TOKENIZE,
    Result,
    api_key_probe,
    async_client,
    bad_request_probe,
    compare,
    completion_body,
    fuzz,
    fuzz_cases,
    half_sent_probe,
    http_request,
    keep_alive_probe,
    leave_mid_stream,
    leave_unstreamed,
    parse_metrics,
    pipelined_probe,
    poisson_offsets,
    prompts,
    send,
    send_openai,
    tally,
    tie_for,
    wait_idle,
)

try:
    import openai
except ImportError:  # httpx only
    openai = None

console = Console(width=shutil.get_terminal_size((140, 40)).columns)
SIGTERM_EXIT_S = 10.0  # issue 14's target
SECOND_SIGNAL_S = 3.0  # "at once", with room for a loaded host
FUZZ_MAX_MODEL_LEN = 128  # a valid fuzzed body without max_tokens generates at most this many tokens
SUSPECT_500 = [  # valid-looking bodies that could reach a corner of the engine (issue 14, Must 3)
    {"prompt": "hi", "max_tokens": 2, "stop_token_ids": [2**63 - 1]},
    {"prompt": "hi", "max_tokens": 2, "stop_token_ids": [-1]},
    {"prompt": [2**31 - 1], "max_tokens": 2},
    {"prompt": "hi", "max_tokens": 2, "top_k": 2**63 - 1},
    {"prompt": "hi", "max_tokens": 2, "temperature": 5e-324},
    {"prompt": "hi", "max_tokens": 2, "temperature": 1e308, "top_p": 1e-38},
    {"prompt": "hi", "max_tokens": 2, "min_p": 1.0, "temperature": 1e-30},
    {"prompt": "hi", "max_tokens": 2, "repetition_penalty": 3e38},
    {"prompt": "hi", "max_tokens": 2, "repetition_penalty": 1e-45},
    {"prompt": "hi", "max_tokens": 2, "frequency_penalty": -2, "presence_penalty": -2, "temperature": 1e-7},
    {"prompt": "hi", "max_tokens": 2, "seed": -(2**63)},
    {"prompt": "hi", "max_tokens": 2, "logprobs": 20, "top_k": 1},
    {"prompt": "hi", "max_tokens": 2, "stop": ["h", "i", "\ufffd"] * 300},
    {"prompt": "\ud800", "max_tokens": 2},
    {"messages": [{"role": "tool", "content": None}], "max_tokens": 2},
    {"messages": [{"role": "assistant", "content": [{"type": "text", "text": ""}]}], "max_tokens": 2},
]


READ_TIMEOUT_S = 5  # f/g's server: --timeout-read under the half-sent probes' wait (the default, 30 s, is longer)


@dataclass
class Sizes:
    streams: int = 64
    max_tokens: int = 32
    capacity_requests: int = 128
    capacity_concurrency: int = 64  # the default --max-num-seqs: the throughput of a full batch
    poisson: int = 600
    overload: float = 2.4
    disconnects: int = 140
    disconnect_wave: int = 20
    preempt_requests: int = 32
    preempt_max_tokens: int = 64
    kv_blocks: int = 24
    sigterm_streams: int = 16
    fuzz: int = 5000
    fuzz_concurrency: int = 8
    fuzz_max_string: int = 2_500_000
    half_sent_wait_s: float = 15.0


QUICK = Sizes(
    streams=8,
    max_tokens=16,
    capacity_requests=16,
    capacity_concurrency=8,
    poisson=60,
    disconnects=14,
    disconnect_wave=7,
    preempt_requests=8,
    preempt_max_tokens=32,
    kv_blocks=8,
    sigterm_streams=4,
    fuzz=300,
    fuzz_concurrency=4,
    fuzz_max_string=300_000,
    half_sent_wait_s=6.0,
)


# --- servers ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m rooftop serve` on a free loopback port, its output in `log_dir/name.log`."""

    def __init__(self, name: str, args: list[str], log_dir: Path, startup_s: float):
        self.name, self.args, self.log_path, self.startup_s = name, args, log_dir / f"{name}.log", startup_s
        self.proc: subprocess.Popen | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = ""

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "rooftop", "serve", "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        self.log = open(self.log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"server {self.name} not ready within {self.startup_s:.0f} s: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.model = httpx.get(f"{self.url}/v1/models", headers=self._key_header(), timeout=30).json()["data"][0]["id"]
        return self

    def _key_header(self) -> dict:
        if "--api-key" in self.args:
            return {"Authorization": f"Bearer {self.args[self.args.index('--api-key') + 1]}"}
        return {}

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait(60) is None:
                self.kill()
        if hasattr(self, "log"):
            self.log.close()

    def rss_mb(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def weight_args(weights: str) -> list[str]:
    """FORMAT or FORMAT@DTYPE as serve options."""
    fmt, _, dtype = weights.partition("@")
    return ["--weights", fmt] + (["--dtype", dtype] if dtype else [])


# --- the run ---------------------------------------------------------------------------------------------------


@dataclass
class Check:
    """One check's outcome: `targets` are issue 14's Targets (they decide the exit status), `musts` other parts of
    the issue the run can see (reported, not decisive)."""

    key: str
    title: str
    counts: dict = field(default_factory=dict)
    targets: dict[str, bool] = field(default_factory=dict)
    musts: dict[str, bool] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(self.targets.values())


@dataclass
class Options:
    model: str | None
    seed: int
    deadline_s: float
    log_dir: Path
    prefix_caching: bool
    startup_timeout_s: float


class Run:
    def __init__(self, sizes: Sizes, options: Options):
        self.sizes, self.options, self.model, self.seed = sizes, options, options.model, options.seed
        self.deadline = options.deadline_s
        self.checks: list[Check] = []
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )

    @contextlib.contextmanager
    def server(self, name: str, args: list[str]) -> Iterator[ServerProcess]:
        model = ["--model", self.model] if self.model else []
        srv = ServerProcess(name, [*model, *args], self.options.log_dir, self.options.startup_timeout_s)
        task = self.progress.add_task(f"[dim]starting server {name}", total=None)
        try:
            srv.start()
        except BaseException:
            srv.stop()
            raise
        finally:
            self.progress.remove_task(task)
        try:
            yield srv
        finally:
            srv.stop()

    def task(self, description: str, total: int):
        task = self.progress.add_task(description, total=total)
        return lambda n=1: self.progress.advance(task, n)

    async def counted(self, coro, tick):
        out = await coro
        tick()
        return out

    # a --------------------------------------------------------------------------------------------------------

    async def batch_invariance(self, weights: str) -> Check:
        s = self.sizes
        check = Check("a", f"batch invariance, {weights}")
        caching = [] if self.options.prefix_caching else ["--no-enable-prefix-caching"]
        with self.server(f"a-{weights}", weight_args(weights) + caching) as srv:
            async with async_client(srv.url, self.deadline) as client:
                for mode in ("greedy", "seeded"):
                    seeds = [None if mode == "greedy" else self.seed * 100_000 + 1000 + i for i in range(s.streams)]
                    bodies = [
                        completion_body(p, s.max_tokens, seed=sd, model=srv.model)
                        for p, sd in zip(prompts(self.seed + (mode == "seeded"), s.streams, 3), seeds, strict=True)
                    ]
                    alone = await self._one_by_one(client, bodies, self.task(f"a {weights} {mode}: alone", len(bodies)))
                    tick = self.task(f"a {weights} {mode}: {s.streams} at once", len(bodies))
                    batched, largest = await self._all_at_once(srv, client, bodies, tick)
                    c = compare(batched, alone)
                    check.counts[f"{mode} differ"] = c.differ + c.failed
                    check.details[mode] = asdict(c) | largest
                    check.targets[f"{mode}: 0 differing outputs"] = c.passed
        check.counts["largest step"] = "{seqs} seqs, prefill {prefill_tokens} tokens".format(
            seqs=max(d["largest_step_seqs"] for d in check.details.values()),
            prefill_tokens=max(d["largest_prefill_tokens"] for d in check.details.values()),
        )
        return check

    async def _one_by_one(self, client, bodies, tick) -> list[Result]:
        """Each body alone, one after another: the reference the concurrent runs are compared with."""
        alone = []
        for b in bodies:
            alone.append(await send(client, COMPLETIONS, b, self.deadline))
            tick()
        return alone

    async def _all_at_once(self, srv, client, bodies, tick) -> tuple[list[Result], dict]:
        """Every body at once (odd ones through the openai client when it is installed); the largest steps seen in
        the dashboard's recent steps."""
        ac = (
            openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=self.deadline)
            if openai
            else None
        )
        try:
            coros = [
                send_openai(ac, b, self.deadline) if ac and i % 2 else send(client, COMPLETIONS, b, self.deadline)
                for i, b in enumerate(bodies)
            ]
            results = await asyncio.gather(*(self.counted(c, tick) for c in coros))
        finally:
            if ac is not None:
                await ac.close()
        steps = (await client.get("/dashboard/state")).json().get("steps", [])
        prefill = [st["tokens"] for st in steps if st["phase"] != "decode"]
        largest = {
            "largest_step_seqs": max((st["batch"] for st in steps), default=0),
            "largest_prefill_tokens": max(prefill, default=0),
        }
        return list(results), largest

    # b --------------------------------------------------------------------------------------------------------

    async def overload(self, srv: ServerProcess) -> Check:
        s, rng = self.sizes, random.Random(self.seed + 20)
        check = Check("b", "Poisson overload")
        async with async_client(srv.url, self.deadline) as client:
            cap_bodies = [completion_body(p, s.max_tokens) for p in prompts(self.seed + 21, s.capacity_requests)]
            tick = self.task("b capacity (closed loop)", len(cap_bodies))
            queue = list(cap_bodies)
            done: list[Result] = []

            async def worker() -> None:
                while queue:
                    done.append(await send(client, COMPLETIONS, queue.pop(), self.deadline))
                    tick()

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(s.capacity_concurrency)))
            elapsed = time.perf_counter() - start
            capacity = sum(r.kind == "ok" for r in done) / elapsed
            rate = s.overload * capacity
            bodies = [
                completion_body(p, s.max_tokens, stream=rng.random() < 0.5) for p in prompts(self.seed + 22, s.poisson)
            ]
            offsets = poisson_offsets(self.seed + 23, s.poisson, rate)
            before = parse_metrics((await client.get("/metrics")).text)
            tick = self.task(f"b {s.poisson} Poisson requests at {rate:.1f}/s", s.poisson)
            results = await self._send_at_counted(offsets, bodies, client, tick)
            idle, state, waited = await wait_idle(client, 60)
            after = parse_metrics((await client.get("/metrics")).text)
        counts = tally(results)
        ok = sorted(r.seconds for r in results if r.kind == "ok")
        check.counts = {"capacity req/s": round(capacity, 2), "rate req/s": round(rate, 2), **counts}
        rejected = 'rooftop_requests_total{outcome="rejected"}'
        check.details = {
            "closed_loop": tally(done) | {"seconds": round(elapsed, 2), "concurrency": s.capacity_concurrency},
            "e2e_s_p50_p99": [ok[len(ok) // 2], ok[min(len(ok) - 1, int(len(ok) * 0.99))]] if ok else None,
            "metrics_rejected_delta": after.get(rejected, 0) - before.get(rejected, 0),
            "idle_after": state,
            "seconds_to_idle": round(waited, 2),
            "failure_examples": [r.brief() for r in results if r.kind in FAILURES][:10],
            "429_without_retry_after": sum(r.kind == "429" and not r.retry_after for r in results),
        }
        check.targets = _transport_targets(counts) | {"KV back to 0": idle}
        return check

    async def _send_at_counted(self, offsets, bodies, client, tick) -> list[Result]:
        """send_at, ticking the progress bar as each request ends."""
        start = time.perf_counter()

        async def one(offset: float, body: dict) -> Result:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await send(client, COMPLETIONS, body, self.deadline)

        return await asyncio.gather(*(self.counted(one(t, b), tick) for t, b in zip(offsets, bodies, strict=True)))

    # c --------------------------------------------------------------------------------------------------------

    async def disconnects(self, srv: ServerProcess) -> Check:
        s, rng = self.sizes, random.Random(self.seed + 30)
        check = Check("c", "client disconnects")
        modes = [
            "mid-stream" if (x := rng.random()) < 0.7 else "after headers" if x < 0.85 else "not streamed"
            for _ in range(s.disconnects)
        ]
        bodies = [completion_body(p, 512) for p in prompts(self.seed + 31, s.disconnects)]
        ends: list[str] = []
        async with async_client(srv.url, self.deadline) as client:
            before = parse_metrics((await client.get("/metrics")).text)
            tick = self.task(f"c {s.disconnects} disconnects", s.disconnects)
            for w in range(0, s.disconnects, s.disconnect_wave):
                coros = []
                for mode, body in zip(modes[w : w + s.disconnect_wave], bodies[w : w + s.disconnect_wave], strict=True):
                    if mode == "not streamed":
                        coros.append(self._unstreamed(srv.url, body, rng.uniform(0.05, 0.5)))
                    else:
                        events = rng.randint(1, 8) if mode == "mid-stream" else 0
                        coros.append(leave_mid_stream(client, body, events, self.deadline))
                ends += await asyncio.gather(*(self.counted(c, tick) for c in coros))
            idle, state, waited = await wait_idle(client, 30)
            after = parse_metrics((await client.get("/metrics")).text)
            normal = await send(client, COMPLETIONS, {"prompt": "and now", "max_tokens": 4}, self.deadline)
        outcomes = {
            k.split('"')[1]: after[k] - before.get(k, 0) for k in after if k.startswith("rooftop_requests_total{")
        }
        ended = {e: ends.count(e) for e in sorted(set(ends))}
        check.counts = {"disconnects": len(ends), **ended, "aborted (metrics)": outcomes.get("abort", 0)}
        check.details = {
            "modes": {m: modes.count(m) for m in sorted(set(modes))},
            "outcomes_delta": {k: v for k, v in outcomes.items() if v},
            "idle_after": state,
            "seconds_to_idle": round(waited, 2),
            "request_after": normal.brief(),
        }
        bad = sum(v for k, v in ended.items() if k == "hang" or k.startswith("reset") or k.startswith("status"))
        check.targets = {
            "0 resets/hangs": bad == 0,
            "KV back to 0": idle,
            "serves after": normal.kind == "ok",
        }
        return check

    @staticmethod
    async def _unstreamed(url: str, body: dict, after_s: float) -> str:
        try:
            await leave_unstreamed(url, body, after_s)
            return "left"
        except OSError as e:
            return f"reset: {type(e).__name__}"

    # d --------------------------------------------------------------------------------------------------------

    async def preemption(self, weights: str) -> Check:
        s = self.sizes
        check = Check("d", f"preemption, {weights}")
        caching = [] if self.options.prefix_caching else ["--no-enable-prefix-caching"]
        args = weight_args(weights) + caching + ["--num-kv-blocks", str(s.kv_blocks)]
        with self.server(f"d-{weights}", args) as srv:
            async with async_client(srv.url, self.deadline) as client:
                bodies = [
                    completion_body(p, s.preempt_max_tokens, logprobs=5, model=srv.model)
                    for p in prompts(self.seed + 40, s.preempt_requests, 2)
                ]
                alone = await self._one_by_one(client, bodies, self.task(f"d {weights}: alone", len(bodies)))
                tick = self.task(f"d {weights}: {len(bodies)} at once, {s.kv_blocks} KV blocks", len(bodies))
                batched, largest = await self._all_at_once(srv, client, bodies, tick)
                idle, state, _ = await wait_idle(client, 30)
                preemptions = parse_metrics((await client.get("/metrics")).text)["rooftop_num_preemptions_total"]
        tie = tie_for(weights)
        c = compare(batched, alone, tie=tie)
        errors = sum(r.kind != "ok" for r in batched + alone)
        check.counts = {
            "requests": c.requests,
            "exact": c.exact,
            "within near tie": c.within_tie,
            "  of which same tokens": c.of_which_same_tokens,
            "differ": c.differ,
            "errors": errors,
            "preemptions": int(preemptions),
        }
        check.details = asdict(c) | largest | {"tie": tie, "idle_after": state}
        check.targets = {
            "0 differing outputs (near-tie rule)": c.differ == 0,
            "0 errors": errors == 0,
            "KV back to 0": idle,
        }
        return check

    # e --------------------------------------------------------------------------------------------------------

    async def sigterm(self) -> Check:
        s = self.sizes
        check = Check("e", "SIGTERM under load")
        with self.server("e-sigterm", []) as srv:
            async with async_client(srv.url, self.deadline) as client:
                bodies = [completion_body(p, 4000) for p in prompts(self.seed + 50, s.sigterm_streams)]
                streams = [asyncio.create_task(send(client, COMPLETIONS, b, 90)) for b in bodies]
                running = await self._until_running(client, len(bodies), 60)
                srv.signal(signal.SIGTERM)
                start = time.perf_counter()
                rc = await asyncio.to_thread(srv.wait, 60)
                exit_s = time.perf_counter() - start
                if rc is None:
                    srv.kill()
                results = await asyncio.gather(*streams)
        clean = sum(r.kind in ("ok", "error_event") for r in results)
        check.counts = {
            "streams": len(results),
            "running at signal": running,
            "clean ends": clean,
            "exit status": rc,
            "exit s": round(exit_s, 2),
        }
        check.details = {"streams": tally(results), "examples": [r.brief() for r in results[:3]]}
        check.targets = {
            f"exit 0 within {SIGTERM_EXIT_S:.0f} s": rc == 0 and exit_s <= SIGTERM_EXIT_S,
            "streams end with [DONE]": clean == len(results),
        }
        for name, sig in (("second SIGTERM", signal.SIGTERM), ("double SIGINT", signal.SIGINT)):
            got = await self._second_signal(name, sig)
            check.details[name] = got
            check.musts[f"{name}: exits at once, non-zero, no SIGABRT"] = got["ok"]
            check.counts[f"{name} exit"] = got["exit status"]
        return check

    async def _until_running(self, client, n: int, timeout_s: float) -> int:
        deadline, running = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            m = parse_metrics((await client.get("/metrics")).text)
            running = int(m["rooftop_num_requests_running"])
            if running >= n and m["rooftop_generation_tokens_total"] > n:
                break
            await asyncio.sleep(0.1)
        return running

    async def _second_signal(self, name: str, sig: int) -> dict:
        with self.server(f"e-{name.replace(' ', '-')}", []) as srv:
            async with async_client(srv.url, self.deadline) as client:
                bodies = [completion_body(p, 4000) for p in prompts(self.seed + 51, 4)]
                streams = [asyncio.create_task(send(client, COMPLETIONS, b, 90)) for b in bodies]
                await self._until_running(client, len(bodies), 60)
                srv.signal(sig)
                await asyncio.sleep(1.0)
                first_rc = srv.proc.poll()
                srv.signal(sig)
                start = time.perf_counter()
                rc = first_rc if first_rc is not None else await asyncio.to_thread(srv.wait, 60)
                seconds = time.perf_counter() - start
                if rc is None:
                    srv.kill()
                await asyncio.gather(*streams)
        aborted = rc in (-signal.SIGABRT, 128 + signal.SIGABRT)
        if first_rc is not None:  # it stopped on the first signal: no second one was needed
            ok = first_rc == 0
        else:
            ok = rc is not None and rc != 0 and not aborted and seconds <= SECOND_SIGNAL_S
        return {
            "exit status": rc,
            "exited before the second signal": first_rc is not None,
            "seconds after second": round(seconds, 2),
            "SIGABRT": aborted,
            "ok": ok,
        }

    # f --------------------------------------------------------------------------------------------------------

    async def fuzz(self, srv: ServerProcess) -> tuple[Check, object]:
        s = self.sizes
        check = Check("f", "fuzzed bodies")
        cases = list(fuzz_cases(self.seed + 60, s.fuzz, s.fuzz_max_string))
        rss_before = srv.rss_mb()
        async with async_client(srv.url, self.deadline) as client:
            tick = self.task(f"f {s.fuzz} fuzzed bodies", len(cases))
            result = await fuzz(client, cases, s.fuzz_concurrency, self.deadline, on_done=tick)
            normal = await send(client, COMPLETIONS, {"prompt": "still fine?", "max_tokens": 4}, self.deadline)
            chat = await send(client, CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            idle, state, _ = await wait_idle(client, 60)
        fives = sum(n for st, n in result.statuses.items() if st >= 500)
        check.counts = {
            "bodies": result.sent,
            "2xx": sum(n for st, n in result.statuses.items() if st < 300),
            "4xx": sum(n for st, n in result.statuses.items() if 400 <= st < 500),
            "5xx": fives,
            "bad answers": len(result.problems) - result.transport["reset"] - result.transport["hang"],
            "resets": result.transport["reset"],
            "hangs": result.transport["hang"],
            "400 with param null": result.param_null_400,
        }
        check.details = result.as_dict() | {
            "rss_mb_before_after": [rss_before, srv.rss_mb()],
            "requests_after": [normal.brief(), chat.brief()],
            "idle_after": state,
        }
        check.targets = {
            "0 5xx": fives == 0,
            "every 4xx an OpenAI error": check.counts["bad answers"] == 0,
            "0 resets/hangs": result.transport["reset"] + result.transport["hang"] == 0,
            "serves after": normal.kind == chat.kind == "ok" and idle,
        }
        return check, result.first_500

    # g --------------------------------------------------------------------------------------------------------

    async def raw_http(self, srv: ServerProcess, first_500) -> Check:
        s = self.sizes
        check = Check("g", "raw HTTP")
        host = srv.url.removeprefix("http://")
        tick = self.task("g raw HTTP probes", len(BAD_REQUESTS) + len(SUSPECT_500) + 8)

        def probes() -> dict:
            out = {"bad requests": [], "suspects": []}
            for name, data in BAD_REQUESTS.items():
                out["bad requests"].append(bad_request_probe(srv.url, name, data))
                tick()
            out["pipelined"] = pipelined_probe(srv.url)
            tick()
            big = b'{"prompt": "' + b"x" * (3 << 20) + b'"}'
            firsts = [
                ("after a 400", http_request("POST", COMPLETIONS, host, b'{"prompt": '), 400),
                ("after a 404", http_request("GET", "/nowhere", host), 404),
                ("after a 405", http_request("GET", COMPLETIONS, host), 405),
                ("after a 413", http_request("POST", COMPLETIONS, host, big), 413),
            ]
            five = first_500.content if first_500 is not None else None
            five_path = first_500.path if first_500 is not None else COMPLETIONS
            for body in SUSPECT_500:
                data = json.dumps(body).encode("utf-8", "surrogatepass")
                path = CHAT if "messages" in body else COMPLETIONS
                status = httpx.post(f"{srv.url}{path}", content=data, timeout=self.deadline).status_code
                out["suspects"].append({"body": json.dumps(body)[:120], "status": status})
                if status >= 500 and five is None:
                    five, five_path = data, path
                tick()
            if five is not None:
                firsts.append(("after a 500", http_request("POST", five_path, host, five), 500))
            else:
                tick()  # no 500 to reuse a connection after
            out["keep-alive"] = []
            for name, first, status in firsts:
                out["keep-alive"].append(keep_alive_probe(srv.url, name, first, status))
                tick()
            out["half-sent"] = [
                half_sent_probe(
                    srv.url,
                    "half-sent headers",
                    f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}\r\n".encode(),
                    s.half_sent_wait_s,
                ),
                half_sent_probe(
                    srv.url,
                    "half-sent body",
                    f"POST {TOKENIZE} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    'Content-Length: 100\r\n\r\n{"prompt": '.encode(),
                    s.half_sent_wait_s,
                ),
            ]
            tick(2)
            return out

        out = await asyncio.to_thread(probes)
        bad = out["bad requests"]
        fives = sum(p["verdict"] == "5xx" for p in bad) + sum(p["status"] >= 500 for p in out["suspects"])
        hangs = sum(p["verdict"] == "hang" for p in bad)
        kept = [p for p in out["keep-alive"] if p["verdict"].startswith("ok")]
        check.counts = {
            "broken requests": len(bad),
            "answered <500": sum(p["verdict"] == "ok" for p in bad),
            "closed": sum(p["verdict"] == "closed" for p in bad),
            "5xx": fives,
            "hangs": hangs,
            "pipelined": out["pipelined"]["verdict"],
            "keep-alive reused": f"{len(kept)}/{len(out['keep-alive'])}",
            "500 provoked": first_500 is not None or any(p["status"] >= 500 for p in out["suspects"]),
            "half-sent closed after s": [p["server_closed_after_s"] for p in out["half-sent"]],
        }
        check.details = out
        check.targets = {
            "0 5xx": fives == 0,
            "0 hangs": hangs == 0,
            "pipelining": out["pipelined"]["verdict"] == "ok",
            "0 resets (keep-alive)": len(kept) == len(out["keep-alive"]),
            "others served during half-sent": all(p["others_served"] for p in out["half-sent"]),
        }
        check.musts = {
            "half-sent requests timed out": all(p["server_closed_after_s"] is not None for p in out["half-sent"])
        }
        return check

    # h --------------------------------------------------------------------------------------------------------

    async def api_key(self) -> Check:
        check = Check("h", "API key")
        key = f"reliability-{self.seed}"
        with self.server("h-api-key", ["--api-key", key]) as srv:
            tick = self.task("h API key on every route", 3)
            rows = await asyncio.to_thread(api_key_probe, srv.url, key)
            tick()
            auth = {"Authorization": f"Bearer {key}"}
            body = {"prompt": "hi", "max_tokens": 1}
            with httpx.Client(base_url=srv.url, timeout=self.deadline, headers=auth) as c:
                origin = c.post(COMPLETIONS, json=body, headers={"Origin": "http://evil.example"}).status_code
                foreign = c.post(COMPLETIONS, json=body, headers={"Host": "evil.example"}).status_code
                root = c.get("/v1/models").json()["data"][0].get("root", "")
            tick(2)
        open_guarded = [r for r in rows if r["guarded"] and not r["ok"]]
        check.counts = {
            "routes": len(rows),
            "guarded routes open": len(open_guarded),
            "open routes refused": sum(1 for r in rows if not r["guarded"] and not r["ok"]),
            "browser Origin": origin,
            "foreign Host": foreign,
        }
        check.details = {"routes": rows, "models_root": root}
        check.targets = {"every route but /health, /metrics needs the key": all(r["ok"] for r in rows)}
        check.musts = {
            "a browser Origin is refused": origin >= 400,
            "a foreign Host is refused": foreign >= 400,
            "no absolute path in /v1/models": "/" not in root,
        }
        return check


def _transport_targets(counts: dict) -> dict[str, bool]:
    return {
        "0 5xx": counts.get("5xx", 0) + counts.get("error_event", 0) == 0,
        "0 resets": counts.get("reset", 0) + counts.get("refused", 0) + counts.get("incomplete", 0) == 0,
        "0 hangs": counts.get("hang", 0) == 0,
        "well-formed answers": counts.get("malformed", 0) == 0,
    }


async def run_checks(run: Run, checks: str, weights: list[str]) -> None:
    async def guarded(key: str, title: str, coro) -> object:
        try:
            return await coro
        except Exception as e:  # a check that could not run is a failure with its reason, the others go on
            run.checks.append(Check(key, title, error=f"{type(e).__name__}: {e}"))
            console.log(f"[red]check {key} ({title}) could not run: {type(e).__name__}: {e}")
            return None

    def keep(check) -> None:
        if check is not None:
            run.checks.append(check)

    if "a" in checks:
        for w in weights:
            keep(await guarded("a", f"batch invariance, {w}", run.batch_invariance(w)))
    if "b" in checks or "c" in checks:
        try:
            with run.server("bc-main", []) as srv:
                if "b" in checks:
                    keep(await guarded("b", "Poisson overload", run.overload(srv)))
                if "c" in checks:
                    keep(await guarded("c", "client disconnects", run.disconnects(srv)))
        except RuntimeError as e:
            run.checks.append(Check("b/c", "main server", error=str(e)))
    if "d" in checks:
        for w in weights:
            keep(await guarded("d", f"preemption, {w}", run.preemption(w)))
    if "e" in checks:
        keep(await guarded("e", "SIGTERM under load", run.sigterm()))
    if "f" in checks or "g" in checks:
        try:
            fg_args = ["--max-model-len", str(FUZZ_MAX_MODEL_LEN), "--timeout-read", str(READ_TIMEOUT_S)]
            with run.server("fg-fuzz", fg_args) as srv:
                first_500 = None
                if "f" in checks:
                    got = await guarded("f", "fuzzed bodies", run.fuzz(srv))
                    if got is not None:
                        keep(got[0])
                        first_500 = got[1]
                if "g" in checks:
                    keep(await guarded("g", "raw HTTP", run.raw_http(srv, first_500)))
        except RuntimeError as e:
            run.checks.append(Check("f/g", "fuzz server", error=str(e)))
    if "h" in checks:
        keep(await guarded("h", "API key", run.api_key()))


def summary(checks: list[Check]) -> Table:
    table = Table(title="reliability (issue 14)", show_lines=True)
    for col in ("check", "counts", "targets", "result"):
        table.add_column(col, overflow="fold")
    for c in checks:
        counts = "\n".join(f"{k}: {v}" for k, v in c.counts.items()) or (c.error or "")
        marks = [f"{'[green]✓' if ok else '[red]✗'}[/] {name}" for name, ok in c.targets.items()]
        marks += [f"{'[green]✓' if ok else '[yellow]✗'}[/] [dim](Must) {name}" for name, ok in c.musts.items()]
        result = "[green]pass" if c.passed else "[red]FAIL" + (" (did not run)" if c.error else "")
        table.add_row(f"{c.key}  {c.title}", counts, "\n".join(marks), result)
    return table


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(
    out: Annotated[Path, typer.Option(help="where the JSON report goes")] = Path("reliability.json"),
    model: Annotated[str | None, typer.Option(help="GGUF file or HF directory (default: the bundled model)")] = None,
    weights: Annotated[
        str, typer.Option(help="comma-separated --weights formats for checks a and d (FORMAT or FORMAT@DTYPE)")
    ] = "float,int8,int4",
    checks: Annotated[str, typer.Option(help="which checks to run, letters a-h")] = "abcdefgh",
    quick: Annotated[bool, typer.Option(help="every count shrunk, for a smoke run")] = False,
    seed: Annotated[int, typer.Option(help="seeds every prompt, arrival, disconnect and fuzzed body")] = 0,
    deadline: Annotated[float, typer.Option(help="seconds a request may take before it counts as a hang")] = 120.0,
    prefix_caching: Annotated[bool, typer.Option(help="keep prefix caching on in checks a and d")] = False,
    startup_timeout: Annotated[float, typer.Option(help="seconds a server may take to load")] = 300.0,
    log_dir: Annotated[Path | None, typer.Option(help="server logs (default: next to --out)")] = None,
) -> None:
    """Run issue 14's reliability checks against `rooftop serve` processes and report counts and pass/fail."""
    sizes = QUICK if quick else Sizes()
    log_dir = log_dir or out.with_suffix("").with_name(out.stem + "-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    formats = [w.strip() for w in weights.split(",") if w.strip()]
    run = Run(sizes, Options(model, seed, deadline, log_dir, prefix_caching, startup_timeout))
    started = time.perf_counter()
    with run.progress:
        asyncio.run(run_checks(run, checks.lower(), formats))
    console.print(summary(run.checks))
    passed = bool(run.checks) and all(c.passed for c in run.checks)
    report = {
        "issue": 14,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "processor": platform.processor(), "cores": os.cpu_count()},
        "python": platform.python_version(),
        "model": model or "bundled",
        "weights": formats,
        "quick": quick,
        "seed": seed,
        "sizes": asdict(sizes),
        "openai_client": openai.__version__ if openai else None,
        "seconds": round(time.perf_counter() - started, 1),
        "passed": passed,
        "checks": [asdict(c) | {"passed": c.passed} for c in run.checks],
    }
    out.write_text(json.dumps(report, indent=2, default=str))
    console.print(f"report: {out}  server logs: {log_dir}  ({report['seconds']:.0f} s)")
    raise typer.Exit(0 if passed else 1)


if __name__ == "__main__":
    app()
