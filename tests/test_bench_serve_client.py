"""The load generator against a scripted streaming server whose chunk timings are known: metrics equal the
hand computation from the client's own timestamps and match the script's delays; failures are counted with
their errors and leave the survivors' metrics alone."""

import asyncio

import numpy as np
import pytest
from scripted_openai_server import MODEL, Script, ScriptedServer

from rooftop.bench.serve.client import Target
from rooftop.bench.serve.datasets import SampleRequest, load_tokenizer
from rooftop.bench.serve.metrics import summarize
from rooftop.bench.serve.runner import run_load

# A chunk never comes before its script (the server sleeps first); how late it comes is the host's business: 130 ms
# has been seen on 2 busy cores. The upper bound only catches a clock started at the wrong moment.
EARLY_S, LATE_S = 0.005, 1.0
# The server sleeps between chunks, so only times counted from the request are bounded below: a first chunk that
# reaches the client late makes the next gap look short. Gaps are checked through their sum, e2el.


def near(measured: float, scripted: float, late: float = LATE_S) -> bool:
    return scripted - EARLY_S <= measured <= scripted + late


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def run(
    server: ScriptedServer,
    prompts: list[str],
    tok,
    max_tokens=5,
    chat=False,
    concurrency=None,
    offsets=None,
    timeout=10.0,
):
    target = Target(f"{server.base_url}/{'chat/completions' if chat else 'completions'}", MODEL, chat, True, timeout)
    requests = [SampleRequest(p, 1, max_tokens) for p in prompts]
    asyncio.run(run_load(target, requests[:1], [0.0], 1, tok))  # warm-up: httpx's first-use imports
    server.bodies.clear()
    return asyncio.run(run_load(target, requests, offsets or [0.0] * len(requests), concurrency, tok))


def test_metrics_equal_the_hand_computation_and_the_script(tok):
    with ScriptedServer(Script(first_delay=0.05, gap=0.02)) as server:
        out = run(server, ["hello"] * 4, tok, max_tokens=5, concurrency=2)
    rs = out.records
    assert all(r.ok for r in rs) and [r.index for r in rs] == [0, 1, 2, 3]
    for r in rs:
        assert (r.output_tokens, r.output_tokens_from, r.server_prompt_tokens) == (5, "usage", 7)
        assert len(r.itl_s) == 4  # five token chunks; the finish_reason, usage and [DONE] chunks carry none
        assert r.e2el_s == pytest.approx(r.ttft_s + sum(r.itl_s), abs=1e-9)
        assert near(r.ttft_s, 0.05) and r.ttft_s >= 0.05  # the server sleeps 50 ms before its first chunk
        assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 4)
        assert near(r.e2el_s, 0.05 + 4 * 0.02)
    s = summarize(rs, out.duration_s)
    ms = lambda values: np.asarray(values) * 1e3  # noqa: E731
    assert s["ttft_ms_mean"] == pytest.approx(ms([r.ttft_s for r in rs]).mean())
    assert s["ttft_ms_p99"] == pytest.approx(np.percentile(ms([r.ttft_s for r in rs]), 99))
    assert s["tpot_ms_median"] == pytest.approx(np.median(ms([(r.e2el_s - r.ttft_s) / 4 for r in rs])))
    assert s["itl_ms_p90"] == pytest.approx(np.percentile(ms([g for r in rs for g in r.itl_s]), 90))
    assert s["e2el_ms_mean"] == pytest.approx(ms([r.e2el_s for r in rs]).mean())
    assert s["itl_ms_median"] == pytest.approx(np.median(ms([g for r in rs for g in r.itl_s])))
    assert s["total_output_tokens"] == 20 and s["output_throughput_tok_per_s"] == pytest.approx(20 / out.duration_s)
    # two at a time: the second pair is sent when the first finishes, ~0.05 + 4 * 0.02 = 0.13 s in
    assert s["peak_concurrent_requests"] == 2
    assert near(sorted(r.send_time_s for r in rs)[2], 0.13)
    assert near(out.duration_s, 0.26, late=2 * LATE_S)  # two rounds of lateness
    assert out.client["chunks"] >= 4 * 5 and out.client["client_overhead_us_per_chunk_mean"] < 1000


