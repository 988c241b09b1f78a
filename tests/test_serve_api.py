"""rooftop serve through real HTTP on a loopback port: the openai client, streaming, concurrency, metrics,
disconnects, backpressure and the API key (the tiny random model: the text is noise, the plumbing is not)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest
from serve_support import api_error, held_server, metrics, running_server, sse_events

import rooftop

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def client(url: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_health_and_models(server):
    assert httpx.get(f"{server}/health").status_code == 200
    models = client(server).models.list().data
    assert [m.id for m in models] == ["tiny-long"] and models[0].max_model_len == 256
    assert "/" not in models[0].model_extra["root"]  # the file's name, never a path on the server
    for path in ("/health", "/metrics", "/v1/models", "/"):  # HEAD wherever GET exists
        head = httpx.head(f"{server}{path}")
        assert head.status_code == 200 and head.content == b"", path


def test_chat_streamed_equals_not_streamed_with_usage(server):
    c = client(server)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi there"}]
    full = c.chat.completions.create(model="tiny-long", messages=messages, max_tokens=12, **GREEDY)
    assert full.object == "chat.completion" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    prompt_tokens = httpx.post(f"{server}/tokenize", json={"messages": messages}).json()["count"]
    assert full.usage.prompt_tokens == prompt_tokens
    assert full.usage.total_tokens == prompt_tokens + 12
    chunks = list(
        c.chat.completions.create(
            model="tiny-long",
            messages=messages,
            max_completion_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, 12)
    assert usage.prompt_tokens_details.cached_tokens == 32  # the same prompt again: two full blocks were cached


def test_completions_streamed_equals_not_streamed_with_usage(server):
    c = client(server)
    full = c.completions.create(model="tiny-long", prompt="Once upon a time", max_tokens=10, **GREEDY)
    assert full.usage.prompt_tokens == len("Once upon a time") and full.usage.completion_tokens == 10
    chunks = list(
        c.completions.create(model="tiny-long", prompt="Once upon a time", max_tokens=10, stream=True, **GREEDY)
    )
    assert "".join(ch.choices[0].text for ch in chunks) == full.choices[0].text
    by_ids = c.completions.create(
        model="tiny-long", prompt=[ord(ch) + 3 for ch in "Once upon a time"], max_tokens=10, **GREEDY
    )
    assert by_ids.choices[0].text == full.choices[0].text  # byte vocabulary: id = byte + 3 specials


def test_sse_is_framed_exactly_as_openai(server):
    body = {"prompt": "abc", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    text = httpx.post(f"{server}/v1/completions", json=body).text
    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: ") for e in events[:-1])
    last = json.loads(events[-3].removeprefix("data: "))
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    final = json.loads(events[-4].removeprefix("data: "))
    assert final["choices"][0]["finish_reason"] == "length" and final["timings"]["output_tokens"] == 3


def test_timings_and_prefix_cache_hits(server):
    c = client(server)
    prompt = "A long shared prefix that fills several KV blocks of sixteen tokens each. "
    first = c.completions.create(model="tiny-long", prompt=prompt, max_tokens=4, **GREEDY)
    second = c.completions.create(model="tiny-long", prompt=prompt, max_tokens=4, **GREEDY)
    t = second.model_extra["timings"]
    assert set(t) >= {
        "queue_ms",
        "ttft_ms",
        "tpot_ms",
        "prefill_ms",
        "decode_ms",
        "prompt_tokens",
        "output_tokens",
        "cached_tokens",
    }
    assert t["prompt_tokens"] == len(prompt) and t["output_tokens"] == 4
    assert 0 <= t["queue_ms"] <= t["ttft_ms"] <= t["e2e_ms"] and t["tpot_ms"] > 0 and t["prefill_ms"] > 0
    assert first.model_extra["timings"]["cached_tokens"] == 0
    assert t["cached_tokens"] == second.usage.prompt_tokens_details.cached_tokens == len(prompt) // 16 * 16


def test_sampling_fields_reach_the_engine(server):
    c = client(server)

    def text(**fields) -> tuple[str, str]:
        choice = c.completions.create(model="tiny-long", prompt="Sample me", max_tokens=24, **fields).choices[0]
        return choice.text, choice.finish_reason

    seeded = text(temperature=1.0, seed=7, top_p=0.9, extra_body={"top_k": 50, "min_p": 0.01})
    assert text(temperature=1.0, seed=7, top_p=0.9, extra_body={"top_k": 50, "min_p": 0.01}) == seeded
    greedy, _ = text(temperature=0, extra_body={"ignore_eos": True})
    assert (
        text(temperature=0, frequency_penalty=2.0, presence_penalty=1.0, extra_body={"ignore_eos": True})[0] != greedy
    )
    assert text(temperature=0, extra_body={"ignore_eos": True, "repetition_penalty": 1.5})[0] != greedy
    stop = greedy[5:7]
    assert text(temperature=0, stop=[stop], extra_body={"ignore_eos": True}) == (greedy[: greedy.index(stop)], "stop")
    # vLLM's stop_reason: the stop string that ended the choice (None for the length), in the reply and the stream
    same = {"model": "tiny-long", "prompt": "Sample me", "max_tokens": 24, "temperature": 0, "stop": [stop]}
    stopped = c.completions.create(**same, extra_body={"ignore_eos": True})
    assert stopped.choices[0].model_extra["stop_reason"] == stop
    chunks = list(
        c.completions.create(
            model="tiny-long", prompt="Sample me", max_tokens=24, temperature=0, stop=[stop], stream=True
        )
    )
    assert [ch.choices[0].model_extra["stop_reason"] for ch in chunks if ch.choices[0].finish_reason] == [stop]
    long = c.completions.create(model="tiny-long", prompt="Sample me", max_tokens=2, temperature=0)
    assert long.choices[0].finish_reason == "length" and long.choices[0].model_extra["stop_reason"] is None


def test_logprobs(server):
    c = client(server)
    chat = c.chat.completions.create(
        model="tiny-long",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
        **GREEDY,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.top_logprobs[0].token == e.token and e.logprob <= 0 for e in content)  # greedy picks the top
    text = c.completions.create(model="tiny-long", prompt="hi", max_tokens=4, logprobs=2, **GREEDY)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == text.choices[0].text  # one byte per token, all printable here or not: same decode
    # a drawn token outside the top 1 is in its position's top_logprobs too (OpenAI's "up to logprobs + 1")
    drawn = c.completions.create(model="tiny-long", prompt="hi", max_tokens=16, logprobs=1, temperature=5.0, seed=3)
    lp = drawn.choices[0].logprobs
    assert all(
        t in top and top[t] == got for t, got, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    )
    assert any(len(top) == 2 for top in lp.top_logprobs)  # at temperature 5, some drawn token is not the likeliest


def test_n_choices_are_indexed_seeded_shared_and_counted(server):
    """n = 3: choices 0..2, choice i exactly the request alone with seed + i (vLLM's rule); streamed, the choices
    interleave by index with the same texts; usage counts the prompt once and every choice's tokens; the second and
    third choices take the prompt's two chunks from the first's prefix cache instead of computing them."""
    c = client(server)
    prompt = "n choices share this prompt of forty-one!"  # 41 bytes: two chunks of 16 are shared
    body = {"model": "tiny-long", "prompt": prompt, "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3}
    hits = metrics(server)["rooftop_prefix_cache_hits_total"]
    full = c.completions.create(**body, extra_body={"ignore_eos": True})
    assert metrics(server)["rooftop_prefix_cache_hits_total"] - hits == 2 * 32
    assert [ch.index for ch in full.choices] == [0, 1, 2] and len({ch.text for ch in full.choices}) == 3
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (41, 18)
    for i, choice in enumerate(full.choices):
        alone = c.completions.create(**{**body, "n": 1, "seed": 5 + i}, extra_body={"ignore_eos": True})
        assert alone.choices[0].text == choice.text
    stream = c.completions.create(
        **body, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
    )
    texts, finished, order = ["", "", ""], [None] * 3, []
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finished[choice.index] = choice.finish_reason or finished[choice.index]
            order.append(choice.index)
    assert texts == [ch.text for ch in full.choices] and finished == ["length"] * 3
    assert order != sorted(order)  # interleaved, not one choice after another
    assert chunk.usage.completion_tokens == 18
    chat = c.chat.completions.create(
        model="tiny-long", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, stream=True, **GREEDY
    )
    roles = [ch.choices[0].index for ch in chat if ch.choices and ch.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]


def test_a_batch_of_prompts_gets_each_prompts_choices_in_order(server):
    """OpenAI's batched completion: a list of prompts (text or token ids), each with its n choices; choice j of prompt
    i at index i * n + j, each exactly that prompt alone with seed + j; usage counts each prompt once. Streamed, the
    same texts under the same indexes."""
    c = client(server)
    prompts = ["The first prompt", "A second, longer prompt"]
    body = {"model": "tiny-long", "max_tokens": 5, "temperature": 1.0, "seed": 7, "n": 2}
    full = c.completions.create(prompt=prompts, **body, extra_body={"ignore_eos": True})
    assert [ch.index for ch in full.choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):
        alone = c.completions.create(prompt=prompt, **body, extra_body={"ignore_eos": True})
        assert [ch.text for ch in alone.choices] == [ch.text for ch in full.choices[2 * i : 2 * i + 2]]
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (sum(map(len, prompts)), 20)
    as_ids = [[ord(ch) + 3 for ch in p] for p in prompts]  # byte vocabulary: id = byte + 3 specials
    by_ids = c.completions.create(prompt=as_ids, **body, extra_body={"ignore_eos": True})
    assert [ch.text for ch in by_ids.choices] == [ch.text for ch in full.choices]
    stream = c.completions.create(
        prompt=prompts, **body, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
    )
    texts = [""] * 4
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [ch.text for ch in full.choices] and chunk.usage.prompt_tokens == full.usage.prompt_tokens


def test_logit_bias_forces_and_bans_tokens(server):
    """The tiny model's vocabulary is bytes (id = byte + 3): +100 on "z" makes every token "z"; -100 on the token
    greedy picks makes it pick another."""
    c = client(server)

    def text(prompt: str, bias: dict | None = None) -> str:
        return (
            c.completions.create(model="tiny-long", prompt=prompt, max_tokens=4, logit_bias=bias, **GREEDY)
            .choices[0]
            .text
        )

    assert text("hi", {str(ord("z") + 3): 100}) == "zzzz"
    prompt = next(p for p in ("hi", "ab", "xyz", "0", "Q", "the", "!?") if text(p)[:1].isascii() and text(p)[:1])
    first = text(prompt)[0]
    assert text(prompt, {str(ord(first) + 3): -100})[:1] != first


def test_vllms_output_fields_on_both_endpoints_streamed_or_not(server):
    """The tiny vocabulary: EOS is id 2, <|im_start|> id 1, "a" id 100, "z" id 125, "y" 124. min_tokens holds back
    a forced EOS, include_stop_str_in_output keeps the stop string, skip_special_tokens false shows <|im_start|>,
    bad_words "zz" makes every other "z" a "y", allowed_token_ids [100] every token "a"."""
    c = client(server)
    messages = [{"role": "user", "content": "hi"}]

    def both(**fields) -> tuple[str, int]:
        """Each endpoint's text and token count, streamed and not, which must agree."""
        answers = []
        for chat in (True, False):
            call = c.chat.completions.create if chat else c.completions.create
            where = {"messages": messages} if chat else {"prompt": "hi"}
            full = call(model="tiny-long", max_tokens=6, temperature=0, **where, **fields)
            text = full.choices[0].message.content if chat else full.choices[0].text
            chunks = list(call(model="tiny-long", max_tokens=6, temperature=0, stream=True, **where, **fields))
            pieces = [(ch.choices[0].delta.content if chat else ch.choices[0].text) or "" for ch in chunks]
            assert "".join(pieces) == text
            answers.append((text, full.usage.completion_tokens))
        assert answers[0][1] == answers[1][1]
        return answers[1]

    assert both(logit_bias={"2": 100}) == ("", 1)
    assert both(logit_bias={"2": 100}, extra_body={"min_tokens": 3})[1] == 4
    zs = {"logit_bias": {"125": 100}, "stop": ["zz"]}
    assert both(**zs) == ("", 2)
    assert both(**zs, extra_body={"include_stop_str_in_output": True}) == ("zz", 2)
    assert both(**zs, extra_body={"include_stop_str_in_output": True, "min_tokens": 3}) == ("zzzz", 4)
    starts = {"logit_bias": {"1": 100}}
    assert both(**starts) == ("", 6)
    shown = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    assert both(**starts, extra_body=shown) == ("<|im_start|>" * 6, 6)
    zy = {"logit_bias": {"125": 100, "124": 50}, "extra_body": {"ignore_eos": True, "bad_words": ["zz"]}}
    assert both(**zy) == ("zyzyzy", 6)
    assert both(extra_body={"ignore_eos": True, "allowed_token_ids": [100]}) == ("aaaaaa", 6)
    error = api_error(httpx.post(f"{server}/v1/completions", json={"prompt": "hi", "allowed_token_ids": [300]}), 400)
    assert error["param"] == "allowed_token_ids" and "out of range [0, 259)" in error["message"]


def test_echo_puts_the_prompt_before_each_choice(server):
    """Each choice of a batch of two prompts starts with its prompt, streamed or not; a prompt of token ids is echoed
    as their text."""
    c = client(server)
    batch = {"model": "tiny-long", "prompt": ["Echo", "ab"], "n": 2, "max_tokens": 4, "echo": True, **GREEDY}
    plain = [
        c.completions.create(**batch | {"prompt": p, "n": 1, "echo": False}).choices[0].text for p in batch["prompt"]
    ]
    echoed = c.completions.create(**batch)
    assert [ch.text for ch in echoed.choices] == ["Echo" + plain[0]] * 2 + ["ab" + plain[1]] * 2
    assert echoed.usage.completion_tokens == 16
    texts = [""] * 4
    for chunk in c.completions.create(**batch, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [ch.text for ch in echoed.choices]
    by_ids = c.completions.create(**batch | {"prompt": [ord(ch) + 3 for ch in "Echo"], "n": 1})
    assert by_ids.choices[0].text == "Echo" + plain[0]


def test_echo_with_max_tokens_0_gives_the_prompt_and_its_logprobs_alone(server):
    """OpenAI's and vLLM's way to score a prompt: echo with max_tokens 0 returns the prompt's text and its tokens'
    logprobs (the first null), nothing generated, finished for its length; streamed the same. Without echo, 0 is
    refused."""
    c = client(server)
    ask = {"model": "tiny-long", "prompt": ["Score me", "ab"], "echo": True, "logprobs": 1, **GREEDY}
    scored = c.completions.create(**ask, max_tokens=0)
    one_more = c.completions.create(**ask, max_tokens=1)
    assert [ch.text for ch in scored.choices] == ["Score me", "ab"]
    assert [ch.finish_reason for ch in scored.choices] == ["length", "length"]
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == one_more.usage.prompt_tokens
    assert scored.model_extra["timings"]["output_tokens"] == scored.model_extra["timings"]["predicted_n"] == 0
    for got, more in zip(scored.choices, one_more.choices, strict=True):
        n = len(got.logprobs.tokens)
        assert "".join(got.logprobs.tokens) == got.text and got.logprobs.token_logprobs[0] is None
        assert len(more.logprobs.tokens) == n + 1
        assert got.logprobs.token_logprobs == more.logprobs.token_logprobs[:n]
        assert got.logprobs.top_logprobs[1:] == more.logprobs.top_logprobs[1:n]
    streamed = {"text": ["", ""], "logprobs": [[], []], "finish": [None, None]}
    for chunk in c.completions.create(**ask, max_tokens=0, stream=True):
        for choice in chunk.choices:
            streamed["text"][choice.index] += choice.text
            if choice.logprobs is not None:
                streamed["logprobs"][choice.index] += choice.logprobs.token_logprobs
            streamed["finish"][choice.index] = choice.finish_reason or streamed["finish"][choice.index]
        if chunk.choices and chunk.choices[0].finish_reason:
            assert chunk.model_extra["timings"]["output_tokens"] == 0
    assert streamed["text"] == ["Score me", "ab"] and streamed["finish"] == ["length", "length"]
    assert streamed["logprobs"] == [ch.logprobs.token_logprobs for ch in scored.choices]
    error = api_error(httpx.post(f"{server}/v1/completions", json={"prompt": "hi", "max_tokens": 0}), 400)
    assert error["param"] == "max_tokens" and "got 0" in error["message"]
    body = {"prompt": "hi", "max_tokens": 0, "echo": True, "min_tokens": 2}
    error = api_error(httpx.post(f"{server}/v1/completions", json=body), 400)
    assert error["param"] == "min_tokens" and error["message"] == "min_tokens must be at most max_tokens (0), got 2"


def test_32_concurrent_streams_each_equal_alone(server):
    prompts = [f"Request {i}: {'ab' * (i % 7)}" for i in range(32)]
    lengths = [4 + i % 5 for i in range(32)]
    c = client(server)
    alone = [
        c.completions.create(model="tiny-long", prompt=p, max_tokens=n, **GREEDY).choices[0].text
        for p, n in zip(prompts, lengths, strict=False)
    ]

    async def streamed(ac: openai.AsyncOpenAI, prompt: str, n: int) -> tuple[str, str]:
        stream = await ac.completions.create(model="tiny-long", prompt=prompt, max_tokens=n, stream=True, **GREEDY)
        parts, reason = [], None
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        return "".join(parts), reason

    async def all_at_once() -> list[tuple[str, str]]:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as ac:
            return await asyncio.gather(*(streamed(ac, p, n) for p, n in zip(prompts, lengths, strict=False)))

    before = metrics(server)
    results = asyncio.run(all_at_once())
    assert [text for text, _ in results] == alone
    assert [reason for _, reason in results] == ["length"] * 32
    after = metrics(server)
    assert after['rooftop_requests_total{outcome="length"}'] - before['rooftop_requests_total{outcome="length"}'] == 32


def test_preempted_streams_equal_alone_and_the_preemptions_are_counted(long_gguf):
    """A pool of 12 blocks for 4 requests that grow to 7 blocks each: preemptions, counted in /metrics, and with
    batch invariance (replayed decodes) every stream is exactly its request alone."""
    prompts = [f"Request {i}: " + "abcdefgh" * 4 for i in range(4)]
    with running_server(long_gguf, {"num_kv_blocks": 12, "block_size": 16}) as url:
        c = client(url)
        alone = [
            c.completions.create(model="tiny-long", prompt=p, max_tokens=60, **GREEDY).choices[0].text for p in prompts
        ]
        assert metrics(url)["rooftop_num_preemptions_total"] == 0

        async def all_at_once() -> list[str]:
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as ac:
                outs = await asyncio.gather(
                    *(ac.completions.create(model="tiny-long", prompt=p, max_tokens=60, **GREEDY) for p in prompts)
                )
            return [o.choices[0].text for o in outs]

        assert asyncio.run(all_at_once()) == alone
        assert metrics(url)["rooftop_num_preemptions_total"] > 0


def test_metrics_parse_and_move_as_requests_complete(server):
    before = metrics(server)
    out = client(server).completions.create(model="tiny-long", prompt="count me", max_tokens=5, **GREEDY)
    # the engine thread sets the state gauges (running, waiting, then KV use) just after it hands over the answer
    wait_for(lambda: metrics(server)["rooftop_kv_cache_usage_perc"] == 0)
    after = metrics(server)

    def moved(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert moved('rooftop_requests_total{outcome="length"}') == 1
    assert moved("rooftop_generation_tokens_total") == 5
    assert moved("rooftop_prompt_tokens_total") == out.usage.prompt_tokens
    for histogram in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert moved(f"rooftop_{histogram}_seconds_count") == 1
    assert moved("rooftop_inter_token_latency_seconds_count") == 4
    assert moved("rooftop_time_per_output_token_seconds_count") == 1
    assert moved('rooftop_steps_total{phase="decode"}') >= 4
    assert moved("rooftop_prefix_cache_queries_total") == out.usage.prompt_tokens
    assert after['rooftop_achieved_flops_per_second{phase="decode"}'] > 0
    assert after['rooftop_achieved_bytes_per_second{phase="prefill"}'] > 0
    for phase in ("prefill", "decode"):  # each phase's recent steps: their wall time and their fused bound
        assert 0 < after[f'rooftop_step_bound_seconds{{phase="{phase}"}}']
        assert after[f'rooftop_step_seconds{{phase="{phase}"}}'] > 0
    assert after["rooftop_roof_bytes_per_second"] > 0 and after['rooftop_roof_flops_per_second{compute="fp32"}'] > 0
    assert after["rooftop_num_requests_running"] == after["rooftop_num_requests_waiting"] == 0
    assert after["rooftop_kv_cache_usage_perc"] == 0
    assert "rooftop_prefix_cache_hits_total" in after


def assert_aborted_and_freed(url: str, llm, generated: int) -> None:
    """The request has been counted as aborted after `generated` tokens, and its KV blocks are free again."""
    wait_for(lambda: metrics(url)['rooftop_requests_total{outcome="abort"}'] == 1)
    wait_for(lambda: metrics(url)["rooftop_kv_cache_usage_perc"] == 0)  # the state the engine thread sets next
    after = metrics(url)
    assert after["rooftop_num_requests_running"] == 0 and after["rooftop_generation_tokens_total"] == generated
    stats = llm.engine.stats()
    assert stats.kv_blocks_used == 0 and stats.running == stats.waiting == 0


def assert_serves_the_next_request(url: str) -> None:
    ok = httpx.post(f"{url}/v1/completions", json={"prompt": "and now", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a_client_that_disconnects_mid_stream_is_aborted_and_its_blocks_freed(long_gguf):
    """The engine holds the request after two tokens, so it is still running when the client leaves on any host."""
    body = {"prompt": "go on and on", "max_tokens": 240, "stream": True, "temperature": 0, "ignore_eos": True}
    body["logprobs"] = 1  # an event for every token, whatever bytes the tiny model writes
    with held_server(long_gguf, steps=2, engine={"max_model_len": 256}) as (url, llm, hold):
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
            events = sse_events(response.iter_lines())
            next(events), next(events)
            assert hold.held.wait(30)
            during = metrics(url)
            assert during["rooftop_num_requests_running"] == 1 and during["rooftop_kv_cache_usage_perc"] > 0
        assert_aborted_and_freed(url, llm, generated=2)
        hold.release()
        assert_serves_the_next_request(url)


def test_a_non_streamed_request_whose_client_leaves_is_aborted(long_gguf):
    """The client sends its request, waits until the engine holds it after its first token, and closes the
    connection without reading an answer: the server must abort the request rather than finish it."""
    body = json.dumps({"prompt": "wait for me", "max_tokens": 240, "temperature": 0, "ignore_eos": True}).encode()
    with held_server(long_gguf, steps=1, engine={"max_model_len": 256}) as (url, llm, hold):
        host, port = url.removeprefix("http://").split(":")
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert hold.held.wait(30)  # generating: the request has its first token
        assert_aborted_and_freed(url, llm, generated=1)
        hold.release()
        assert_serves_the_next_request(url)


def test_tokenize_and_detokenize(server):
    ids = httpx.post(f"{server}/tokenize", json={"prompt": "hello"}).json()
    tokens = [ord(ch) + 3 for ch in "hello"]
    assert ids == {"count": 5, "max_model_len": 256, "tokens": tokens, "token_strs": None}
    assert httpx.post(f"{server}/detokenize", json={"tokens": ids["tokens"]}).json() == {"prompt": "hello"}
    # vLLM's return_token_strs (it was refused) and /version (a 404)
    strings = httpx.post(f"{server}/tokenize", json={"prompt": "hello", "return_token_strs": True}).json()
    assert strings["tokens"] == tokens and strings["token_strs"] == list("hello")
    assert httpx.get(f"{server}/version").json() == {"version": rooftop.__version__}


def test_api_key(long_gguf):
    with running_server(long_gguf, {"max_model_len": 128}, api_key="sekret") as url:
        with pytest.raises(openai.AuthenticationError, match="invalid or missing API key"):
            client(url, api_key="wrong").models.list()
        response = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"})
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
        assert (
            client(url, api_key="sekret")
            .completions.create(model="tiny-long", prompt="hi", max_tokens=2)
            .usage.completion_tokens
            == 2
        )
        assert httpx.get(f"{url}/health").status_code == 200  # health and metrics stay open to probes
        assert httpx.get(f"{url}/metrics").status_code == 200


def test_a_full_waiting_queue_answers_429_and_the_server_goes_on(long_gguf):
    """The engine holds the running request after its first token, so it keeps the one slot while the test fills
    the waiting queue, however fast the host."""
    body = {"prompt": "a long one", "max_tokens": 1900, "stream": True, "temperature": 0, "ignore_eos": True}
    body["logprobs"] = 1  # an event for every token, whatever bytes the tiny model writes
    with held_server(long_gguf, steps=1, engine={"max_num_seqs": 1}, max_waiting_requests=1) as (url, _, hold):
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as running:
            events = sse_events(running.iter_lines())  # kept: a dropped iterator closes the connection
            next(events)  # it runs: the one slot is taken
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as waiting:
                assert waiting.status_code == 200  # accepted: it waits for the slot
                refused = httpx.post(f"{url}/v1/completions", json={"prompt": "me too", "max_tokens": 2})
                assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
                assert "requests are already waiting" in refused.json()["error"]["message"]
        assert metrics(url)['rooftop_requests_total{outcome="rejected"}'] == 1
        wait_for(lambda: metrics(url)["rooftop_num_requests_running"] == 0)
        hold.release()
        assert_serves_the_next_request(url)


def test_an_engine_failure_fails_the_requests_in_flight_and_the_server_goes_on(long_gguf):
    from rooftop import LLM

    llm = LLM(model=long_gguf, kv_cache_bytes=64 << 20, max_model_len=128)
    step, calls = llm.engine.step, []

    def failing_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated kernel crash")
        return step()

    llm.engine.step = failing_once
    with running_server(None, llm=llm) as url:
        failed = httpx.post(f"{url}/v1/completions", json={"prompt": "boom", "max_tokens": 2}, timeout=30)
        message = failed.json()["error"]["message"]
        assert failed.status_code == 500 and "the engine failed on this step (error id " in message
        assert "simulated kernel crash" not in failed.text  # the log has it, the client does not
        ok = httpx.post(f"{url}/v1/completions", json={"prompt": "again", "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200
        assert metrics(url)['rooftop_requests_total{outcome="error"}'] == 1
        assert llm.engine.stats().kv_blocks_used == 0


def test_the_start_line_names_the_weights_and_says_dummy(caplog):
    """The server's log said only the model's name: nothing told a user whose weights were random."""
    from rooftop import LLM
    from rooftop.config import RunConfig

    llm = LLM(model="smollm2-135m", load_format="dummy", kv_cache_bytes=8 << 20)
    run = RunConfig("smollm2-135m", load_format="dummy")
    with caplog.at_level("INFO", logger="rooftop.serve"), running_server(None, llm=llm, run=run):
        pass
    weights = llm.precision.weights.name  # bf16-fp32 on rooftop's CPU kernels
    assert f"serving smollm2-135m ({weights}, dummy weights) on http://" in caplog.text


def test_the_default_served_name_is_the_models_name_never_a_path_nor_config_json():
    from rooftop.serve.state import served_name

    assert served_name("/models/SmolLM2-135M.Q4_1.gguf") == "SmolLM2-135M.Q4_1"
    assert served_name("/models/tinyllama/config.json") == "tinyllama"  # it served "config.json"
    assert served_name("my-llama.json") == "my-llama"
    assert served_name("/models/Qwen3-0.6B") == "Qwen3-0.6B"
    assert served_name("llama-3.2-1b") == "llama-3.2-1b"
