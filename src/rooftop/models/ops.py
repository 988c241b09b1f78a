"""The op backends a model runs on, picked once when it is built: PyTorch's ops, rooftop's CPU kernels (float32 on
the CPU) for RMSNorm, RoPE, SiLU-mul and decode attention, or on CUDA PyTorch's ops with rooftop's Triton kernels
for the paged KV cache (models/cuda_ops.py). All compute the same model."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from rooftop.config import ModelConfig
from rooftop.kernels import cpu
from rooftop.models.attention import paged_attention, prefill_chunks
from rooftop.models.kv_cache import AttentionMetadata, kernel_view
from rooftop.models.rope import apply_rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalized in float32 and cast back before the weight, as transformers does (few ops: decode runs 61)."""
    xf = x.float()
    inv_rms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    return weight * (xf * inv_rms).to(x.dtype)


def rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """An elementwise op on each row of x (T, n), computed the same whatever T is. PyTorch's CPU loops send a
    tensor's last few elements through a scalar tail whose exp rounds differently from the vector body, so a row's
    values would depend on how many rows share the call (batch invariance): each row is padded to whole vector
    iterations (a multiple of 64 floats) first."""
    pad = -x.shape[-1] % 64
    return fn(F.pad(x, (0, pad)))[..., : x.shape[-1]] if pad else fn(x)


