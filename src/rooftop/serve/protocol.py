"""The OpenAI request bodies (with vLLM's extra sampling fields), parsed strictly: "16" is not a number, NaN is
not a temperature. Every field OpenAI documents for the two endpoints is decided: honoured; accepted as a hint that
changes nothing here (the README lists them); or refused with a 400 that names it and says why (`UNSUPPORTED`). A
field nobody documents is refused too (serve/body.py), so no field is silently dropped.

Structured output comes as OpenAI's `response_format` or vLLM's `structured_outputs` (serve/formats.py), tools as
OpenAI's `tools` and `tool_choice` (engine/tools.py), each becoming part of the request's SamplingParams."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from rooftop.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from rooftop.engine.structured import StructuredOutputsParams
from rooftop.engine.tools import Function, ToolChoice, check_tool_choice, check_tools, with_tool_grammar
from rooftop.errors import InvalidRequestError
from rooftop.serve.body import Body, Float, NullFalse, NullTrue
from rooftop.serve.formats import ResponseFormat, StructuredOutputs
from rooftop.serve.messages import Message

MAX_BATCH = 1024  # completions (prompts x n) one request may ask for: each is an engine request
TOKEN_ID = re.compile(r"[0-9]{1,10}")  # a logit_bias key


class StreamOptions(Body):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # a hint: rooftop's chunks carry no obfuscation padding either way


class SamplingFields(Body):
    """What chat and completions share: OpenAI's fields and vLLM's extras (top_k, min_p, repetition_penalty, ...)."""

    UNSUPPORTED: ClassVar[dict[str, str]] = {}  # field -> why it is refused when given (not null)
    STREAMED_PROMPT_LOGPROBS: ClassVar[str] = "prompt_logprobs are not available with stream: true (as in vLLM)"
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
    logit_bias: dict[str, Float] | None = None
    stream: NullFalse = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None  # vLLM's: a completion's in each choice, a chat's beside its choices
    user: str | None = None  # a hint: an end user's id, for OpenAI's abuse detection

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def max_tokens_field(self) -> str:
        """The field that asked for the output's length, as OpenAI's `param` names it."""
        return "max_tokens"

    @property
    def choices(self) -> int:
        return 1 if self.n is None else self.n

    def sampling_params(
        self, max_tokens: int | None, default_max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None
    ) -> SamplingParams:
        """SamplingParams (whose validation names the bad value), after refusing the fields rooftop does not
        implement."""
        for name, why in self.UNSUPPORTED.items():
            if getattr(self, name) is not None:
                raise InvalidRequestError(f"{name} is not supported: {why}", name)
        if self.prompt_logprobs is not None and self.stream:
            raise InvalidRequestError(self.STREAMED_PROMPT_LOGPROBS, "prompt_logprobs")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "stream_options is only allowed with stream: true (as OpenAI has it)", "stream_options"
            )
        return SamplingParams(
            n=self.choices,
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
            prompt_logprobs=prompt_logprobs,
            logit_bias=self.token_biases(),
            structured_outputs=self.structured_outputs_params(),
            min_tokens=self.min_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words or [],
        )

    def token_biases(self) -> dict[int, float] | None:
        """logit_bias with its keys (token ids written as strings, OpenAI's) as integers."""
        if self.logit_bias is None:
            return None
        bad = [k for k in self.logit_bias if not TOKEN_ID.fullmatch(k)]
        if bad:
            raise InvalidRequestError(
                f"logit_bias keys are token ids written as integers, got {bad[0]!r:.40}", "logit_bias"
            )
        return {int(k): v for k, v in self.logit_bias.items()}

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

    @property
    def structured_outputs_field(self) -> str:
        return "structured_outputs" if self.structured_outputs is not None else "response_format"


class ChatCompletionRequest(SamplingFields):
    UNSUPPORTED: ClassVar[dict[str, str]] = {
        "audio": "rooftop generates text only",
        "prediction": "predicted outputs are not implemented",
        "web_search_options": "rooftop does not search the web",
        "moderation": "rooftop runs no moderation",
        "reasoning_effort": "rooftop does not steer a model's reasoning",
        "verbosity": "rooftop does not steer a reply's length but by max_tokens",
        "functions": "OpenAI deprecated it for tools, which rooftop takes",
        "function_call": "OpenAI deprecated it for tool_choice, which rooftop takes",
    }
    prompt_field: ClassVar[str] = "messages"  # the field a too-long prompt is blamed on
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: NullFalse = False
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: NullTrue = True
    # vLLM's chat template fields (loading/tokenizer.py: apply_chat_template)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None  # the template's own variables, e.g. enable_thinking
    echo: NullFalse = False  # vLLM's: a reply that continues the assistant's last message starts with that message
    modalities: list[str] | None = None  # ["text"] only
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    moderation: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    functions: Any = None
    function_call: Any = None
    # hints: accepted, change nothing here (OpenAI's storage, billing, caching and abuse-detection keys)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict | None = None

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def chat_messages(self) -> list[dict]:
        if not self.messages:
            raise InvalidRequestError("messages must hold at least one message", "messages")
        return [m.as_dict(i) for i, m in enumerate(self.messages)]

    def template_options(self) -> dict:
        """How the messages are rendered: LLM.apply_chat_template's keywords."""
        return _template_options(self)

    def echoed(self, messages: list[dict]) -> str | None:
        """With echo, what starts each choice's content (vLLM's rule): the last message's text where that message is
        the assistant's, the role of the reply (a reply continued with continue_final_message), else nothing."""
        if not self.echo:
            return None
        return messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""

    def tool_choice_given(self) -> tuple[list[Function], ToolChoice]:
        """The tools offered and how they may be used (checked: a bad one is a 400 naming its field)."""
        functions = [] if self.tools is None else check_tools(self.tools)
        return functions, check_tool_choice(self.tool_choice, functions)

    def to_sampling_params(
        self, default_max_tokens: int, functions: list[Function], choice: ToolChoice
    ) -> SamplingParams:
        """SamplingParams with the tool grammar of `choice`: from `tool_choice_given`."""
        if self.modalities is not None and self.modalities != ["text"]:
            raise InvalidRequestError(
                f'modalities must be ["text"] (rooftop generates text only), got {self.modalities}', "modalities"
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}", "top_logprobs"
            )
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        field = self.max_tokens_field
        try:
            params = self.sampling_params(getattr(self, field), default_max_tokens, logprobs, self.prompt_logprobs)
        except InvalidRequestError as e:  # name the field the client sent
            if e.param != "max_tokens" or field == "max_tokens":
                raise
            raise InvalidRequestError(str(e).replace("max_tokens", field), field) from None
        try:
            return with_tool_grammar(params, functions, choice, self.parallel_tool_calls)
        except InvalidRequestError as e:
            raise InvalidRequestError(
                str(e).replace("a structured output", self.structured_outputs_field), self.structured_outputs_field
            ) from None


