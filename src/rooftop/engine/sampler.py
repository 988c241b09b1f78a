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


@dataclass
class SamplingRow:
    """One row of a step's logits: how to sample it, its seeded generator, and the ids the penalties look at
    (references to the sequence's own lists: nothing is copied per step)."""

    params: SamplingParams
    generator: torch.Generator | None = None
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = ()


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """(B, vocab) logits with each row's repetition, presence and frequency penalties applied (a copy only when any
    row has one)."""
    penalized = [
        i
        for i, r in enumerate(rows)
        if r.params.repetition_penalty != 1.0 or r.params.presence_penalty or r.params.frequency_penalty
    ]
    if not penalized:
        return logits
    logits = logits.clone()
    for i in penalized:
        p, r = rows[i].params, rows[i]
        if p.repetition_penalty != 1.0 and (r.prompt_ids or r.output_ids):
            seen = torch.tensor(sorted(set(r.prompt_ids) | set(r.output_ids)), device=logits.device)
            logits[i] = apply_repetition_penalty(logits[i], seen, p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and r.output_ids:
            logits[i] = apply_presence_frequency_penalties(
                logits[i], r.output_ids, p.presence_penalty, p.frequency_penalty
            )
    return logits


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """(B, vocab) temperature-scaled logits with every token outside each row's top-k / top-p / min-p support set
    to -inf, all rows at once (top-k on the top-k-masked rows' own ranks; top-p on the probabilities left by top-k)."""
    vocab = logits.shape[-1]
    logits = logits / _column([p.temperature for p in params], logits)
    ks = [p.top_k if p.top_k < vocab else 0 for p in params]
    if any(ks):
        top = torch.topk(logits, max(ks)).values
        kth = top.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=logits.device)[:, None])
        kth = kth.masked_fill(_column(ks, kth) == 0, float("-inf"))  # rows without top-k keep everything
        logits = logits.masked_fill(logits < kth, float("-inf"))
    nucleus = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if nucleus:
        top_p = _column([params[i].top_p for i in nucleus], logits)
        rows = logits[nucleus]
        probs = rows.softmax(-1)
        # the nucleus is nearly always within the most likely few hundred tokens: rank those (topk), and sort the
        # whole vocabulary only when they do not cover top_p (sorting 49152 logits took 5 ms, a third of a step)
        ranked, order = torch.topk(probs, min(TOP_P_CANDIDATES, vocab))
        if bool((ranked.sum(-1, keepdim=True) < top_p).any()):
            ranked, order = torch.sort(probs, descending=True)
        # drop a token when the tokens ranked above it already cover top_p; the first always stays
        keep = (ranked.cumsum(-1) - ranked) < top_p
        kept = torch.where(keep, rows.gather(1, order), float("-inf"))
        logits[nucleus] = torch.full_like(rows, float("-inf")).scatter_(1, order, kept)
    min_p = [p.min_p for p in params]
    if any(min_p):
        probs = logits.softmax(-1)
        threshold = _column(min_p, probs) * probs.amax(-1, keepdim=True)
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One index per row of (B, n) probabilities: unseeded rows in one call, each seeded row from its own generator
    (so a seeded request draws the same tokens whatever else is in the batch)."""
    picks = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        picks[unseeded] = torch.multinomial(probs[unseeded], 1)[:, 0]
    for i, g in enumerate(generators):
        if g is not None:
            picks[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    return picks


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    """One token id per row of (B, vocab) float32 logits: penalties, then greedy rows by argmax and the others
    filtered and drawn, each group in batched calls."""
    logits = apply_penalties(logits, rows)
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(-1)
    # rows with top-k or top-p keep a few hundred tokens at most: draw among those; a draw over all 49152
    # (multinomial) took ~2 ms of random numbers
    narrow = [i for i, r in enumerate(rows) if not r.params.greedy and (r.params.top_k or r.params.top_p < 1.0)]
    wide = [i for i, r in enumerate(rows) if not r.params.greedy and i not in narrow]
    for group in (narrow, wide):
        if not group:
            continue
        filtered = filter_logits(logits[group], [rows[i].params for i in group])
        candidates = None
        if group is narrow:
            width = int(torch.isfinite(filtered).sum(-1).max())
            filtered, candidates = torch.topk(filtered, width)
        picks = draw(filtered.softmax(-1), [rows[i].generator for i in group])
        tokens[group] = picks if candidates is None else candidates.gather(1, picks[:, None])[:, 0]
    return tokens.tolist()


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
