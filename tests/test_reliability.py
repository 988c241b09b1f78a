"""Bounded reliability runs of issue 14 (the full run is benchmarks/reliability.py): concurrent streams against
each request alone in every weight format, greedy and seeded; Poisson-ish overload; clients that leave mid-stream;
fuzzed bodies; raw HTTP; the API key. Loopback only, the tiny random model, every draw seeded, and no assertion
that rests on the host's speed: where requests must share a step, or still be running when their client leaves,
the test holds the engine (Gate) instead of racing it."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx
import openai
import pytest
from reliability_support import (
    BAD_REQUESTS,
    COMPLETIONS,
    FAILURES,
    LOGPROB_TOL,
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
    send_at,
    send_openai,
    tally,
    wait_idle,
)
from serve_support import KV_BYTES, running_server

from rooftop.engine.outputs import StepOutput

WEIGHTS = ["float", "int8", "int4"]  # every format the engine runs on the CPU: fp32, q8_0, q4_1
STREAMS = 16
DEADLINE_S = 120.0  # per request: a hang, not a slow host


class Gate:
    """Holds an LLM's engine: while held, a step does nothing (the engine thread still takes new requests and
    aborts between steps). `run_until(condition)` lets steps run until `condition(tokens)` holds, `tokens` being
    the output tokens each request id has had so far, then holds again; `open()` lets everything run."""

    def __init__(self, llm):
        self.llm, self._step = llm, llm.engine.step
        self.tokens: Counter = Counter()
        self.until: Callable[[Counter], bool] | None = None
        self.opened = False
        self.reached = threading.Event()
        llm.engine.step = self._gated

    def _gated(self) -> StepOutput:
        if self.opened:
            return self._step()
        if self.until is None or self.reached.is_set():
            time.sleep(0.005)
            return StepOutput()
        out = self._step()
        for d in out.deltas:
            self.tokens[d.request_id] += len(d.new_token_ids)
        if self.until(self.tokens):  # set before the deltas reach a client, who may then leave and end the steps
            self.reached.set()
        return out

    def hold(self) -> None:
        self.until, self.opened = None, False
        self.reached.clear()

    def run_until(self, condition: Callable[[Counter], bool]) -> None:
        self.reached.clear()
        self.until = condition

    def open(self) -> None:
        self.opened = True


def gated_llm(model, **engine):
    from rooftop import LLM

    llm = LLM(model=model, kv_cache_bytes=KV_BYTES, **engine)
    return llm, Gate(llm)


async def until(condition, timeout_s: float = 60.0) -> None:
    """Await `condition()` (a coroutine function), polling; a deadline, not a race."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def gauge(client, name: str) -> float:
    return parse_metrics((await client.get("/metrics")).text)[name]


async def _waiting_is(client, n: int) -> bool:
    return await gauge(client, "rooftop_num_requests_waiting") == n


async def _aborted_is(client, n: int) -> bool:
    return await gauge(client, 'rooftop_requests_total{outcome="abort"}') == n


def assert_engine_idle(llm) -> None:
    stats = llm.engine.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0), stats


@pytest.fixture(scope="module", params=WEIGHTS)
def gated_server(request, long_gguf):
    # no prefix caching: the batched run must not reuse the blocks the alone run cached, so that any difference is
    # the batch's
    llm, gate = gated_llm(long_gguf, weights=request.param, max_model_len=256, enable_prefix_caching=False)
    with running_server(None, llm=llm) as url:
        yield request.param, url, gate, llm


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_concurrent_streams_equal_each_alone(gated_server, sampling):
    """16 streams that share their steps (the engine is held until all 16 wait, so the first step prefills all of
    them together) give each request's tokens, and its logprobs within 1e-4, as the same request alone: greedy,
    and sampled at temperature 0.8 with a seed per request. Half the streams go through the openai client."""
    weights, url, gate, llm = gated_server
    seed = 1 if sampling == "greedy" else 2
    bodies = [
        completion_body(p, 12, seed=None if sampling == "greedy" else 1000 + i, model="tiny-long")
        for i, p in enumerate(prompts(seed, STREAMS))
    ]

    async def run():
        async with async_client(url, DEADLINE_S) as client:
            gate.open()
            alone = [await send(client, COMPLETIONS, b) for b in bodies]
            gate.hold()
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0) as ac:
                tasks = [
                    asyncio.create_task(send_openai(ac, b, DEADLINE_S) if i % 2 else send(client, COMPLETIONS, b))
                    for i, b in enumerate(bodies)
                ]
                await until(lambda: _waiting_is(client, STREAMS))
                gate.open()
                batched = await asyncio.gather(*tasks)
            return alone, batched

    alone, batched = asyncio.run(run())
    step = max(s["batch"] for s in httpx.get(f"{url}/dashboard/state", timeout=30).json()["steps"])
    assert step == STREAMS, f"the streams did not share a step (largest step: {step} sequences)"
    c = compare(batched, alone, tol=LOGPROB_TOL)
    assert c.passed, f"{weights} {sampling}: {c.differ + c.failed} of {c.requests} differ from alone: {c.examples}"
    assert_engine_idle(llm)


