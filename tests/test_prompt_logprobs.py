"""SamplingParams.prompt_logprobs: each prompt token's log-probability (and the top k) is the full forward pass's,
through chunked prefill, with a prefix cache that holds the prompt, batched with other requests that it leaves
unchanged, and once per position after a preemption; on the server, echo with logprobs and vLLM's
prompt_logprobs field."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from engine_support import run
from serve_support import api_error, sse_events

from rooftop import SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.sampler import Logprob
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.models.kv_cache import KVCache

PROMPT = "the quick brown fox jumps over it"  # 33 byte tokens: chunks of 8 cut it in five
PARAMS = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, prompt_logprobs=2)


def reference(llm, ids: list[int]) -> torch.Tensor:
    """log_softmax of one forward pass over the whole prompt: row p is the distribution of token p + 1."""
    with torch.inference_mode():
        cache = KVCache(llm.config, len(ids), torch.float32, "cpu")
        hidden = llm.model.forward(torch.tensor(ids), cache, 0, Phase.PREFILL)
        return llm.model.logits(hidden).log_softmax(-1)


def assert_match(output, expected: torch.Tensor, k: int, tie: float = 1e-4) -> None:
    """Each entry against the reference's row, within `tie`: the chunks' attention sums in another order than one
    pass does, so two logits nearer than that may come out in either order (the rank and the top k's order then too)."""
    ids = output.prompt_token_ids
    entries = output.prompt_logprobs
    assert len(entries) == len(ids) and entries[0] is None
    for p, entry in enumerate(entries[1:]):
        row, chosen = expected[p], float(expected[p][ids[p + 1]])
        assert entry.token_id == ids[p + 1]
        assert entry.logprob == pytest.approx(chosen, abs=tie)
        assert int((row > chosen + tie).sum()) + 1 <= entry.rank <= int((row >= chosen - tie).sum())
        assert [lp for _, lp in entry.top] == pytest.approx(torch.topk(row, k).values.tolist(), abs=tie)
        assert [lp for _, lp in entry.top] == pytest.approx([float(row[i]) for i, _ in entry.top], abs=tie)


@pytest.mark.parametrize("config", [{}, {"max_num_batched_tokens": 8}], ids=["whole", "chunked"])
def test_prompt_logprobs_are_the_full_forward_pass(tiny_llm, config):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(**config))
    out = run(eng, [("a", PROMPT, PARAMS)])["a"]
    assert_match(out, reference(tiny_llm, out.prompt_token_ids), 2)
    assert out.prompt_logprobs[1][out.prompt_token_ids[1]] == Logprob(
        out.prompt_logprobs[1].logprob, out.prompt_logprobs[1].rank, PROMPT[1]
    )  # vLLM's form, decoded


def test_a_cached_prompt_still_gets_its_prompt_logprobs(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(block_size=4, max_num_batched_tokens=8))
    first = run(eng, [("a", PROMPT, PARAMS)])["a"]
    second = run(eng, [("b", PROMPT, PARAMS)])["b"]
    plain = run(eng, [("c", PROMPT, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))])["c"]
    assert second.num_cached_tokens == 0 and plain.num_cached_tokens > 0
    assert [e and (e.token_id, e.logprob, e.top) for e in second.prompt_logprobs] == [
        e and (e.token_id, e.logprob, e.top) for e in first.prompt_logprobs
    ]
    assert second.token_ids == first.token_ids == plain.token_ids and plain.prompt_logprobs is None


def test_batched_requests_are_unchanged_by_one_with_prompt_logprobs(tiny_llm):
    others = [
        (f"o{i}", PROMPT[i:] + "!" * i, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1))
        for i in range(3)
    ]
    config = EngineConfig(max_num_batched_tokens=16, enable_prefix_caching=False)
    alone = run(LLMEngine(tiny_llm.model, tiny_llm.tokenizer, config), others)
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, config)
    batched = run(eng, [("p", PROMPT, PARAMS), *others])
    for request_id, output in alone.items():
        assert batched[request_id].token_ids == output.token_ids
        assert [e.logprob for e in batched[request_id].logprobs] == [e.logprob for e in output.logprobs]
    assert_match(batched["p"], reference(tiny_llm, batched["p"].prompt_token_ids), 2)


