"""The OpenAI request bodies (with vLLM's extra sampling fields), parsed strictly: "16" is not a number, NaN is
not a temperature. Unknown fields are ignored, as OpenAI-compatible servers do.

Structured output comes as OpenAI's `response_format` or vLLM's `structured_outputs`, never both; either becomes
SamplingParams.structured_outputs."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rooftop.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from rooftop.engine.structured import StructuredOutputsParams
from rooftop.errors import InvalidRequestError

Float = Annotated[float, Field(allow_inf_nan=False)]
ROLES = Literal["system", "developer", "user", "assistant", "tool"]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(Body):
    include_usage: bool = False


class ContentPart(Body):
    type: str
    text: str | None = None


class Message(Body):
    role: ROLES
    content: str | list[ContentPart] | None = None

    def as_dict(self, index: int) -> dict:
        """{"role", "content"} with the text parts joined, for the chat template."""
        if isinstance(self.content, list):
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(
                        f"messages[{index}].content: only text parts are supported, got a {part.type!r} part",
                        f"messages[{index}].content",
                    )
            return {"role": self.role, "content": "".join(p.text for p in self.content)}
        return {"role": self.role, "content": self.content or ""}


class JsonSchemaFormat(Body):
    """OpenAI's response_format.json_schema. `strict` false is accepted, and the schema is enforced all the same."""

    name: str
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise InvalidRequestError(
                "response_format of type json_schema needs json_schema.schema", "response_format.json_schema"
            )
        try:
            return StructuredOutputsParams(json=self.json_schema.schema_)
        except InvalidRequestError as e:  # name the field the client sent
            message = str(e).replace("structured_outputs.json", "response_format.json_schema.schema")
            raise InvalidRequestError(message, "response_format.json_schema.schema") from None


class StructuredOutputs(Body):
    """vLLM's structured_outputs: exactly one of its fields."""

    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def params(self) -> StructuredOutputsParams:
        return StructuredOutputsParams(
            json=self.json_, regex=self.regex, choice=self.choice, grammar=self.grammar, json_object=self.json_object
        )


class SamplingFields(Body):
    """What chat and completions share: OpenAI's fields and vLLM's extras (top_k, min_p, repetition_penalty, ...)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: int | None = None  # vLLM: 0 or -1 switch it off
    min_p: Float | None = None
    repetition_penalty: Float | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def max_tokens_field(self) -> str:
        """The field that asked for the output's length, as OpenAI's `param` names it."""
        return "max_tokens"

    def sampling_params(self, max_tokens: int | None, default_max_tokens: int, logprobs: int | None) -> SamplingParams:
        """SamplingParams (whose validation names the bad value); n > 1 is refused: one completion per request."""
        if self.n is not None and self.n != 1:
            raise InvalidRequestError(f"n must be 1 (one completion per request), got {self.n}", "n")
        return SamplingParams(
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            temperature=_or(self.temperature, 1.0),
            top_p=_or(self.top_p, 1.0),
            top_k=0 if self.top_k in (None, -1) else self.top_k,
            min_p=_or(self.min_p, 0.0),
            repetition_penalty=_or(self.repetition_penalty, 1.0),
            presence_penalty=_or(self.presence_penalty, 0.0),
            frequency_penalty=_or(self.frequency_penalty, 0.0),
            seed=self.seed,
            stop=[] if self.stop is None else self.stop,  # "" is a stop string, refused as such
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            structured_outputs=self.structured_outputs_params(),
        )

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """From response_format or structured_outputs; a body with both (response_format not "text") is refused."""
        wanted = self.response_format is not None and self.response_format.type != "text"
        if wanted and self.structured_outputs is not None:
            raise InvalidRequestError(
                "response_format and structured_outputs both constrain the output: send one of them",
                "response_format",
            )
        if self.structured_outputs is not None:
            return self.structured_outputs.params()
        return None if self.response_format is None else self.response_format.structured_outputs()


class ChatCompletionRequest(SamplingFields):
    prompt_field: ClassVar[str] = "messages"  # the field a too-long prompt is blamed on
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def chat_messages(self) -> list[dict]:
        if not self.messages:
            raise InvalidRequestError("messages must hold at least one message", "messages")
        return [m.as_dict(i) for i, m in enumerate(self.messages)]

    def to_sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}", "top_logprobs"
            )
        if self.max_completion_tokens is None:
            return self.sampling_params(
                self.max_tokens, default_max_tokens, (self.top_logprobs or 0) if self.logprobs else None
            )
        try:
            return self.sampling_params(
                self.max_completion_tokens, default_max_tokens, (self.top_logprobs or 0) if self.logprobs else None
            )
        except InvalidRequestError as e:  # name the field the client sent
            if e.param != "max_tokens":
                raise
            raise InvalidRequestError(
                str(e).replace("max_tokens", "max_completion_tokens"), "max_completion_tokens"
            ) from None


class CompletionRequest(SamplingFields):
    prompt_field: ClassVar[str] = "prompt"
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text or token ids (a list holding one of them is accepted too)."""
        if self.echo:
            raise InvalidRequestError("echo is not supported", "echo")
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise InvalidRequestError(f"prompt must be one prompt; got a batch of {len(prompt)}", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise InvalidRequestError("prompt is empty", "prompt")
        return prompt

    def to_sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return self.sampling_params(self.max_tokens, default_max_tokens, self.logprobs)


class TokenizeRequest(Body):
    """vLLM's /tokenize: a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]


def _or(value, default):
    return default if value is None else value