def test_poisson_overload_answers_every_request_and_frees_everything(long_gguf):
    """40 requests at seeded Poisson offsets into a server with 2 slots and 4 waiting places: each gets a full
    answer or a 429 with Retry-After and an error body; none gets a 5xx, a reset or a hang; then nothing is left
    running or holding KV blocks. How many get 429 depends on the host's speed; what each one gets does not."""
    from rooftop import LLM

    llm = LLM(model=long_gguf, kv_cache_bytes=KV_BYTES, max_model_len=256, max_num_seqs=2)
    rng = random.Random(3)
    bodies = [completion_body(p, rng.randint(4, 24), stream=rng.random() < 0.5, temperature=0) for p in prompts(3, 40)]
    offsets = poisson_offsets(3, len(bodies), rate=200.0)

    async def run():
        async with async_client(url, DEADLINE_S) as client:
            before = parse_metrics((await client.get("/metrics")).text)
            results = await send_at(offsets, bodies, client, DEADLINE_S)
            idle = await wait_idle(client, 60)
            after = parse_metrics((await client.get("/metrics")).text)
        return before, results, idle, after

    with running_server(None, llm=llm, max_waiting_requests=4) as url:
        before, results, (idle, state, _), after = asyncio.run(run())
    counts = tally(results)
    print("poisson overload:", counts)
    assert not any(counts.get(k) for k in FAILURES), [r.brief() for r in results if r.kind in FAILURES][:5]
    for r, b in zip(results, bodies, strict=True):
        if r.kind == "429":
            assert r.retry_after and r.error and r.error["type"] == "rate_limit_error"
        else:
            assert r.kind == "ok" and r.finish_reason == "length" and len(r.tokens) == b["max_tokens"], r.brief()
    rejected = (
        after['rooftop_requests_total{outcome="rejected"}'] - before['rooftop_requests_total{outcome="rejected"}']
    )
    assert rejected == counts.get("429", 0)
    assert idle, state
    assert_engine_idle(llm)


