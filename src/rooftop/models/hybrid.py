"""Qwen3.5's two layer types: Gated DeltaNet (linear attention with a per-sequence state, models/delta_net.py) and
gated full attention (a sigmoid gate from q_proj on the output, RoPE on part of each head). Three of every four
layers of the released models are Gated DeltaNet.

A step's rows are its prefill chunks' tokens, then one row per decode (kv_cache.AttentionMetadata): a DeltaNet
layer runs each chunk through the chunked form from its sequence's state slot (zeroed when the chunk starts the
sequence) and all decodes at once through the recurrent form, each from its own slot. So a chunked prefill carries
the state across chunks, and a preempted sequence, whose slot is given back, starts again from zeros when it is
recomputed from its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rooftop.config import LinearAttention
from rooftop.models import delta_net
from rooftop.models.kv_cache import AttentionMetadata, StatePool
from rooftop.models.mlp import DenseMLP
from rooftop.models.ops import Ops, rms_norm, rowwise
from rooftop.models.rope import apply_rope
from rooftop.quant.linear import Linear, RowPlan


@dataclass
class GatedAttentionBlock:
    """RMSNorm; fused projection whose q part holds, per head, head_dim query dims then head_dim gate dims; q/k
    RMSNorm; RoPE on the first rotary_dim dims; paged attention; output times sigmoid(gate); o_proj; the MLP."""

    attn_norm: torch.Tensor
    qkv: Linear  # hidden -> 2 * q_size + 2 * kv_size
    o: Linear
    q_norm: torch.Tensor  # (head_dim,)
    k_norm: torch.Tensor
    mlp_norm: torch.Tensor
    mlp: DenseMLP
    cos: torch.Tensor  # (positions, rotary_dim)
    signed_sin: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    def __call__(
        self,
        x: torch.Tensor,
        ops: Ops,
        positions: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        plan: RowPlan,
    ) -> torch.Tensor:
        proj = self.qkv(ops.rms_norm(x, self.attn_norm), plan=plan)
        x = self.o(ops.gated_attention(self, proj, positions, k_pool, v_pool, meta), residual=x, plan=plan)
        return self.mlp(ops.rms_norm(x, self.mlp_norm), ops, plan, residual=x)

    def project(self, proj: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The fused projection's rows (T, 2 * q_size + 2 * kv_size) as PyTorch's form takes them: q and k normed and
        rotated, v (each (T, heads, head_dim)), and the output gate (T, q_size)."""
        T, hd = proj.shape[0], self.head_dim
        qg, k, v = proj.split([2 * self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1)
        qg = qg.view(T, self.heads, 2 * hd)
        q = self.rotate(rms_norm(qg[..., :hd], self.q_norm, self.eps), positions)
        k = self.rotate(rms_norm(k.view(T, self.kv_heads, hd), self.k_norm, self.eps), positions)
        return q, k, v.reshape(T, self.kv_heads, hd), qg[..., hd:].reshape(T, -1)

    def gated(self, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Attention's output (T, heads, head_dim) times sigmoid(gate): what o_proj takes, (T, q_size)."""
        return attn.reshape(gate.shape) * rowwise(torch.sigmoid, gate)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on the first rotary_dim dims of each head (T, heads, head_dim); the others pass through."""
        rot = self.cos.shape[1]
        turned = apply_rope(x[..., :rot], self.cos[positions, None], self.signed_sin[positions, None])
        return torch.cat([turned, x[..., rot:]], dim=-1)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, *self.mlp.linears()]


@dataclass
class DeltaNetBlock:
    """RMSNorm; one fused projection to the convolution's channels (q, k, v), the output gate z and the per-head
    beta and decay inputs; the causal convolution and the gated delta rule per sequence; gated RMSNorm; out_proj;
    the MLP. `index` is the layer's place among the linear-attention layers (its part of the StatePool)."""

    attn_norm: torch.Tensor
    in_proj: Linear  # hidden -> conv channels + value_dim + 2 * value heads
    conv: torch.Tensor  # (channels, kernel) float32
    neg_a: torch.Tensor  # (value heads,) -exp(A_log): the decay rate
    dt_bias: torch.Tensor
    norm: torch.Tensor  # (value_head_dim,)
    out_proj: Linear
    mlp_norm: torch.Tensor
    mlp: DenseMLP
    shapes: LinearAttention
    index: int
    eps: float
    tiled: bool = False  # value heads in llama.cpp's tiled order: head j reads key head j % key heads

    def __call__(
        self, x: torch.Tensor, ops: Ops, states: StatePool, meta: AttentionMetadata, plan: RowPlan
    ) -> torch.Tensor:
        la, T = self.shapes, x.shape[0]
        proj = self.in_proj(ops.rms_norm(x, self.attn_norm), plan=plan)
        conv_state, state = states.conv[self.index], states.recurrent[self.index]
        out = torch.empty(T, la.num_value_heads * la.value_head_dim, device=x.device)
        if meta.prefills:
            rows = slice(0, meta.num_prefill_rows)
            mixed, z, b, a = self.split(proj[rows])
            g, beta = self.gates(b, a)
            heads = torch.empty(meta.num_prefill_rows, la.num_value_heads, la.value_head_dim, device=x.device)
            for chunk in meta.prefills:
                rows, slot = slice(chunk.start, chunk.end), chunk.state_slot
                if chunk.cached == 0:  # the sequence's first tokens: no state yet
                    conv_state[slot].zero_()
                    state[slot].zero_()
                y, conv_state[slot] = delta_net.causal_conv(mixed[rows].float(), self.conv, conv_state[slot])
                heads[rows], state[slot] = delta_net.chunked(*self.heads(y), g[rows], beta[rows], state[slot])
            out[: meta.num_prefill_rows] = self.gated_norm(heads, z)
        if meta.has_decodes:
            rows = slice(meta.num_prefill_rows, T)
            out[rows] = ops.delta_net_decode(self, proj[rows], conv_state, state, meta.decode_state_slots)
        x = self.out_proj(out.to(x.dtype), residual=x, plan=plan)
        return self.mlp(ops.rms_norm(x, self.mlp_norm), ops, plan, residual=x)

    def split(self, proj: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The fused projection's rows as the convolution's channels, the output gate z, and b and a (one per value
        head), which make beta and the decay."""
        la = self.shapes
        value_dim = la.num_value_heads * la.value_head_dim
        return proj.split([la.conv_channels, value_dim, la.num_value_heads, la.num_value_heads], dim=-1)

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decay g = -exp(A_log) * softplus(a + dt_bias) and the write strength beta = sigmoid(b), per row and
        value head, float32."""
        beta = rowwise(torch.sigmoid, b.float())
        return self.neg_a * rowwise(F.softplus, a.float() + self.dt_bias), beta

    def gated_norm(self, heads: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The rule's outputs (T, value heads, value dim) through the gated RMSNorm: what out_proj takes, (T,
        value heads * value dim)."""
        return delta_net.gated_rms_norm(heads, z.reshape(heads.shape), self.norm, self.eps).flatten(1)

    def heads(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolution's output (T, channels) as q, k (T, value heads, key dim; each key head serving
        value heads / key heads value heads, consecutive ones or, tiled, every key-heads-th), normalized, q scaled;
        and v (T, value heads, value dim)."""
        la, T = self.shapes, y.shape[0]
        key_dim = la.num_key_heads * la.key_head_dim
        q, k, v = y.split([key_dim, key_dim, la.num_value_heads * la.value_head_dim], dim=-1)
        repeat = la.num_value_heads // la.num_key_heads
        q, k = (t.reshape(T, la.num_key_heads, la.key_head_dim) for t in (q, k))
        q, k = (t.repeat(1, repeat, 1) if self.tiled else t.repeat_interleave(repeat, dim=1) for t in (q, k))
        q = delta_net.l2norm(q) * la.key_head_dim**-0.5
        return q, delta_net.l2norm(k), v.reshape(T, la.num_value_heads, la.value_head_dim)

    def linears(self) -> list[Linear]:
        return [self.in_proj, self.out_proj, *self.mlp.linears()]
