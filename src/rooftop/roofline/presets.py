"""Model presets: the public config.json of each model, parsed by the same code that reads a model directory."""

from __future__ import annotations

import copy

from rooftop.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from rooftop.errors import InvalidRequestError
from rooftop.loading.hf_config import config_from_hf
from rooftop.roofline.hardware import suggest

# Each dict holds the fields of the repository's config.json that shape the model (training-only fields such as
# initializer_range or attention_dropout left out), as published on huggingface.co/<repo>/blob/main/config.json.


def _hf(repo: str, cfg: dict) -> ModelConfig:
    config = config_from_hf({"torch_dtype": "bfloat16", **cfg}, {})  # every preset's published checkpoint is bf16
    config.name = repo
    return config


_LLAMA_3_1 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

# the fields every Qwen3 dense and MoE config.json shares (Qwen/Qwen3-*, transformers 4.51, April 2025)
_QWEN3 = {
    "vocab_size": 151936,
    "head_dim": 128,  # fixed across sizes: q_proj is heads*128 wide, not hidden_size (0.6B: 16*128 = 2048 > 1024)
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
_QWEN3_DENSE = {**_QWEN3, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}

PRESETS: dict[str, ModelConfig] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (Nov 2024), the bundled model; bos/eos as in the bundled GGUF's metadata
    "smollm2-135m": _hf(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 100000,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "qwen3-0.6b": _hf(
        "Qwen/Qwen3-0.6B",
        {
            **_QWEN3_DENSE,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-1.7b": _hf(
        "Qwen/Qwen3-1.7B",
        {
            **_QWEN3_DENSE,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-4b": _hf(
        "Qwen/Qwen3-4B",
        {
            **_QWEN3_DENSE,
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-8b": _hf(
        "Qwen/Qwen3-8B",
        {
            **_QWEN3_DENSE,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-14b": _hf(
        "Qwen/Qwen3-14B",
        {
            **_QWEN3_DENSE,
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": 40,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-32b": _hf(
        "Qwen/Qwen3-32B",
        {
            **_QWEN3_DENSE,
            "hidden_size": 5120,
            "intermediate_size": 25600,
            "num_hidden_layers": 64,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-30b-a3b": _hf(
        "Qwen/Qwen3-30B-A3B",
        {
            **_QWEN3,
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "tie_word_embeddings": False,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,  # every layer is an MoE layer...
            "mlp_only_layers": [],  # ...none dense
        },
    ),
    # meta-llama/Llama-3.1-8B and -70B (July 2024): the same config but for the shapes
    "llama-3.1-8b": _hf(
        "meta-llama/Llama-3.1-8B",
        {
            **_LLAMA_3_1,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
        },
    ),
    "llama-3.1-70b": _hf(
        "meta-llama/Llama-3.1-70B",
        {
            **_LLAMA_3_1,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
        },
    ),
    # meta-llama/Llama-3.2-1B (Sept 2024): Llama 3.1's config with tied embeddings, 64-wide heads and a 32x rope
    # stretch over the same 8192-token original context
    "llama-3.2-1b": _hf(
        "meta-llama/Llama-3.2-1B",
        {
            **_LLAMA_3_1,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "rope_scaling": {**_LLAMA_3_1["rope_scaling"], "factor": 32.0},
            "tie_word_embeddings": True,
        },
    ),
    # Qwen/Qwen3.6-27B (2026): a vision-language wrapper whose LLM is text_config; the same qwen3_5 architecture as
    # Qwen3.5-27B. 48 Gated DeltaNet layers and 16 gated full-attention layers (every 4th). The vision tower
    # (vision_config) and the MTP head are not part of the LLM and are left out.
    "qwen3.6-27b": _hf(
        "Qwen/Qwen3.6-27B",
        {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": "qwen3_5_text",
                "vocab_size": 248320,
                "hidden_size": 5120,
                "intermediate_size": 17408,
                "num_hidden_layers": 64,
                "num_attention_heads": 24,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "attn_output_gate": True,
                "output_gate_type": "swish",
                "full_attention_interval": 4,
                # the file spells out all 64 entries
                "layer_types": ([LINEAR_ATTENTION] * 3 + [FULL_ATTENTION]) * 16,
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 48,
                "linear_key_head_dim": 128,
                "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4,
                "mamba_ssm_dtype": "float32",
                "max_position_embeddings": 262144,
                "rms_norm_eps": 1e-06,
                "partial_rotary_factor": 0.25,
                "rope_parameters": {
                    "mrope_interleaved": True,
                    "mrope_section": [11, 11, 10],
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 10000000,
                    "rope_type": "default",
                },
                "attention_bias": False,
                "tie_word_embeddings": False,
                "mtp_num_hidden_layers": 1,
                "bos_token_id": 248044,
                "eos_token_id": 248044,
            },
        },
    ),
    # Not a released checkpoint: the worked example's plain dense 27B. Gemma-2-27B's shapes (google/gemma-2-27b
    # config.json: hidden 4608, 46 layers, 32 query / 16 KV heads of 128, FFN 36864, 256000-token vocabulary, tied
    # embeddings) on the Llama architecture, without Gemma's soft-capping, sliding window and extra norms:
    # 27.2e9 parameters, 54.5 GB at 2 bytes per weight.
    "dense-27b": _hf(
        "dense-27b",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 256000,
            "hidden_size": 4608,
            "intermediate_size": 36864,
            "num_hidden_layers": 46,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
        },
    ),
}


def _lookup() -> dict[str, str]:
    """Every accepted spelling (short key, HF repo id, repo name without the owner), lowercase -> key."""
    names = {}
    for key, config in PRESETS.items():
        for spelling in (key, config.name, config.name.rsplit("/", 1)[-1]):
            names[spelling.lower()] = key
    return names


def find_preset(name: str) -> ModelConfig:
    """A copy of the preset called `name` ("qwen3-8b", "Qwen/Qwen3-8B", "Qwen3-8B"), case ignored."""
    key = _lookup().get(name.strip().lower())
    if key is None:
        raise InvalidRequestError(f"unknown model preset {name!r}" + suggest(name.strip(), list(PRESETS)))
    return copy.deepcopy(PRESETS[key])
