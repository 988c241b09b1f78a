"""What code ported from vLLM reads and passes: chat_template_kwargs, add_generation_prompt and
continue_final_message (in LLM.chat and the server), kv_cache_dtype "fp8", and the outputs' stop_reason, finished,
num_cached_tokens and logprobs as {token_id: Logprob} (the tiny random model: the text is noise, the shapes are
not)."""

from __future__ import annotations

import pickle

import httpx
import openai
import pytest
from gguf_factory import CHATML
from serve_support import running_server
from test_cli import assert_user_error, rooftop_in_process

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig
from rooftop.enums import FinishReason
from rooftop.errors import InvalidRequestError

# Qwen3's switch, as its template writes it: an empty think block when thinking is off
THINKING = CHATML + (
    "{% if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"
HI = [{"role": "user", "content": "Hi"}]
PREFILL = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is "}]
BYTE = 3  # the tiny vocabulary: token id = byte + 3 specials


@pytest.fixture(scope="module")
def llm(tiny_gguf):
    """The tiny model with prefill chunks of one block (the prefix cache reused block by block), an fp8 KV cache
    named as vLLM names it, and a chat template that reads enable_thinking."""
    llm = LLM(model=tiny_gguf, chunked_prefill_size=16, kv_cache_dtype="fp8")
    llm.tokenizer.chat_template = THINKING
    return llm


def test_kv_cache_dtype_fp8_is_vllms_alias_of_fp8_e4m3(llm):
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8_e4m3"
    assert llm.engine.kv_cache_dtype == llm.engine.stats().kv_cache_dtype == "fp8_e4m3"  # reported canonical
    with pytest.raises(InvalidRequestError, match="e4m3 only"):
        EngineConfig(kv_cache_dtype="fp8_e5m2")
    with pytest.raises(InvalidRequestError, match="fp8: fp8_e4m3"):
        EngineConfig(kv_cache_dtype="fp9")


def test_the_cli_takes_fp8_and_refuses_e5m2(tiny_gguf):
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "-n", "1", "--kv-cache-dtype", "fp8")
    assert r.returncode == 0, r.stderr
    assert "tokens, fp8_e4m3," in r.stderr  # the KV cache line says the canonical name
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "--kv-cache-dtype", "fp8_e5m2")
    assert_user_error(r, "fp8_e5m2", "e4m3 only")


def test_chat_template_kwargs_are_variables_of_the_template(llm):
    assert not llm.apply_chat_template(HI).endswith(EMPTY_THINK)
    off = llm.apply_chat_template(HI, chat_template_kwargs={"enable_thinking": False})
    assert off == llm.apply_chat_template(HI) + EMPTY_THINK
    assert llm.apply_chat_template(HI, chat_template_kwargs={"enable_thinking": True}) == llm.apply_chat_template(HI)
    params = SamplingParams(max_tokens=2, temperature=0)
    out = llm.chat(HI, params, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})[0]
    assert out.prompt == off


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [(["enable_thinking"], "dict of template variables"), ({1: True}, "keys are strings"), ({"messages": []}, "own")],
)
def test_bad_chat_template_kwargs_are_refused(llm, kwargs, words):
    with pytest.raises(InvalidRequestError, match=words) as e:
        llm.chat(HI, use_tqdm=False, chat_template_kwargs=kwargs)
    assert e.value.param == "chat_template_kwargs"


def test_continue_final_message_leaves_the_last_message_open(llm):
    """transformers' rule, which vLLM uses: the prompt ends where the last message's content does (its end-of-turn
    dropped), its trailing space kept where the template keeps it."""
    closed = llm.apply_chat_template(PREFILL, add_generation_prompt=False)
    assert closed.endswith("The answer is <|im_end|>\n")
    open_ = llm.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True)
    assert open_ == closed.removesuffix("<|im_end|>\n")
    params = SamplingParams(max_tokens=2)
    out = llm.chat(PREFILL, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)[0]
    assert out.prompt == open_
    assert llm.apply_chat_template(HI, add_generation_prompt=False).endswith("<|im_end|>\n")
    padded = [*PREFILL[:-1], {"role": "assistant", "content": "  The answer is "}]  # spaces on both sides
    assert llm.apply_chat_template(padded, add_generation_prompt=False, continue_final_message=True).endswith(
        "The answer is "
    )  # its trailing space kept where the template writes it, whatever comes before the text
    with pytest.raises(InvalidRequestError, match="cannot both be true"):
        llm.chat(PREFILL, use_tqdm=False, continue_final_message=True)  # add_generation_prompt defaults to true


