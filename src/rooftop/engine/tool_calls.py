"""Tool calls read from a model's output: the hermes-style `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
blocks (engine/tools.py) become OpenAI's tool calls, the text around them the message's content.

One reader serves a stream and a finished output alike (`parse_tool_calls` feeds the whole text at once), so a
streamed reply and the same reply unstreamed carry the same content and calls. It says a call's id and name as soon
as the block's head `{"name": "...", "arguments": ` is complete, then the arguments' text as it comes (the raw JSON
of the value, up to where it ends). Text that could still be the start of `<tool_call>` is held back; whitespace
beside a call is not content. A block that closes without the usual head counts once it closes, if its JSON holds a
name and an object of arguments; one that closes and is no call at all (not JSON, say) stays content, as written.

An output cut short (by max_tokens, or a stop string) inside a block never leaves `<tool_call>` markup in the
content:
- cut once `{"name": "..."` is complete (the name's closing quote came): a call of that name, its arguments the
  text of their value as far as it got ("" if it had not begun), as OpenAI returns a call cut by `length` (a
  stream that had not said it yet, its head being incomplete, says its id and name at the end);
- cut before that (just after `<tool_call>`, inside the name): dropped, neither content nor a call, with the
  whitespace before it;
- cut inside the tag itself (`<tool_c`): dropped likewise where nothing but whitespace comes before it since the
  output's start or the last call; after other text (`a < b, <tool`) it stays content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from rooftop.engine.tools import CALL_CLOSE, CALL_OPEN

# a call's name, complete once its closing quote has come; its head, once the arguments' first character has
NAME = r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")'
NAMED = re.compile(NAME)
HEAD = re.compile(NAME + r'\s*,\s*"arguments"\s*:\s*(?=\S)')
_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    """One call: its id (call_ and 24 hex digits), the function's name, and the arguments' JSON text."""

    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Content:
    """Text of the message's content."""

    text: str


@dataclass
class CallStart:
    """A new call: the index-th of the reply (with its id and name)."""

    index: int
    call: ToolCall


@dataclass
class Arguments:
    """More of the index-th call's arguments."""

    index: int
    text: str


