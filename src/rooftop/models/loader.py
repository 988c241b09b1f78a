"""build_model: a LoadedModel's tensors -> a Transformer. Hugging Face weight names, Q/K/V and gate/up fusion,
which form each weight keeps (float in the run's dtype, or a file's 4/8-bit groups) and the op backend."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rooftop.config import ModelConfig, check_runnable
from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.loaded import LoadedModel
from rooftop.models.blocks import DecoderBlock
from rooftop.models.ops import choose_ops
from rooftop.models.rope import cos_sin_table
from rooftop.models.transformer import Transformer
from rooftop.quant.linear import make_linear, weight_policy
from rooftop.quant.weights import Weight, to_float


class _Tensors:
    """The file's tensors in the form the model keeps: float tensors in its dtype on its device, 4/8-bit groups as
    they are where the CPU kernels read them (float linears and other devices get them dequantized)."""

    def __init__(self, weights: Mapping[str, Weight], dtype: torch.dtype, device: torch.device, policy: str):
        self.weights, self.dtype, self.device = weights, dtype, device
        self.keep_groups = policy != "float" and device.type == "cpu"

    def take(self, name: str, shape: tuple[int, ...] | None, required: bool = True) -> Weight | None:
        w = self.weights.get(name)
        if w is None:
            if required:
                raise ModelLoadError(f"the model file has no tensor {name}")
            return None
        if shape is not None and tuple(w.shape) != shape:
            raise ModelLoadError(f"tensor {name} has shape {tuple(w.shape)}, the config implies {shape}")
        if not isinstance(w, torch.Tensor) and not self.keep_groups:
            w = w.dequantize()
        return w.to(device=self.device, dtype=self.dtype).contiguous() if isinstance(w, torch.Tensor) else w

    def cat(self, *parts: Weight | None) -> Weight | None:
        """Fused projections: one matrix from several, kept in their common form when they share one."""
        if any(t is None for t in parts):
            return None
        kind = type(parts[0])
        if kind is not torch.Tensor and all(type(t) is kind for t in parts):
            return kind.cat(list(parts))
        return torch.cat([to_float(t).to(device=self.device, dtype=self.dtype) for t in parts], dim=0).contiguous()


def _decoder_block(t: _Tensors, c: ModelConfig, i: int, policy: str) -> DecoderBlock:
    """Layer i of a Llama / Qwen2 / Qwen3 checkpoint under Hugging Face's names."""
    d, qs, kvs, ff = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size
    p = f"model.layers.{i}."
    a = p + "self_attn."
    qkv = t.cat(
        t.take(a + "q_proj.weight", (qs, d)),
        t.take(a + "k_proj.weight", (kvs, d)),
        t.take(a + "v_proj.weight", (kvs, d)),
    )
    q_norm, k_norm = (t.take(a + f"{n}_norm.weight", (c.head_dim,), c.qk_norm) for n in "qk")
    qk_norm = None
    if q_norm is not None:
        qk_norm = torch.cat([q_norm.expand(c.num_heads, -1), k_norm.expand(c.num_kv_heads, -1)]).contiguous()
    return DecoderBlock(
        attn_norm=t.take(p + "input_layernorm.weight", (d,)),
        qkv=make_linear(qkv, t.cat(*(t.take(a + f"{n}_proj.bias", None, False) for n in "qkv")), policy),
        o=make_linear(t.take(a + "o_proj.weight", (d, qs)), t.take(a + "o_proj.bias", (d,), False), policy),
        qk_norm=qk_norm,
        mlp_norm=t.take(p + "post_attention_layernorm.weight", (d,)),
        gate_up=make_linear(
            t.cat(t.take(p + "mlp.gate_proj.weight", (ff, d)), t.take(p + "mlp.up_proj.weight", (ff, d))), None, policy
        ),
        down=make_linear(t.take(p + "mlp.down_proj.weight", (d, ff)), None, policy),
    )


def build_model(
    loaded: LoadedModel, dtype: torch.dtype, device: torch.device | str, weights: str = "auto"
) -> Transformer:
    """The model of `loaded` in `dtype` on `device`, its linears as the `weights` choice (WEIGHT_CHOICES) runs here."""
    c, device = loaded.config, torch.device(device)
    check_runnable(c)
    policy = weight_policy(weights, loaded.native_format, device, dtype)
    if policy == "int4" and device.type != "cpu":
        raise UnsupportedModelError("int4 weights run on PyTorch's CPU kernels only for now; use int8 or float")
    t = _Tensors(loaded.weights, dtype, device, policy)
    embed = t.take("model.embed_tokens.weight", (c.vocab_size, c.hidden_size))  # a lookup table, in the file's form
    norm = t.take("model.norm.weight", (c.hidden_size,))
    head = embed if c.tie_word_embeddings else t.take("lm_head.weight", (c.vocab_size, c.hidden_size))
    lm_head = make_linear(head, None, policy, lm_head=True)
    blocks = [_decoder_block(t, c, i, policy) for i in range(c.num_layers)]
    cos, sin = cos_sin_table(c, c.max_position_embeddings, dtype, device)
    ops = choose_ops(c, dtype, device, cos, sin)
    return Transformer(c, dtype, device, embed, blocks, norm, lm_head, ops, policy)