class TorchOps:
    """PyTorch's ops: any device, any dtype."""

    def __init__(self, config: ModelConfig, cos: torch.Tensor, sin: torch.Tensor):
        self.config, self.cos, self.sin = config, cos, sin

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_norm_eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What attention needs of the step's positions, gathered once per step: cos and sin (T, 1, head_dim)."""
        return self.cos[positions, None], self.sin[positions, None]

    def attention(self, qkv, qk_norm, rope, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        """Q/K norm (Qwen3), RoPE and paged attention: (T, q_size + 2 * kv_size) -> (T, q_size)."""
        c = self.config
        T = qkv.shape[0]
        qk, v = qkv.split([c.q_size + c.kv_size, c.kv_size], dim=-1)
        qk = qk.view(T, c.num_heads + c.num_kv_heads, c.head_dim)  # q's heads then k's: one norm, one RoPE
        if qk_norm is not None:
            qk = rms_norm(qk, qk_norm, c.rms_norm_eps)
        q, k = apply_rope(qk, *rope).split([c.num_heads, c.num_kv_heads], dim=1)
        attn = self.paged_attention(q, k, v.view(T, c.num_kv_heads, c.head_dim), k_pool, v_pool, meta)
        return attn.reshape(T, c.q_size)

    def paged_attention(self, q, k, v, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        """Write the step's K/V into the pool and attend (models/attention.py); the gated attention layers of hybrid
        models call it after their own norms and RoPE."""
        return paged_attention(q, k, v, k_pool, v_pool, meta)

    def gated_attention(self, block, proj, positions, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        """A gated attention layer's attention (models/hybrid.py's GatedAttentionBlock) from its fused projection's
        rows to what its o_proj takes: q and k normed and rotated, paged attention, the output gate."""
        q, k, v, gate = block.project(proj, positions)
        return block.gated(self.paged_attention(q, k, v, k_pool, v_pool, meta), gate)

    def delta_net_decode(self, block, proj, conv_states, states, slots: torch.Tensor) -> torch.Tensor:
        """A step's decodes through a Gated DeltaNet layer (models/hybrid.py's DeltaNetBlock), one token each, from
        its fused projection's rows `proj` (B, width) to what its out_proj takes (B, value heads * value dim): the
        gates; the causal convolution over each sequence's kept inputs and SiLU; the heads; the recurrent form of
        models/delta_net.py, the convolution's inputs and states gathered from the layer's pools at `slots` and put
        back; the gated RMSNorm."""
        from rooftop.models import delta_net  # which imports this module's rowwise

        mixed, z, b, a = block.split(proj)
        g, beta = block.gates(b, a)
        window = torch.cat([conv_states[slots], mixed.float()[:, :, None]], dim=-1)  # (B, channels, kernel)
        conv_states[slots] = window[..., 1:]
        y = rowwise(F.silu, (window * block.conv).sum(-1))
        out, states[slots] = delta_net.recurrent(*block.heads(y), g, beta, states[slots])
        return block.gated_norm(out, z)


class KernelOps:
    """rooftop's CPU kernels (float32 on the CPU): norm and RoPE in place on q and k, decodes attend straight from
    the pool, whatever shares their step, and prefill chunks over the K/V gathered from it."""

    def __init__(self, kernels: ModuleType, config: ModelConfig, cos: torch.Tensor, sin: torch.Tensor):
        self.kernels, self.config, self.cos, self.sin = kernels, config, cos, sin

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, weight, self.config.rms_norm_eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.kernels.silu_mul(gate_up)

    def rope(self, positions: torch.Tensor) -> torch.Tensor:
        return positions  # the kernel reads the tables at the positions itself

    def prefill_rows(self, q, k, v, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        """The step's prefill rows (q: (rows, heads, head_dim)): their K/V into the pool, then each chunk's
        attention in rooftop's kernel."""
        written = meta.slot_mapping[: q.shape[0]]
        k_pool.index_copy_(0, written, k)
        v_pool.index_copy_(0, written, v)
        return prefill_chunks(q, k_pool, v_pool, meta, self.prefill_attention)

    def gated_attention(self, block, proj, positions, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        """TorchOps.gated_attention with the decodes in one call to rooftop's kernel (kernels/attention.cpp:
        norms, partial RoPE, attention straight from the pool, the gate), whatever shares their step; prefill rows in
        PyTorch's form but for each chunk's attention."""
        parts = []
        rows = meta.num_prefill_rows
        if meta.prefills:
            q, k, v, gate = block.project(proj[:rows], positions[:rows])
            parts.append(block.gated(self.prefill_rows(q, k, v, k_pool, v_pool, meta), gate))
        if meta.has_decodes:
            step, scales = decode_step(k_pool, v_pool, meta)
            norms_and_rope = (block.q_norm, block.k_norm, positions[rows:], block.cos, block.signed_sin, block.eps)
            decodes = self.kernels.gated_decode_attention(
                proj[rows:], *norms_and_rope, *step, block.heads, block.kv_heads, block.head_dim**-0.5, **scales
            )
            parts.append(decodes)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def delta_net_decode(self, block, proj, conv_states, states, slots: torch.Tensor) -> torch.Tensor:
        """The same step in one call to rooftop's kernel (kernels/delta_rule.cpp): the convolution's inputs and each
        state updated in place in their pools, a state read and written once a pass where PyTorch's form makes six
        tensors of it, and the layer's ~40 small ops around the rule in one loop."""
        return self.kernels.delta_net_decode(
            proj,
            block.conv,
            conv_states,
            block.neg_a,
            block.dt_bias,
            block.norm,
            block.eps,
            states,
            slots,
            block.shapes.num_key_heads,
            block.tiled,
        )

    def experts_rows(self, row, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> tuple:
        """Rows' weighted sums over their experts (T, k) and routing weights (T, k), in one call to the kernels'
        RowExperts (models/mlp.py's SparseMoE), and the distinct experts run."""
        return row.rows(x, experts, weights)

    def prefill_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, cached: int) -> torch.Tensor:
        """A prefill chunk's causal attention in rooftop's kernel (kernels/prefill_attention.cpp: blocks past a
        query's position skipped, where PyTorch's CPU flash attention computes a later chunk's masked blocks too),
        over K/V gathered from the pool as float32."""
        return self.kernels.prefill_attention(q, keys.float(), values.float(), cached, self.config.head_dim**-0.5)

    def attention(self, qkv, qk_norm, positions, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        c = self.config
        self.kernels.rope_(
            qkv, c.num_heads + c.num_kv_heads, c.head_dim, positions, self.cos, self.sin, qk_norm, c.rms_norm_eps
        )
        parts = []
        rows = meta.num_prefill_rows
        if meta.prefills:
            q, k, v = qkv[:rows].view(rows, -1, c.head_dim).split([c.num_heads, c.num_kv_heads, c.num_kv_heads], dim=1)
            parts.append(self.prefill_rows(q, k, v, k_pool, v_pool, meta).reshape(rows, c.q_size))
        if meta.has_decodes:  # the new K/V written and each sequence's cache read in place from the pool
            step, scales = decode_step(k_pool, v_pool, meta)
            decodes = self.kernels.decode_attention(
                qkv[rows:], *step, c.num_heads, c.num_kv_heads, c.head_dim**-0.5, **scales
            )
            parts.append(decodes)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def decode_step(k_pool, v_pool, meta: AttentionMetadata) -> tuple[tuple, dict]:
    """What the decode kernels take of a step besides its q, k and v: the pools as stored, the decodes' slots,
    block tables, lengths and the block size; and a quantized pool's scales."""
    (k_values, k_scale), (v_values, v_scale) = kernel_view(k_pool), kernel_view(v_pool)
    rows = meta.num_prefill_rows
    step = (k_values, v_values, meta.slot_mapping[rows:], meta.decode_tables, meta.decode_lengths, meta.block_size)
    return step, {"k_scale": k_scale, "v_scale": v_scale}


Ops = TorchOps | KernelOps  # CudaOps is a TorchOps


def choose_ops(config: ModelConfig, dtype: torch.dtype, device: torch.device, cos, sin) -> Ops:
    """On CUDA PyTorch's ops with rooftop's paged attention kernels (CudaOps); on the CPU rooftop's kernels where
    they built and take the model's activations (float32), else PyTorch's."""
    if device.type == "cuda":
        from rooftop.models.cuda_ops import CudaOps  # Triton, imported only where a GPU runs the model

        return CudaOps(config, cos, sin, device)
    kernels = cpu.ops() if device.type == "cpu" and dtype == torch.float32 else None
    return TorchOps(config, cos, sin) if kernels is None else KernelOps(kernels, config, cos, sin)