def test_request_body_and_ignore_eos(tok):
    with ScriptedServer() as server:
        run(server, ["a prompt"], tok, max_tokens=3)
        body = server.bodies[0]
    assert body == {
        "model": MODEL,
        "prompt": "a prompt",
        "max_tokens": 3,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def test_chat_without_usage_counts_tokens_with_the_tokenizer(tok):
    with ScriptedServer(Script(first_delay=0.06, gap=0.01, usage=False)) as server:
        out = run(server, ["hi"], tok, max_tokens=6, chat=True)
    r = out.records[0]
    assert r.ok and r.text == " the" * 6
    assert (r.output_tokens, r.output_tokens_from) == (6, "tokenizer")
    assert r.ttft_s >= 0.06  # from the first chunk with text, not the role chunk sent at once
    assert len(r.itl_s) == 5


def test_chunks_of_several_tokens(tok):
    with ScriptedServer(Script(first_delay=0.03, gap=0.03, per_chunk=2)) as server:
        out = run(server, ["hi"], tok, max_tokens=6)
    r = out.records[0]
    assert r.output_tokens == 6 and len(r.itl_s) == 2  # three chunks of two tokens
    assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 5) and near(r.e2el_s, 0.03 + 2 * 0.03)


def test_arrivals_follow_the_schedule(tok):
    offsets = [0.0, 0.05, 0.1, 0.25]
    with ScriptedServer(Script(first_delay=0.01, gap=0.01)) as server:
        out = run(server, ["x"] * 4, tok, max_tokens=2, offsets=offsets)
    assert all(near(r.send_time_s, t) for r, t in zip(out.records, offsets, strict=False))


def test_failures_are_counted_with_their_errors_and_leave_the_rest_alone(tok):
    prompts = ["ok 1", "FAIL500", "ok 2", "BREAK", "ok 3", "HANG", "ERRCHUNK", "EMPTY", "ok 4"]
    with ScriptedServer(Script(first_delay=0.05, gap=0.02)) as server:
        out = run(server, prompts, tok, max_tokens=5, timeout=1.0)
    by_prompt = dict(zip(prompts, out.records, strict=False))
    assert by_prompt["FAIL500"].error == 'HTTP 500: {"error": {"message": "scripted failure"}}'
    assert by_prompt["BREAK"].error.startswith("RemoteProtocolError: peer closed connection")
    assert by_prompt["BREAK"].ttft_s is not None and by_prompt["BREAK"].e2el_s is None  # kept for diagnosis only
    assert by_prompt["HANG"].error == "timed out after 1 s"
    assert by_prompt["ERRCHUNK"].error == "scripted mid-stream error"
    assert by_prompt["EMPTY"].error == "the stream carried no output tokens"
    s = summarize(out.records, out.duration_s)
    assert (s["completed"], s["failed"]) == (4, 5)
    assert sum(s["errors"].values()) == 5 and "scripted mid-stream error" in s["errors"]
    survivors = [r for r in out.records if r.ok]
    alone = summarize(survivors, out.duration_s)
    for key in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p99"):
            assert s[f"{key}_ms_{stat}"] == alone[f"{key}_ms_{stat}"], (key, stat)
    assert s["total_output_tokens"] == 20  # the broken stream's two tokens are not counted
    # nine streams at once share these cores with the server thread: lateness adds up
    assert near(s["ttft_ms_median"] / 1e3, 0.05, late=3 * LATE_S) and near(s["itl_ms_median"] / 1e3, 0.02)
    assert out.duration_s >= 1.0  # the run waits for the hung request's timeout
