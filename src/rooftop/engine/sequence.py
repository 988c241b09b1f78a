"""Sequence: one request inside the engine — its tokens, how many have K/V in the cache, its blocks, its state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.sampler import TokenLogprob
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.structured import GrammarState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity, not field-by-field: schedulers look sequences up in lists
class Sequence:
    """The scheduler's and the sampler's view of a request; its text lives in the output processor."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    arrival_index: int = 0  # first come, first served; the latest arrival is preempted first
    generator: torch.Generator | None = None  # seeded sampling keeps its state across steps
    grammar: GrammarState | None = None  # structured output's place in its grammar, across steps and preemptions
    prompt_source: Sequence | None = None  # one with the same prompt, computing it for this one's prefix cache hit
    bad_words: list[list[int]] = field(default_factory=list)  # the params' bad_words as token ids, for the sampler
    status: Status = Status.WAITING
    cached: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    state_slot: int | None = None  # a hybrid model's linear-attention state slot, while it runs
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # params.prompt_logprobs: entry j is prompt token j + 1's, from position j's logits (the first token has none)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def uncached(self) -> int:
        """Tokens still to compute: the prompt's rest, or the one token sampled last."""
        return self.num_tokens - self.cached
