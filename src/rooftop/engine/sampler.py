"""Next-token choice from float32 logits: penalties, temperature, top-k, top-p, min-p, then a draw; logprobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.structured import GrammarState, apply_grammars
from rooftop.kernels import cpu


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style, as transformers: a seen token's positive logit is divided by `penalty`, a negative one multiplied."""
    picked = logits[seen]
    logits = logits.clone()
    penalized = torch.where(picked > 0, picked / penalty, picked * penalty)
    # any positive penalty runs: one that float32 rounds to 0 or inf pushes seen tokens to the ends of the range
    finite = torch.finfo(logits.dtype).max
    logits[seen] = penalized.nan_to_num(nan=0.0, posinf=finite, neginf=-finite)
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
WIDEN = 8  # candidates taken next when a row's top_p is not covered (`_wider`)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's greedy token: rooftop's CPU kernel for float32 rows on the CPU (torch.argmax's CPU loop costs
    more than a layer's attention at batch 1, docs/PERFORMANCE.md), torch.argmax elsewhere; the same ids."""
    kernels = cpu.ops() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    return logits.argmax(-1) if kernels is None else kernels.argmax_rows(logits.contiguous())


def finite_rows(logits: torch.Tensor) -> list[bool]:
    """Whether each row's logits are all finite (no NaN, no infinity): rooftop's CPU kernel for float32 rows on the
    CPU (one pass, where PyTorch's isfinite is several, each run cold right after the forward: docs/PERFORMANCE.md),
    torch.isfinite elsewhere; the same answers."""
    kernels = cpu.ops() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    finite = torch.isfinite(logits).all(-1) if kernels is None else kernels.finite_rows(logits.contiguous())
    return finite.tolist()


@dataclass
class SamplingRow:
    """One row of a step's logits: how to sample it, its seeded generator, and the ids the penalties look at
    (references to the sequence's own lists: nothing is copied per step)."""

    params: SamplingParams
    generator: torch.Generator | None = None
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = ()
    # a verify step's row before the sequence's last: the draft token the next row (the same sequence's, one
    # position on) takes as its context. A seeded sequence's next row is drawn only if this row draws the draft
    draft: int | None = None
    grammar: GrammarState | None = None  # a structured output's: only the tokens it allows may be drawn
    eos_token_ids: Sequence[int] = ()  # the model's: with the params' stop tokens, what min_tokens holds back
    bad_words: Sequence[Sequence[int]] = ()  # the token ids of the params' bad_words (`bad_word_token_ids`)

    def banned(self) -> set[int]:
        """The tokens this row may not draw: those that would end its output (its stop tokens, and EOS unless
        ignore_eos) while it has fewer than min_tokens, and the last token of each bad word whose other tokens
        end the output."""
        p, output = self.params, self.output_ids
        banned = set()
        if len(output) < p.min_tokens:
            banned.update(p.stop_token_ids, () if p.ignore_eos else self.eos_token_ids)
        for word in self.bad_words:
            before = len(word) - 1
            if len(output) >= before and list(output[len(output) - before :]) == list(word[:before]):
                banned.add(word[-1])
        return banned


