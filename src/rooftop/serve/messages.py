"""A chat request's messages: OpenAI's roles, text content (a string or text parts), an assistant's tool calls and a
tool result's tool_call_id, as the engine's chat template takes them (engine/tool_prompt.py checks the calls)."""

from __future__ import annotations

from typing import Any, Literal

from rooftop.errors import InvalidRequestError
from rooftop.serve.body import Body

ROLES = Literal["system", "developer", "user", "assistant", "tool"]
# What a reply carries and a client sends back with it (the openai client echoes a reply's message as it came):
# accepted when empty, refused otherwise, as rooftop never writes them
REPLY_ONLY = ("annotations", "audio", "function_call")


class ContentPart(Body):
    """A part of a message's content: text, or OpenAI's other kinds, which are named so that they are refused by their
    kind (rooftop takes text only), not as an unknown field of a text part."""

    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class Message(Body):
    role: ROLES
    content: str | list[ContentPart] | None = None
    name: str | None = None  # a participant's name: passed to the chat template, which may use it or not
    tool_calls: list[dict] | None = None  # an assistant's calls, as OpenAI writes them
    tool_call_id: str | None = None  # a tool result's: the call it answers
    refusal: str | None = None  # an assistant's refusal: its text, when it has no content
    annotations: list | None = None
    audio: Any = None
    function_call: Any = None

    def as_dict(self, index: int) -> dict:
        """{"role", "content", ...} with the text parts joined, for the chat template."""
        for name in REPLY_ONLY:
            if getattr(self, name):
                raise InvalidRequestError(
                    f"messages[{index}].{name} is not supported (rooftop takes text and tool calls)",
                    f"messages[{index}].{name}",
                )
        text = self._text(index)
        if self.content in (None, []) and self.role in ("system", "developer", "user"):  # "" is content: an empty one
            raise InvalidRequestError(
                f"messages[{index}]: a {self.role} message needs content", f"messages[{index}].content"
            )
        if self.role == "tool" and self.tool_call_id is None:
            raise InvalidRequestError(
                f"messages[{index}]: a tool message needs the tool_call_id of the call it answers",
                f"messages[{index}].tool_call_id",
            )
        message = {"role": self.role, "content": text or self.refusal or ""}
        extra = {"name": self.name, "tool_calls": self.tool_calls, "tool_call_id": self.tool_call_id}
        return message | {k: v for k, v in extra.items() if v is not None}

    def _text(self, index: int) -> str | None:
        if not isinstance(self.content, list):
            return self.content
        for i, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise InvalidRequestError(
                    f"messages[{index}].content[{i}]: {part.type} parts are not supported (rooftop takes text only)",
                    f"messages[{index}].content",
                )
            if other := next((k for k in ("image_url", "input_audio", "file") if getattr(part, k) is not None), None):
                raise InvalidRequestError(
                    f"messages[{index}].content[{i}].{other} is not a field of a text part",
                    f"messages[{index}].content[{i}].{other}",
                )
        return "".join(p.text for p in self.content)
