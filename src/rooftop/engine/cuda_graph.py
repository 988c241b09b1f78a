"""Decode steps on CUDA replayed from CUDA graphs, one captured per batch size, as vLLM and nano-vllm do.

A decode step launches a few hundred small kernels; from Python each launch costs microseconds, which at batch 1
is as long as the kernels themselves. A graph replays the whole forward pass, lm_head included, in one launch. Its
inputs live in static device buffers that the graph reads: each step writes the rows' token ids, positions, KV
slots, lengths, state slots and block tables into one pinned host buffer and copies it to the device in one
transfer, pads the batch to the next captured size (a padded row has slot -1, which writes no K/V, length 0, which
attends to nothing, and the spare state slot, which no sequence holds) and replays the graph of that size.

What is captured must not wait on the host: the CUDA backend's ops (models/cuda_ops.py) read every step-dependent
value from device tensors. A mixture of experts counts its experts' rows on the host, and a tensor-parallel step
runs collectives and a plan broadcast: both run eagerly (`graphs_for`).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import replace

import numpy as np
import torch

from rooftop.config import EngineConfig
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.models.kv_cache import AttentionMetadata, KVPool, kv_storage_dtype
from rooftop.models.transformer import Transformer
from rooftop.quant.linear import row_plan

log = logging.getLogger("rooftop.engine")

MAX_CAPTURED = 512  # vLLM's largest default capture size


def capture_sizes(config: EngineConfig) -> list[int]:
    """The decode batch sizes (rows) captured, with vLLM's --cuda-graph-sizes rule: several values are the sizes
    themselves; one value N gives 1, 2, 4 and the multiples of 8 up to N; none, N = min(2 · max_num_seqs, 512).
    Never more rows than a step can have (max_num_batched_tokens)."""
    given = config.cuda_graph_sizes or []
    if len(given) > 1:
        sizes = set(given)
    else:
        largest = given[0] if given else min(2 * config.max_num_seqs, MAX_CAPTURED)
        sizes = {n for n in (1, 2, 4) if n <= largest} | set(range(8, largest + 1, 8))
    return sorted(n for n in sizes if n <= config.max_num_batched_tokens)


def padded_size(rows: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds `rows` rows, or None when the step is larger than every graph."""
    i = bisect.bisect_left(sizes, rows)
    return sizes[i] if i < len(sizes) else None


def cuda_engine_config(config: EngineConfig, model_dtype: torch.dtype) -> EngineConfig:
    """The engine's settings on CUDA: batch invariance off (cuBLAS, tinygemm and the split-K kernels choose their
    tiles and reduction order by a step's rows, so a row's bits follow its batch), said in the log; a block size
    the decode kernel takes; the KV cache in the model's dtype."""
    if config.block_size < 16 or config.block_size & (config.block_size - 1):
        raise InvalidRequestError(
            f"block_size {config.block_size}: on CUDA the decode kernel takes a power of two from 16", "block_size"
        )
    if kv_storage_dtype(config.kv_cache_dtype, model_dtype) != model_dtype:
        raise InvalidRequestError(
            f"kv_cache_dtype {config.kv_cache_dtype} is not supported on CUDA yet (auto: the model's dtype)",
            "kv_cache_dtype",
        )
    if config.batch_invariant:
        log.info("batch invariance is off on CUDA: its kernels pick tiles and reduction orders by a step's rows")
        config = replace(config, batch_invariant=False)
    return config


