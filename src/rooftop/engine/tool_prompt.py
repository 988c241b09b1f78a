"""A conversation with tools, made ready for the chat template: the tools offered and the calls and results that
went before (OpenAI's `tool_calls` on assistant messages, `role: tool` messages).

A template with its own tool syntax (one that reads `tools`, as Qwen's do) gets the tools and the messages as they
are, each call's arguments parsed to an object as such templates expect. A template without one (SmolLM2's) gets
rooftop's default, the hermes-style convention engine/tools.py enforces: a system prompt that lists the tools as
JSON and shows the call format; earlier calls written back into the assistant's turn as `<tool_call>` blocks; tool
results as a user turn of `<tool_response>` blocks.

A call's `arguments` may be any string, as OpenAI takes them: rooftop's own reply carries a call cut by max_tokens
with its arguments as far as they got (`{"city": "La`, or "" when cut after the name), and it must take that reply
back. Arguments that are not an object's JSON text go to the template as the string they are (ArgumentsText): a
template writes it as it is, `tojson` makes it a JSON string, and the default prompt's block holds it as one
(`{"name": "get_weather", "arguments": "{\\"city\\": \\"La"}`); a template that reads the arguments as a mapping
(`|items`, `.items()`) finds an empty one rather than failing. Only arguments that are not a string are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from rooftop.engine.tools import CALL_CLOSE, CALL_OPEN, Function
from rooftop.errors import InvalidRequestError

TOOL_PROMPT = """You can call functions to help with the request. Their signatures, one JSON object per line:
<tools>
{tools}
</tools>
To call a function, write its name and arguments as a JSON object between {open} and {close}, one block per call:
{open}
{{"name": "function name", "arguments": {{"argument name": "value"}}}}
{close}"""
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


class ArgumentsText(str):
    """A call's arguments that are not an object's JSON text, for the chat template: the string itself (written as
    it is, `is string` holds, JSON makes it a JSON string), and where a template takes them as a mapping, an empty
    one (no items, keys or values; `get` gives the default), so rendering never fails on them."""

    def items(self) -> list:
        return []

    def keys(self) -> list:
        return []

    def values(self) -> list:
        return []

    def get(self, key, default=None):
        return default


Mapping.register(ArgumentsText)  # jinja's `|items` filter and `is mapping` test ask for a Mapping


def tool_messages(messages: list[dict], functions: list[Function], template_takes_tools: bool) -> list[dict]:
    """`messages` for the template: checked, with the calls and results in the template's terms; without a template
    tool syntax, the tools (if any are offered) in a system prompt."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"message {i} must be a dict with 'role' and 'content'")
    messages = [m | {"content": _content(m.get("content"), i)} if "content" in m else m for i, m in enumerate(messages)]
    calls = [_calls(m, i) for i, m in enumerate(messages)]
    for i, m in enumerate(messages):
        if m.get("role") == "tool" and not isinstance(m.get("tool_call_id", ""), str):
            raise InvalidRequestError(f"messages[{i}].tool_call_id must be a string", f"messages[{i}].tool_call_id")
    if template_takes_tools:
        return [_text(m) | ({"tool_calls": made} if made else {}) for m, made in zip(messages, calls, strict=True)]
    out: list[dict] = []
    for m, made in zip(messages, calls, strict=True):
        m = _text(m)
        if made:
            blocks = [f"{CALL_OPEN}\n{json.dumps(_call_json(c), ensure_ascii=False)}\n{CALL_CLOSE}" for c in made]
            m = m | {"content": "\n".join(([m["content"]] if m["content"] else []) + blocks)}
        if m["role"] == "tool":
            response = f"{RESPONSE_OPEN}\n{m['content']}\n{RESPONSE_CLOSE}"
            if out and out[-1].get("tool_results"):  # results of one turn's calls: one user turn
                out[-1]["content"] += "\n" + response
                continue
            m = {"role": "user", "content": response, "tool_results": True}
        out.append(m)
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    if functions:
        lines = "\n".join(json.dumps(f.as_tool(), ensure_ascii=False) for f in functions)
        prompt = TOOL_PROMPT.format(tools=lines, open=CALL_OPEN, close=CALL_CLOSE)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = out[0] | {"content": f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _content(content, i: int) -> str | None:
    """A message's content as text: OpenAI's list of content parts joined where each is a text part ({"type":
    "text", "text": ...}); an image, audio or file part refused by its kind, as the server refuses it."""
    if not isinstance(content, list):
        return content
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"{kind} parts are not supported (rooftop takes text only)" if kind else "not a content part"
            raise InvalidRequestError(f"messages[{i}].content[{j}]: {what}", f"messages[{i}].content")
    return "".join(part["text"] for part in content)


def _text(message: dict) -> dict:
    """The message without its calls, its content a string ("" for none, as templates test it)."""
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    return out | {"content": message.get("content") or ""}


def _calls(message: dict, i: int) -> list[dict]:
    """An assistant message's tool_calls, checked ({"id", "type": "function", "function": {"name", "arguments"}}
    with the arguments a string) and as templates with a tool syntax read them: the arguments an object where they
    are an object's JSON text, an ArgumentsText otherwise."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not calls:
        return []
    where = f"messages[{i}].tool_calls"
    if message.get("role") != "assistant" or not isinstance(calls, list):
        raise InvalidRequestError(f"{where}: only an assistant message carries a list of tool calls", where)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(
                f'{where}[{j}] must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}',
                f"{where}[{j}]",
            )
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            param = f"{where}[{j}].function.arguments"
            raise InvalidRequestError(
                f"{param} must be a string (the arguments' JSON text), got {arguments!r:.60}", param
            )
        function = function | {"arguments": _arguments(arguments)}
        out.append({"type": "function", **{k: v for k, v in call.items() if k != "function"}, "function": function})
    return out


def _arguments(text: str) -> dict | ArgumentsText:
    """The object an arguments' JSON text holds, or the text as it is where it holds none (cut, say)."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else ArgumentsText(text)


def _call_json(call: dict) -> dict:
    return {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
