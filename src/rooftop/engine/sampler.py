"""Next-token choice from float32 logits: repetition penalty, temperature, top-k, top-p, min-p, then a draw."""

from __future__ import annotations

import torch

from rooftop.engine.sampling_params import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style, as transformers: a seen token's positive logit is divided by `penalty`, a negative one multiplied."""
    picked = logits[seen]
    logits = logits.clone()
    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits with every token outside the top-k / top-p / min-p support set to -inf."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already cover top_p; the first always stays
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if params.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, seen: list[int], generator: torch.Generator | None) -> int:
    """One token id from (vocab,) logits; `seen` are the prompt and output ids so far (for the penalty)."""
    if params.repetition_penalty != 1.0 and seen:
        logits = apply_repetition_penalty(logits, torch.tensor(sorted(set(seen)), device=logits.device), params.repetition_penalty)
    if params.greedy:
        return int(torch.argmax(logits))
    probs = filter_logits(logits, params).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))
