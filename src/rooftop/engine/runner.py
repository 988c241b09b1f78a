"""One engine step on the model: prefill chunks and decodes packed into one flat batch, then their logits.

The scheduler has decided each sequence's phase; the runner lays the step out with the prefill chunks' rows first
(those that widen quantized weights to float matmuls before the others) and the decodes' after them, runs it in
one forward pass (every weight read once for all of them) and returns the logits of the sequences that reached
their last token (all the rows of a verify step), with the device synchronized around the clock so the measured time is real.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rooftop.engine.scheduler import ScheduledSeq
from rooftop.enums import Phase
from rooftop.models.kv_cache import AttentionSeq, KVPool, build_metadata
from rooftop.models.transformer import Transformer
from rooftop.quant.linear import WIDEN_ROWS, row_plan


@dataclass
class StepLogits:
    """The float32 logits (rows, vocab) of the step's sampling sequences, `sampled[k]` the index in the batch of
    row k (a verify step's sequence has 1 + its drafts rows, consecutive), and the step's device-synchronized
    seconds."""

    logits: torch.Tensor | None
    sampled: list[int]
    seconds: float


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


@torch.inference_mode()
def run_step(model: Transformer, pool: KVPool, batch: list[ScheduledSeq], batch_invariant: bool) -> StepLogits:
    """Run the step; with `batch_invariant` each row takes the path its own sequence's chunk or decode decides."""
    order = step_order(batch)
    token_ids, positions, seqs = [], [], []
    for i in order:
        s = batch[i]
        token_ids += s.seq.all_token_ids[s.cached : s.cached + s.new - len(s.draft)] + s.draft
        positions += range(s.cached, s.cached + s.new)
        seqs.append(AttentionSeq(s.seq.block_table, s.cached, s.new, s.phase, s.seq.state_slot or 0))
    device = model.device
    synchronize(device)
    t0 = time.perf_counter()
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    positions = torch.tensor(positions, dtype=torch.long, device=device)
    chunks = [s.new for s in seqs if s.phase is Phase.PREFILL]
    plan = row_plan(chunks, len(token_ids), model.dtype, batch_invariant)
    meta = build_metadata(seqs, pool.block_size, device, batch_invariant)
    hidden = model.forward_batch(ids, positions, pool, meta, plan)
    rows, sampled = [], []
    end = 0
    for i in order:
        end += batch[i].new
        if batch[i].needs_logits:  # a verify step samples each of its rows: its last token's and every draft's
            rows += range(end - 1 - len(batch[i].draft), end)
            sampled += [i] * (1 + len(batch[i].draft))
    logits = model.logits(hidden[rows], batch_invariant) if rows else None
    synchronize(device)
    return StepLogits(logits, sampled, time.perf_counter() - t0)
