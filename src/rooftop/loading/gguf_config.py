"""GGUF metadata -> ModelConfig (no tensor is read: the analyzer uses this as the engine does)."""

from __future__ import annotations

from rooftop.config import FULL_ATTENTION, LINEAR_ATTENTION, LinearAttention, ModelConfig, RopeScaling
from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.gguf_file import GGUFFile

# GGUF's architecture names (gguf.MODEL_ARCH_NAMES, as llama.cpp's converter writes them) -> rooftop's
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "qwen35": "qwen3_5",
    "qwen3next": "qwen3_next",
}


def config_from_metadata(meta: dict) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
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
    if rope_dims != head_dim and arch not in ("qwen35", "qwen3next"):
        raise UnsupportedModelError(f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", factor=float(get("rope.scaling.factor")))
    elif meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise UnsupportedModelError(f"RoPE scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    extra = {}  # the mixture of experts' and the hybrid layers' fields
    if arch in ("qwen3moe", "qwen3next"):  # llama.cpp always renormalizes their top-k weights (norm_topk_prob)
        extra = {
            "num_experts": int(get("expert_count")),
            "num_experts_per_tok": int(get("expert_used_count")),
            "moe_intermediate_size": int(get("expert_feed_forward_length")),
            "shared_expert_intermediate_size": int(meta.get(f"{arch}.expert_shared_feed_forward_length", 0)),
            "norm_topk_prob": bool(meta.get(f"{arch}.expert_weights_norm", True)),
        }
    if arch in ("qwen35", "qwen3next"):
        extra |= _hybrid_fields(meta, arch, int(get("block_count")), rope_dims / head_dim)
    return ModelConfig(
        architecture=ARCHITECTURES[arch],
        vocab_size=int(meta.get(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens", [])))),
        hidden_size=hidden,
        intermediate_size=int(
            meta.get(f"{arch}.feed_forward_length", 0) if arch == "qwen3moe" else get("feed_forward_length")
        ),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(get("context_length")),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        qk_norm=arch in ("qwen3", "qwen3moe", "qwen35", "qwen3next"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[eos] if eos is not None else [],
        name=str(meta.get("general.name", "")),
        **extra,
    )


def _hybrid_fields(meta: dict, arch: str, layers: int, rotary_fraction: float) -> dict:
    """Qwen3.5's and Qwen3-Next's layer types and Gated DeltaNet shapes, from the ssm.* keys llama.cpp's converter
    writes."""

    def get(key: str) -> int:
        if f"{arch}.{key}" not in meta:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return int(meta[f"{arch}.{key}"])

    every, value_heads = get("full_attention_interval"), get("ssm.time_step_rank")
    return {
        "layer_types": [FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(layers)],
        "linear_attention": LinearAttention(
            num_key_heads=get("ssm.group_count"),
            num_value_heads=value_heads,
            key_head_dim=get("ssm.state_size"),
            value_head_dim=get("ssm.inner_size") // value_heads,
            conv_kernel_dim=get("ssm.conv_kernel"),
        ),
        "attn_output_gate": True,
        "partial_rotary_factor": rotary_fraction,
    }


def config_from_gguf(gguf_file: GGUFFile) -> ModelConfig:
    """The config, with tied embeddings read off the tensor list (no `output.weight`: lm_head is the embedding)."""
    try:
        config = config_from_metadata(gguf_file.metadata)
    except (ValueError, TypeError, ZeroDivisionError) as e:  # values of the wrong type or range
        raise ModelLoadError(f"GGUF metadata describes no valid model ({type(e).__name__}: {e})") from None
    config.tie_word_embeddings = not any(t.name == "output.weight" for t in gguf_file.tensors)
    return config
