"""GGUF metadata -> ModelConfig (no tensor is read: the analyzer uses this as the engine does)."""

from __future__ import annotations

from rooftop.config import RUNNABLE_ARCHITECTURES, ModelConfig, RopeScaling
from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.gguf_file import GGUFFile


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
    except (ValueError, TypeError, ZeroDivisionError) as e:  # values of the wrong type or range
        raise ModelLoadError(f"GGUF metadata describes no valid model ({type(e).__name__}: {e})") from None
    config.tie_word_embeddings = not any(t.name == "output.weight" for t in gguf_file.tensors)
    return config