class CompletionRequest(SamplingFields):
    STREAMED_PROMPT_LOGPROBS: ClassVar[str] = (
        SamplingFields.STREAMED_PROMPT_LOGPROBS
        + "; streamed, echo: true with logprobs puts the prompt's logprobs in each choice's first chunk"
    )
    prompt_field: ClassVar[str] = "prompt"
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: NullFalse = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each text or token ids: OpenAI's prompt is one of them or a batch (a list of them), and each
        prompt of a batch gets its n choices."""
        if self.suffix:
            raise InvalidRequestError("suffix is not supported: rooftop completes after the prompt only", "suffix")
        if self.best_of is not None and self.best_of != self.choices:
            raise InvalidRequestError(
                f"best_of must equal n ({self.choices}) if given: rooftop returns every completion it generates, "
                f"got {self.best_of}",
                "best_of",
            )
        prompt = self.prompt
        batch = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        if len(batch) * self.choices > MAX_BATCH:
            raise InvalidRequestError(
                f"a request may ask for at most {MAX_BATCH} completions (prompts x n); got {len(batch)} x "
                f"{self.choices}",
                "prompt",
            )
        for i, one in enumerate(batch):
            if not one:
                raise InvalidRequestError("prompt is empty" if len(batch) == 1 else f"prompt {i} is empty", "prompt")
        return batch

    @property
    def echo_only(self) -> bool:
        """OpenAI's and vLLM's echo with max_tokens 0: the prompt back alone, with its logprobs where asked (how a
        prompt's log-likelihood is scored). One token is generated to get there, and not returned."""
        return self.echo and self.max_tokens == 0

    def to_sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """vLLM's: echo with logprobs asks for the prompt's logprobs too, as many alternatives as the output's
        (unless prompt_logprobs says how many)."""
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo:
            prompt_logprobs = self.logprobs
        if self.echo_only and self.min_tokens:  # checked here: the one token generated would allow min_tokens 1
            raise InvalidRequestError(f"min_tokens must be at most max_tokens (0), got {self.min_tokens}", "min_tokens")
        max_tokens = 1 if self.echo_only else self.max_tokens
        return self.sampling_params(max_tokens, default_max_tokens, self.logprobs, prompt_logprobs)


class TokenizeRequest(Body):
    """vLLM's /tokenize: a prompt, or chat messages rendered with the chat template (as chat renders them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False  # vLLM's: each id's vocabulary string beside it

    def template_options(self) -> dict:
        """As ChatCompletionRequest's; refused with a prompt, which no template renders."""
        if self.messages is None:
            for name in ("continue_final_message", "chat_template_kwargs"):
                if getattr(self, name):
                    raise InvalidRequestError(f"{name} goes with messages: a prompt is not rendered", name)
        return _template_options(self)


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]


def _template_options(body: ChatCompletionRequest | TokenizeRequest) -> dict:
    return {
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message,
        "chat_template_kwargs": body.chat_template_kwargs,
    }


def _or(value, default):
    return default if value is None else value
