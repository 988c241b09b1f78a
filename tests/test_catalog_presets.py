"""The hardware catalog and the model presets: datasheet invariants, name lookup, and parameter counts that match the
published model sizes."""

from __future__ import annotations

import pytest

from rooftop.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig, RopeScaling
from rooftop.errors import InvalidRequestError
from rooftop.roofline.catalog import CATALOG, find_hardware
from rooftop.roofline.presets import PRESETS, find_preset


def parameter_count(c: ModelConfig, active: bool = False) -> int:
    """Weights of the LLM from its shapes; `active`: only the routed experts a token uses."""
    d = c.hidden_size
    total = c.vocab_size * d * (1 if c.tie_word_embeddings else 2) + d  # embeddings, lm_head, final norm
    for kind in c.layer_types or [FULL_ATTENTION] * c.num_layers:
        total += 2 * d  # input and post-attention norms
        if kind == FULL_ATTENTION:
            q_out = c.q_size * (2 if c.attn_output_gate else 1)  # a gated q_proj also yields the gate
            total += d * q_out + 2 * d * c.kv_size + c.q_size * d
            total += 2 * c.head_dim if c.qk_norm else 0
        else:
            la = c.linear_attention
            nk, nv, dk, dv = la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim
            total += d * (2 * nk * dk + 2 * nv * dv)  # in_proj_qkvz
            total += d * 2 * nv  # in_proj_ba
            total += la.conv_channels * la.conv_kernel_dim  # depthwise conv1d
            total += nv * dv * d  # out_proj
            total += 2 * nv + dv  # A_log, dt_bias, gated norm
        if c.is_moe:
            experts = c.num_experts_per_tok if active else c.num_experts
            total += d * c.num_experts + experts * 3 * d * c.moe_intermediate_size
        else:
            total += 3 * d * c.intermediate_size
    return total


# ---- hardware catalog


def test_every_entry_is_complete_and_dense():
    for key, hw in CATALOG.items():
        for dtype in ("fp32", "bf16", "int8"):
            assert hw.peak_flops[dtype] > 0, (key, dtype)
        assert hw.peak_flops["bf16"] > hw.peak_flops["fp32"], key  # tensor units beat the plain FP32 rate
        assert hw.memory_bandwidth > 0 and hw.memory_bytes > 0 and hw.interconnect_bandwidth > 0, key
        assert hw.source, key
        assert find_hardware(key) is hw


def test_h200_datasheet():
    h200 = CATALOG["h200"]
    assert h200.memory_bandwidth == 4.8e12
    assert h200.memory_bytes == 141e9
    assert h200.interconnect_bandwidth == 450e9  # NVLink 4, one direction


def test_h100_and_h200_share_the_compute_die():
    assert CATALOG["h100"].peak_flops == CATALOG["h200"].peak_flops
    assert CATALOG["h100"].peak_flops["bf16"] == pytest.approx(989e12, rel=0.005)  # dense, not the 1,979 sparse
    assert CATALOG["h100"].memory_bandwidth < CATALOG["h200"].memory_bandwidth


def test_a100_has_no_fp8_and_falls_back_to_bf16():
    a100 = CATALOG["a100"]
    assert "fp8" not in a100.peak_flops
    assert a100.peak("fp8") == a100.peak("bf16") == 312e12


