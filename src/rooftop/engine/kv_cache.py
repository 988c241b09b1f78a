"""A contiguous per-sequence KV cache, preallocated for the tokens the request may reach."""

from __future__ import annotations

import torch

from rooftop.config import ModelConfig


class KVCache:
    """K and V of every layer: (layers, capacity, kv_heads, head_dim) each. Written once per token, never recomputed."""

    def __init__(self, config: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device):
        shape = (config.num_layers, capacity, config.num_kv_heads, config.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.capacity = capacity

    def append(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (T, kv_heads, hd) at positions start.. and return all keys and values up to them."""
        end = start + k.shape[0]
        assert end <= self.capacity, f"KV cache of {self.capacity} tokens cannot hold position {end - 1}"
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v
        return self.k[layer, :end], self.v[layer, :end]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
