"""Next-token choice from float32 logits: penalties, temperature, top-k, top-p, min-p, then a draw; logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rooftop.engine.sampling_params import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style, as transformers: a seen token's positive logit is divided by `penalty`, a negative one multiplied."""
    picked = logits[seen]
    logits = logits.clone()
    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def apply_presence_frequency_penalties(
    logits: torch.Tensor, output_ids: Sequence[int], presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI's: each token already generated loses `presence` once plus `frequency` per time it was generated."""
    ids, counts = torch.tensor(list(output_ids), device=logits.device).unique(return_counts=True)
    logits = logits.clone()
    logits[ids] -= presence + frequency * counts.to(logits.dtype)
    return logits


TOP_P_CANDIDATES = 256


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits with every token outside the top-k / top-p / min-p support set to -inf."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = logits.softmax(-1)
        # the nucleus is nearly always within the most likely few hundred tokens: rank those (topk), and sort the
        # whole vocabulary only when they do not cover top_p (sorting 49152 logits took 5 ms, a third of a step)
        probs_ranked, order = torch.topk(probs, min(TOP_P_CANDIDATES, probs.shape[-1]))
        if float(probs_ranked.sum()) < params.top_p:
            probs_ranked, order = torch.sort(probs, descending=True)
        # drop a token when the tokens ranked above it already cover top_p; the first always stays
        keep = order[(probs_ranked.cumsum(-1) - probs_ranked) < params.top_p]
        logits = torch.full_like(logits, float("-inf")).index_copy_(0, keep, logits[keep])
    if params.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    seen: list[int],
    generator: torch.Generator | None,
    output_ids: Sequence[int] = (),
) -> int:
    """One token id from (vocab,) logits; `seen` are the prompt and output ids so far (for the repetition penalty),
    `output_ids` the generated ones (for the presence and frequency penalties)."""
    if params.repetition_penalty != 1.0 and seen:
        logits = apply_repetition_penalty(
            logits, torch.tensor(sorted(set(seen)), device=logits.device), params.repetition_penalty
        )
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        logits = apply_presence_frequency_penalties(
            logits, output_ids, params.presence_penalty, params.frequency_penalty
        )
    if params.greedy:
        return int(torch.argmax(logits))
    filtered = filter_logits(logits, params)
    # draw among the tokens the filters kept: a draw over all 49152 (multinomial) took ~2 ms of random numbers
    support = torch.isfinite(filtered).nonzero().squeeze(1)
    probs = filtered[support].softmax(-1)
    return int(support[torch.multinomial(probs, 1, generator=generator)])


@dataclass
class TokenLogprob:
    """One output token's log-probability and the `k` most likely tokens at its position, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprob(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """From the model's distribution at this position (before penalties, temperature and filters), as vLLM reports."""
    logprobs = logits.float().log_softmax(-1)
    top = torch.topk(logprobs, min(k, logprobs.numel())) if k else None
    alternatives = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist(), strict=False))
    return TokenLogprob(token_id, float(logprobs[token_id]), alternatives)