def test_continue_final_message_refuses_a_template_that_rewrites_the_message(tiny_gguf):
    shouting = LLM(model=tiny_gguf)
    shouting.tokenizer.chat_template = CHATML.replace("message['content']", "message['content'] | upper")
    with pytest.raises(InvalidRequestError, match="does not write the last message's content"):
        shouting.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True)


def forced(token_id: int, **options) -> SamplingParams:
    """Greedy, with `token_id` made the only choice: the tiny model's noise steered to a known ending."""
    return SamplingParams(temperature=0, max_tokens=4, logit_bias={token_id: 100.0}, **options)


def test_stop_reason_is_the_stop_string_or_token_that_ended_it(llm):
    x = ord("x") + BYTE
    cases = {
        "stop string": (forced(x, stop=["zz", "x"]), "x"),
        "stop token": (forced(x, stop_token_ids=[x]), x),
        "eos": (forced(llm.tokenizer.eos_token_ids[0]), None),
        "length": (forced(x), None),
    }
    for name, (params, reason) in cases.items():
        out = llm.generate("Hello", params, use_tqdm=False)[0]
        assert out.finished and out.stop_reason == out.outputs[0].stop_reason == reason, name
        assert out.finish_reason == (FinishReason.LENGTH if name == "length" else FinishReason.STOP), name
    both = llm.generate("Hello", forced(x, stop=["x"], n=2), use_tqdm=False)[0]
    assert [o.stop_reason for o in both.outputs] == ["x", "x"]


def test_num_cached_tokens_counts_the_prompt_served_from_the_prefix_cache(llm):
    prompt = "The same forty bytes of prompt, sent twice"  # 42 tokens: two whole blocks of 16 to reuse
    params = SamplingParams(max_tokens=1, temperature=0)
    first, again = (llm.generate(prompt, params, use_tqdm=False)[0] for _ in range(2))
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 32)


def test_each_logprob_is_also_vllms_dict_of_logprobs(llm):
    out = llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0, logprobs=2), use_tqdm=False)[0]
    for token_id, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs, strict=True):
        assert entry.token_id == token_id and len(entry.top) == 2  # rooftop's fields, as before
        chosen = entry[token_id]
        assert chosen.logprob == entry.logprob and chosen.rank == 1  # greedy: the most likely
        assert chosen.decoded_token == llm.tokenizer.decode([token_id], skip_special_tokens=False)
        assert list(entry)[0] == token_id and token_id in entry and len(entry) == len({token_id, *dict(entry.top)})
        for rank, (other, logprob) in enumerate(entry.top, 1):
            assert (entry[other].logprob, entry[other].rank) == (logprob, rank)
    copied = pickle.loads(pickle.dumps(out))  # another process has no tokenizer: the texts travel decoded
    first = out.token_ids[0]
    assert copied.logprobs == out.logprobs and copied.logprobs[0][first] == out.logprobs[0][first]
    alone = llm.generate("Hello", SamplingParams(max_tokens=1, logprobs=0, seed=1), use_tqdm=False)[0]
    entry = alone.outputs[0].logprobs[0]
    assert list(entry) == [alone.token_ids[0]] and entry[alone.token_ids[0]].rank >= 1
    with pytest.raises(KeyError):
        entry[-1]


