"""The load generator's pure parts by hand: summary metrics from made-up records, the SSE reader with given
timestamps, arrival schedules, goodput syntax and the datasets."""

import json
import math

import numpy as np
import pytest

from rooftop.bench.serve.arrivals import arrival_offsets
from rooftop.bench.serve.client import StreamError, StreamReader, Target, api_base
from rooftop.bench.serve.datasets import (
    SampleRequest,
    jsonl_requests,
    load_tokenizer,
    random_requests,
    sharegpt_requests,
)
from rooftop.bench.serve.metrics import RequestRecord, parse_goodput, summarize
from rooftop.errors import InvalidRequestError


def records() -> list[RequestRecord]:
    return [
        RequestRecord(
            0,
            prompt_len=10,
            max_tokens=3,
            send_time_s=0.0,
            ttft_s=0.1,
            itl_s=[0.02, 0.03],
            e2el_s=0.15,
            output_tokens=3,
        ),
        RequestRecord(
            1, prompt_len=20, max_tokens=2, send_time_s=0.1, ttft_s=0.2, itl_s=[0.05], e2el_s=0.25, output_tokens=2
        ),
        RequestRecord(
            2, prompt_len=30, max_tokens=1, send_time_s=1.0, ttft_s=0.3, itl_s=[], e2el_s=0.3, output_tokens=1
        ),
        RequestRecord(
            3, prompt_len=40, max_tokens=4, send_time_s=1.2, ttft_s=0.05, itl_s=[0.01], error="HTTP 500: boom"
        ),
    ]


def test_summary_by_hand():
    s = summarize(records(), duration_s=2.0)
    assert (s["completed"], s["failed"], s["duration_s"]) == (3, 1, 2.0)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (60, 6)  # the failed request's 40 left out
    assert s["request_throughput_req_per_s"] == 1.5
    assert s["output_throughput_tok_per_s"] == 3.0
    assert s["total_token_throughput_tok_per_s"] == 33.0
    # token times 0.1 0.12 0.15 | 0.3 0.35 | 1.3: five tokens in second 0
    assert s["peak_output_throughput_tok_per_s"] == 5.0
    assert s["peak_concurrent_requests"] == 2  # 0-0.15 and 0.1-0.35 overlap
    expected = {
        "ttft": (200, 200, math.sqrt(20000 / 3), 280, 298),  # 100 200 300
        "tpot": (37.5, 37.5, 12.5, 47.5, 49.75),  # (150-100)/2 = 25 and (250-200)/1 = 50; one-token request has none
        "itl": (100 / 3, 30, np.std([20, 30, 50]), 46, 49.6),  # 20 30 | 50 (the failure's 10 left out)
        "e2el": (700 / 3, 250, np.std([150, 250, 300]), 290, 299),
    }
    for name, values in expected.items():
        got = [s[f"{name}_ms_{stat}"] for stat in ("mean", "median", "std", "p90", "p99")]
        assert got == pytest.approx(values, abs=1e-9), name
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert s["goodput_req_per_s"] is None


@pytest.mark.parametrize(
    "slos, good",
    [({"ttft": 250}, 2), ({"tpot": 30}, 2), ({"ttft": 250, "tpot": 30}, 1), ({"e2el": 150}, 1), ({"ttft": 50}, 0)],
)
def test_goodput_counts_requests_meeting_every_slo(slos, good):
    # TPOTs 25, 50 and (one token) 0 as vLLM counts it; the failed request never counts
    assert summarize(records(), 2.0, slos)["goodput_req_per_s"] == good / 2.0


def test_multi_token_chunks_count_every_token():
    r = RequestRecord(0, 5, 4, send_time_s=0.0, ttft_s=0.1, itl_s=[0.1], e2el_s=0.2, output_tokens=4)
    s = summarize([r], 1.0)
    assert s["peak_output_throughput_tok_per_s"] == 4.0
    assert s["tpot_ms_mean"] == pytest.approx(100 / 3)  # (200 - 100) / (4 - 1), not per chunk
    assert s["itl_ms_mean"] == pytest.approx(100)


