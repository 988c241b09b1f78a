"""Hugging Face model directories: config.json + safetensors (one file or sharded) + tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from rooftop.config import ModelConfig, RopeScaling
from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.model_files import LoadedModel
from rooftop.loading.tokenizer import Tokenizer

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


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


def config_from_hf(cfg: dict, generation: dict) -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
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
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=arch == "qwen3",
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos,
        name=str(cfg.get("_name_or_path", "")),
    )


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing or not shards:
            raise ModelLoadError(f"{path}: shards listed in {index.name} are missing: {missing or 'none listed'}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights")
    return files


def load_hf_dir(path: Path) -> LoadedModel:
    """Load an HF directory into float32 weights, the config and the tokenizer."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: no config.json (is this a Hugging Face model directory?)")
    cfg = _read_json(path / "config.json")
    generation = _read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    try:
        config = config_from_hf(cfg, generation)
    except KeyError as e:
        raise ModelLoadError(f"{path / 'config.json'}: missing key {e}") from None
    weights: dict[str, torch.Tensor] = {}
    for f in _weight_files(path):
        try:
            weights.update({k: v.float() for k, v in load_file(f).items()})
        except Exception as e:  # safetensors raises its own error types on a bad header or short file
            raise ModelLoadError(f"{f}: unreadable safetensors file ({e})") from None
    if "lm_head.weight" not in weights:
        config.tie_word_embeddings = True
    tokenizer = Tokenizer.from_hf_dir(path, config.eos_token_ids)
    if not config.eos_token_ids:
        config.eos_token_ids = tokenizer.eos_token_ids
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, source=str(path))
