"""Sequence: one request's tokens, text and stopping state as it goes through prefill and decode."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from rooftop.engine.detokenizer import IncrementalDetokenizer
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.sampler import TokenLogprob
from rooftop.engine.sampling_params import SamplingParams


@dataclass
class RequestOutput:
    """What `LLM.generate` returns for one prompt (vLLM's fields, flattened to one completion)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics
    error: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token when params.logprobs is set

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity, not field-by-field: schedulers look sequences up in lists
class Sequence:
    """A request inside the engine: its tokens, how many have K/V in the cache, its blocks, its text."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    eos_token_ids: list[int]
    max_model_len: int
    metrics: RequestMetrics
    arrival_index: int = 0  # first come, first served; the latest arrival is preempted first
    generator: torch.Generator | None = None  # seeded sampling keeps its state across steps
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded output, already cut at a stop string
    streamed: int = 0  # how much of `text` has been handed out as stream deltas
    finish_reason: str | None = None
    error: str | None = None  # why the request ended with finish_reason "error"
    logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def append_token(self, token_id: int, now: float) -> str:
        """Record a sampled token, update text and finish state; return the new text safe to stream."""
        self.output_token_ids.append(token_id)
        self.metrics.token_times.append(now)
        p = self.params
        cut = False
        if token_id in p.stop_token_ids or (not p.ignore_eos and token_id in self.eos_token_ids):
            self.finish_reason = "stop"
        else:
            before = len(self.text)
            self.text += self.detokenizer.add(token_id)
            cut = self._cut_at_stop_string(before)
        if self.finish_reason is None and (
            len(self.output_token_ids) >= p.max_tokens or self.num_tokens >= self.max_model_len
        ):
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self.metrics.finished_time = now
            if not cut:  # bytes held back for an incomplete character are text all the same at the end
                before = len(self.text)
                self.text += self.detokenizer.flush()
                self._cut_at_stop_string(before)
        return self._stream_delta()

    def _cut_at_stop_string(self, before: int) -> bool:
        """Cut the text at the first stop string that text from `before` on completes; the stop string is dropped."""
        longest = max((len(s) for s in self.params.stop), default=0)
        search_from = max(0, before - longest + 1)
        hits = [i for i in (self.text.find(s, search_from) for s in self.params.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason = "stop"
        return bool(hits)

    def _stream_delta(self) -> str:
        """New text, holding back a tail that could still turn out to be the start of a stop string."""
        hold = 0 if self.finish_reason else max((len(s) for s in self.params.stop), default=1) - 1
        end = max(self.streamed, len(self.text) - hold)
        delta, self.streamed = self.text[self.streamed : end], end
        return delta

    def output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            text=self.text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            metrics=self.metrics,
            error=self.error,
            logprobs=list(self.logprobs),
        )
