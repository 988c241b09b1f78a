"""Bad input to rooftop serve: each gets its 4xx and an OpenAI-style error body, and the server goes on serving."""

from __future__ import annotations

import httpx
import pytest
from serve_support import api_error, metrics

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}  # as OpenAI's clients send it


def chat(**fields) -> dict:
    return {"messages": HI, "max_tokens": 2, **fields}


CASES = [
    # (name, path, body as JSON or raw bytes, status, words the message must hold)
    ("malformed JSON", CHAT, b'{"messages": [', 400, "not valid JSON"),
    ("not an object", CHAT, b"[1, 2]", 400, "must be a JSON object"),
    ("empty body", CHAT, b"", 400, "not valid JSON"),
    ("unknown model", CHAT, chat(model="gpt-5"), 404, "'gpt-5' does not exist"),
    ("missing messages", CHAT, {"max_tokens": 2}, 400, "messages is required"),
    ("missing prompt", TEXT, {"max_tokens": 2}, 400, "prompt is required"),
    ("no messages", CHAT, chat(messages=[]), 400, "at least one message"),
    ("empty prompt", TEXT, {"prompt": ""}, 400, "prompt is empty"),
    ("messages not a list", CHAT, chat(messages="hi"), 400, "messages: Input should be a valid array"),
    ("temperature a string", CHAT, chat(temperature="hot"), 400, "temperature: Input should be a valid number"),
    ("max_tokens a string", CHAT, chat(max_tokens="5"), 400, "max_tokens: Input should be a valid integer"),
    ("stream a string", CHAT, chat(stream="yes"), 400, "stream: Input should be a valid boolean"),
    ("max_tokens a boolean", CHAT, chat(max_tokens=True), 400, "max_tokens: Input should be a valid integer, got true"),
    (
        "stream_options without stream",
        CHAT,
        chat(stream_options={"include_usage": True}),
        400,
        "stream_options is only allowed with stream: true",
    ),
    ("content a number", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (
        "NaN temperature",
        CHAT,
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        400,
        "finite number",
    ),
    ("negative temperature", CHAT, chat(temperature=-1), 400, "temperature must be a finite number >= 0"),
    ("top_p 0", CHAT, chat(top_p=0), 400, "top_p must be in (0, 1]"),
    ("top_p above 1", TEXT, {"prompt": "hi", "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ("max_tokens 0", TEXT, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens must be an integer >= 1"),
    (
        "max_completion_tokens 0",
        CHAT,
        chat(max_completion_tokens=0),
        400,
        "max_completion_tokens must be an integer >= 1",
    ),
    ("seed beyond 64 bits", CHAT, chat(seed=2**64), 400, "seed must be an integer in [-2**63, 2**64 - 1]"),
    ("seed below -2**63", TEXT, {"prompt": "hi", "seed": -(2**63) - 1}, 400, "seed must be an integer in"),
    ("top_k below -1", CHAT, chat(top_k=-2), 400, "top_k must be an integer >= 0"),
    ("min_p above 1", CHAT, chat(min_p=2), 400, "min_p must be in [0, 1]"),
    ("presence_penalty 3", CHAT, chat(presence_penalty=3), 400, "presence_penalty must be in [-2, 2]"),
    ("repetition_penalty 0", CHAT, chat(repetition_penalty=0), 400, "repetition_penalty must be a finite number > 0"),
    ("top_logprobs 50", CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs must be in [0, 20]"),
    ("top_logprobs alone", CHAT, chat(top_logprobs=2), 400, "top_logprobs needs logprobs"),
    ("logprobs 21", TEXT, {"prompt": "hi", "logprobs": 21}, 400, "logprobs must be an integer in [0, 20]"),
    ("empty stop string", CHAT, chat(stop=[""]), 400, "stop must be a non-empty string or a list of them"),
    ("stop an empty string", CHAT, chat(stop=""), 400, "stop must be a non-empty string or a list of them"),
    ("n 0", CHAT, chat(n=0), 400, "n must be in [1, 128]"),
    ("n 129", TEXT, {"prompt": "hi", "n": 129}, 400, "n must be in [1, 128]"),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    (
        "image part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "?"}, IMAGE]}]),
        400,
        "messages[0].content[1]: image_url parts are not supported (rooftop takes text only)",
    ),
    (
        "a text part with an image",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "?", "image_url": IMAGE["image_url"]}]}]),
        400,
        "messages[0].content[0].image_url is not a field of a text part",
    ),
    ("no user content", CHAT, chat(messages=[{"role": "user", "content": None}]), 400, "a user message needs content"),
    (
        "tool result without its call",
        CHAT,
        chat(messages=[*HI, {"role": "tool", "content": "42"}]),
        400,
        "messages[1]: a tool message needs the tool_call_id of the call it answers",
    ),
    (
        "chat prompt too long",
        CHAT,
        chat(messages=[{"role": "user", "content": "x" * 300}]),
        400,
        "the context holds 256",
    ),
    ("prompt too long", TEXT, {"prompt": "x" * 256}, 400, "the prompt has 256 tokens; the context holds 256"),
    ("token id out of range", TEXT, {"prompt": [1, 99999]}, 400, "out of range"),
    (
        "max_tokens past the context",
        TEXT,
        {"prompt": "hi", "max_tokens": 10**30},
        400,
        "lower max_tokens to at most 254",
    ),
    (
        "max_completion_tokens past the context",
        CHAT,
        chat(max_completion_tokens=300),
        400,
        "and max_completion_tokens asks for 300 more",
    ),
    ("an empty prompt in a batch", TEXT, {"prompt": ["a", ""]}, 400, "prompt 1 is empty"),
    ("a batch past the bound", TEXT, {"prompt": ["a"] * 9, "n": 128}, 400, "at most 1024 completions (prompts x n)"),
    (
        "a batch with one prompt too long",
        TEXT,
        {"prompt": ["hi", "x" * 256]},
        400,
        "prompt 1 has 256 tokens; the context holds 256",
    ),
    ("oversized body", TEXT, {"prompt": "x" * (70 << 10)}, 413, "the limit is 65536"),
]


