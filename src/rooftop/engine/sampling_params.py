"""SamplingParams: how to pick each next token and when to stop, validated when built (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rooftop.errors import InvalidRequestError

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs


@dataclass
class SamplingParams:
    """temperature 0 is greedy; top_k 0, top_p 1, min_p 0, repetition_penalty 1 and presence/frequency_penalty 0
    switch those off. `logprobs` k records each output token's log-probability and the k most likely alternatives."""

    max_tokens: int = 16
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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise InvalidRequestError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise InvalidRequestError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        """Below 1e-5 the scaled logits overflow: such temperatures mean greedy, as in vLLM."""
        return self.temperature < 1e-5
