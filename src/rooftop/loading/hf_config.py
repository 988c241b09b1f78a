"""Hugging Face config.json (transformers 4 and 5 formats, MoE, hybrid) -> ModelConfig, reading no weights."""

from __future__ import annotations

import json
from pathlib import Path

from rooftop.config import FULL_ATTENTION, LINEAR_ATTENTION, LinearAttention, ModelConfig, RopeScaling
from rooftop.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError


def read_json(path: Path):
    """A JSON file's contents, or a ModelLoadError naming the file."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",  # its text model; the vision tower is not read
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3NextForCausalLM": "qwen3_next",
}


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _rope(cfg: dict) -> tuple[float, RopeScaling | None]:
    """rope_theta and scaling from either transformers 5 (`rope_parameters`) or 4 (`rope_theta` + `rope_scaling`)."""
    params = dict(cfg.get("rope_scaling") or {})
    params.update(cfg.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        return theta, RopeScaling("llama3", **{k: params[k] for k in keys})
    if kind == "linear":
        return theta, RopeScaling("linear", factor=float(params["factor"]))
    raise UnsupportedModelError(f"RoPE scaling {kind!r} is not supported (supported: default, linear, llama3)")


def _hybrid_fields(cfg: dict) -> dict:
    """Layer types and Gated DeltaNet shapes of a hybrid model (Qwen3-Next, Qwen3.5/3.6); {} for others."""
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None and "full_attention_interval" in cfg:
        every = int(cfg["full_attention_interval"])
        types = [FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(n)]
    if types is None:
        return {}
    linear = None
    if LINEAR_ATTENTION in types:
        linear = LinearAttention(
            num_key_heads=int(cfg["linear_num_key_heads"]),
            num_value_heads=int(cfg["linear_num_value_heads"]),
            key_head_dim=int(cfg["linear_key_head_dim"]),
            value_head_dim=int(cfg["linear_value_head_dim"]),
            conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim", 4)),
        )
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    return {
        "layer_types": list(types),
        "linear_attention": linear,
        "attn_output_gate": bool(cfg.get("attn_output_gate", True)),
        "partial_rotary_factor": float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))),
    }


def _moe_fields(cfg: dict) -> dict:
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if not experts:
        return {}
    dense = cfg.get("mlp_only_layers") or []
    step = int(cfg.get("decoder_sparse_step") or 1)
    if dense or step != 1:  # Qwen3-MoE's option for dense MLP layers between the sparse ones; no released model uses it
        raise UnsupportedModelError(
            f"dense MLP layers among the experts (mlp_only_layers {dense}, decoder_sparse_step {step}) are not "
            "supported: every layer must be a mixture of experts"
        )
    return {
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        "shared_expert_intermediate_size": int(cfg.get("shared_expert_intermediate_size") or 0),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
    }


def _dtype(cfg: dict) -> str | None:
    """The weights' float dtype: transformers 5 writes `dtype`, 4 `torch_dtype`."""
    dtype = cfg.get("dtype") or cfg.get("torch_dtype")
    return str(dtype) if dtype else None


def config_from_hf(cfg: dict, generation: dict) -> ModelConfig:
    """ModelConfig from a config.json dict (a multimodal wrapper's `text_config` is used for the LLM)."""
    archs = cfg.get("architectures") or []
    if "text_config" in cfg:
        cfg = {
            "dtype": cfg.get("dtype") or cfg.get("torch_dtype"),  # a wrapper's text_config may leave these out
            "quantization_config": cfg.get("quantization_config"),
            **cfg["text_config"],
            "architectures": archs,
            "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        }
    required = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"]
    if not (cfg.get("num_experts") or cfg.get("num_local_experts")):
        required.append("intermediate_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise KeyError(", ".join(missing))
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    model_type = str(cfg.get("model_type", "")).removesuffix("_text")  # Qwen3.5's text config: "qwen3_5_text"
    if arch is None and not archs and model_type in ARCHITECTURES.values():
        arch = model_type  # a config saved from a bare config object names only its model_type
    if arch is None:
        raise UnsupportedModelError(
            f"architecture {archs or cfg.get('model_type')!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    if cfg.get("use_sliding_window"):
        raise UnsupportedModelError("sliding-window attention (use_sliding_window: true) is not supported")
    theta, scaling = _rope(cfg)
    heads = int(cfg["num_attention_heads"])
    eos = _ids(generation.get("eos_token_id")) or _ids(cfg.get("eos_token_id"))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=arch in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5"),
        attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos,
        name=str(cfg.get("_name_or_path", "")),
        torch_dtype=_dtype(cfg),
        quantization_config=dict(cfg["quantization_config"]) if cfg.get("quantization_config") else None,
        hidden_act=cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        **_moe_fields(cfg),
        **_hybrid_fields(cfg),
    )


def read_hf_config(path: Path, generation: dict | None = None) -> ModelConfig:
    """A config.json file -> ModelConfig, naming the first required field it lacks."""
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    try:
        return config_from_hf(cfg, generation or {})
    except KeyError as e:
        raise ModelLoadError(f"{path}: missing required field(s): {e.args[0]}") from None
    except InvalidRequestError as e:  # a check of the config's own: its message says what is wrong
        raise ModelLoadError(f"{path}: {e}") from None
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        raise ModelLoadError(f"{path}: inconsistent values ({type(e).__name__}: {e})") from None