def test_no_completed_requests():
    s = summarize(records()[3:], 1.0, {"ttft": 1})
    assert s["completed"] == 0 and s["failed"] == 1 and s["ttft_ms_p99"] is None and s["goodput_req_per_s"] == 0
    assert s["peak_output_throughput_tok_per_s"] == 0 and s["peak_concurrent_requests"] == 0


def test_records_round_trip_through_json():
    rs = [RequestRecord.from_dict(json.loads(json.dumps(r.to_dict()))) for r in records()]
    assert rs == records()


def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50.5", "e2el:2000"]) == {"ttft": 500, "tpot": 50.5, "e2el": 2000}
    assert parse_goodput(["ttft:500 tpot:50"]) == parse_goodput(["ttft:500,tpot:50"]) == {"ttft": 500, "tpot": 50}
    for bad in ("ttft=500", "itl:5", "ttft:", "ttft:-1", "ttft:abc", "ttft:inf"):
        with pytest.raises(InvalidRequestError, match="NAME:MS"):
            parse_goodput([bad])


def feed_all(reader: StreamReader, pieces: list[tuple[bytes, float]]) -> RequestRecord:
    for data, t in pieces:
        reader.feed(data, t)
    reader.finish()
    return reader.record


def chunk(text: str | None = None, finish: str | None = None, chat: bool = True, usage: dict | None = None) -> bytes:
    choice = {"index": 0, "finish_reason": finish}
    choice.update({"delta": {"content": text} if text is not None else {}} if chat else {"text": text or ""})
    event = {"choices": [choice] if usage is None else [], **({"usage": usage} if usage else {})}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_stream_reader_times_token_chunks_only():
    role = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
    first = chunk("Hel")
    pieces = [
        (role, 10.01),  # no text: not a token
        (first[:20], 10.05),  # half an event: nothing yet
        (first[20:] + chunk("lo"), 10.10),  # the rest of one event and a whole second one in one read
        (b": keep-alive comment\r\n\r\n" + chunk(" world"), 10.13),
        (chunk(finish="length") + chunk(usage={"prompt_tokens": 4, "completion_tokens": 3}), 10.2),
        (b"data: [DONE]\n\n", 10.21),
    ]
    r = feed_all(StreamReader(RequestRecord(0, 4, 3), sent=10.0), pieces)
    assert r.ttft_s == pytest.approx(0.10)
    assert r.itl_s == pytest.approx([0.0, 0.03])  # "lo" arrived with "Hel"
    assert r.e2el_s == pytest.approx(0.13)  # the last token, not the usage or [DONE]
    assert (r.output_tokens, r.output_tokens_from, r.server_prompt_tokens, r.text) == (3, "usage", 4, "Hello world")


def test_stream_reader_completions_without_usage():
    r = feed_all(
        StreamReader(RequestRecord(0, 1, 2), 0.0),
        [(chunk("a", chat=False), 1.0), (chunk("b", "stop", chat=False), 1.5)],
    )
    assert (r.ttft_s, r.itl_s, r.e2el_s, r.output_tokens, r.text) == (1.0, [0.5], 1.5, None, "ab")


@pytest.mark.parametrize(
    "data, message",
    [
        (chunk("a") + b'data: {"error": {"message": "out of memory"}}\n\n', "out of memory"),
        (b"data: {not json\n\n", "not a JSON chunk"),
        (chunk(finish="stop") + b"data: [DONE]\n\n", "no output tokens"),
        (chunk("a"), "ended before a finish_reason or \\[DONE\\]"),
    ],
)
def test_stream_reader_failures(data, message):
    with pytest.raises(StreamError, match=message):
        feed_all(StreamReader(RequestRecord(0, 1, 2), 0.0), [(data, 1.0)])


