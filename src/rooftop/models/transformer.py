"""One decoder-only transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU) run on explicit weights.

`forward_batch` runs the new tokens of many sequences as one flat batch: every matmul reads the weights once
for all of them; only attention is per sequence, through the paged KV cache. Q/K/V and gate/up are fused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from rooftop.config import ModelConfig, check_runnable
from rooftop.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rooftop.kernels import cpu
from rooftop.models.attention import decode_attention_kernel, paged_attention
from rooftop.models.kv_cache import AttentionMetadata, KVCache, KVPool
from rooftop.models.rope import apply_rope, cos_sin_table
from rooftop.quant.linear import FLOAT_FORMATS, Linear, make_linear
from rooftop.quant.weights import Weight, to_float
from rooftop.roofline.precision import WEIGHT_FORMATS, WEIGHT_POLICIES, Precision, precision


@dataclass
class Layer:
    attn_norm: torch.Tensor
    qkv: Linear  # hidden -> q_size + 2 * kv_size (with Qwen2's biases)
    o: Linear
    qk_norm: (
        torch.Tensor | None
    )  # Qwen3 only: q_norm for each q head, then k_norm for each k head, (heads + kv_heads, head_dim)
    mlp_norm: torch.Tensor
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalized in float32 and cast back before the weight, as transformers does (few ops: decode runs 61)."""
    xf = x.float()
    inv_rms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    return weight * (xf * inv_rms).to(x.dtype)