def bad_word_token_ids(words: Sequence[str], encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Each bad word's tokens as vLLM bans them: the word without its leading spaces, and with one space before it
    where that is a different first token and as many tokens (a word inside a text usually starts with one)."""
    ids = []
    for word in words:
        bare, spaced = encode(word.lstrip()), encode(" " + word.lstrip())
        ids.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            ids.append(spaced)
    return ids


def apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """(B, vocab) logits with each row's logit_bias added, all rows in one indexed add (a copy only when any row
    has a bias)."""
    biased = [(i, r.params.logit_bias) for i, r in enumerate(rows) if r.params.logit_bias]
    if not biased:
        return logits
    where = [(i, token_id, bias) for i, biases in biased for token_id, bias in biases.items()]
    row_ids, token_ids, values = (list(column) for column in zip(*where, strict=True))
    index = (torch.tensor(row_ids, device=logits.device), torch.tensor(token_ids, device=logits.device))
    values = torch.tensor(values, dtype=logits.dtype, device=logits.device)
    return logits.index_put(index, values, accumulate=True)


def apply_bans(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """(B, vocab) logits with -inf outside each row's allowed_token_ids and on the tokens it has `banned` (a stop
    token beyond the vocabulary bans nothing), row by row as alone (a copy only when any row has either)."""
    vocab = logits.shape[-1]
    where = [(i, t) for i, r in enumerate(rows) for t in sorted(r.banned()) if t < vocab]
    limited = [(i, r.params.allowed_token_ids) for i, r in enumerate(rows) if r.params.allowed_token_ids is not None]
    if not where and not limited:
        return logits
    ban = torch.zeros_like(logits, dtype=torch.bool)
    for i, allowed in limited:
        ban[i] = True
        ban[i, torch.tensor(allowed, dtype=torch.long, device=logits.device)] = False  # add_request checked them
    if where:
        ban[tuple(torch.tensor(column, device=logits.device) for column in zip(*where, strict=True))] = True
    return logits.masked_fill(ban, float("-inf"))


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


@dataclass
class Candidates:
    """Each row's candidate tokens after temperature: their scaled logits (B, C), best first unless C is the whole
    vocabulary in token order (`ids` None), their token ids, which of them the row's filters keep, and their
    probabilities (over the whole row, or over what top-k left)."""

    logits: torch.Tensor
    ids: torch.Tensor | None
    keep: torch.Tensor
    probs: torch.Tensor


def candidates(logits: torch.Tensor, params: list[SamplingParams], width: int | None = None) -> Candidates:
    """Temperature, then top-k, top-p and min-p, for all rows at once, on the few hundred most likely tokens when
    every row has top-k or top-p (the nucleus is nearly always there: ranking 256 with topk instead of sorting all
    49152 logits saved 5 ms, a third of a step), on more of them (`_wider`) when those do not cover a row's top_p;
    on the whole vocabulary when a row has neither. top-p counts the probabilities top-k left; min-p is relative to
    the top."""
    vocab = logits.shape[-1]
    scaled = logits / _column([p.temperature for p in params], logits)
    ks = [p.top_k if p.top_k < vocab else 0 for p in params]
    nucleus = any(p.top_p < 1.0 for p in params)
    restricted = all(k or p.top_p < 1.0 for k, p in zip(ks, params, strict=True))
    if width is None:
        width = min(vocab, max(max(ks), TOP_P_CANDIDATES if nucleus else 0)) if restricted else vocab
    if width < vocab:
        cand, ids = torch.topk(scaled, width)
    else:
        cand, ids = torch.sort(scaled, descending=True) if any(ks) or nucleus else (scaled, None)
    keep = torch.ones_like(cand, dtype=torch.bool)
    if any(ks):  # ties with the k-th logit stay
        kth = cand.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=cand.device)[:, None])
        keep &= (cand >= kth) | (_column(ks, cand) == 0)
    # probabilities over what top-k left, or over the whole row (softmax: logsumexp took 6x as long on CPU)
    masked = cand.masked_fill(~keep, float("-inf"))
    if all(ks):
        probs = masked.softmax(-1)
    else:
        whole = scaled.softmax(-1)
        whole = whole if ids is None else whole.gather(1, ids)
        probs = whole if not any(ks) else torch.where(_column(ks, cand) > 0, masked.softmax(-1), whole)
    if nucleus:
        top_p = _column([p.top_p if p.top_p < 1.0 else float("inf") for p in params], probs)
        if width < vocab:
            # what each row's top_p still needs beyond its candidates (a row with top-k has all it keeps among them)
            need = _column(
                [p.top_p if p.top_p < 1.0 and not k else 0.0 for k, p in zip(ks, params, strict=True)], probs
            )
            short = (need - probs.sum(-1, keepdim=True)).clamp(min=0.0)  # NaN for a row of logits all -inf
            if bool((short > 0).any()):
                return candidates(logits, params, _wider(width, probs, short, vocab))
        keep &= (probs.cumsum(-1) - probs) < top_p  # drop a token once those ranked above it cover top_p
        keep[:, 0] = True  # the most likely stays, even for a top_p that float32 rounds to 0
    min_p = [p.min_p for p in params]
    if any(min_p):
        keep &= probs >= _column(min_p, probs) * probs.amax(-1, keepdim=True)
    return Candidates(cand, ids, keep, probs)


def _wider(width: int, probs: torch.Tensor, short: torch.Tensor, vocab: int) -> int:
    """The next candidate width for rows whose top_p is `short` of being covered: WIDEN times as many, and no fewer
    than the shortfall needs at the last candidate's probability (no token outside the candidates is likelier). A
    nucleus of thousands of tokens (a real model at temperature 1 and top_p 0.95 has them at times) is then found by
    one wider topk, not by sorting the vocabulary; beyond half of it, sorting is the cheaper (docs/PERFORMANCE.md)."""
    last = probs[:, -1:].clamp(min=torch.finfo(probs.dtype).tiny)
    needed = torch.where(short > 0, short / last, 0.0)  # none for rows covered, nor for a NaN row
    wider = max(WIDEN * width, width + int(needed.ceil().max()))
    return vocab if wider > vocab // 2 else wider


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """(B, vocab) temperature-scaled logits with every token outside each row's support set to -inf: the
    candidates `sample` draws from, laid back over the vocabulary."""
    c = candidates(logits, params)
    kept = c.logits.masked_fill(~c.keep, float("-inf"))
    return kept if c.ids is None else torch.full_like(logits, float("-inf")).scatter_(1, c.ids, kept)


def draw(c: Candidates, generators: list[torch.Generator | None], drafts: list[int | None]) -> torch.Tensor:
    """One candidate index per row: unseeded rows in one call, each seeded row from its own generator over only the
    candidates it keeps (best first, a prefix of the row), so a seeded request draws the same tokens whatever else
    shares its batch. A seeded verify step draws its rows in order and stops at the first that does not draw its
    draft (the rows after it are beyond what the sequence keeps: index 0, unused), so its generator advances once
    per kept token, exactly as decoding them one step each would."""
    weights = c.probs.masked_fill(~c.keep, 0.0)
    if all(g is None for g in generators):
        return torch.multinomial(weights, 1)[:, 0]
    picks = torch.empty(weights.shape[0], dtype=torch.long, device=weights.device)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        picks[unseeded] = torch.multinomial(weights[unseeded], 1)[:, 0]
    kept = c.keep.sum(-1).tolist()
    beyond = False  # the previous row was a draft's that did not draw it: this row is not drawn
    for i, g in enumerate(generators):
        if g is None:
            continue
        if beyond:
            picks[i] = 0
        else:
            row = weights[i] if c.ids is None else weights[i, : kept[i]]
            picks[i] = torch.multinomial(row, 1, generator=g)[0]
        token = int(picks[i]) if c.ids is None else int(c.ids[i, picks[i]])
        beyond = drafts[i] is not None and (beyond or token != drafts[i])
    return picks


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int | None]:
    """One token id per row of (B, vocab) float32 logits: logit biases, bans (allowed_token_ids, min_tokens,
    bad_words), the grammars' masks, penalties, then greedy rows by argmax and the others drawn among their
    candidates, each group in batched calls. Rows with top-k or top-p draw among a few hundred tokens at most (a draw
    over all 49152 took ~2 ms of random numbers), the others over the whole vocabulary. A row whose bans and grammar
    leave no token (min_tokens against allowed_token_ids that are all end-of-sequence ids, bad_words over all of
    them) gets None, and the others are sampled as without it: one request's constraints never fail another's."""
    logits = apply_grammars(apply_bans(apply_logit_bias(logits, rows), rows), [r.grammar for r in rows])
    logits = apply_penalties(logits, rows)
    closed = closed_rows(logits, rows)
    if closed:
        live = [i for i in range(len(rows)) if i not in closed]
        tokens: list[int | None] = [None] * len(rows)
        if live:
            for i, token in zip(live, _sample(logits[live], [rows[i] for i in live]), strict=True):
                tokens[i] = token
        return tokens
    return _sample(logits, rows)


def closed_rows(logits: torch.Tensor, rows: list[SamplingRow]) -> set[int]:
    """The rows whose bans and grammar leave no token. Only a row narrowed to a few tokens (allowed_token_ids, a
    grammar) can be one, and only its narrowed logits are looked at: a row's other bans (min_tokens, bad_words) take
    a handful of tokens out of the whole vocabulary, and a pass over every row's logits would cost every decode step
    (docs/PERFORMANCE.md)."""
    closed = set()
    for i, r in enumerate(rows):
        if r.grammar is not None:
            narrowed = logits[i]
        elif r.params.allowed_token_ids is not None:
            narrowed = logits[i, r.params.allowed_token_ids]
        else:
            continue
        if not bool(torch.isfinite(narrowed).any()):
            closed.add(i)
    return closed


def _sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    """`sample` of rows that each have a token to take."""
    greedy = [r.params.greedy for r in rows]
    if all(greedy):
        return argmax(logits).tolist()
    tokens = argmax(logits) if any(greedy) else torch.empty(len(rows), dtype=torch.long, device=logits.device)
    drawn = [i for i in range(len(rows)) if not greedy[i]]
    narrow = [i for i in drawn if rows[i].params.top_k or rows[i].params.top_p < 1.0]
    wide = [i for i in drawn if i not in narrow]
    for group in (narrow, wide):
        if not group:
            continue
        c = candidates(logits if len(group) == len(rows) else logits[group], [rows[i].params for i in group])
        picks = draw(c, [rows[i].generator for i in group], [rows[i].draft for i in group])
        tokens[group] = picks if c.ids is None else c.ids.gather(1, picks[:, None])[:, 0]
    return tokens.tolist()


@dataclass(frozen=True)
class Logprob:
    """vLLM's: one token's log-probability, its rank in the distribution (1: the most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(frozen=True)
class DecodedTokens:
    """A TokenLogprob's `decode` once pickled: the texts of its entries."""

    texts: dict[int, str]

    def __call__(self, token_id: int) -> str:
        return self.texts[token_id]


@dataclass
class TokenLogprob(Mapping[int, Logprob]):
    """One output token's log-probability and the `k` most likely tokens at its position, best first.

    Also vLLM's form of the same position, a dict {token_id: Logprob}: the chosen token, then the top k (ranks 1..k),
    so code written for vLLM's `logprobs[i][token_id].logprob` runs unchanged. `decode` (set by the engine's output
    processor) gives each entry its `decoded_token` when asked, so the server, which decodes for itself, pays
    nothing for it."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    rank: int | None = None  # of the chosen token: 1 + how many tokens are more likely (ties count as more likely)
    decode: Callable[[int], str] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        """What a pickle keeps (another process has no tokenizer to ask): `decode` as the texts of this position's
        entries, decoded now."""
        state = dict(self.__dict__)
        if self.decode is not None and not isinstance(self.decode, DecodedTokens):
            state["decode"] = DecodedTokens({i: self.decode(i) for i in self._ranked()})
        return state

    def _ranked(self) -> dict[int, tuple[float, int | None]]:
        entries = {self.token_id: (self.logprob, self.rank)}
        entries.update({i: (lp, rank) for rank, (i, lp) in enumerate(self.top, 1)})
        return entries

    def __getitem__(self, token_id: int) -> Logprob:
        logprob, rank = self._ranked()[token_id]
        return Logprob(logprob, rank, None if self.decode is None else self.decode(token_id))

    def __contains__(self, token_id: object) -> bool:
        return token_id in self._ranked()

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranked())

    def __len__(self) -> int:
        return len(self._ranked())


def token_logprob(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """From the model's distribution at this position (before penalties, temperature and filters), as vLLM reports;
    the chosen token's rank counts the tokens at least as likely (itself included), as vLLM's does."""
    return token_logprobs(logits[None], [token_id], k)[0]


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """`token_logprob` of each row of (T, vocab) logits and its token, all rows at once (a prompt's chunk has
    hundreds)."""
    logprobs = logits.float().log_softmax(-1)
    ids = torch.tensor(list(token_ids), dtype=torch.long, device=logprobs.device)[:, None]
    chosen = logprobs.gather(1, ids)
    ranks = (logprobs >= chosen).sum(-1).tolist()
    top = torch.topk(logprobs, min(k, logprobs.shape[-1])) if k else None
    alternatives = (
        [[] for _ in ranks]
        if top is None
        else [list(zip(i, v, strict=True)) for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
    )
    return [
        TokenLogprob(t, lp, alt, rank)
        for t, lp, alt, rank in zip(token_ids, chosen[:, 0].tolist(), alternatives, ranks, strict=True)
    ]
