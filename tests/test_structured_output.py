"""Structured output on the bundled model: JSON schemas, regexes, choices and json_object enforced token by token,
through the Python API and the server; batching, speculation and preemption leave it intact."""

from __future__ import annotations

import json
import re
import time

import httpx
import jsonschema
import pytest
import torch
from engine_support import run
from serve_support import api_error, running_server, sse_events

from rooftop import LLM, InvalidRequestError, SamplingParams, StructuredOutputsParams
from rooftop.config import EngineConfig
from rooftop.engine import sampler
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.structured import GrammarCompiler, apply_grammars, bounded

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "address"],
    "additionalProperties": False,
}
PROMPT = [{"role": "user", "content": "Describe a user of a web site as JSON."}]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=256)


def json_params(**options) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 90, **options}, structured_outputs=StructuredOutputsParams(json=SCHEMA))


def assert_valid(output) -> None:
    """A complete output parses and validates; a cut one (length) must have been cut by max_tokens."""
    if output.finish_reason == "stop":
        jsonschema.validate(json.loads(output.text), SCHEMA)
    else:
        assert output.finish_reason == "length" and len(output.token_ids) == 90


def test_a_spec_holds_exactly_one_valid_constraint():
    with pytest.raises(InvalidRequestError, match="exactly one") as e:
        StructuredOutputsParams()
    assert e.value.param == "structured_outputs"
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(InvalidRequestError, match="unclosed group") as e:
        StructuredOutputsParams(regex="a(b")
    assert e.value.param == "structured_outputs.regex"
    with pytest.raises(InvalidRequestError, match="Invalid type") as e:
        StructuredOutputsParams(json={"type": "integr"})
    assert e.value.param == "structured_outputs.json"
    with pytest.raises(InvalidRequestError, match="unknown name") as e:
        StructuredOutputsParams(grammar="start: missing")
    assert e.value.param == "structured_outputs.grammar"
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(ignore_eos=True, structured_outputs=StructuredOutputsParams(json_object=True))
    assert e.value.param == "ignore_eos"
    # vLLM's disable_any_whitespace: what rooftop's JSON always is (it was a TypeError); false cannot be honoured
    assert StructuredOutputsParams(json_object=True, disable_any_whitespace=True).kind == "json_object"
    with pytest.raises(InvalidRequestError, match="disable_any_whitespace must be true") as e:
        StructuredOutputsParams(json_object=True, disable_any_whitespace=False)
    assert e.value.param == "structured_outputs.disable_any_whitespace"


def test_open_numbers_are_bounded_and_listed_properties_closed_the_schemas_own_choices_kept():
    limit = 10**15
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "score": {"type": "number", "minimum": 0, "multipleOf": 0.5},
            "big": {"type": "integer", "minimum": 10**18},
            "list": {"type": "array", "items": {"anyOf": [{"type": "number"}, {"$ref": "#/$defs/n"}]}},
            "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
            "free": {"type": "object"},
            "pair": {"prefixItems": [{"type": "string"}, {"type": "boolean"}]},
            "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
        },
        "$defs": {"n": {"type": ["integer", "null"], "maximum": 9}},
    }
    out = bounded(schema)
    props = out["properties"]
    assert out["additionalProperties"] is False
    assert props["id"] == {"type": "integer", "exclusiveMaximum": limit, "exclusiveMinimum": -limit}
    assert props["score"] == {"type": "number", "minimum": 0, "multipleOf": 0.5, "exclusiveMaximum": limit}
    assert props["big"] == {"type": "integer", "minimum": 10**18}  # a bound past ours: left as it is
    assert props["list"]["items"]["anyOf"][0] == {
        "type": "number",
        "exclusiveMaximum": limit,
        "exclusiveMinimum": -limit,
        "multipleOf": 1e-6,
    }
    assert out["$defs"]["n"] == {"type": ["integer", "null"], "maximum": 9, "exclusiveMinimum": -limit}
    assert props["open"] == schema["properties"]["open"] and props["free"] == {"type": "object"}
    assert props["pair"]["items"] is False and props["both"] == schema["properties"]["both"]
    assert schema["properties"]["id"] == {"type": "integer"} and "additionalProperties" not in schema  # untouched


