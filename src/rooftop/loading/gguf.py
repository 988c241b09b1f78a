"""GGUF files: metadata -> ModelConfig, tensors -> weights under Hugging Face names, vocabulary -> Tokenizer."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QType

from rooftop.config import RUNNABLE_ARCHITECTURES, ModelConfig, RopeScaling
from rooftop.errors import ModelLoadError, RooftopError, UnsupportedModelError
from rooftop.loading.gguf_file import GGUFFile, TensorInfo, read_gguf
from rooftop.loading.model_files import LazyWeights, LoadedModel
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.gguf_blocks import dequantize, q4_0_parts, q4_1_parts, q8_0_parts
from rooftop.quant.weights import Int4Weight, Int8GroupWeight, Weight

GROUP_TYPES = (QType.Q4_0, QType.Q4_1, QType.Q8_0)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for tensors we derive ourselves."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}"
    elif stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    return None


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order (rotary pairs interleaved) back to Hugging Face's (halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def config_from_metadata(meta: dict) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in RUNNABLE_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(RUNNABLE_ARCHITECTURES)})"
        )

    def get(key: str, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    if hidden < 1 or heads < 1:
        raise ModelLoadError(f"GGUF metadata: embedding_length {hidden} and head_count {heads} must be positive")
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    rope_dims = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise UnsupportedModelError(f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", factor=float(get("rope.scaling.factor")))
    elif meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise UnsupportedModelError(f"RoPE scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(meta.get(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens", [])))),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(get("context_length")),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        qk_norm=arch == "qwen3",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[eos] if eos is not None else [],
        name=str(meta.get("general.name", "")),
    )


def config_from_gguf(gguf_file: GGUFFile) -> ModelConfig:
    """The config, with tied embeddings read off the tensor list (no `output.weight`: lm_head is the embedding)."""
    try:
        config = config_from_metadata(gguf_file.metadata)
    except (ValueError, TypeError, ZeroDivisionError, AssertionError) as e:  # values of the wrong type or range
        raise ModelLoadError(f"GGUF metadata describes no valid model ({type(e).__name__}: {e})") from None
    config.tie_word_embeddings = not any(t.name == "output.weight" for t in gguf_file.tensors)
    return config


def group_weight(t: TensorInfo) -> Int4Weight | Int8GroupWeight:
    """A Q4_0 / Q4_1 / Q8_0 matrix as its integers with per-32 scales (and zeros), never widened to floats."""
    rows, cols = t.shape
    groups = cols // 32
    if t.qtype == QType.Q8_0:
        d, q = q8_0_parts(t.data, t.numel)
        return Int8GroupWeight(q.reshape(rows, cols), d.reshape(rows, groups))
    if t.qtype == QType.Q4_1:
        d, m, q = q4_1_parts(t.data, t.numel)
        zero = m + 8 * d  # d·q + m == (q - 8)·d + (m + 8d)
    else:
        d, q = q4_0_parts(t.data, t.numel)
        zero = torch.zeros_like(d)
    return Int4Weight(q.reshape(rows, cols), d.reshape(rows, groups), zero.reshape(rows, groups))


def read_tensor(t: TensorInfo, config: ModelConfig, name: str) -> Weight:
    """One tensor under its HF layout: quantized matrices as their groups, everything else as float32."""
    if t.qtype in GROUP_TYPES and len(t.shape) == 2:
        w = group_weight(t)
    else:
        w = dequantize(t.data, t.qtype, t.shape, t.name)
    if config.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config.num_heads if "q_proj" in name else config.num_kv_heads
        if isinstance(w, torch.Tensor):
            w = unpermute_rope(w, heads)
        else:  # the same row order, applied to integers, scales and zeros alike
            w = w.rows(unpermute_rope(torch.arange(w.shape[0])[:, None], heads)[:, 0])
    return w


def native_format(tensors: list[TensorInfo]) -> str:
    """The engine's weight format closest to what the file's transformer blocks hold (most of their elements)."""
    held: dict[QType, int] = {}
    for t in tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            held[t.qtype] = held.get(t.qtype, 0) + t.numel
    most = max(held, key=held.get, default=QType.F32)
    return {QType.Q4_0: "int4", QType.Q4_1: "int4", QType.Q8_0: "int8"}.get(most, "float")


def load_gguf(path: Path) -> LoadedModel:
    """Read a GGUF file's config and tokenizer now, and its tensors (under HF names and layout) when the model
    asks for each: Q4_0/Q4_1/Q8_0 matrices come as their integer groups, the rest as float32."""
    gguf_file = read_gguf(path)
    meta = gguf_file.metadata
    config = config_from_gguf(gguf_file)
    readers = {}
    for t in gguf_file.tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name == "rope_freqs.weight":  # Llama-3 rope scaling, stored as per-pair frequency divisors
                config.rope_freq_factors = dequantize(t.data, t.qtype, t.shape, t.name).tolist()
            continue
        readers[name] = partial(read_tensor, t, config, name)
    try:
        tokenizer = Tokenizer.from_gguf_metadata(meta)
    except RooftopError:
        raise
    except Exception as e:  # the tokenizers library raises its own exception types on a bad vocabulary or merges
        raise ModelLoadError(f"{path}: the GGUF tokenizer data is invalid ({type(e).__name__}: {e})") from None
    return LoadedModel(config, LazyWeights(readers), tokenizer, str(path), native_format(gguf_file.tensors))
