"""Tools and structured output through `rooftop serve` and the openai client, on the bundled model: a tool-calling
round trip, tool calls streamed as OpenAI streams them, a call cut by max_tokens (streamed or not, and sent back),
tool_choice modes, bad tool definitions refused by name, `chat.completions.parse` with a Pydantic model, and a
streamed chat held to a schema."""

from __future__ import annotations

import json
from typing import Annotated

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from serve_support import api_error, running_server, sse_events

from rooftop import LLM

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Lagos?"}]
CHAT = "/v1/chat/completions"
pytestmark = pytest.mark.slow  # the bundled model


@pytest.fixture(scope="module")
def server():
    with running_server(None, llm=LLM(num_kv_blocks=256)) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def assert_valid_call(call) -> None:
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_tool_round_trip_through_the_openai_client(server):
    """tools -> tool_calls -> a role: tool result -> an answer, the reply's message sent back as the SDK gave it."""
    c = client(server)
    first = c.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=40,
        temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert_valid_call(call)
    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 31, "sky": "sunny"})}
    answer = c.chat.completions.create(
        model=MODEL, messages=[*ASK, choice.message, result], tools=[WEATHER, TIME], max_tokens=40, temperature=0
    ).choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls
    for call in answer.message.tool_calls or []:
        assert call.function.name in ("get_weather", "get_time")


def test_tool_calls_stream_as_openai_streams_them(server):
    """The call's index, id, type and name come first with empty arguments, then argument pieces under the index
    alone; they add up to the unstreamed reply's arguments. A named function ends with `stop` (OpenAI's way),
    `required` with `tool_calls`."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    for tool_choice, finish in [(named, "stop"), ("required", "tool_calls")]:
        body = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": tool_choice, "max_tokens": 40}
        body |= {"temperature": 0, "parallel_tool_calls": False}
        full = httpx.post(f"{server}{CHAT}", json=body, timeout=120).json()["choices"][0]
        assert full["finish_reason"] == finish and full["message"]["content"] is None
        with httpx.stream("POST", f"{server}{CHAT}", json=body | {"stream": True}, timeout=120) as s:
            chunks = [json.loads(e) for e in sse_events(s.iter_lines()) if e != "[DONE]"]
        deltas = [ch["choices"][0]["delta"] for ch in chunks]
        pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        head, rest = pieces[0], pieces[1:]
        expected = full["message"]["tool_calls"][0]
        assert head == {
            "index": 0,
            "id": head["id"],
            "type": "function",
            "function": {**expected["function"], "arguments": ""},
        }
        assert rest and all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)
        assert "".join(p["function"]["arguments"] for p in rest) == expected["function"]["arguments"]
        assert not any(d.get("content") for d in deltas) and chunks[-1]["choices"][0]["finish_reason"] == finish


def test_tool_choice_none_and_auto(server):
    """none: a plain answer, the tools not offered; auto: whatever the model writes, any call held to the tools."""
    none = httpx.post(
        f"{server}{CHAT}",
        json={"messages": ASK, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 12, "temperature": 0},
        timeout=120,
    ).json()["choices"][0]
    assert none["message"]["content"] and "tool_calls" not in none["message"]
    auto = client(server).chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=40, temperature=1.0, seed=3
    )
    for call in auto.choices[0].message.tool_calls or []:
        assert_valid_call(call)


CITY_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def streamed_message(url: str, body: dict) -> tuple[dict, str, list[dict]]:
    """The message a stream adds up to (content, and each call's id, name and arguments), its finish_reason, and
    its deltas."""
    with httpx.stream("POST", f"{url}{CHAT}", json=body | {"stream": True}, timeout=120) as s:
        chunks = [json.loads(e) for e in sse_events(s.iter_lines()) if e != "[DONE]"]
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    calls: list[dict] = []
    for piece in (p for d in deltas for p in d.get("tool_calls", [])):
        if "id" in piece:
            assert piece["index"] == len(calls) and piece["function"]["arguments"] == ""
            calls.append({"id": piece["id"], "type": "function", "function": dict(piece["function"])})
        else:
            calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
    content = "".join(d.get("content") or "" for d in deltas) or None
    return {"content": content, "tool_calls": calls}, chunks[-1]["choices"][0]["finish_reason"], deltas


def test_a_call_cut_by_max_tokens_streamed_or_not_and_sent_back(server):
    """Greedy, `required`, cut by max_tokens after the second call's name (48) or inside its arguments (52): that
    call comes back with its arguments as far as they got, finish_reason `length`, no markup in the content; a
    stream adds up to the same message. The reply, sent back with the calls' results, is taken."""
    for max_tokens in (48, 52):
        body = {"messages": ASK, "tools": [CITY_WEATHER], "tool_choice": "required", "max_tokens": max_tokens}
        body |= {"temperature": 0}
        full = httpx.post(f"{server}{CHAT}", json=body, timeout=120).json()["choices"][0]
        message = full["message"]
        assert full["finish_reason"] == "length" and message["content"] is None
        first, cut = (c["function"] for c in message["tool_calls"])
        assert first == {"name": "get_weather", "arguments": '{"city": "Lagos"}'} and cut["name"] == "get_weather"
        assert (cut["arguments"] == "") == (max_tokens == 48) and '{"city": "Lagos"}'.startswith(cut["arguments"])
        streamed, finish, deltas = streamed_message(server, body)
        assert finish == "length" and streamed["content"] is None
        assert [c["function"] for c in streamed["tool_calls"]] == [first, cut]
        assert all(set(d) <= {"role", "tool_calls"} for d in deltas)
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "31 C"} for c in message["tool_calls"]]
    again = {"messages": [*ASK, {"role": "assistant", **message}, *results], "tools": [CITY_WEATHER]}
    response = httpx.post(f"{server}{CHAT}", json=again | {"max_tokens": 8, "temperature": 0}, timeout=120)
    assert response.status_code == 200, response.text


BAD_TOOLS = [  # (fields, param, words)
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name", "letters"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
        "tools[0].function.parameters",
        "type: object",
    ),
    ({"tools": [WEATHER, WEATHER]}, "tools", "given more than once"),
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type", "only function tools"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
        "tool_choice",
        "does not define",
    ),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    (
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
        "both constrain",
    ),
    (
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {}}}],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
        "must be a string",
    ),
]


def test_bad_tools_are_refused_by_name_and_the_server_goes_on(server):
    for fields, param, words in BAD_TOOLS:
        error = api_error(httpx.post(f"{server}{CHAT}", json={"messages": ASK, "max_tokens": 2, **fields}), 400)
        assert error["param"] == param and words in error["message"], error
    assert httpx.post(f"{server}{CHAT}", json={"messages": ASK, "max_tokens": 2}, timeout=60).status_code == 200


class City(BaseModel):
    name: Annotated[str, Field(max_length=20)]
    country: Annotated[str, Field(max_length=20)]
    population: int


def test_parse_with_a_pydantic_model_and_a_streamed_schema(server):
    """The openai client's parse(): its strict JSON schema enforced, the reply parsed into the model; a streamed
    chat under the same schema adds up to JSON that validates."""
    c = client(server)
    ask = [{"role": "user", "content": "Describe Lagos as JSON."}]
    parsed = c.chat.completions.parse(model=MODEL, messages=ask, response_format=City, max_tokens=60, temperature=0)
    choice = parsed.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": City.model_json_schema(), "strict": True},
    }
    stream = c.chat.completions.create(
        model=MODEL, messages=ask, response_format=schema, max_tokens=60, temperature=1.0, seed=1, stream=True
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    if chunks[-1].choices[0].finish_reason == "stop":
        City.model_validate_json(text)