def test_clients_that_leave_mid_stream_are_aborted_and_free_everything(long_gguf):
    """20 clients leave while their requests run: 4 before their first token, 12 after 1-3 streamed tokens, 4
    non-streamed ones that close the connection. The engine holds once the requests still there have 3 tokens, so
    none can finish first. Every request is counted as aborted, running/waiting/KV blocks fall back to 0 (in
    /metrics, the dashboard's state and the engine) and the next request is served."""
    llm, gate = gated_llm(long_gguf, max_model_len=2048)
    rng = random.Random(4)
    modes = ["before first token"] * 4 + ["mid-stream"] * 12 + ["not streamed"] * 4
    rng.shuffle(modes)
    bodies = [completion_body(p, 1000) for p in prompts(4, len(modes))]
    staying = sum(m != "before first token" for m in modes)

    async def run():
        async with async_client(url, DEADLINE_S) as client:
            queued = asyncio.Event()
            reached = asyncio.Event()
            tasks = []
            for mode, body in zip(modes, bodies, strict=True):
                if mode == "not streamed":
                    tasks.append(asyncio.create_task(leave_unstreamed(url, body, reached)))
                else:
                    events = 0 if mode == "before first token" else rng.randint(1, 3)
                    tasks.append(asyncio.create_task(leave_mid_stream(client, body, events, DEADLINE_S, queued)))
            await until(lambda: _waiting_is(client, len(modes)))
            queued.set()
            await until(lambda: _aborted_is(client, len(modes) - staying))
            # the staying requests share every step from the first (one prefill of them all), so they have 3
            # tokens each at once; the clients that read fewer leave on the way, and are aborted between steps
            gate.run_until(lambda tokens: max(tokens.values(), default=0) >= 3)
            await asyncio.to_thread(gate.reached.wait, DEADLINE_S)
            reached.set()
            ended = await asyncio.gather(*tasks)
            await until(lambda: _aborted_is(client, len(modes)))
            idle = await wait_idle(client, 60)
            steps = (await client.get("/dashboard/state")).json()["steps"]
            gate.open()
            after = await send(client, COMPLETIONS, {"prompt": "and now", "max_tokens": 2})
        return ended, idle, steps, after

    with running_server(None, llm=llm) as url:
        ended, (idle, state, _), steps, after = asyncio.run(run())
    assert max(s["batch"] for s in steps) == staying  # they shared their steps, as the hold assumes
    assert [e for e in ended if e is not None] == ["left"] * (len(modes) - modes.count("not streamed"))
    assert idle, state
    assert after.kind == "ok"
    assert_engine_idle(llm)


def test_fuzzed_bodies_get_4xx_with_an_error_body_and_never_5xx(server):
    """300 seeded bodies over /v1/completions, /v1/chat/completions, /tokenize and /detokenize (wrong types, edge
    and huge numbers, NaN, unknown and missing fields, broken JSON, other content types, unicode junk, nesting,
    strings past the body limit): no 5xx, no reset, no hang, every 4xx an OpenAI-style error, every 2xx the route's
    body; then the server still answers a normal request."""
    cases = list(fuzz_cases(seed=5, count=300, max_string=100_000))

    async def run():
        async with async_client(server, DEADLINE_S) as client:
            result = await fuzz(client, cases, concurrency=4, deadline_s=DEADLINE_S)
            ok = await send(client, COMPLETIONS, {"prompt": "still fine?", "max_tokens": 2})
            idle = await wait_idle(client, 60)
        return result, ok, idle

    result, ok, (idle, state, _) = asyncio.run(run())
    print("fuzz:", result.as_dict())
    assert result.sent == len(cases)
    assert not result.problems, result.problems[:10]
    assert ok.kind == "ok" and idle, (ok.brief(), state)


def test_raw_http_broken_pipelined_and_kept_alive(server):
    """Over a socket: broken requests get a 4xx or a close, never a 5xx or silence; three pipelined requests get
    three answers in order; a keep-alive connection serves the next request after a 400, 404, 405 and 413; a
    half-sent request does not keep others from being served."""
    host = server.removeprefix("http://")
    broken = [bad_request_probe(server, name, data) for name, data in BAD_REQUESTS.items()]
    assert all(p["verdict"] in ("ok", "closed") for p in broken), [p for p in broken if p["verdict"] != "ok"]
    assert pipelined_probe(server)["verdict"] == "ok"
    for name, first, status in [
        ("after a 400", http_request("POST", COMPLETIONS, host, b'{"prompt": '), 400),
        ("after a 404", http_request("GET", "/nowhere", host), 404),
        ("after a 405", http_request("GET", COMPLETIONS, host), 405),
        ("after a 413", http_request("POST", COMPLETIONS, host, b'{"prompt": "' + b"x" * (70 << 10) + b'"}'), 413),
    ]:
        probe = keep_alive_probe(server, name, first, status)
        assert probe["verdict"].startswith("ok"), probe
    half = half_sent_probe(server, "half-sent headers", f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}\r\n".encode(), 1)
    assert half["others_served"], half


def test_api_key_guards_every_route_but_health_and_metrics(long_gguf):
    """With --api-key, every route but /health and /metrics refuses a missing or wrong key (issue 14, Must 6)."""
    with running_server(long_gguf, {"max_model_len": 128}, api_key="sekret") as url:
        rows = api_key_probe(url, "sekret")
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