def test_the_server_renders_chat_template_kwargs_and_continue_final_message(llm):
    with running_server(None, llm=llm) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def tokens(**body) -> list[int]:
            r = httpx.post(f"{url}/tokenize", json={"messages": HI, **body})
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        def prompt_tokens(**extra) -> int:
            reply = c.chat.completions.create(model="tiny", messages=HI, max_tokens=1, extra_body=extra)
            return reply.usage.prompt_tokens

        off = {"chat_template_kwargs": {"enable_thinking": False}}
        assert httpx.post(f"{url}/detokenize", json={"tokens": tokens(**off)}).json()["prompt"].endswith(EMPTY_THINK)
        assert len(tokens(**off)) == len(tokens()) + len(EMPTY_THINK) == prompt_tokens(**off)
        assert prompt_tokens() == len(tokens())
        cont = {"add_generation_prompt": False, "continue_final_message": True}
        r = httpx.post(f"{url}/tokenize", json={"messages": PREFILL, **cont})
        ids = r.json()["tokens"]
        assert httpx.post(f"{url}/detokenize", json={"tokens": ids}).json()["prompt"].endswith("The answer is ")
        reply = c.chat.completions.create(model="tiny", messages=PREFILL, max_tokens=1, extra_body=cont)
        assert reply.usage.prompt_tokens == len(ids)

        # echo (vLLM's): the continued message starts each choice's content, streamed or not, outside usage
        greedy = {"model": "tiny", "max_tokens": 4, "temperature": 0, "n": 2}
        plain = c.chat.completions.create(messages=PREFILL, extra_body=cont, **greedy)
        echoed = c.chat.completions.create(messages=PREFILL, extra_body=cont | {"echo": True}, **greedy)
        assert [ch.message.content for ch in echoed.choices] == [
            "The answer is " + plain.choices[0].message.content
        ] * 2
        assert echoed.usage == plain.usage
        chunks = list(
            c.chat.completions.create(messages=PREFILL, extra_body=cont | {"echo": True}, stream=True, **greedy)
        )
        firsts = [ch.choices[0].delta for ch in chunks if ch.choices][:4]
        assert [(d.role, d.content) for d in firsts] == [("assistant", None), (None, "The answer is ")] * 2
        streamed = ["", ""]
        for chunk in chunks:
            for choice in chunk.choices:
                streamed[choice.index] += choice.delta.content or ""
        assert streamed == [ch.message.content for ch in echoed.choices]
        user_last = c.chat.completions.create(messages=HI, extra_body={"echo": True}, **greedy)
        assert [ch.message.content for ch in user_last.choices] == [
            ch.message.content for ch in c.chat.completions.create(messages=HI, **greedy).choices
        ]

        refused = {
            "chat_template_kwargs": ({"chat_template_kwargs": ["enable_thinking"]}, "should be an object"),
            "reserved": ({"chat_template_kwargs": {"tools": []}}, "own parameter"),
            "both": ({"continue_final_message": True}, "cannot both be true"),
        }
        for name, (body, words) in refused.items():
            r = httpx.post(f"{url}/v1/chat/completions", json={"messages": PREFILL, "max_tokens": 1, **body})
            error = r.json()["error"]
            assert r.status_code == 400 and words in error["message"], (name, error)
            assert error["param"] in ("chat_template_kwargs", "continue_final_message"), (name, error)
        r = httpx.post(f"{url}/tokenize", json={"prompt": "hi", **off})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_llms_seed_repeats_the_sampled_outputs_of_unseeded_requests(tiny_gguf):
    """vLLM's LLM(seed=...): requests without a seed of their own draw from the generator it seeds, so a script's
    sampled outputs repeat; an option LLM does not take is refused naming LLM, not the class behind it."""
    params = SamplingParams(max_tokens=8, temperature=1.0)
    first, second = (LLM(model=tiny_gguf, seed=7).generate([[5, 6, 7]] * 3, params) for _ in range(2))
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert len({tuple(o.token_ids) for o in first}) > 1  # drawn, not greedy: the three differ
    with pytest.raises(InvalidRequestError, match=r"LLM\(\) takes no 'sead' \(its engine options: max_num_seqs"):
        LLM(model=tiny_gguf, sead=7)
    with pytest.raises(InvalidRequestError, match="seed must be an integer >= 0, got -1"):
        LLM(model=tiny_gguf, seed=-1)