PARAMS = {  # the field each refusal names, as OpenAI's `param`; None where the body as a whole is to blame
    "malformed JSON": None,
    "not an object": None,
    "empty body": None,
    "unknown model": "model",
    "missing messages": "messages",
    "missing prompt": "prompt",
    "no messages": "messages",
    "empty prompt": "prompt",
    "messages not a list": "messages",
    "temperature a string": "temperature",
    "max_tokens a string": "max_tokens",
    "stream a string": "stream",
    "content a number": "messages[0].content",
    "NaN temperature": "temperature",
    "negative temperature": "temperature",
    "top_p 0": "top_p",
    "top_p above 1": "top_p",
    "max_tokens 0": "max_tokens",
    "max_completion_tokens 0": "max_completion_tokens",
    "seed beyond 64 bits": "seed",
    "seed below -2**63": "seed",
    "top_k below -1": "top_k",
    "min_p above 1": "min_p",
    "presence_penalty 3": "presence_penalty",
    "repetition_penalty 0": "repetition_penalty",
    "top_logprobs 50": "top_logprobs",
    "top_logprobs alone": "top_logprobs",
    "logprobs 21": "logprobs",
    "empty stop string": "stop",
    "stop an empty string": "stop",
    "n 0": "n",
    "n 129": "n",
    "unknown role": "messages[0].role",
    "image part": "messages[0].content",
    "no user content": "messages[0].content",
    "a text part with an image": "messages[0].content[0].image_url",
    "tool result without its call": "messages[1].tool_call_id",
    "chat prompt too long": "messages",
    "prompt too long": "prompt",
    "token id out of range": "prompt",
    "max_tokens past the context": "max_tokens",
    "max_completion_tokens past the context": "max_completion_tokens",
    "an empty prompt in a batch": "prompt",
    "a batch past the bound": "prompt",
    "a batch with one prompt too long": "prompt",
    "oversized body": None,
    "stream_options without stream": "stream_options",
    "max_tokens a boolean": "max_tokens",
}


