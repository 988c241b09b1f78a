"""Speculative decoding's proposers: draft tokens for the decoding sequences, which the next step verifies (the
n-gram one here, the draft model's in engine/draft.py).

A proposal is a point mass: the tokens a sequence is guessed to continue with. The verify step computes the
target model's rows for them (engine/runner.py) and the sampler draws each row as a decode would
(engine/sampler.py); a draft is kept while the drawn token equals it. For a point-mass draft q = one-hot(x) this
is the standard rejection rule: x is accepted with probability p(x) (the drawn token is x), and on a rejection the
token drawn is distributed as normalize(max(p - q, 0)), p without x. So the output is the target's distribution,
and greedy and seeded requests get exactly the tokens they get without speculation.

A sequence whose proposals keep failing stops proposing for a while (`Backoff`), so that on text its prompt does
not ground, speculation costs little more than the verify steps it still tries now and then.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from rooftop.config import ModelConfig, SpeculativeConfig
from rooftop.engine.draft import DraftProposer
from rooftop.engine.sequence import Sequence
from rooftop.errors import InvalidRequestError
from rooftop.loading.tokenizer import Tokenizer
from rooftop.models.transformer import Transformer

MAX_PAUSE = 32  # the most decode steps a sequence waits before proposing again after fruitless verify steps


def ngram_draft(tokens: list[int], k: int, longest: int, shortest: int) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the last n tokens of `tokens`, for the
    longest n from `longest` down to `shortest` that occurs earlier (vLLM's prompt lookup); [] when none does."""
    ids = np.asarray(tokens, dtype=np.int64)
    for n in range(min(longest, len(ids) - 1), shortest - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)  # every n-gram that has a successor
        starts = np.flatnonzero((windows == ids[-n:]).all(axis=1))
        if starts.size:
            start = int(starts[-1]) + n
            return tokens[start : start + k]
    return []


@dataclass
class Backoff:
    """After a verify step that accepts nothing a sequence waits `pause` decode steps before proposing again,
    doubling with each fruitless one up to MAX_PAUSE; any accepted draft resets it."""

    pause: int = 0
    left: int = 0  # decode steps still to wait

    def ready(self) -> bool:
        if self.left:
            self.left -= 1
            return False
        return True

    def observe(self, accepted: int) -> None:
        self.pause = 0 if accepted else min(max(1, 2 * self.pause), MAX_PAUSE)
        self.left = self.pause


class NgramProposer:
    """Prompt lookup: no second model; each sequence's own tokens, prompt and output, are the draft."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self._backoff: weakref.WeakKeyDictionary[Sequence, Backoff] = weakref.WeakKeyDictionary()

    def propose(self, most: dict[Sequence, int]) -> dict[Sequence, list[int]]:
        """Draft tokens for each sequence, at most `most[seq]` of them (and num_speculative_tokens)."""
        c, drafts = self.config, {}
        for seq, limit in most.items():
            if limit < 1 or not self._backoff.setdefault(seq, Backoff()).ready():
                continue
            k = min(limit, c.num_speculative_tokens)
            draft = ngram_draft(seq.all_token_ids, k, c.prompt_lookup_max, c.prompt_lookup_min)
            if draft:
                drafts[seq] = draft
        return drafts

    def observe(self, seq: Sequence, accepted: int) -> None:
        """A verify step of `seq` accepted `accepted` of its drafts."""
        self._backoff.setdefault(seq, Backoff()).observe(accepted)

    def release(self, seq: Sequence) -> None:
        """The sequence finished or was aborted (its backoff goes with it: a weak key)."""


def make_proposer(
    config: SpeculativeConfig | None,
    model: ModelConfig,
    target: Transformer | None = None,
    max_model_len: int = 0,
    tokenizer: Tokenizer | None = None,
) -> NgramProposer | DraftProposer | None:
    """The proposer `config` asks for, or None without speculation; refused by name where it cannot run. The draft
    method needs the `target` model (a self-draft is made of its layers; a draft file must share its vocabulary, and
    a draft directory without tokenizer files takes the target's `tokenizer`, as vLLM's does)."""
    if config is None:
        return None
    if not model.can_speculate:
        raise InvalidRequestError(
            "speculative decoding rolls rejected drafts back in the KV cache; this hybrid model's linear-attention "
            "layers keep a recurrent state that cannot be rolled back",
            "speculative_config",
        )
    if config.method == "draft":
        if target is None:
            raise ValueError("the draft method needs the target model")
        return DraftProposer(config, target, max_model_len or model.max_position_embeddings, tokenizer)
    return NgramProposer(config)


def sampling_runs(sampled: list[int]) -> list[tuple[int, int, int]]:
    """(batch index, first logits row, rows) of each sampling sequence, from the runner's row-to-sequence list (a
    verify step's rows are consecutive)."""
    runs: list[tuple[int, int, int]] = []
    for row, i in enumerate(sampled):
        if runs and runs[-1][0] == i:
            runs[-1] = (i, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((i, row, 1))
    return runs


def accepted_run(draft: list[int], tokens: list[int | None]) -> list[int] | None:
    """The tokens a step gives a sequence, from the tokens drawn at each of its rows (1 + its drafts): the drafts
    up to the first row that did not draw its draft, then that row's token (the bonus one when all were drawn).
    None when a row it needs has no token (its logits were not finite)."""
    run = []
    for j, token in enumerate(tokens):
        if token is None:
            return None
        run.append(token)
        if j == len(draft) or token != draft[j]:
            break
    return run