def test_numbers_end_within_their_digits(llm):
    """A 16th integer digit or a 7th decimal is outside the grammar; asked to describe a user as any JSON object,
    the model (which wrote an id of digits until max_tokens without the bound) writes no longer number. Whether it
    then ends its object depends on the host's rounding: on a Zen 5 host it did within 200 tokens, on a Zen 3 host
    it repeats one key until max_tokens (greedy, the same grammar), so an ending is checked only where it ends."""
    compiler = GrammarCompiler(llm.tokenizer.backend, llm.model.config.vocab_size, llm.tokenizer.eos_token_ids)
    encode = lambda text: llm.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert compiler.start(StructuredOutputsParams(json_object=True)).advance(encode('{"a":[1,-2.5,"x",{"b":null}]}'))
    assert not compiler.start(StructuredOutputsParams(json_object=True)).advance(encode('{"id":1234567890123456'))
    number = StructuredOutputsParams(json={"type": "object", "properties": {"x": {"type": "number"}}})
    assert compiler.start(number).advance(encode('{"x":0.123456}'))
    assert not compiler.start(number).advance(encode('{"x":0.1234567'))
    spec = StructuredOutputsParams(json_object=True)
    out = llm.chat(PROMPT, SamplingParams(max_tokens=200, temperature=0, structured_outputs=spec))[0]
    assert out.text.startswith("{") and not re.search(r"\d{16}", out.text)
    assert out.finish_reason == "length" or isinstance(json.loads(out.text), dict)


def test_greedy_and_seeded_outputs_follow_the_schema(llm):
    """Greedy and seeded temperature-1.0 rows in one batch; every complete output validates."""
    params = [json_params(temperature=0)] + [json_params(temperature=1.0, seed=s) for s in (1, 2, 3)]
    outputs = llm.generate([llm.apply_chat_template(PROMPT)] * 4, params)
    for out in outputs:
        assert_valid(out)
    assert sum(o.finish_reason == "stop" for o in outputs) >= 3


def test_regex_choice_and_json_object_are_honoured_exactly(llm):
    regex = r"[0-9]{3}-[0-9]{4}"
    specs = [StructuredOutputsParams(regex=regex), StructuredOutputsParams(choice=["yes", "no", "maybe"])]
    specs += [StructuredOutputsParams(json_object=True)]
    prompts = ["Call me at", "Is the sky blue? Answer:", "A JSON object:"]
    for seed in (0, 5):
        params = [SamplingParams(max_tokens=40, temperature=1.0, seed=seed, structured_outputs=s) for s in specs]
        phone, choice, obj = llm.generate(prompts, params)
        assert phone.finish_reason == "stop" and re.fullmatch(regex, phone.text)
        assert choice.finish_reason == "stop" and choice.text in ("yes", "no", "maybe")
        if obj.finish_reason == "stop":
            assert isinstance(json.loads(obj.text), dict)


def test_max_tokens_cuts_with_length(llm):
    out = llm.chat(PROMPT, json_params(max_tokens=5, temperature=0))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5 and out.text.startswith('{"')


def test_a_stop_string_ends_a_structured_output_and_is_named_as_its_stop_reason(llm):
    """As vLLM: a stop string cuts the output where it meets it, complete or not; stop_reason tells that from a
    complete output (None: it ended at EOS)."""
    whole = llm.chat(PROMPT, json_params(temperature=0))[0]
    assert whole.finish_reason == "stop" and whole.stop_reason is None
    cut = llm.chat(PROMPT, json_params(temperature=0, stop=['"age"']))[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == '"age"'
    assert whole.text.startswith(cut.text) and '"age"' in whole.text[len(cut.text) :]


def test_an_unconstrained_row_is_untouched_by_constrained_neighbours(llm):
    """Greedy: the same tokens alone and batched with constrained rows; the masks leave its logits bit-identical."""
    free = SamplingParams(max_tokens=24, temperature=0)
    prompt = llm.apply_chat_template([{"role": "user", "content": "Name three rivers."}])
    alone = llm.generate([prompt], free)[0]
    batched = llm.generate([prompt, prompt, prompt], [json_params(temperature=0), free, json_params(temperature=0)])
    assert batched[1].token_ids == alone.token_ids
    logits = torch.randn(3, llm.model.config.vocab_size)
    compiler = GrammarCompiler(llm.tokenizer.backend, llm.model.config.vocab_size, llm.tokenizer.eos_token_ids)
    state = compiler.start(StructuredOutputsParams(choice=["yes"]))
    masked = apply_grammars(logits, [None, state, None])
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    yes = llm.tokenizer.encode("yes", add_special_tokens=False)[0]
    assert masked[1].isfinite().nonzero().flatten().tolist() == [yes]
    assert apply_grammars(logits, [None, None, None]) is logits
    compiler.start(StructuredOutputsParams(choice=["yes"]))
    assert len(compiler) == 1  # compiled once, copied per request


def test_a_grammar_state_refuses_a_token_outside_it_and_says_why(llm):
    compiler = GrammarCompiler(llm.tokenizer.backend, llm.model.config.vocab_size, llm.tokenizer.eos_token_ids)
    state = compiler.start(StructuredOutputsParams(choice=["yes"]))
    no = llm.tokenizer.encode("no", add_special_tokens=False)
    assert not state.advance(no) and state.error
    state = compiler.start(StructuredOutputsParams(choice=["yes"]))
    assert state.advance(llm.tokenizer.encode("yes", add_special_tokens=False) + llm.tokenizer.eos_token_ids)


def test_the_mask_is_timed_as_the_steps_host_time(llm, monkeypatch):
    """The grammar's work runs in the step after the forward pass: in around_seconds (what the attribution counts
    as host time), which the forward pass's `seconds` leaves out."""
    delay = 0.05

    def slow(logits, grammars):
        time.sleep(delay)
        return apply_grammars(logits, grammars)

    monkeypatch.setattr(sampler, "apply_grammars", slow)
    eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_kv_blocks=64))
    eng.add_request(
        "a", "Call me at", SamplingParams(max_tokens=3, structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    )
    records = []
    while eng.has_unfinished():
        records.append(eng.step().record)
    assert len(records) == 3 and all(r.around_seconds >= delay for r in records)


def test_speculation_skips_structured_rows_and_keeps_them_valid(llm):
    """A structured output does not draft; a free one beside it does; the JSON still validates."""
    text = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."
    prompt = llm.apply_chat_template([{"role": "user", "content": text}])
    eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_kv_blocks=256, speculative_config=NGRAM))
    free = SamplingParams(max_tokens=30, temperature=0)
    out = run(eng, [("json", llm.apply_chat_template(PROMPT), json_params(temperature=0)), ("free", prompt, free)])
    assert_valid(out["json"])
    assert out["json"].metrics.spec_decode.drafts == 0 and out["free"].metrics.spec_decode.drafts > 0