@pytest.mark.parametrize("name, path, body, status, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_status_and_an_error_body(server, name, path, body, status, words):
    send = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = httpx.post(f"{server}{path}", **send, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["code"] == status and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == PARAMS[name]
    ok = httpx.post(f"{server}{TEXT}", json={"prompt": "still there?", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a_chunked_body_over_the_limit_is_refused(server):
    def chunks():
        for _ in range(80):
            yield b"x" * 1024

    response = httpx.post(f"{server}{TEXT}", content=chunks(), timeout=30)  # no Content-Length: sent chunked
    assert response.status_code == 413 and "over the limit" in response.json()["error"]["message"]


def test_unknown_routes_and_methods_answer_json(server):
    missing = httpx.get(f"{server}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no route GET /v1/nothing"
    wrong = httpx.get(f"{server}{CHAT}")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


def test_bad_requests_are_counted_as_invalid(server):
    """On /metrics and on the dashboard, whose outcomes left refused requests out."""
    before = metrics(server)['rooftop_requests_total{outcome="invalid"}']
    shown = httpx.get(f"{server}/dashboard/state").json()["requests"]["invalid"]
    httpx.post(f"{server}{CHAT}", json=chat(temperature=-1))
    assert metrics(server)['rooftop_requests_total{outcome="invalid"}'] == before + 1
    assert httpx.get(f"{server}/dashboard/state").json()["requests"]["invalid"] == shown + 1


def test_tokenize_needs_a_prompt_or_messages(server):
    response = httpx.post(f"{server}/tokenize", json={})
    assert response.status_code == 400 and "either prompt or messages" in response.json()["error"]["message"]
    response = httpx.post(f"{server}/detokenize", json={"tokens": [-1]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tokens"


def test_openais_nullable_booleans_take_null_as_their_default(server):
    """OpenAI's stream, logprobs, echo and parallel_tool_calls are `boolean | null`: SDKs that send every field send
    them as null, which OpenAI and vLLM read as the default (they were refused: "Input should be a valid boolean")."""
    nulls = {"stream": None, "logprobs": None, "parallel_tool_calls": None}
    empty_system = [{"role": "system", "content": ""}, *HI]  # an empty string is content (a missing one is refused)
    response = httpx.post(f"{server}{CHAT}", json=chat(**nulls, messages=empty_system), timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["logprobs"] is None
    response = httpx.post(f"{server}{TEXT}", json={"prompt": "hi", "max_tokens": 2, "echo": None, "stream": None})
    assert response.status_code == 200, response.text
    assert not response.json()["choices"][0]["text"].startswith("hi")  # echo null: no echo
    options = {"include_usage": True, "include_obfuscation": True}  # a hint: no padding either way
    streamed = httpx.post(f"{server}{CHAT}", json=chat(stream=True, stream_options=options), timeout=30)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert '"completion_tokens": 2' in streamed.text.replace('":2', '": 2')


@pytest.mark.parametrize(
    "fields",
    [{"top_p": 1e-46}, {"repetition_penalty": 1e-300}, {"repetition_penalty": 1e300}, {"seed": 2**64 - 1}],
    ids=["top_p rounding to 0 in float32", "tiny repetition_penalty", "huge repetition_penalty", "largest seed"],
)
def test_every_accepted_value_runs(server, fields):
    """Values the validation takes are values the engine can run: no 500 for a valid-looking request."""
    response = httpx.post(f"{server}{TEXT}", json={"prompt": "hi hi hi", "max_tokens": 3, **fields}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


def test_an_internal_error_is_a_plain_500_on_a_connection_that_stays_usable(long_gguf):
    """A bug in a handler: the client gets a 500 that names no internals, its keep-alive connection serves the next
    request, and the error is counted once."""
    from serve_support import KV_BYTES, running_server

    from rooftop import LLM

    llm = LLM(model=long_gguf, kv_cache_bytes=KV_BYTES)
    encode = llm.tokenizer.encode

    def broken(text, *args, **kwargs):
        if "boom" in text:
            raise RuntimeError("secret internal detail")
        return encode(text, *args, **kwargs)

    llm.tokenizer.encode = broken
    with running_server(long_gguf, llm=llm) as url, httpx.Client(base_url=url, timeout=30) as client:
        failed = client.post(TEXT, json={"prompt": "boom", "max_tokens": 2})
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "internal_server_error" and "internal error (id " in error["message"]
        assert "secret" not in failed.text and "RuntimeError" not in failed.text
        ok = client.post(TEXT, json={"prompt": "fine", "max_tokens": 2})  # the same pooled connection
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert metrics(url)['rooftop_requests_total{outcome="error"}'] == 1


REFUSED = [  # (path, body, words the message must hold, param): fields rooftop does not implement, bad values of new ones
    (CHAT, chat(n=2, seed=2**64 - 1), "seed + n - 1 must be at most", "seed"),
    (
        CHAT,
        chat(guided_choice=["yes", "no"]),
        "guided_choice is not a field rooftop implements (refused rather than ignored): vLLM's "
        "structured_outputs.choice replaced it",
        "guided_choice",
    ),
    (CHAT, chat(prompt_logprobs=1, stream=True), "not available with stream: true", "prompt_logprobs"),
    (CHAT, chat(min_tokens=3, max_tokens=2), "min_tokens must be at most max_tokens (2), got 3", "min_tokens"),
    (TEXT, {"prompt": "a", "skip_special_tokens": 1}, "skip_special_tokens", "skip_special_tokens"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": "hi", "x": 1}]),
        "not a field",
        "messages[0].x",
    ),
    (CHAT, chat(audio={"voice": "alloy", "format": "wav"}), "audio is not supported", "audio"),
    (
        CHAT,
        chat(prediction={"type": "content", "content": "x"}),
        "prediction is not supported",
        "prediction",
    ),
    (CHAT, chat(modalities=["text", "audio"]), 'modalities must be ["text"]', "modalities"),
    (CHAT, chat(functions=[{"name": "f"}]), "deprecated it for tools", "functions"),
    (CHAT, chat(reasoning_effort="low"), "reasoning_effort is not supported", "reasoning_effort"),
    (CHAT, chat(web_search_options={}), "does not search the web", "web_search_options"),
    (TEXT, {"prompt": "a", "suffix": "b"}, "suffix is not supported", "suffix"),
    (TEXT, {"prompt": "a", "best_of": 3}, "best_of must equal n", "best_of"),
    (
        CHAT,
        chat(messages=[{"role": "assistant", "audio": {"id": "a"}}]),
        "not supported",
        "messages[0].audio",
    ),
    (CHAT, chat(logit_bias={"hello": 1}), "logit_bias keys are token ids", "logit_bias"),
    (TEXT, {"prompt": "a", "logit_bias": {"5": 101}}, "biases in [-100, 100]", "logit_bias"),
    (CHAT, chat(logit_bias={"99999": 5}), "out of range", "logit_bias"),
]
HINTS = {  # OpenAI's fields that change nothing here: accepted, listed in the README as ignored
    "user": "u-1",
    "metadata": {"k": "v"},
    "store": False,
    "service_tier": "auto",
    "safety_identifier": "s-1",
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"ttl": "30m"},
    "modalities": ["text"],
}


def test_unimplemented_fields_are_refused_by_name_and_hints_accepted(server):
    """Each refusal is a 400 naming the field (its own name, even when nobody documents it); OpenAI's hint fields
    and the default values of refused ones (echo false, suffix "", best_of = n, replayed empty reply fields) run."""
    for path, body, words, param in REFUSED:
        error = api_error(httpx.post(f"{server}{path}", json=body, timeout=30), 400)
        assert words in error["message"] and error["param"] == param, (body, error)
    replayed = {"role": "assistant", "content": "hello", "refusal": None, "annotations": [], "audio": None}
    ok = httpx.post(f"{server}{CHAT}", json=chat(**HINTS, messages=[*HI, replayed, *HI]), timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text
    text = {"prompt": "hi", "max_tokens": 2, "user": "u", "echo": False, "suffix": "", "best_of": 2, "n": 2}
    ok = httpx.post(f"{server}{TEXT}", json=text, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4, ok.text
