"""SamplingParams: how to pick each next token and when to stop, validated when built (vLLM's names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from rooftop.engine.structured import StructuredOutputsParams
from rooftop.errors import InvalidRequestError

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs
MAX_N = 128  # outputs per prompt: OpenAI's bound on n
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a token's bias: -100 bans it, 100 all but forces it
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass
class SamplingParams:
    """temperature 0 is greedy; top_k 0 (or vLLM's -1), top_p 1, min_p 0, repetition_penalty 1 and
    presence/frequency_penalty 0 switch those off. `max_tokens` None is vLLM's: until EOS or the context's end. `logprobs` k records each output token's log-probability and the k most likely alternatives;
    `prompt_logprobs` k the same of each prompt token after the first (vLLM's: such a request computes its whole
    prompt, reading nothing from the prefix cache, whose positions have no logits). `logit_bias` maps token ids to a
    bias in [-100, 100] added to their logits before anything else (OpenAI's). `structured_outputs` constrains every
    token to a grammar (engine/structured.py). `n` outputs are generated for the prompt, as n requests sharing its
    computed prompt (`choices`).

    vLLM's output controls: no EOS, stop token or stop string ends the output before `min_tokens` tokens (EOS and
    the stop tokens are masked from the logits until then); `include_stop_str_in_output` keeps the matched stop
    string in the text; `skip_special_tokens` leaves special tokens out of the text. Special tokens are decoded as
    vLLM decodes them with a fast tokenizer, never spaced apart: `spaces_between_special_tokens` is accepted either
    way and changes nothing, as there. `allowed_token_ids` restricts every token to those ids; `bad_words` bans each
    word's token sequence (the last token of a word's tokens, with or without a leading space, is banned wherever
    the output ends with the tokens before it). `detokenize=False` makes no text (`text` stays ""): the token ids
    alone, as vLLM's."""

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = field(default_factory=list)
    detokenize: bool = True

    def __post_init__(self) -> None:
        def check(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise InvalidRequestError(message, param)

        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = self.stop if self.stop is not None else []
        check(
            isinstance(self.stop, list | tuple) and all(isinstance(s, str) and s for s in self.stop),
            "stop",
            f"stop must be a non-empty string or a list of them, got {_brief(self.stop)}",
        )
        self.stop = list(self.stop)
        self.stop_token_ids = self.stop_token_ids if self.stop_token_ids is not None else []
        check(
            isinstance(self.stop_token_ids, list | tuple) and all(_integer(t, 0) for t in self.stop_token_ids),
            "stop_token_ids",
            f"stop_token_ids must be a list of token ids (integers >= 0), got {_brief(self.stop_token_ids)}",
        )
        self.stop_token_ids = list(self.stop_token_ids)
        check(_integer(self.n, 1, MAX_N), "n", f"n must be in [1, {MAX_N}], got {self.n!r}")
        check(
            self.max_tokens is None or _integer(self.max_tokens, 1),
            "max_tokens",
            f"max_tokens must be an integer >= 1 or None (until EOS or the context's end), got {self.max_tokens!r}",
        )
        check(
            _integer(self.min_tokens, 0), "min_tokens", f"min_tokens must be an integer >= 0, got {self.min_tokens!r}"
        )
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"min_tokens must be at most max_tokens ({self.max_tokens}), got {self.min_tokens}",
        )
        check(
            _number(self.temperature) and self.temperature >= 0,
            "temperature",
            f"temperature must be a finite number >= 0, got {self.temperature!r}",
        )
        check(_number(self.top_p) and 0 < self.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        check(
            _integer(self.top_k, -1),
            "top_k",
            f"top_k must be an integer >= 0 (0, or vLLM's -1, disables it), got {self.top_k!r}",
        )
        self.top_k = max(self.top_k, 0)
        check(_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", f"min_p must be in [0, 1], got {self.min_p!r}")
        check(
            _number(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check(_number(value) and -2 <= value <= 2, name, f"{name} must be in [-2, 2], got {value!r}")
        if self.seed == -1 and not isinstance(self.seed, bool):  # vLLM's spelling of no seed
            self.seed = None
        check(
            self.seed is None or _integer(self.seed, SEED_RANGE[0], SEED_RANGE[1]),
            "seed",
            f"seed must be an integer in [-2**63, 2**64 - 1] (a torch generator's range), got {self.seed!r}",
        )
        check(
            self.seed is None or self.seed + self.n - 1 <= SEED_RANGE[1],
            "seed",
            f"seed + n - 1 must be at most 2**64 - 1 (output i is seeded with seed + i), got seed {self.seed}",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(
                value is None or _integer(value, 0, MAX_LOGPROBS),
                name,
                f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}",
            )
        for name in (
            "ignore_eos",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "detokenize",
        ):
            check(
                isinstance(getattr(self, name), bool),
                name,
                f"{name} must be true or false, got {getattr(self, name)!r}",
            )
        check(
            self.detokenize or not self.stop,
            "stop",
            "stop strings are matched in the text, which detokenize=False does not make (stop_token_ids end it by id)",
        )
        allowed = self.allowed_token_ids
        check(
            allowed is None or (isinstance(allowed, list | tuple) and allowed and all(_integer(t, 0) for t in allowed)),
            "allowed_token_ids",
            f"allowed_token_ids must be a non-empty list of token ids (integers >= 0), got {_brief(allowed)}",
        )
        check(
            isinstance(self.bad_words, list | tuple) and all(isinstance(w, str) and w.strip() for w in self.bad_words),
            "bad_words",
            f"bad_words must be a list of strings, each with text other than spaces, got {_brief(self.bad_words)}",
        )
        bias = self.logit_bias or {}
        check(
            isinstance(bias, dict)
            and all(_integer(t, 0) for t in bias)
            and all(_number(b) and abs(b) <= MAX_LOGIT_BIAS for b in bias.values()),
            "logit_bias",
            f"logit_bias maps token ids (integers >= 0) to biases in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
            f"got {_brief(self.logit_bias)}",
        )
        check(
            self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
            "structured_outputs",
            f"structured_outputs must be a StructuredOutputsParams, got {type(self.structured_outputs).__name__}",
        )
        check(
            self.structured_outputs is None or not self.ignore_eos,
            "ignore_eos",
            "ignore_eos cannot be combined with structured_outputs: a complete output ends at EOS, the only token "
            "its grammar allows there",
        )

    def choices(self) -> list[SamplingParams]:
        """The params of each of the n outputs, one engine request each: the same, n = 1, and output i of a seeded
        request seeded with seed + i (vLLM's rule), so each is reproducible and none repeats another."""
        return [replace(self, n=1, seed=None if self.seed is None else self.seed + i) for i in range(self.n)]

    @property
    def greedy(self) -> bool:
        """Below 1e-5 the scaled logits overflow: such temperatures mean greedy, as in vLLM."""
        return self.temperature < 1e-5


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(value, low: int, high: float = math.inf) -> bool:
    """An int (not a bool, which Python counts as one) in [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number(value) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
