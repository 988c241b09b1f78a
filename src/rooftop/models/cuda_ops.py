"""The CUDA backend: PyTorch's ops (TorchOps) for norms, RoPE and SiLU-mul, and the paged KV cache through rooftop's
Triton kernels (kernels/paged_attention.py), so that a step's forward pass never waits on the host.

PyTorch's paged path (models/attention.py) sizes each decode's gathered keys from its length on the host
(`.tolist()`, `int(lengths.max())`): on a GPU each is a sync in the middle of the forward pass, and no CUDA graph
can hold one. Here the step's K/V go into the pool by slot (a padded row's slot is -1 and writes nothing) and the
decodes attend from the pool's blocks by their tables and lengths, all device tensors. Prefill chunks keep
PyTorch's scaled_dot_product_attention over their gathered keys (flash attention on the GPU), their slots and
lengths built on the host before the step.
"""

from __future__ import annotations

import torch

from rooftop.config import ModelConfig
from rooftop.errors import UnsupportedModelError
from rooftop.kernels import paged_attention as kernels
from rooftop.models.attention import prefill_chunks
from rooftop.models.kv_cache import AttentionMetadata, StoredPool
from rooftop.models.ops import TorchOps
from rooftop.quant.cuda_linear import multiprocessors


class CudaOps(TorchOps):
    """TorchOps with the paged KV cache on Triton kernels: every op of a decode step is a device op, so a CUDA graph
    can capture the step (engine/cuda_graph.py)."""

    def __init__(self, config: ModelConfig, cos: torch.Tensor, sin: torch.Tensor, device: torch.device):
        problem = kernels.check_shapes(config.head_dim, 16)
        if problem:
            raise UnsupportedModelError(f"rooftop's CUDA attention cannot run this model: {problem}")
        super().__init__(config, cos, sin)
        self.multiprocessors = multiprocessors(device)

    def paged_attention(self, q, k, v, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        """Write the step's k, v (T, kv_heads, hd) into the pool, then attend. q: (T, heads, hd) -> (T, heads, hd)."""
        if isinstance(k_pool, StoredPool):
            raise UnsupportedModelError("a KV cache stored in another dtype than the model's does not run on CUDA yet")
        kernels.store_kv(_rows(k), _rows(v), k_pool, v_pool, meta.slot_mapping)
        rows = meta.num_prefill_rows
        parts = []
        if meta.prefills:
            parts.append(prefill_chunks(q[:rows], k_pool, v_pool, meta))
        if meta.has_decodes:
            decodes = kernels.decode_attention(
                _rows(q[rows:]),
                k_pool,
                v_pool,
                meta.decode_tables,
                meta.decode_lengths,
                meta.block_size,
                q.shape[-1] ** -0.5,
                self.multiprocessors,
            )
            parts.append(decodes)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(T, heads, hd) with each row's heads contiguous, as the kernels read it (a copy only when it is not)."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()
