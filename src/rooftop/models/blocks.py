"""Block types: what one layer of an architecture computes, on whichever op backend the model picked. Llama, Qwen2,
Qwen3 and Qwen3-MoE share the decoder block; its MLP half is dense or a mixture of experts (models/mlp.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rooftop.models.kv_cache import AttentionMetadata
from rooftop.models.mlp import DenseMLP, SparseMoE
from rooftop.models.ops import Ops
from rooftop.quant.linear import Linear, RowPlan


@dataclass
class DecoderBlock:
    """RMSNorm, fused QKV, (Qwen3's Q/K norm,) RoPE, paged attention, output projection; RMSNorm, the MLP."""

    attn_norm: torch.Tensor
    qkv: Linear  # hidden -> q_size + 2 * kv_size (with Qwen2's biases)
    o: Linear
    qk_norm: torch.Tensor | None  # Qwen3: q_norm for each q head, then k_norm for each k head, (heads + kv_heads, hd)
    mlp_norm: torch.Tensor
    mlp: DenseMLP | SparseMoE

    def __call__(
        self,
        x: torch.Tensor,
        ops: Ops,
        rope,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        plan: RowPlan,
    ) -> torch.Tensor:
        qkv = self.qkv(ops.rms_norm(x, self.attn_norm), plan=plan)
        x = self.o(ops.attention(qkv, self.qk_norm, rope, k_pool, v_pool, meta), residual=x, plan=plan)
        return self.mlp(ops.rms_norm(x, self.mlp_norm), ops, plan, residual=x)

    def linears(self) -> list[Linear]:
        """Every weight matrix of the layer, for the report of bytes per format."""
        return [self.qkv, self.o, *self.mlp.linears()]
