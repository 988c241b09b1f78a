"""Speculative decoding's `draft` method: a second, smaller model proposes each decoding sequence's next tokens.

The draft is a model file sharing the target's tokenizer (`model`), or a self-draft: the target's own first N
layers with its final norm and lm_head (`draft_layers`), the same weight objects, no copy. It decodes greedily, so a
proposal is a point mass like an n-gram one and the verify step's rejection rule (engine/speculative.py) keeps the
target's distribution unchanged: greedy and seeded requests get exactly the tokens they get without speculation.

The draft's K/V live beside the target's: one small KVCache per sequence it proposes for (models/kv_cache.py),
remembering which tokens it holds. Before each proposal the cache is brought up to the sequence's tokens: the
longest prefix it already holds is kept (the accepted drafts included) and the rest is computed; a rejected
draft's slots are simply overwritten. A finished, aborted or preempted sequence's cache is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from rooftop.config import SpeculativeConfig
from rooftop.engine.sequence import Sequence, Status
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.loading.model_files import load_model
from rooftop.loading.tokenizer import Tokenizer
from rooftop.models.kv_cache import KVCache
from rooftop.models.loader import build_model
from rooftop.models.transformer import Transformer


def self_draft(target: Transformer, layers: int) -> Transformer:
    """The target's first `layers` layers, final norm and lm_head as a model of their own (shared weights)."""
    total = target.config.num_layers
    if not 1 <= layers < total:
        raise InvalidRequestError(
            f"speculative_config draft_layers must be in 1..{total - 1} (the target has {total} layers); got {layers}",
            "speculative_config",
        )
    config = replace(target.config, num_layers=layers, layer_types=None)
    return Transformer(
        config,
        target.dtype,
        target.device,
        target.embed,
        target.layers[:layers],
        target.norm,
        target.lm_head,
        target.ops,
        target.weight_policy,
    )


def draft_model(config: SpeculativeConfig, target: Transformer, tokenizer: Tokenizer | None = None) -> Transformer:
    """The draft model `config` names, on the target's device in its dtype; refused where it cannot draft. It
    exchanges token ids only: a directory without tokenizer files takes `tokenizer` (the target's)."""
    if config.draft_layers is not None:
        return self_draft(target, config.draft_layers)
    loaded = load_model(config.model, tokenizer)
    c = loaded.config
    if c.vocab_size != target.config.vocab_size:
        raise InvalidRequestError(
            f"speculative_config model {config.model}: the draft's vocabulary has {c.vocab_size} tokens, the "
            f"target's {target.config.vocab_size}; a draft model must share the target's tokenizer",
            "speculative_config",
        )
    if c.num_linear_attention_layers:
        raise InvalidRequestError(
            f"speculative_config model {config.model}: a hybrid draft's linear-attention state cannot be rolled "
            "back to before a rejected draft",
            "speculative_config",
        )
    return build_model(loaded, target.dtype, target.device)


@dataclass
class DraftCache:
    """One sequence's draft K/V and the tokens they are of (position order)."""

    cache: KVCache
    tokens: list[int]


class DraftProposer:
    """Greedy drafts of a draft model, one sequence at a time."""

    def __init__(
        self, config: SpeculativeConfig, target: Transformer, max_model_len: int, tokenizer: Tokenizer | None = None
    ):
        self.config = config
        self.model = draft_model(config, target, tokenizer)
        self.max_model_len = max_model_len
        self.caches: dict[Sequence, DraftCache] = {}

    def propose(self, most: dict[Sequence, int]) -> dict[Sequence, list[int]]:
        """Draft tokens for each sequence, at most `most[seq]` of them (and num_speculative_tokens)."""
        for seq in [s for s in self.caches if s.status is not Status.RUNNING]:  # preempted (or finished)
            self.release(seq)
        drafts = {}
        with torch.inference_mode():
            for seq, limit in most.items():
                # the draft writes positions up to num_tokens + k - 2: within its own context too (a draft file's
                # may be shorter than the target's)
                room = self.model.config.max_position_embeddings - seq.num_tokens + 1
                k = min(limit, self.config.num_speculative_tokens, room)
                if k >= 1:
                    drafts[seq] = self._draft(seq, k)
        return drafts

    def _draft(self, seq: Sequence, k: int) -> list[int]:
        tokens = seq.all_token_ids
        entry = self.caches.get(seq)
        if entry is None:
            longest = min(len(seq.prompt_token_ids) + seq.params.max_tokens, self.max_model_len)
            capacity = min(longest, self.model.config.max_position_embeddings)
            entry = DraftCache(KVCache(self.model.config, capacity, self.model.dtype, self.model.device), [])
            self.caches[seq] = entry
        kept = 0  # the longest prefix of the sequence's tokens the cache holds, leaving one token to compute
        for held, token in zip(entry.tokens, tokens[:-1], strict=False):
            if held != token:
                break
            kept += 1
        # the tokens it lacks computed as the target computed them: the prompt's rest as a prompt, the output as
        # decode rows (as the target's verify step; prefill's kernels round otherwise, and a draft of the target's
        # own weights then missed a sixth of its tokens)
        prompt_rest = len(seq.prompt_token_ids) - kept
        if prompt_rest > 0:
            prompt = torch.tensor(tokens[kept : kept + prompt_rest], dtype=torch.long, device=self.model.device)
            self.model.forward(prompt, entry.cache, kept, Phase.PREFILL)
            kept += prompt_rest
        draft = [self._next(entry, tokens[kept:], kept, Phase.DECODE)]
        entry.tokens = tokens
        for _ in range(k - 1):  # each draft token but the last goes into the cache to draft the next
            draft.append(self._next(entry, draft[-1:], len(entry.tokens), Phase.DECODE))
            entry.tokens = entry.tokens + draft[-2:-1]
        return draft

    def _next(self, entry: DraftCache, new: list[int], start: int, phase: Phase) -> int:
        """The draft's greedy token after `new` at positions start.. (the cache holding the `start` before)."""
        ids = torch.tensor(new, dtype=torch.long, device=self.model.device)
        hidden = self.model.forward(ids, entry.cache, start, phase)
        return int(self.model.logits(hidden[-1:]).argmax(-1))

    def observe(self, seq: Sequence, accepted: int) -> None:
        """Greedy drafts do not back off: every decode proposes."""

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's draft cache (it finished, was aborted or preempted)."""
        self.caches.pop(seq, None)