def test_what_vllm_code_calls_on_an_llm_and_its_outputs(llm):
    """get_tokenizer() and its apply_chat_template(tokenize=...), CompletionOutput.finished(), logprobs None where
    none were asked for, OpenAI's content parts in LLM.chat, max_tokens None (to EOS or the context's end)."""
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(HI, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=True) == tokenizer.encode(
        text, add_special_tokens=False
    )
    greedy = SamplingParams(max_tokens=3, temperature=0)
    [plain] = llm.chat(HI, greedy, use_tqdm=False)
    assert plain.outputs[0].finished() and plain.logprobs is None and plain.outputs[0].logprobs is None
    assert plain.outputs[0].cumulative_logprob is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]}]
    assert llm.chat(parts, greedy, use_tqdm=False)[0].token_ids == plain.token_ids
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(InvalidRequestError, match=r"messages\[0\].content\[0\]: image_url parts are not supported"):
        llm.chat(image, greedy, use_tqdm=False)
    to_the_end = llm.generate([BYTE + 65] * 4, SamplingParams(max_tokens=None, temperature=0, ignore_eos=True))[0]
    assert len(to_the_end.token_ids) == llm.engine.max_model_len - 4 and to_the_end.finish_reason == "length"


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda llm: llm.generate(None),
            r"prompts must be a prompt \(text, token ids or a prompt dict\) or a list of them, got NoneType",
        ),
        (lambda llm: llm.generate(5), "prompts must be a prompt"),
        (lambda llm: llm.generate(["a"], {"max_tokens": 3}), "sampling_params must be a SamplingParams or a list"),
        (lambda llm: llm.chat(HI, {"max_tokens": 3}), "sampling_params must be a SamplingParams or a list"),
        # a stop token outside the vocabulary was ignored (or, beside min_tokens, banned another token)
        (lambda llm: llm.generate("a", SamplingParams(stop_token_ids=[10**9])), r"stop_token_ids out of range"),
    ],
)
def test_arguments_of_the_wrong_kind_are_refused_by_name(llm, call, message):
    with pytest.raises(InvalidRequestError, match=message):
        call(llm)


def test_chat_with_tools_takes_a_list_of_sampling_params(llm):
    """One SamplingParams per conversation, as without tools (it failed on the list)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    params = [SamplingParams(max_tokens=2, temperature=0), SamplingParams(max_tokens=5, temperature=0)]
    outputs = llm.chat([HI, HI], params, tools=[tool], tool_choice="none", use_tqdm=False)
    assert [len(o.token_ids) for o in outputs] == [2, 5]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"block_size": True}, "block_size must be an integer >= 1, got True"),
        ({"num_kv_blocks": False}, "num_kv_blocks must be an integer >= 1, got False"),
        ({"enable_prefix_caching": "no"}, "enable_prefix_caching must be true or false, got 'no'"),
    ],
)
def test_engine_options_of_the_wrong_type_are_refused(options, message):
    """A bool counted as an integer (block_size=True ran blocks of one token) and "no" as true (caching stayed on)."""
    with pytest.raises(InvalidRequestError, match=message):
        EngineConfig(**options)


def test_detokenize_false_gives_the_token_ids_without_text(llm):
    """vLLM's detokenize=False: the same tokens, no text; stop strings, matched in the text, are refused with it."""
    greedy = dict(max_tokens=4, temperature=0, ignore_eos=True)
    with_text = llm.generate("ab", SamplingParams(**greedy), use_tqdm=False)[0]
    ids_only = llm.generate("ab", SamplingParams(**greedy, detokenize=False), use_tqdm=False)[0]
    assert ids_only.token_ids == with_text.token_ids and ids_only.text == "" and with_text.text
    with pytest.raises(InvalidRequestError, match="detokenize=False"):
        SamplingParams(detokenize=False, stop=["x"])