def capture_decode_graphs(
    model: Transformer, pool: KVPool, config: EngineConfig, max_model_len: int
) -> DecodeGraphs | None:
    """The engine's captured decode steps, or None (said in the log) where they run eagerly."""
    why = eager_reason(model, config)
    sizes = capture_sizes(config)
    if why is None and not sizes:
        why = "no capture size fits max_num_batched_tokens"
    if why is not None:
        if model.device.type == "cuda":
            log.info("decode steps run eagerly: %s", why)
        return None
    width = -(-min(max_model_len, pool.num_blocks * pool.block_size) // pool.block_size)
    spare = pool.states.slots - 1 if pool.states is not None else 0
    return DecodeGraphs(model, pool, sizes, width, spare)


def eager_reason(model: Transformer, config: EngineConfig) -> str | None:
    """Why decode steps of `model` run eagerly on its device, or None when they are captured."""
    if model.device.type != "cuda":
        return "not on CUDA"
    if config.enforce_eager:
        return "enforce_eager"
    if model.tp is not None:
        return "tensor parallelism (collectives and the plan broadcast run each step)"
    if model.moe:
        return "a mixture of experts (the experts' rows are counted on the host)"
    return None


class DecodeGraphs:
    """A CUDA graph of the decode forward pass and lm_head per captured batch size, over static input buffers."""

    def __init__(self, model: Transformer, pool: KVPool, sizes: list[int], table_width: int, spare_state_slot: int):
        self.model, self.pool, self.sizes, self.width = model, pool, sizes, table_width
        self.spare_state_slot = spare_state_slot
        n, device = sizes[-1], model.device
        # one byte buffer on each side: five int64 vectors of n rows (ids, positions, slots, lengths, state slots),
        # then the int32 block tables (n, width); a step copies the vectors and its rows' tables in one transfer
        self.vector_bytes = 5 * n * 8
        total = self.vector_bytes + n * table_width * 4
        self.host = torch.zeros(total, dtype=torch.uint8, pin_memory=True)
        self.device_buffer = torch.zeros(total, dtype=torch.uint8, device=device)
        self.host_vectors, self.host_tables = (t.numpy() for t in _views(self.host, n, table_width))
        vectors, self.tables = _views(self.device_buffer, n, table_width)
        self.ids, self.positions, self.slots, self.lengths, self.state_slots = vectors.unbind(0)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.memory_pool = torch.cuda.graph_pool_handle()
        fill_inputs(self.host_vectors, self.host_tables, [], [], [], self.pool.block_size, n, spare_state_slot)
        self.device_buffer.copy_(self.host)
        for size in reversed(sizes):  # the largest first: the smaller graphs reuse its memory pool
            self._forward(size)  # eager once: Triton compiles and cuBLAS sets up outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.memory_pool):
                logits = self._forward(size)
            self.graphs[size] = (graph, logits)
        torch.cuda.synchronize(device)

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slots[:size],
            prefills=[],
            block_size=self.pool.block_size,
            num_prefill_rows=0,
            decode_tables=self.tables[:size],
            decode_lengths=self.lengths[:size],
            decodes_alone=False,
            decode_state_slots=self.state_slots[:size],
        )
        plan = row_plan([], size, self.model.dtype, batch_invariant=False)
        hidden = self.model.forward_batch(self.ids[:size], self.positions[:size], self.pool, meta, plan)
        return self.model.logits(hidden, batch_invariant=False)

    def runs(self, seqs) -> bool:
        """Whether a step of these sequences (AttentionSeq, in row order) replays a graph: decodes only (a
        verify step's rows included), within the largest captured size and the tables' width."""
        rows = sum(s.new for s in seqs)
        return (
            all(s.phase is Phase.DECODE for s in seqs)
            and padded_size(rows, self.sizes) is not None
            and all(len(s.block_table) <= self.width for s in seqs)
        )

    def replay(self, token_ids: list[int], positions: list[int], seqs, logit_rows: list[int]) -> torch.Tensor:
        """The logits of `logit_rows` after replaying the graph of the step's padded size."""
        size = padded_size(len(token_ids), self.sizes)
        block = self.pool.block_size
        fill_inputs(self.host_vectors, self.host_tables, token_ids, positions, seqs, block, size, self.spare_state_slot)
        used = self.vector_bytes + size * self.width * 4
        self.device_buffer[:used].copy_(self.host[:used], non_blocking=True)
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[logit_rows]


def fill_inputs(
    vectors: np.ndarray,
    tables: np.ndarray,
    token_ids: list[int],
    positions: list[int],
    seqs,
    block_size: int,
    size: int,
    spare_state_slot: int,
) -> None:
    """A decode step's rows into the host buffers, padded to `size` rows. vectors (5, n): token ids, positions, KV
    slots, lengths (keys attended, the row's own included), state slots; tables (n, width): each row's block table.
    A verify step's row i attends its sequence's cache and rows 0..i. Padding rows: token 0 at position 0, slot -1
    (no K/V written), length 0 (no keys read), the spare state slot; their tables are never read."""
    ids, pos, slots, lengths, state_slots = vectors
    rows = len(token_ids)
    ids[:rows], pos[:rows] = token_ids, positions
    row = 0
    for s in seqs:
        for i in range(s.new):
            position = s.cached + i
            slots[row] = s.block_table[position // block_size] * block_size + position % block_size
            lengths[row] = position + 1
            state_slots[row] = s.state_slot
            tables[row, : len(s.block_table)] = s.block_table
            row += 1
    if row != rows:
        raise ValueError(f"the step has {rows} tokens but its sequences {row} rows")
    ids[rows:size], pos[rows:size], slots[rows:size], lengths[rows:size] = 0, 0, -1, 0
    state_slots[rows:size] = spare_state_slot


def _views(buffer: torch.Tensor, n: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (5, n) int64 vectors and (n, width) int32 tables laid out in a byte buffer."""
    vectors = buffer[: 5 * n * 8].view(torch.int64).view(5, n)
    tables = buffer[5 * n * 8 :].view(torch.int32).view(n, width)
    return vectors, tables