def test_a_preempted_request_records_each_prompt_position_once(tiny_llm):
    # 20 blocks of 4 tokens hold both prompts, not both outputs: the later request is preempted and recomputed
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=20, block_size=4))
    long = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, prompt_logprobs=0)
    out = run(eng, [("a", PROMPT, long), ("b", PROMPT[::-1], long)])
    assert eng.stats().preemptions > 0
    for output in out.values():
        assert_match(output, reference(tiny_llm, output.prompt_token_ids), 0)


def test_the_first_delta_carries_them_and_a_one_token_prompt_has_only_none(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer)
    eng.add_request("a", [5], PARAMS)
    deltas = []
    while eng.has_unfinished():
        deltas += eng.step().deltas
    assert deltas[0].prompt_logprobs == [None] and all(d.prompt_logprobs is None for d in deltas[1:])
    assert deltas[-1].output.prompt_logprobs == [None]


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_bad_prompt_logprobs_are_refused(value):
    with pytest.raises(InvalidRequestError, match="prompt_logprobs must be an integer in"):
        SamplingParams(prompt_logprobs=value)


def complete(server: str, **body) -> dict:
    body = {"prompt": "Hello there", "max_tokens": 3, "temperature": 0, "ignore_eos": True} | body
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_echo_with_logprobs_puts_the_prompts_before_the_outputs(server):
    plain = complete(server, logprobs=2)["logprobs"]
    choice = complete(server, logprobs=2, echo=True)
    logprobs, prompt = choice["logprobs"], choice["prompt_logprobs"]
    n = len(prompt)
    assert choice["text"].startswith("Hello there") and logprobs["tokens"] == [*"Hello there", *plain["tokens"]]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None and prompt[0] is None
    for p in range(1, n):
        entry = prompt[p]
        token_id, first = next(iter(entry.items()))  # the prompt token's own, then the top 2
        assert first["decoded_token"] == "Hello there"[p] and first["rank"] >= 1 and len(entry) <= 3
        assert logprobs["token_logprobs"][p] == first["logprob"]
        top = logprobs["top_logprobs"][p]  # the top 2 and the prompt token's own (OpenAI's up to logprobs + 1)
        assert len(top) <= 3 and top["Hello there"[p]] == first["logprob"]
    assert logprobs["token_logprobs"][n:] == plain["token_logprobs"]
    assert logprobs["top_logprobs"][n:] == plain["top_logprobs"]
    assert logprobs["text_offset"] == list(range(len(logprobs["tokens"])))  # one character per byte token here
    streamed = {"tokens": [], "token_logprobs": []}
    body = {"prompt": "Hello there", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "echo": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body | {"logprobs": 2, "stream": True}) as r:
        for event in sse_events(r.iter_lines()):
            if event != "[DONE]":
                for c in json.loads(event)["choices"]:
                    for key in streamed:
                        streamed[key] += (c["logprobs"] or {}).get(key, [])
    assert streamed == {key: logprobs[key] for key in streamed}


def test_vllms_prompt_logprobs_field(server):
    choice = complete(server, prompt_logprobs=0)
    assert choice["logprobs"] is None and choice["prompt_logprobs"][0] is None
    assert [len(entry) for entry in choice["prompt_logprobs"][1:]] == [1] * (len("Hello there") - 1)
    error = api_error(httpx.post(f"{server}/v1/completions", json={"prompt": "a", "prompt_logprobs": 21}), 400)
    assert error["param"] == "prompt_logprobs" and "prompt_logprobs must be an integer in [0, 20]" in error["message"]
    body = {"prompt": "a", "prompt_logprobs": 1, "stream": True}
    error = api_error(httpx.post(f"{server}/v1/completions", json=body), 400)
    assert error["param"] == "prompt_logprobs" and "not available with stream: true" in error["message"]


def test_chat_puts_the_rendered_prompts_logprobs_beside_its_choices(server):
    """vLLM's chat field: the rendered conversation's entries once, beside the choices, as a completion of the same
    token ids gives them."""
    messages = [{"role": "user", "content": "Hello there"}]
    body = {"messages": messages, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "n": 2, "prompt_logprobs": 1}
    reply = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30).json()
    ids = httpx.post(f"{server}/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    assert reply["prompt_logprobs"] == complete(server, prompt=ids, prompt_logprobs=1)["prompt_logprobs"]
    assert len(reply["prompt_logprobs"]) == len(ids) and all("prompt_logprobs" not in c for c in reply["choices"])