def test_preemption_keeps_the_grammar_in_step_with_the_output(llm):
    """A pool too small for all: preempted, recomputed sequences give the tokens they give with room to spare."""
    prompt = llm.apply_chat_template(PROMPT)
    requests = [(f"r{i}", prompt, json_params(temperature=1.0, seed=i, max_tokens=60)) for i in range(3)]
    roomy = run(LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_kv_blocks=256)), requests)
    tight_engine = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_kv_blocks=8, block_size=16))
    tight = run(tight_engine, requests)
    assert tight_engine.stats().preemptions > 0
    for rid, out in roomy.items():
        assert tight[rid].token_ids == out.token_ids


@pytest.fixture(scope="module")
def server(llm):
    with running_server(None, llm=llm) as url:
        yield url


def test_the_server_enforces_response_format_and_structured_outputs(server):
    chat = {"messages": PROMPT, "max_tokens": 90, "temperature": 0}
    schema_format = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
    r = httpx.post(f"{server}/v1/chat/completions", json={**chat, "response_format": schema_format}, timeout=60)
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)

    body = {"prompt": "Call me at", "max_tokens": 20, "structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}}
    full = httpx.post(f"{server}/v1/completions", json={**body, "temperature": 0}, timeout=60).json()["choices"][0]
    assert full["finish_reason"] == "stop" and re.fullmatch("[0-9]{3}-[0-9]{4}", full["text"])
    with httpx.stream("POST", f"{server}/v1/completions", json={**body, "temperature": 0, "stream": True}) as s:
        events = [json.loads(e) for e in sse_events(s.iter_lines()) if e != "[DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events) == full["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"

    # any JSON object
    ok = [{"role": "user", "content": 'Give a JSON object with the key "ok" set to true.'}]
    body = {"messages": ok, "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}}
    choice = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and isinstance(json.loads(choice["message"]["content"]), dict)


def test_the_server_refuses_bad_specs_by_name_and_keeps_serving(server):
    chat = {"messages": PROMPT, "max_tokens": 4}
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integr"}}}
    cases = [
        ({"response_format": bad_schema}, "response_format.json_schema.schema", "Invalid type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "json_schema.schema"),
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "unclosed group"),
        ({"structured_outputs": {"grammar": "start: nope"}}, "structured_outputs.grammar", "unknown name"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "response_format",
            "structured_outputs",
        ),
    ]
    for extra, param, message in cases:
        error = api_error(httpx.post(f"{server}/v1/chat/completions", json={**chat, **extra}), 400)
        assert error["param"] == param and message in error["message"], error
    ok = httpx.post(f"{server}/v1/chat/completions", json={**chat, "response_format": {"type": "text"}}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_a_tokenizer_without_the_models_end_of_sequence_ids_is_a_clear_refusal(llm):
    """A dummy model of a preset (Qwen3's EOS 151645) borrows SmolLM2's 49152-token tokenizer: llguidance's ValueError
    was a 500 for every request with tools or a JSON format; it is a 400 naming the ids."""
    compiler = GrammarCompiler(llm.tokenizer.backend, 151936, [151645])
    with pytest.raises(
        InvalidRequestError, match=r"need a tokenizer that holds the model's end-of-sequence ids \[151645\]"
    ):
        compiler.start(StructuredOutputsParams(json_object=True))