@pytest.mark.parametrize(
    "name, key",
    [
        ("H200", "h200"),
        ("h200-sxm", "h200"),
        ("NVIDIA H100 SXM5", "h100"),
        ("RTX 4090", "rtx4090"),
        ("4090", "rtx4090"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("mi300x", "mi300x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("A100 80GB", "a100"),
        ("HGX B200", "b200"),
        ("l4", "l4"),
    ],
)
def test_find_hardware_aliases(name, key):
    assert find_hardware(name) is CATALOG[key]


def test_unknown_hardware_suggests_close_names():
    with pytest.raises(InvalidRequestError, match="unknown hardware 'h20'") as e:
        find_hardware("h20")
    assert "did you mean" in str(e.value) and "h200" in str(e.value)
    with pytest.raises(InvalidRequestError, match="unknown hardware 'H100 PCIe'"):
        find_hardware("H100 PCIe")  # a different card, not an alias of the SXM part


# ---- model presets

PUBLISHED = {  # total parameters from each model card
    "smollm2-135m": 134.5e6,
    "qwen3-0.6b": 0.6e9,
    "qwen3-1.7b": 1.7e9,
    "qwen3-4b": 4.0e9,
    "qwen3-8b": 8.2e9,
    "qwen3-14b": 14.8e9,
    "qwen3-32b": 32.8e9,
    "qwen3-30b-a3b": 30.5e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "llama-3.2-1b": 1.24e9,
    "qwen3.6-27b": 27e9,  # the language model; the checkpoint adds a vision tower and an MTP head
    "dense-27b": 27e9,
}


def test_every_preset_has_a_published_size():
    assert set(PUBLISHED) == set(PRESETS)


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_parameter_count_matches_published_size(key):
    assert parameter_count(PRESETS[key]) == pytest.approx(PUBLISHED[key], rel=0.02)


def test_exact_counts():
    assert parameter_count(PRESETS["smollm2-135m"]) == 134_515_008
    assert parameter_count(PRESETS["llama-3.2-1b"]) == 1_235_814_400  # the safetensors count; tied embeddings
    # Qwen3.6-27B safetensors: 27,781,427,952 in all, less the vision tower (460,730,096) and the MTP head (424,699,392)
    assert parameter_count(PRESETS["qwen3.6-27b"]) == 26_895_998_464


def test_moe_active_parameters():
    moe = PRESETS["qwen3-30b-a3b"]
    assert moe.architecture == "qwen3_moe"
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
    assert parameter_count(moe, active=True) == pytest.approx(3.3e9, rel=0.03)


def test_dense_27b_is_54_gb_in_bf16():
    assert 2 * parameter_count(PRESETS["dense-27b"]) == pytest.approx(54e9, rel=0.02)
    assert PRESETS["dense-27b"].architecture == "llama"


def test_qwen3_head_dim_is_not_hidden_over_heads():
    small = PRESETS["qwen3-0.6b"]
    assert (small.hidden_size, small.num_heads, small.head_dim) == (1024, 16, 128)
    assert small.q_size == 2048 and small.qk_norm and small.tie_word_embeddings
    assert not PRESETS["qwen3-8b"].tie_word_embeddings


def test_llama_3_1_rope_scaling():
    for key in ("llama-3.1-8b", "llama-3.1-70b"):
        c = PRESETS[key]
        assert c.rope_theta == 500000.0
        assert c.rope_scaling == RopeScaling(
            "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        )
    small = PRESETS["llama-3.2-1b"]
    assert small.rope_scaling.factor == 32.0 and small.rope_theta == 500000.0 and small.tie_word_embeddings
    assert (small.head_dim, small.max_position_embeddings, small.bos_token_id) == (64, 131072, 128000)


def test_qwen3_6_hybrid_layers():
    c = PRESETS["qwen3.6-27b"]
    assert c.architecture == "qwen3_5" and c.attn_output_gate and c.head_dim == 256
    assert (c.num_linear_attention_layers, c.num_full_attention_layers) == (48, 16)
    assert c.layer_types[:4] == [LINEAR_ATTENTION] * 3 + [FULL_ATTENTION]
    la = c.linear_attention
    assert (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim) == (16, 48, 128, 128)
    assert la.conv_kernel_dim == 4
    assert la.conv_channels == 10240  # the checkpoint's conv1d weight is [10240, 1, 4]


def test_architectures():
    assert {c.architecture for c in PRESETS.values()} == {"llama", "qwen3", "qwen3_moe", "qwen3_5"}


@pytest.mark.parametrize("name", ["qwen3-8b", "Qwen/Qwen3-8B", "QWEN3-8B", " qwen/qwen3-8b "])
def test_find_preset_spellings(name):
    assert find_preset(name).name == "Qwen/Qwen3-8B"


def test_find_preset_returns_a_copy():
    c = find_preset("qwen3.6-27b")
    c.layer_types[0] = FULL_ATTENTION
    c.num_layers = 1
    assert PRESETS["qwen3.6-27b"].layer_types[0] == LINEAR_ATTENTION and PRESETS["qwen3.6-27b"].num_layers == 64
    assert find_preset("HuggingFaceTB/SmolLM2-135M-Instruct").name == find_preset("smollm2-135m-instruct").name


def test_unknown_preset_suggests_close_names():
    with pytest.raises(InvalidRequestError, match="unknown model preset 'qwen3-9b'") as e:
        find_preset("qwen3-9b")
    assert "did you mean" in str(e.value) and "qwen3-8b" in str(e.value)
