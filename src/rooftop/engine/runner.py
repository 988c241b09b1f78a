"""One engine step on the model: prefill chunks and decodes packed into one flat batch, then their logits.

The scheduler has decided each sequence's phase; the runner lays the step out with the prefill chunks' rows first
(those that widen quantized weights to float matmuls before the others) and the decodes' after them, runs it in
one forward pass (every weight read once for all of them) and returns the logits of the sequences that reached
their last token (all the rows of a verify step), and those of the prompt positions whose logprobs were asked for
(SamplingParams.prompt_logprobs), with the device synchronized around the clock so the measured time is real.

The layout is a `StepPlan` of plain values: under tensor parallelism rank 0 sends it to the other ranks, which run
the same forward pass on their part of the model (`execute`), so every rank computes the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rooftop.engine.cuda_graph import DecodeGraphs
from rooftop.engine.scheduler import ScheduledSeq
from rooftop.enums import Phase
from rooftop.models.kv_cache import AttentionSeq, KVPool, build_metadata
from rooftop.models.transformer import Transformer
from rooftop.quant.linear import WIDEN_ROWS, row_plan


@dataclass
class StepPlan:
    """What every rank needs to run a step: the flat batch's token ids and positions, each sequence as attention
    sees it (in row order), which rows' logits are sampled, which give prompt tokens their logprobs (through the
    lm_head on their own, so the sampled rows' logits are the same bits with or without them), and whether the step
    is batch-invariant."""

    token_ids: list[int]
    positions: list[int]
    seqs: list[AttentionSeq]
    logit_rows: list[int]
    batch_invariant: bool
    prompt_rows: list[int] = field(default_factory=list)


@dataclass
class StepLogits:
    """The float32 logits (rows, vocab) of the step's sampling sequences, `sampled[k]` the index in the batch of
    row k (a verify step's sequence has 1 + its drafts rows, consecutive), the step's device-synchronized
    seconds, and by index in the batch the float32 logits of the positions `ScheduledSeq.prompt_positions` names."""

    logits: torch.Tensor | None
    sampled: list[int]
    seconds: float
    prompt_logits: dict[int, torch.Tensor] = field(default_factory=dict)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_order(batch: list[ScheduledSeq]) -> list[int]:
    """Indices of `batch` in row order: prefill chunks of WIDEN_ROWS tokens or more, the other prefill chunks, then
    decodes."""
    prefills = [i for i, s in enumerate(batch) if s.phase is Phase.PREFILL]
    wide = [i for i in prefills if batch[i].new >= WIDEN_ROWS]
    narrow = [i for i in prefills if batch[i].new < WIDEN_ROWS]
    return wide + narrow + [i for i, s in enumerate(batch) if s.phase is Phase.DECODE]


def plan_step(batch: list[ScheduledSeq], batch_invariant: bool) -> tuple[StepPlan, list[int], list[int]]:
    """The step's plan, for each sampled row the index in `batch` of its sequence, and in row order the indices of
    the sequences with prompt rows."""
    token_ids, positions, seqs, rows, sampled, prompt_rows, prompted = [], [], [], [], [], [], []
    end = 0
    for i in step_order(batch):
        s = batch[i]
        token_ids += s.seq.all_token_ids[s.cached : s.cached + s.new - len(s.draft)] + s.draft
        positions += range(s.cached, s.cached + s.new)
        seqs.append(AttentionSeq(list(s.seq.block_table), s.cached, s.new, s.phase, s.seq.state_slot or 0))
        if s.prompt_positions:
            prompt_rows += [end + p - s.cached for p in s.prompt_positions]
            prompted.append(i)
        end += s.new
        if s.needs_logits:  # a verify step samples each of its rows: its last token's and every draft's
            rows += range(end - 1 - len(s.draft), end)
            sampled += [i] * (1 + len(s.draft))
    return StepPlan(token_ids, positions, seqs, rows, batch_invariant, prompt_rows), sampled, prompted


@torch.inference_mode()
def execute(model: Transformer, pool: KVPool, plan: StepPlan) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The forward pass of `plan`, its sampled rows' logits and its prompt rows' (on rank 0 under tensor
    parallelism; None on the other ranks, and where the step has no such rows)."""
    device = model.device
    if model.tp is not None:  # every rank reduces the step the same way: in rank order with batch invariance
        model.tp.ordered = plan.batch_invariant
    ids = torch.tensor(plan.token_ids, dtype=torch.long, device=device)
    positions = torch.tensor(plan.positions, dtype=torch.long, device=device)
    chunks = [s.new for s in plan.seqs if s.phase is Phase.PREFILL]
    rows = row_plan(chunks, len(plan.token_ids), model.dtype, plan.batch_invariant)
    meta = build_metadata(plan.seqs, pool.block_size, device, plan.batch_invariant)
    hidden = model.forward_batch(ids, positions, pool, meta, rows)
    logits = model.logits(hidden[plan.logit_rows], plan.batch_invariant) if plan.logit_rows else None
    prompt = model.logits(hidden[plan.prompt_rows], plan.batch_invariant) if plan.prompt_rows else None
    return logits, prompt


def run_step(
    model: Transformer,
    pool: KVPool,
    batch: list[ScheduledSeq],
    batch_invariant: bool,
    pool_key: int = 0,
    graphs: DecodeGraphs | None = None,
) -> StepLogits:
    """Run the step; with `batch_invariant` each row takes the path its own sequence's chunk or decode decides.
    Under tensor parallelism the plan goes to the other ranks first (they run it on their pool `pool_key`), inside
    the clock: sending it is part of the step. On CUDA a decode step that fits a captured graph replays it."""
    plan, sampled, prompted = plan_step(batch, batch_invariant)
    device = model.device
    synchronize(device)
    t0 = time.perf_counter()
    prompt = None
    if graphs is not None and plan.logit_rows and graphs.runs(plan.seqs):
        logits = graphs.replay(plan.token_ids, plan.positions, plan.seqs, plan.logit_rows)
    elif model.tp is None:
        logits, prompt = execute(model, pool, plan)
    else:
        logits, prompt = model.tp.lead.run(("step", pool_key, plan), lambda: execute(model, pool, plan))
    synchronize(device)
    seconds = time.perf_counter() - t0
    prompt_logits = {}
    if prompted:
        counts = [len(batch[i].prompt_positions) for i in prompted]
        prompt_logits = dict(zip(prompted, prompt.split(counts), strict=True))
    return StepLogits(logits, sampled, seconds, prompt_logits)