class Transformer:
    """Weights on one device in one dtype, and the forward pass over them."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, Weight],
        dtype: torch.dtype,
        device: torch.device,
        weight_format: str = "float",
    ):
        c = config
        check_runnable(c)
        if weight_format not in WEIGHT_POLICIES:
            raise InvalidRequestError(f"weights must be one of {', '.join(WEIGHT_POLICIES)}; got {weight_format!r}")
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        if weight_format == "int4" and self.device.type != "cpu":
            raise UnsupportedModelError("int4 weights run on PyTorch's CPU kernels only for now; use int8 or float")
        self.weight_format = weight_format

        def take(name: str, shape: tuple[int, ...] | None, required: bool = True) -> Weight | None:
            """A weight in the file's form: float tensors in the model's dtype, 4/8-bit groups as they are."""
            w = weights.get(name)
            if w is None:
                if required:
                    raise ModelLoadError(f"the model file has no tensor {name}")
                return None
            if shape is not None and tuple(w.shape) != shape:
                raise ModelLoadError(f"tensor {name} has shape {tuple(w.shape)}, the config implies {shape}")
            if not isinstance(w, torch.Tensor) and (weight_format == "float" or self.device.type != "cpu"):
                w = w.dequantize()  # integer groups are read by the CPU kernels only
            return w.to(device=self.device, dtype=dtype).contiguous() if isinstance(w, torch.Tensor) else w

        def cat(*parts: Weight | None) -> Weight | None:
            """Fused projections: one matrix from several, kept in their common form when they share one."""
            if any(t is None for t in parts):
                return None
            kind = type(parts[0])
            if kind is not torch.Tensor and all(type(t) is kind for t in parts):
                return kind.cat(list(parts))
            return torch.cat([to_float(t).to(device=self.device, dtype=dtype) for t in parts], dim=0).contiguous()

        def per_head_norm(q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> torch.Tensor | None:
            if q_norm is None:
                return None
            return torch.cat([q_norm.expand(c.num_heads, -1), k_norm.expand(c.num_kv_heads, -1)]).contiguous()

        d, qs, kvs, ff = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size
        self.embed = take("model.embed_tokens.weight", (c.vocab_size, d))  # a lookup table, in the file's form
        self.norm = take("model.norm.weight", (d,))
        head = self.embed if c.tie_word_embeddings else take("lm_head.weight", (c.vocab_size, d))
        self.lm_head = make_linear(head, None, weight_format, lm_head=True)
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            self.layers.append(
                Layer(
                    attn_norm=take(p + "input_layernorm.weight", (d,)),
                    qkv=make_linear(
                        cat(
                            take(a + "q_proj.weight", (qs, d)),
                            take(a + "k_proj.weight", (kvs, d)),
                            take(a + "v_proj.weight", (kvs, d)),
                        ),
                        cat(*(take(a + f"{n}_proj.bias", None, False) for n in "qkv")),
                        weight_format,
                    ),
                    o=make_linear(
                        take(a + "o_proj.weight", (d, qs)), take(a + "o_proj.bias", (d,), False), weight_format
                    ),
                    qk_norm=per_head_norm(
                        take(a + "q_norm.weight", (c.head_dim,), c.qk_norm),
                        take(a + "k_norm.weight", (c.head_dim,), c.qk_norm),
                    ),
                    mlp_norm=take(p + "post_attention_layernorm.weight", (d,)),
                    gate_up=make_linear(
                        cat(take(p + "mlp.gate_proj.weight", (ff, d)), take(p + "mlp.up_proj.weight", (ff, d))),
                        None,
                        weight_format,
                    ),
                    down=make_linear(take(p + "mlp.down_proj.weight", (d, ff)), None, weight_format),
                )
            )
        self.cos, self.sin = cos_sin_table(c, c.max_position_embeddings, dtype, self.device)

    @property
    def precision(self) -> Precision:
        """What the steps read and compute in, as the linears report it: activations and KV cache in the dtype, the
        block linears' format and the lm_head's, and the step size from which quantized linears widen to floats."""
        fmt = FLOAT_FORMATS[self.dtype]
        linear = self.layers[0].qkv  # every block linear has one format
        weights, head = WEIGHT_FORMATS[linear.format], WEIGHT_FORMATS[self.lm_head.format]
        return replace(
            precision(fmt, fmt),
            weights=weights,
            widen_rows=linear.widen_rows,
            lm_head=None if head == weights else head,
        )

    def forward(self, input_ids: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        """One sequence: T new tokens at positions start..start+T-1 after `start` tokens already in `cache`."""
        positions = torch.arange(start, start + input_ids.shape[0], device=input_ids.device)
        return self.forward_batch(input_ids, positions, cache.pool, cache.metadata(start, input_ids.shape[0]))

    def forward_batch(
        self, input_ids: torch.Tensor, positions: torch.Tensor, pool: KVPool, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states (T, hidden) of the step's T tokens (all sequences, flat); their K/V go into `pool`."""
        c = self.config
        x = self.embed_tokens(input_ids)
        kernels = cpu.usable(x)  # float32 on the CPU: rooftop's kernels for the small ops too
        norm = rms_norm if kernels is None else kernels.rms_norm
        rope_tables = None if kernels else (self.cos[positions, None], self.sin[positions, None])  # (T, 1, head_dim)
        for i, layer in enumerate(self.layers):
            h = norm(x, layer.attn_norm, c.rms_norm_eps)
            qkv = layer.qkv(h)
            if kernels is not None:
                attn = self.attention_with_kernels(kernels, i, qkv, layer.qk_norm, positions, pool, meta)
            else:
                attn = self.attention(i, qkv, layer.qk_norm, rope_tables, pool, meta)
            x = layer.o(attn, residual=x)
            h = norm(x, layer.mlp_norm, c.rms_norm_eps)
            gate_up = layer.gate_up(h)
            if kernels is not None:
                act = kernels.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                act = F.silu(gate) * up
            x = layer.down(act, residual=x)
        return norm(x, self.norm, c.rms_norm_eps)

    def attention(self, i, qkv, qk_norm, rope_tables, pool: KVPool, meta: AttentionMetadata) -> torch.Tensor:
        """Q/K norm (Qwen3), RoPE and paged attention in PyTorch ops: (T, q_size + 2 * kv_size) -> (T, q_size)."""
        c = self.config
        T = qkv.shape[0]
        qk, v = qkv.split([c.q_size + c.kv_size, c.kv_size], dim=-1)
        qk = qk.view(T, c.num_heads + c.num_kv_heads, c.head_dim)  # q's heads then k's: one norm, one RoPE
        if qk_norm is not None:
            qk = rms_norm(qk, qk_norm, c.rms_norm_eps)
        q, k = apply_rope(qk, *rope_tables).split([c.num_heads, c.num_kv_heads], dim=1)
        attn = paged_attention(q, k, v.view(T, c.num_kv_heads, c.head_dim), pool.k_layers[i], pool.v_layers[i], meta)
        return attn.reshape(T, c.q_size)

    def attention_with_kernels(
        self, kernels, i, qkv, qk_norm, positions, pool: KVPool, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The same with rooftop's CPU kernels: norm and RoPE in place on q and k, and decode steps attend straight
        from the pool (prefill chunks still take PyTorch's scaled_dot_product_attention)."""
        c = self.config
        T = qkv.shape[0]
        kernels.rope_(
            qkv, c.num_heads + c.num_kv_heads, c.head_dim, positions, self.cos, self.sin, qk_norm, c.rms_norm_eps
        )
        if not meta.prefills:
            return decode_attention_kernel(kernels, qkv, pool.k_layers[i], pool.v_layers[i], meta, c)
        q, k, v = qkv.view(T, -1, c.head_dim).split([c.num_heads, c.num_kv_heads, c.num_kv_heads], dim=1)
        return paged_attention(q, k, v, pool.k_layers[i], pool.v_layers[i], meta).reshape(T, c.q_size)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, torch.Tensor):
            return F.embedding(input_ids, self.embed)
        return self.embed.lookup(input_ids).to(self.dtype)  # only the rows of these tokens are widened

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits (T, vocab) for the given hidden states (only the positions that need sampling)."""
        return self.lm_head(hidden).float()