def test_request_bodies_are_vllms():
    t = Target("http://x/v1/completions", "m", chat=False)
    assert t.body(SampleRequest("hi", 1, 7)) == {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 7,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chat = Target("u", "m", chat=True, ignore_eos=False).body(SampleRequest("hi", 1, 7))
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "ignore_eos" not in chat and "prompt" not in chat


def test_api_base():
    assert api_base("http://h:8000") == api_base("http://h:8000/") == "http://h:8000/v1"
    assert api_base("http://h:8000/v1/") == "http://h:8000/v1"
    assert api_base("https://h/openai/v1") == "https://h/openai/v1"
    with pytest.raises(InvalidRequestError, match="--base-url"):
        api_base("localhost:8000")


def test_arrivals():
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    poisson = np.diff(arrival_offsets(4001, rate=10, burstiness=1.0, seed=1))
    steady = np.diff(arrival_offsets(4001, rate=10, burstiness=4.0, seed=1))
    for gaps, cv in ((poisson, 1.0), (steady, 0.5)):  # gamma: mean 1/rate, coefficient of variation 1/sqrt(shape)
        assert gaps.mean() == pytest.approx(0.1, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    assert arrival_offsets(5, 2.0, 0.5, seed=3) == arrival_offsets(5, 2.0, 0.5, seed=3)
    assert arrival_offsets(5, 2.0, 0.5, seed=3)[0] == 0.0
    for rate, burst in ((0, 1), (-1, 1), (1, 0)):
        with pytest.raises(InvalidRequestError):
            arrival_offsets(3, rate, burst)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def test_random_prompts_have_the_asked_lengths(tok):
    exact = random_requests(tok, 20, 64, 8, 0.0, seed=0)
    assert [r.prompt_len for r in exact] == [64] * 20 and {r.output_len for r in exact} == {8}
    assert all(len(tok.encode(r.prompt, add_special_tokens=False)) == 64 for r in exact)
    assert len({r.prompt for r in exact}) == 20
    spread = random_requests(tok, 50, 100, 10, 0.5, seed=0)
    assert all(45 <= r.prompt_len <= 155 and 5 <= r.output_len <= 15 for r in spread)
    assert len({r.prompt_len for r in spread}) > 10
    assert [r.prompt for r in random_requests(tok, 3, 16, 4, 0.0, 7)] == [
        r.prompt for r in random_requests(tok, 3, 16, 4, 0.0, 7)
    ]
    with pytest.raises(InvalidRequestError, match="range-ratio"):
        random_requests(tok, 1, 10, 10, 1.0, 0)


def test_sharegpt_prompts(tok, tmp_path):
    long_reply = " ".join(["word"] * 30)
    data = [
        {
            "conversations": [
                {"from": "human", "value": "Tell me about the sea, please."},
                {"from": "gpt", "value": long_reply},
            ]
        },
        {
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": long_reply}]
        },  # prompt < 4 tokens
        {"conversations": [{"from": "human", "value": "only one turn in this one"}]},
        {"id": "no conversations"},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    got = sharegpt_requests(path, tok, 3, None, seed=0)
    assert [r.prompt for r in got] == ["Tell me about the sea, please."] * 3  # the one usable prompt, repeated
    assert got[0].output_len == len(tok.encode(long_reply)) and got[0].prompt_len == len(tok.encode(got[0].prompt))
    assert sharegpt_requests(path, tok, 1, 5, seed=0)[0].output_len == 5
    path.write_text("{}")
    with pytest.raises(InvalidRequestError, match="JSON list"):
        sharegpt_requests(path, tok, 1, None, 0)


def test_jsonl_prompts_and_their_errors(tok, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one"}\n\n{"prompt": "two", "other": 1}\n')
    got = jsonl_requests(path, tok, 4, 9, seed=0)
    assert sorted({r.prompt for r in got}) == ["one", "two"] and len(got) == 4 and {r.output_len for r in got} == {9}
    for text, message in (
        ('{"prompt": "a"}\n{"text": "b"}\n', "line 2: needs"),
        ('{"prompt": "a"}\n{oops\n', "line 2: not valid JSON"),
    ):
        path.write_text(text)
        with pytest.raises(InvalidRequestError, match=message):
            jsonl_requests(path, tok, 1, 9, 0)
    with pytest.raises(InvalidRequestError, match="cannot read"):
        jsonl_requests(tmp_path / "missing.jsonl", tok, 1, 9, 0)
