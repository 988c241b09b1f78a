"""build_model: a LoadedModel's tensors -> a Transformer. Hugging Face weight names, Q/K/V and gate/up fusion,
which form each weight keeps (float in the run's dtype, or a file's 4/8-bit groups) and the op backend."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rooftop.config import FULL_ATTENTION, LINEAR_ATTENTION, LinearAttention, ModelConfig, check_runnable
from rooftop.errors import ModelLoadError
from rooftop.kernels import pages
from rooftop.loading.loaded import LazyWeights, LoadedModel
from rooftop.loading.shard import ShardError
from rooftop.models.blocks import DecoderBlock
from rooftop.models.hybrid import DeltaNetBlock, GatedAttentionBlock
from rooftop.models.mlp import DenseMLP, SparseMoE
from rooftop.models.ops import choose_ops
from rooftop.models.parallel import (
    TPGroup,
    VocabParallelEmbedding,
    VocabParallelHead,
    check_tensor_parallel,
    kv_head_rows,
    rank_config,
    vocab_rows,
)
from rooftop.models.rope import cos_sin_table
from rooftop.models.tensors import Tensors
from rooftop.models.transformer import Transformer
from rooftop.quant.linear import as_file_choice, embedding_table, linear_format, router_linear, weight_policy
from rooftop.quant.weights import BLOCK_FORMATS, Weight, to_float
from rooftop.roofline.ops import tp_sizes


def _decoder_block(t: Tensors, c: ModelConfig, i: int) -> DecoderBlock:
    """Layer i of a Llama / Qwen2 / Qwen3 / Qwen3-MoE checkpoint under Hugging Face's names. Under tensor parallelism
    the fused QKV is column-parallel (this rank's query heads and their KV heads) and o row-parallel."""
    d, qs, kvs = c.hidden_size, c.q_size, c.kv_size
    p = f"model.layers.{i}."
    a = p + "self_attn."
    heads = t.part(qs)
    kv = None if t.tp is None else kv_head_rows(c, t.tp.rank, t.tp.size)
    qkv = t.cat(
        t.take(a + "q_proj.weight", (qs, d), rows=heads),
        t.take(a + "k_proj.weight", (kvs, d), rows=kv),
        t.take(a + "v_proj.weight", (kvs, d), rows=kv),
    )
    biases = [
        t.take(a + f"{n}_proj.bias", (size,), False, rows)
        for n, size, rows in zip("qkv", (qs, kvs, kvs), (heads, kv, kv), strict=True)
    ]
    missing = [a + f"{n}_proj.bias" for n, b in zip("qkv", biases, strict=True) if b is None]
    if missing and (len(missing) < 3 or c.attention_bias):  # some of the three, or none where the config has them
        raise ModelLoadError(
            f"the model file has no tensor {missing[0]}"
            + (", which the config's attention_bias promises" if len(missing) == 3 else ", beside the other biases")
        )
    q_norm, k_norm = (t.take(a + f"{n}_norm.weight", (c.head_dim,), c.qk_norm) for n in "qk")
    qk_norm = None
    if q_norm is not None:
        local = rank_config(c, t.tp.size if t.tp else 1)
        qk_norm = torch.cat([q_norm.expand(local.num_heads, -1), k_norm.expand(local.num_kv_heads, -1)]).contiguous()
    return DecoderBlock(
        attn_norm=t.take(p + "input_layernorm.weight", (d,)),
        qkv=t.linear(qkv, t.cat(*biases)),
        o=t.row_parallel(t.take(a + "o_proj.weight", (d, qs), columns=heads), t.take(a + "o_proj.bias", (d,), False)),
        qk_norm=qk_norm,
        mlp_norm=t.take(p + "post_attention_layernorm.weight", (d,)),
        mlp=_moe(t, c, p + "mlp.") if c.is_moe else _dense_mlp(t, p + "mlp.", d, c.intermediate_size),
    )


def _dense_mlp(t: Tensors, p: str, d: int, ff: int) -> DenseMLP:
    """Gate and up fused; under tensor parallelism column-parallel (this rank's intermediate features of both), and
    down row-parallel over the same features."""
    part = t.part(ff)
    gate_up = t.cat(
        t.take(p + "gate_proj.weight", (ff, d), rows=part), t.take(p + "up_proj.weight", (ff, d), rows=part)
    )
    down = t.row_parallel(t.take(p + "down_proj.weight", (d, ff), columns=part), None)
    return DenseMLP(gate_up=t.linear(gate_up, None), down=down)


def _moe(t: Tensors, c: ModelConfig, p: str) -> SparseMoE:
    """The router in float32 (its logits pick the experts: rounding them would change which run) and each expert's
    gate/up and down in the model's weight format."""
    d = c.hidden_size
    router = router_linear(to_float(t.take(p + "gate.weight", (c.num_experts, d))).to(t.device))
    experts = [_dense_mlp(t, f"{p}experts.{e}.", d, c.moe_intermediate_size) for e in range(c.num_experts)]
    if not c.shared_expert_intermediate_size:
        return SparseMoE(router, experts, c.num_experts_per_tok, c.norm_topk_prob)
    shared = _dense_mlp(t, p + "shared_expert.", d, c.shared_expert_intermediate_size)
    gate = router_linear(to_float(t.take(p + "shared_expert_gate.weight", (1, d))).to(t.device))
    return SparseMoE(router, experts, c.num_experts_per_tok, c.norm_topk_prob, shared, gate)


def _hybrid_block(
    t: Tensors, c: ModelConfig, i: int, rope: tuple[torch.Tensor, torch.Tensor], linear: int, tiled: bool
):
    """Layer i of Qwen3.5 or Qwen3-Next: Gated DeltaNet or gated attention, then the MLP (Qwen3-Next: experts and a
    shared expert). Their RMSNorms are zero-centred (the file holds weight - 1; transformers multiplies by
    1 + weight), so 1 is added here, once; the DeltaNet's gated norm is not."""
    d, la, p = c.hidden_size, c.linear_attention, f"model.layers.{i}."
    mlp = _moe(t, c, p + "mlp.") if c.is_moe else _dense_mlp(t, p + "mlp.", d, c.intermediate_size)
    norms = {n: t.take(p + f"{n}.weight", (d,)) + 1 for n in ("input_layernorm", "post_attention_layernorm")}
    if c.layer_types[i] == FULL_ATTENTION:
        a, qs, kvs, hd = p + "self_attn.", c.q_size, c.kv_size, c.head_dim
        qkv = t.cat(
            t.take(a + "q_proj.weight", (2 * qs, d)),
            t.take(a + "k_proj.weight", (kvs, d)),
            t.take(a + "v_proj.weight", (kvs, d)),
        )
        return GatedAttentionBlock(
            attn_norm=norms["input_layernorm"],
            qkv=t.linear(qkv, None),
            o=t.linear(t.take(a + "o_proj.weight", (d, qs)), None),
            q_norm=t.take(a + "q_norm.weight", (hd,)) + 1,
            k_norm=t.take(a + "k_norm.weight", (hd,)) + 1,
            mlp_norm=norms["post_attention_layernorm"],
            mlp=mlp,
            cos=rope[0],
            signed_sin=rope[1],
            heads=c.num_heads,
            kv_heads=c.num_kv_heads,
            head_dim=hd,
            eps=c.rms_norm_eps,
        )
    a, heads, value_dim = p + "linear_attn.", la.num_value_heads, la.num_value_heads * la.value_head_dim
    if c.architecture == "qwen3_next" and a + "in_proj_qkvz.weight" in t.weights:  # HF: grouped by key head
        fused = t.cat(
            t.take(a + "in_proj_qkvz.weight", (la.conv_channels + value_dim, d)),
            t.take(a + "in_proj_ba.weight", (2 * heads, d)),
        )
        in_proj = _rows(fused, qwen3_next_order(la))
    elif c.architecture == "qwen3_next":  # llama.cpp's converter split q, k, v from z; b and a stay per key head
        ba = t.take(a + "in_proj_ba.weight", (2 * heads, d))
        r = heads // la.num_key_heads
        pairs = torch.arange(2 * heads).reshape(la.num_key_heads, 2 * r)
        in_proj = t.cat(
            t.take(a + "in_proj_qkv.weight", (la.conv_channels, d)),
            t.take(a + "in_proj_z.weight", (value_dim, d)),
            _rows(ba, torch.cat([pairs[:, :r].flatten(), pairs[:, r:].flatten()])),
        )
    else:
        in_proj = t.cat(
            t.take(a + "in_proj_qkv.weight", (la.conv_channels, d)),
            t.take(a + "in_proj_z.weight", (value_dim, d)),
            t.take(a + "in_proj_b.weight", (heads, d)),
            t.take(a + "in_proj_a.weight", (heads, d)),
        )
    return DeltaNetBlock(
        attn_norm=norms["input_layernorm"],
        in_proj=t.linear(in_proj, None),
        conv=t.take(a + "conv1d.weight", (la.conv_channels, 1, la.conv_kernel_dim))[:, 0].float().contiguous(),
        neg_a=-t.take(a + "A_log", (heads,)).float().exp(),
        dt_bias=t.take(a + "dt_bias", (heads,)).float(),
        norm=t.take(a + "norm.weight", (la.value_head_dim,)).float(),
        out_proj=t.linear(t.take(a + "out_proj.weight", (d, value_dim)), None),
        mlp_norm=norms["post_attention_layernorm"],
        mlp=mlp,
        shapes=la,
        index=linear,
        eps=c.rms_norm_eps,
        tiled=tiled,
    )


def _rows(w: Weight, order: torch.Tensor) -> Weight:
    return w[order] if isinstance(w, torch.Tensor) else w.rows(order)


def qwen3_next_order(la: LinearAttention) -> torch.Tensor:
    """Qwen3-Next's in_proj_qkvz rows hold, per key head, its q (key dim), k, then its value heads' v and z; and
    in_proj_ba's, per key head, its value heads' b then a. The index of each row of rooftop's layout (all q, all k,
    all v, all z, all b, all a, heads in order) in the two stacked."""
    dk, dv, r = la.key_head_dim, la.value_head_dim, la.num_value_heads // la.num_key_heads
    width = 2 * dk + 2 * r * dv  # one key head's rows of in_proj_qkvz
    heads = torch.arange(la.num_key_heads)[:, None]
    part = lambda start, n: (heads * width + start + torch.arange(n)).flatten()  # noqa: E731
    ba = la.num_key_heads * width + heads * 2 * r + torch.arange(2 * r)  # (key heads, 2r): b then a
    return torch.cat(
        [
            part(0, dk),
            part(dk, dk),
            part(2 * dk, r * dv),
            part(2 * dk + r * dv, r * dv),
            ba[:, :r].flatten(),
            ba[:, r:].flatten(),
        ]
    )


def requantized_note(choice: str, file_format: str | None, held: str) -> str | None:
    """What a quantized `--weights` choice does to a file's blocks of another format: rounds them again, from their
    values, to the format it holds (a Q4_K file under int4: Q4_1), which `auto` would have run as stored. The run's
    format line shows only the result, so a user comparing accuracy or load time is told."""
    if choice == "auto" or file_format is None or held not in ("q4_1", "q8_0", "int4-g32", "int8"):
        return None
    # the file's formats whose values the held groups keep exactly (Q4_0's in Q4_1 groups)
    kept = {"q4_1": ("q4_0", "q4_1"), "int4-g32": ("q4_0", "q4_1"), "q8_0": ("q8_0",)}.get(held, ())
    again = [f for f in file_format.split("+") if f in (*BLOCK_FORMATS, "q4_1", "q8_0") and f not in kept]
    if not again:
        return None
    return (
        f"--weights {choice}: the file's {' and '.join(again)} matrices were quantized again to {held} at load "
        "(a second rounding; --weights auto runs them as the file holds them)"
    )


def build_model(
    loaded: LoadedModel,
    dtype: torch.dtype,
    device: torch.device | str,
    weights: str = "auto",
    tp: TPGroup | None = None,
    on_layer: Callable[[], None] | None = None,
) -> Transformer:
    """The model of `loaded` in `dtype` on `device`, its linears as the `weights` choice (WEIGHT_CHOICES) runs here;
    with `tp`, this rank's part of it, read from the file as the rank's rows and columns only. `on_layer` is called
    as each layer is built (a progress bar's)."""
    c, device = loaded.config, torch.device(device)
    check_runnable(c)
    weights = as_file_choice(weights, loaded.file_format, device)
    policy = weight_policy(weights, loaded.native_format, device, dtype)
    if tp is not None and tp.size > 1:
        check_tensor_parallel(c, tp.size)
    t = Tensors(loaded.weights, dtype, device, policy, weights == "auto", tp, loaded.converted_types)
    if note := requantized_note(weights, loaded.file_format, linear_format(policy, device, dtype)):
        loaded.notes.append(note)
    try:
        model = _build(loaded, t, dtype, device, policy, on_layer)
    except ShardError as e:  # a format's blocks that this many ranks would cut: which sizes keep them whole
        block = e.block
        sizes = tp_sizes(c, lambda n: c.q_size % (n * block) == 0 and c.intermediate_size % (n * block) == 0)
        raise ShardError(
            f"{e}: tensor_parallel_size {tp.size} does not split it in whole blocks; valid sizes for this file: "
            f"{', '.join(map(str, sizes))}",
            block,
            e.size,
        ) from None
    if isinstance(loaded.weights, LazyWeights) and (unused := loaded.weights.untaken()):
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        loaded.notes.append(
            f"{len(unused)} tensor{'' if len(unused) == 1 else 's'} of the file not used by the model: "
            f"{', '.join(map(loaded.weights.described, unused[:3]))}{more}"
        )
    return model


def _build(
    loaded: LoadedModel,
    t: Tensors,
    dtype: torch.dtype,
    device: torch.device,
    policy: str,
    on_layer: Callable[[], None] | None,
) -> Transformer:
    c, tp = loaded.config, t.tp
    vocab = None if tp is None else vocab_rows(c.vocab_size, tp.rank, tp.size)
    # a lookup table, in the file's form (under tensor parallelism: this rank's rows of the vocabulary)
    embed = t.take("model.embed_tokens.weight", (c.vocab_size, c.hidden_size), rows=vocab)
    norm = t.take("model.norm.weight", (c.hidden_size,))
    head = embed if c.tie_word_embeddings else t.take("lm_head.weight", (c.vocab_size, c.hidden_size), rows=vocab)
    lm_head = t.linear(head, None, lm_head=True)
    if device.type != "cpu":  # a lookup table in the model's dtype: only CPU tensors look rows up from groups
        embed = to_float(embed).to(device, dtype)
    else:
        embed = embedding_table(embed, lm_head if c.tie_word_embeddings else None)
    if tp is not None:
        embed = VocabParallelEmbedding(embed, *vocab, tp)
        lm_head = VocabParallelHead(lm_head, -(-c.vocab_size // tp.size), c.vocab_size, tp)
    cos, sin = cos_sin_table(c, c.max_position_embeddings, dtype, device)
    hybrid = c.architecture in ("qwen3_5", "qwen3_next")
    if hybrid:
        norm = norm + 1  # zero-centred, as its layers' norms
    tiled = loaded.linear_value_order == "tiled"
    blocks = []
    for i in range(c.num_layers):
        if hybrid:
            blocks.append(_hybrid_block(t, c, i, (cos, sin), c.layer_types[:i].count(LINEAR_ATTENTION), tiled))
        else:
            blocks.append(_decoder_block(t, c, i))
        pages.release_freed()  # the layer's intermediates: else the next layer's pile on above them
        if isinstance(loaded.weights, LazyWeights):
            loaded.weights.release_pages()  # the file's, that the layer's tiles were made from
        if on_layer is not None:
            on_layer()
    local = rank_config(c, 1 if tp is None else tp.size)
    ops = choose_ops(local, dtype, device, cos, sin)
    return Transformer(c, dtype, device, embed, blocks, norm, lm_head, ops, policy, t.conversions, tp)
