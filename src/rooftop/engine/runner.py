"""One engine step on the model: prefill chunks and decodes packed into one flat batch, then their logits.

`prepare_prefill` and `prepare_decode` lay out the two phases' tokens; `run_step` runs them through the model
in one forward pass (every weight read once for all of them) and returns the logits of each sequence that
reached its last token, with the device synchronized around the clock so the measured time is real.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rooftop.engine.scheduler import ScheduledSeq
from rooftop.models.kv_cache import KVPool, build_metadata
from rooftop.models.transformer import Transformer


@dataclass
class StepInputs:
    token_ids: list[int]
    positions: list[int]
    seqs: list[tuple[list[int], int, int]]  # (block table, cached, new) per sequence, in row order


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare_prefill(chunks: list[ScheduledSeq]) -> StepInputs:
    """Prompt chunks: each sequence's next `num_new` tokens, after the `cached` ones already in the pool."""
    inputs = StepInputs([], [], [])
    for c in chunks:
        tokens = c.seq.all_token_ids[c.cached : c.cached + c.num_new]
        inputs.token_ids += tokens
        inputs.positions += range(c.cached, c.cached + c.num_new)
        inputs.seqs.append((c.seq.block_table, c.cached, c.num_new))
    return inputs


def prepare_decode(decodes: list[ScheduledSeq]) -> StepInputs:
    """One token per sequence: the last one sampled, at the position after its cached tokens."""
    inputs = StepInputs([], [], [])
    for d in decodes:
        inputs.token_ids.append(d.seq.all_token_ids[d.cached])
        inputs.positions.append(d.cached)
        inputs.seqs.append((d.seq.block_table, d.cached, 1))
    return inputs


def is_decode(s: ScheduledSeq) -> bool:
    """The sequence's one new token is its last sampled output (a prompt's last token is still prefill)."""
    return s.num_new == 1 and s.cached == s.seq.num_tokens - 1 and bool(s.seq.output_token_ids)


@torch.inference_mode()
def run_step(model: Transformer, pool: KVPool, batch: list[ScheduledSeq]) -> tuple[dict[int, torch.Tensor], float]:
    """Forward the step; return {index in `batch`: float32 logits (vocab,)} for sampling sequences, and seconds."""
    order = [i for i, s in enumerate(batch) if not is_decode(s)] + [i for i, s in enumerate(batch) if is_decode(s)]
    prefill = prepare_prefill([batch[i] for i in order if not is_decode(batch[i])])
    decode = prepare_decode([batch[i] for i in order if is_decode(batch[i])])
    device = model.device
    synchronize(device)
    t0 = time.perf_counter()
    ids = torch.tensor(prefill.token_ids + decode.token_ids, dtype=torch.long, device=device)
    positions = torch.tensor(prefill.positions + decode.positions, dtype=torch.long, device=device)
    meta = build_metadata(prefill.seqs + decode.seqs, pool.block_size, device)
    hidden = model.forward_batch(ids, positions, pool, meta)
    rows, sampled = [], []
    end = 0
    for i in order:
        end += batch[i].num_new
        if batch[i].samples:
            rows.append(end - 1)
            sampled.append(i)
    logits = model.logits(hidden[rows]) if rows else None
    synchronize(device)
    seconds = time.perf_counter() - t0
    return {i: logits[k] for k, i in enumerate(sampled)}, seconds
