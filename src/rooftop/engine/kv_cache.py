"""The paged KV cache: one preallocated pool of fixed-size blocks, and the attention metadata of a step.

Token position p of a sequence lives at slot `table[p // block_size] * block_size + p % block_size` of the
pool; attention gathers a sequence's slots back into order, so it sees exactly what a contiguous cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rooftop.config import ModelConfig


class KVPool:
    """K and V of every layer: (layers, num_blocks * block_size, kv_heads, head_dim) each."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        shape = (config.num_layers, num_blocks * block_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)  # views, made once: decode reads them per layer

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass
class PrefillChunk:
    """Rows start:end of the step's tokens belong to one sequence that already has `cached` tokens."""

    start: int
    end: int
    cached: int
    slots: torch.Tensor  # (cached + new,) pool slots of positions 0 .. cached + new - 1


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written
    prefills: list[PrefillChunk]
    decode_rows: torch.Tensor | None = None  # (B,) rows of the step's tokens that are single-token decodes
    decode_slots: torch.Tensor | None = None  # (B, S) pool slots of each decode sequence, padded
    decode_mask: torch.Tensor | None = None  # (B, 1, 1, S) True where a slot is a real token; None: all are
    decode_lengths: torch.Tensor | None = None  # (B,) tokens in each decode sequence's cache, the new one included


def slots_of(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pool slots of token positions, through a block table (or a batch of padded tables, one per row)."""
    return table.gather(-1, positions // block_size) * block_size + positions % block_size


def build_metadata(
    seqs: list[tuple[list[int], int, int]], block_size: int, device: torch.device
) -> AttentionMetadata:
    """Metadata for a step over sequences given as (block table, cached tokens, new tokens), in row order.

    A sequence with one new token and a non-empty cache takes the batched decode path; anything else is a
    prefill (chunk) attended one sequence at a time.
    """
    slot_mapping, prefills, decodes = [], [], []
    row = 0
    for block_table, cached, new in seqs:
        table = torch.tensor(block_table, dtype=torch.long)
        slot_mapping.append(slots_of(table, torch.arange(cached, cached + new), block_size))
        if new == 1 and cached > 0:
            decodes.append((row, list(block_table), cached + 1))
        else:
            slots = slots_of(table, torch.arange(cached + new), block_size)
            prefills.append(PrefillChunk(row, row + new, cached, slots.to(device)))
        row += new
    meta = AttentionMetadata(torch.cat(slot_mapping).to(device), prefills)
    if decodes:
        width = max(length for _, _, length in decodes)
        blocks = max(len(t) for _, t, _ in decodes)
        padded = torch.tensor([t + [0] * (blocks - len(t)) for _, t, _ in decodes])
        positions = torch.arange(width).expand(len(decodes), width)
        lengths = torch.tensor([length for _, _, length in decodes])
        valid = positions < lengths[:, None]
        # padding positions read slot 0 and are masked out
        slots = torch.where(valid, slots_of(padded, positions.clamp(max=blocks * block_size - 1), block_size), 0)
        meta.decode_rows = torch.tensor([r for r, _, _ in decodes], dtype=torch.long, device=device)
        meta.decode_slots = slots.to(device)
        meta.decode_lengths = lengths.to(device)
        if any(length < width for _, _, length in decodes):  # no mask at all when no sequence is padded
            meta.decode_mask = valid[:, None, None, :].to(device)
    return meta


class KVCache:
    """One sequence's own small pool, for running the model on a single sequence outside the engine."""

    def __init__(self, config: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device | str, block_size: int = 16):
        num_blocks = -(-capacity // block_size)
        self.pool = KVPool(config, num_blocks, block_size, dtype, torch.device(device))
        self.table = list(range(num_blocks))
        self.capacity = capacity

    def metadata(self, start: int, new: int) -> AttentionMetadata:
        assert start + new <= self.capacity, f"KV cache of {self.capacity} tokens cannot hold position {start + new - 1}"
        return build_metadata([(self.table, start, new)], self.pool.block_size, self.pool.k.device)