Event = Content | CallStart | Arguments


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallReader:
    """Reads an output as it grows (`feed` each new piece, `finish` at the end) into Content, CallStart and
    Arguments events; `calls` holds the calls so far."""

    def __init__(self):
        self.text = ""
        self.pos = 0  # everything before it has been said
        self.block: int | None = None  # where the open block's JSON starts
        self.arguments: int | None = None  # where the open call's arguments start (its head was complete)
        self.spaces = ""  # whitespace held until text follows it (whitespace beside a call is not content)
        self.spaces_before = ""  # what was held when the open block began: content again if it is not a call
        self.after_call = False  # a call just closed: the whitespace after it is dropped
        self.since_call = 0  # where the text after the last call (or the output's start) begins
        self.calls: list[ToolCall] = []

    def feed(self, piece: str) -> list[Event]:
        self.text += piece
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        """The end of the output (the module's docstring says how a cut block reads): held text is content, unless
        it could begin `<tool_call>` with only whitespace before it since the start or the last call; an open block
        is a call if its name was complete (its arguments as far as they got), dropped otherwise."""
        events: list[Event] = []
        if self.block is None:
            held = _held(self.text, self.pos, CALL_OPEN)
            if held and not self.text[self.since_call : len(self.text) - held].strip():  # a cut call's tag
                self.spaces = ""
            else:
                self._content(self.text[self.pos :], events)
        elif self.arguments is None:
            whole = self._whole_call(self.text[self.block :])
            named = None if whole is not None else _name(NAMED.match(self.text, self.block))
            if whole is not None:
                self._start(*whole, events)
            elif named is not None:  # cut after its name: a call with no arguments yet
                self._start(named, None, events)
            else:  # cut before its name was complete: not a call, nor content
                self.spaces = ""
        else:
            self._arguments(events, last=True)
        if not self.calls and self.spaces:
            events.append(Content(self.spaces))
        self.pos, self.block, self.arguments, self.spaces = len(self.text), None, None, ""
        return events

    def _step(self, events: list[Event]) -> bool:
        """Say what can be said from `pos` on; True if it moved into or out of a block (look again)."""
        if self.block is None:
            found = self.text.find(CALL_OPEN, self.pos)
            if found < 0:
                self._content(self.text[self.pos : len(self.text) - _held(self.text, self.pos, CALL_OPEN)], events)
                return False
            self._content(self.text[self.pos : found], events)
            self.spaces_before, self.spaces, self.block = self.spaces, "", found + len(CALL_OPEN)
            self.pos = self.block
            return True
        if self.arguments is None:
            head = HEAD.match(self.text, self.block)
            name = _name(head)
            if name is not None:
                self._start(name, None, events)
                self.arguments = self.pos = head.end()
        called = self.arguments is not None
        if called:
            value_end = self._arguments(events)
            close = -1 if value_end is None else self.text.find(CALL_CLOSE, value_end)
        else:  # no head (yet): a call in another shape counts once its block closes
            close = self.text.find(CALL_CLOSE, self.block)
            whole = None if close < 0 else self._whole_call(self.text[self.block : close])
            called = whole is not None
            if called:
                self._start(*whole, events)
            elif close >= 0:  # not a call after all: the block is content
                self.spaces = self.spaces_before
                self._content(self.text[self.block - len(CALL_OPEN) : close + len(CALL_CLOSE)], events)
        if close < 0:
            return False
        self.pos, self.block, self.arguments = close + len(CALL_CLOSE), None, None
        if called:
            self.spaces, self.after_call, self.since_call = "", True, self.pos
        return True

    def _start(self, name: str, arguments: str | None, events: list[Event]) -> None:
        call = ToolCall(new_call_id(), name)
        self.calls.append(call)
        events.append(CallStart(len(self.calls) - 1, call))
        if arguments is not None:
            call.arguments = arguments
            events.append(Arguments(len(self.calls) - 1, arguments))

    def _arguments(self, events: list[Event], last: bool = False) -> int | None:
        """Say the open call's arguments from `pos` on: up to where their JSON value ends (returned), or, while it
        goes on, all that has come short of a `</tool_call>` (at the `last` call, the block ends there)."""
        try:
            end = value_end = _DECODER.raw_decode(self.text, self.arguments)[1]
        except json.JSONDecodeError:
            value_end, close = None, self.text.find(CALL_CLOSE, self.arguments)
            if close >= 0:
                end = close
            else:
                end = len(self.text) - (0 if last else _held(self.text, self.pos, CALL_CLOSE))
        if end > self.pos:
            piece = self.text[self.pos : end]
            self.calls[-1].arguments += piece
            events.append(Arguments(len(self.calls) - 1, piece))
            self.pos = end
        return value_end

    def _content(self, text: str, events: list[Event]) -> None:
        """Text outside the calls (from `pos`, unless inside a block that turned out not to be a call): said, but
        its trailing whitespace held until more text follows, and the whitespace after a call dropped."""
        if self.block is None:
            self.pos += len(text)
        if self.after_call:
            text = text.lstrip()
            self.after_call = not text
        body = text.rstrip()
        if body:
            events.append(Content(self.spaces + body))
            self.spaces = ""
        self.spaces += text[len(body) :]

    @staticmethod
    def _whole_call(block: str) -> tuple[str, str] | None:
        """(name, arguments' JSON) of a block whose JSON is a complete call in another shape; None otherwise."""
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return None
        ok = isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)
        return (call["name"], json.dumps(call["arguments"], ensure_ascii=False)) if ok else None


def _name(match: re.Match | None) -> str | None:
    """The name a NAMED or HEAD match holds; None without a match or where its string is not valid JSON."""
    try:
        return None if match is None else json.loads(match.group(1))
    except json.JSONDecodeError:
        return None


def _held(text: str, start: int, tag: str) -> int:
    """How many characters at the end of `text` (from `start` on) could begin `tag`: held back."""
    for n in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """(The content, None if there is none, and the calls) of a finished output."""
    reader = ToolCallReader()
    events = reader.feed(text) + reader.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    return content or None, reader.calls
