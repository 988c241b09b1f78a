"""The op model and predictions against hand-derived formulas, the worked example, MoE, hybrid and TP."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_roofline_cli import SMALL

from rooftop.errors import InvalidRequestError
from rooftop.roofline import StepShape, analyze, parameter_count, precision, step_ops
from rooftop.roofline.catalog import find_hardware
from rooftop.roofline.ops import expected_experts_touched, kv_bytes_per_token, state_bytes_per_sequence, weight_bytes
from rooftop.roofline.predict import DoesNotFitError, compute_bound, expected_time, time_step
from rooftop.roofline.presets import find_preset

BF16 = precision("bf16")
H200 = find_hardware("h200")


def op(ops, name):
    return next(o for o in ops if o.name == name)


def test_bf16_weight_bytes_are_two_per_parameter():
    for name in ("qwen3-8b", "llama-3.1-8b", "qwen3-30b-a3b", "qwen3.6-27b", "smollm2-135m"):
        c = find_preset(name)
        assert weight_bytes(c, BF16) == 2 * parameter_count(c).total, name
        # one token's: an MoE's top-k experts of each layer only (the active parameters; a dense model's all), and
        # of an untied table the token's row alone (the active count holds the whole table, as model cards count it)
        unread = 0 if c.tie_word_embeddings else (c.vocab_size - 1) * c.hidden_size
        assert weight_bytes(c, BF16, per_token=True) == 2 * (parameter_count(c).active - unread), name
    assert not find_preset("llama-3.1-8b").tie_word_embeddings  # the rule above is tried on an untied table
    moe = find_preset("qwen3-30b-a3b")  # 48 layers of 128 experts, 8 per token, each 3 x 2048 x 768
    idle = 48 * (128 - 8) * 3 * 2048 * 768 * 2 + (151936 - 1) * 2048 * 2  # and its untied table but a row
    assert weight_bytes(moe, BF16) - weight_bytes(moe, BF16, per_token=True) == idle


def test_kv_bytes_per_token_formula():
    c = find_preset("qwen3-8b")  # 36 layers, 8 KV heads, head_dim 128
    assert (c.num_layers, c.num_kv_heads, c.head_dim) == (36, 8, 128)
    assert kv_bytes_per_token(c, BF16) == 2 * 36 * 8 * 128 * 2
    # fp8 is the engine's fp8_e4m3 (vLLM's alias): a byte per value and a float32 scale per token and KV head
    assert kv_bytes_per_token(c, precision("bf16", "fp8")) == 2 * 36 * 8 * (128 + 4)
    assert precision("bf16", "fp8") == precision("bf16", "fp8_e4m3")


def test_qwen3_head_dim_comes_from_the_config():
    c = find_preset("qwen3-0.6b")
    assert c.head_dim == 128 and c.hidden_size // c.num_heads == 64
    qkv = op(step_ops(c, BF16, StepShape.decode(1, 10)), "qkv_proj")
    assert qkv.flops == c.num_layers * 2 * c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * 128


def test_decode_at_batch_one_reads_the_weights_plus_the_kv_cache():
    c, context = find_preset("llama-3.1-8b"), 2000
    assert not c.tie_word_embeddings
    step = time_step(c, BF16, StepShape.decode(1, context), H200)
    # every weight, except that the (untied) input embedding table is only read at the token's row
    weights = weight_bytes(c, BF16) - c.vocab_size * c.hidden_size * 2 + c.hidden_size * 2
    kv = (context + 1) * kv_bytes_per_token(c, BF16) + kv_bytes_per_token(c, BF16)  # read all, write the new one
    activations = step.bytes - weights - kv
    assert 0 < activations < 0.002 * step.bytes
    assert step.bound == "memory"
    assert step.time_s == pytest.approx(step.bytes / H200.memory_bandwidth, rel=1e-3)


def test_prefill_flops_are_two_per_parameter_per_token_plus_attention():
    c, S = find_preset("llama-3.1-8b"), 1024
    step = time_step(c, BF16, StepShape.prefill(1, S), H200)
    params = parameter_count(c)
    linear = 2 * (params.non_embedding - (2 * c.num_layers + 1) * c.hidden_size) * S
    attention = c.num_layers * 4 * c.num_heads * c.head_dim * S * (S + 1) / 2
    lm_head = 2 * c.hidden_size * c.vocab_size  # only the last position's logits
    assert step.flops == pytest.approx(linear + attention + lm_head, rel=2e-3)


@pytest.mark.parametrize(
    "fmt, bits", [("int4", 4.25), ("q4_0", 4.5), ("q4_1", 5.0), ("q8_0", 8.5), ("int8", 8.0), ("fp8", 8.0)]
)
def test_quantized_weight_bytes_include_their_overhead(fmt, bits):
    c = find_preset("qwen3-8b")
    ratio = weight_bytes(c, precision(fmt)) / weight_bytes(c, BF16)
    assert ratio == pytest.approx(bits / 16, rel=0.01)
    assert precision(fmt).weights.bits_per_weight(4096) == pytest.approx(bits, abs=0.01)


def test_compute_peak_is_the_precision_that_computes():
    # weight-only kernels multiply in bf16: on datasheet hardware their roof is the bf16 peak
    for fmt in ("int4", "int8", "q4_0", "q4_1", "q8_0"):
        assert H200.peak(precision(fmt).compute) == H200.peak("bf16"), fmt
    assert precision("fp8").compute == "fp8" and precision("fp32").compute == "fp32"
    assert H200.peak("fp8") == pytest.approx(2 * H200.peak("bf16"), rel=1e-3)
    a100 = find_hardware("a100")
    assert a100.peak("fp8") == a100.peak("bf16")  # no fp8 units: runs at its bf16 rate


def test_worked_example_27b_bf16_on_h200():
    c = find_preset("dense-27b")
    assert 26e9 < parameter_count(c).total < 28e9
    pred = analyze(c, H200, BF16, prompt_len=4096, output_len=128)
    assert pred.weight_bytes == pytest.approx(54e9, rel=0.02)
    assert pred.decode_first.bound == "memory"
    assert pred.decode_first.time_s > 11e-3 and pred.tpot_s > 11e-3
    assert pred.prefill.bound == "compute"
    int4 = analyze(c, H200, precision("int4"), prompt_len=4096, output_len=128)
    assert 3.3 < pred.tpot_s / int4.tpot_s < 4.0  # about four-fold less to read


def test_memory_and_largest_batch():
    """An engine takes 0.9 of the device (vLLM's --gpu-memory-utilization) and, beside the weights and each
    sequence's KV cache, holds the prefill step's activations: the residual stream and its normed copy (2d) and
    the MLP's gate_up and silu·mul outputs (3·ff) per token at 2 bytes, and each sampled row's fp32 logits."""
    c = find_preset("llama-3.1-8b")
    pred = analyze(c, H200, BF16, prompt_len=1000, output_len=24, batch=4)
    per_seq = 1024 * kv_bytes_per_token(c, BF16)
    activations = 1000 * (2 * 4096 + 3 * 14336) * 2 + 128256 * 4  # one sequence's share of the prefill
    assert pred.activation_bytes == 4 * activations
    assert pred.memory_needed_bytes == pytest.approx(weight_bytes(c, BF16) + 4 * per_seq + 4 * activations)
    assert pred.memory_available_bytes == 0.9 * H200.memory_bytes == 0.9 * pred.device_memory_bytes
    assert pred.max_batch == int((0.9 * H200.memory_bytes - weight_bytes(c, BF16)) // (per_seq + activations))
    whole = analyze(c, H200, BF16, prompt_len=1000, output_len=24, batch=4, gpu_memory_utilization=1.0)
    assert whole.max_batch == int((H200.memory_bytes - weight_bytes(c, BF16)) // (per_seq + activations))
    assert whole.max_batch > pred.max_batch


def test_configuration_that_does_not_fit_says_what_does_not_and_by_how_much():
    from rooftop.roofline.predict import memory_fit

    l4 = find_hardware("l4")  # 24 GB, 21.6 usable
    with pytest.raises(
        DoesNotFitError,
        match=r"^the weights alone need 14\d\.\d GB per device but NVIDIA L4 has 21\.6 GB usable \(0\.9 of 24\.0 GB\): "
        r"1\d\d\.\d GB short; use more tensor parallelism or fewer bits per weight$",
    ):
        analyze(find_preset("llama-3.1-70b"), l4, BF16, 128, 16)
    c = find_preset("llama-3.1-8b")  # 16.1 GB of weights, 128 kB of KV cache per token
    fit = memory_fit(c, BF16, l4, 60_000, 64_000)
    short = fit.weights + fit.per_sequence + fit.activations_per_sequence - 21.6e9
    assert fit.per_sequence == 64_000 * 131072 and fit.weights < 21.6e9
    with pytest.raises(
        DoesNotFitError,
        match=rf"^one sequence does not fit: its KV cache at 64000 tokens needs 8\.4 GB and its prefill's activations "
        rf"6\.1 GB, but 5\.5 GB of the 21\.6 GB usable \(0\.9 of 24\.0 GB\) is left after the weights: "
        rf"{short / 1e9:.1f} GB short; use a shorter prompt or output, fewer KV bits \(--kv-cache-dtype fp8\)",
    ):
        analyze(c, l4, BF16, 60_000, 4_000)
    with pytest.raises(DoesNotFitError, match=r"^batch 64 does not fit: its KV cache at 8192 tokens per sequence "):
        analyze(c, l4, BF16, 8000, 192, batch=64)
    fit = memory_fit(c, BF16, l4, 8000, 8192)
    assert fit.max_batch == 2 and analyze(c, l4, BF16, 8000, 192, batch=2).max_batch == 2
    with pytest.raises(DoesNotFitError, match=r"short; batch <= 2 fits$"):
        analyze(c, l4, BF16, 8000, 192, batch=3)
    with pytest.raises(DoesNotFitError, match="its KV cache and recurrent state at 262144 tokens need"):
        analyze(find_preset("qwen3.6-27b"), find_hardware("h100"), BF16, 262_000, 144)


@pytest.mark.parametrize("kwargs", [{"batch": 0}, {"prompt_len": 0}, {"output_len": -1}])
def test_sizes_below_one_are_refused(kwargs):
    with pytest.raises(InvalidRequestError, match="must be an integer >= 1"):
        analyze(find_preset("qwen3-8b"), H200, BF16, **{"prompt_len": 8, "output_len": 8, **kwargs})


def test_tensor_parallel_splits_weights_and_adds_all_reduces():
    c = find_preset("llama-3.1-70b")
    one = time_step(c, BF16, StepShape.decode(1, 100), find_hardware("h100"))
    four = time_step(c, BF16, StepShape.decode(1, 100, tp=4), find_hardware("h100"))
    assert four.bytes == pytest.approx(one.bytes / 4, rel=0.01)
    reduce = op(four.ops, "all_reduce")  # after each layer's attention and MLP, and the vocab-parallel embedding
    assert reduce.comm_bytes == pytest.approx((2 * c.num_layers + 1) * 2 * 3 / 4 * c.hidden_size * 2)
    assert reduce.collectives == 2 * c.num_layers + 1
    gather = op(four.ops, "logits_gather")  # one sampled row's float32 logits, 3/4 of them from the other ranks
    assert gather.comm_bytes == pytest.approx(3 / 4 * c.vocab_size * 4) and gather.collectives == 1
    assert op(four.ops, "plan_broadcast").collectives == 1
    assert not any(o.comm_bytes or o.collectives for o in one.ops)
    with pytest.raises(InvalidRequestError, match="tensor parallel degree 3 does not divide.*valid sizes: 1, 2, 4, 8"):
        step_ops(c, BF16, StepShape.decode(1, 100, tp=3))


def test_a_measured_collective_latency_is_paid_per_collective():
    c = find_preset("llama-3.1-8b")
    h100 = find_hardware("h100")
    measured = replace(h100, collective_latency_s=50e-6)
    shape = StepShape.decode(1, 100, tp=2)
    plain, slow = time_step(c, BF16, shape, h100), time_step(c, BF16, shape, measured)
    collectives = sum(o.collectives for o in plain.ops)
    assert collectives == 2 * c.num_layers + 3
    assert slow.comm_time_s == pytest.approx(plain.comm_time_s + collectives * 50e-6)
    assert expected_time(slow, measured, c, BF16) == pytest.approx(  # the measured latency replaces the catalog's
        expected_time(plain, h100, c, BF16) + collectives * (50e-6 - h100.efficiency.all_reduce_s), rel=1e-9
    )


def test_efficiencies_scale_the_roofs():
    c = find_preset("qwen3-8b")
    full = analyze(c, H200, BF16, 512, 64)
    half = analyze(c, H200.scaled(memory_efficiency=0.5), BF16, 512, 64)
    assert half.decode_first.time_s == pytest.approx(2 * full.decode_first.time_s, rel=1e-6)


def test_moe_reads_top_k_experts_at_batch_one_and_all_at_large_batch():
    c = find_preset("qwen3-30b-a3b")
    expert_bytes = BF16.weights.linear_bytes(c.hidden_size, 2 * c.moe_intermediate_size) * c.num_layers
    one = op(step_ops(c, BF16, StepShape.decode(1, 100)), "experts_gate_up")
    many = op(step_ops(c, BF16, StepShape.decode(4096, 100)), "experts_gate_up")
    assert one.bytes_read == pytest.approx(c.num_experts_per_tok * expert_bytes, rel=0.01)
    routed_inputs = c.num_layers * 4096 * c.num_experts_per_tok * c.hidden_size * 2  # activations, not weights
    assert many.bytes_read - routed_inputs == pytest.approx(c.num_experts * expert_bytes, rel=0.01)
    assert expected_experts_touched(128, 8, 1) == pytest.approx(8)
    assert parameter_count(c).active < parameter_count(c).total / 5


def test_hybrid_state_is_read_every_decode_step_and_does_not_grow():
    c = find_preset("qwen3.6-27b")
    assert (c.num_linear_attention_layers, c.num_full_attention_layers) == (48, 16)
    short = op(step_ops(c, BF16, StepShape.decode(1, 1_000)), "linear_recurrence")
    long = op(step_ops(c, BF16, StepShape.decode(1, 100_000)), "linear_recurrence")
    la = c.linear_attention
    state = 48 * la.num_value_heads * la.key_head_dim * la.value_head_dim * BF16.state_bytes
    assert short.bytes == long.bytes and short.bytes >= 2 * state
    assert state_bytes_per_sequence(c, BF16) > state
    assert kv_bytes_per_token(c, BF16) == 2 * 16 * c.num_kv_heads * c.head_dim * 2
    attention_short = op(step_ops(c, BF16, StepShape.decode(1, 1_000)), "attention")
    attention_long = op(step_ops(c, BF16, StepShape.decode(1, 100_000)), "attention")
    assert attention_long.bytes > 50 * attention_short.bytes


MODELS = st.sampled_from(["qwen3-8b", "llama-3.1-8b", "qwen3-30b-a3b", "qwen3.6-27b", "smollm2-135m"])
HARDWARE = st.sampled_from(["h200", "a100", "l4", "mi300x"])


@settings(max_examples=40, deadline=None)
@given(MODELS, HARDWARE, st.integers(1, 512), st.integers(1, 8192), st.sampled_from(["bf16", "int4", "fp8"]))
def test_a_larger_batch_never_lowers_step_time(model, hw_name, batch, context, fmt):
    c, hw, p = find_preset(model), find_hardware(hw_name), precision(fmt)
    for shape in (StepShape.decode, StepShape.prefill):
        assert (
            time_step(c, p, shape(batch + 1, context), hw).time_s >= time_step(c, p, shape(batch, context), hw).time_s
        )


@settings(max_examples=40, deadline=None)
@given(MODELS, st.integers(1, 512), st.integers(1, 8192))
def test_decode_intensity_grows_with_batch(model, batch, context):
    c = find_preset(model)
    small = time_step(c, BF16, StepShape.decode(batch, context), H200)
    large = time_step(c, BF16, StepShape.decode(batch * 2, context), H200)
    assert large.intensity >= small.intensity


@settings(max_examples=15, deadline=None)
@given(MODELS, HARDWARE, st.integers(1, 4096))
def test_crossovers_agree_with_the_ridge_point(model, hw_name, context):
    c, hw = find_preset(model), find_hardware(hw_name)
    pred = analyze(c, hw, BF16, context, 2, check_memory=False)
    ridge = hw.ridge_point("bf16")
    s = pred.prefill_compute_bound_from_tokens
    assert s is not None
    assert time_step(c, BF16, StepShape.prefill(1, s), hw).intensity >= ridge
    if s > 1:
        assert time_step(c, BF16, StepShape.prefill(1, s - 1), hw).intensity < ridge
    b = pred.decode_compute_bound_from_batch
    if b is not None:
        assert compute_bound(time_step(c, BF16, StepShape.decode(b, context), hw))
        assert time_step(c, BF16, StepShape.decode(b, context), hw).intensity >= ridge
        if b > 1:
            assert time_step(c, BF16, StepShape.decode(b - 1, context), hw).intensity < ridge
    else:  # never compute-bound: per-sequence KV reads keep the intensity under the ridge at any batch
        assert time_step(c, BF16, StepShape.decode(1 << 22, context), hw).intensity < ridge


def test_tensor_parallel_beyond_the_kv_heads_replicates_the_kv_cache():
    c = find_preset("llama-3.1-70b")  # 8 KV heads
    from rooftop.roofline.predict import memory_fit

    kv = 1000 * kv_bytes_per_token(c, BF16)
    weights = weight_bytes(c, BF16)
    eight, sixteen = (memory_fit(c, BF16, H200, 500, 1000, tp=tp) for tp in (8, 16))
    assert (eight.weights, eight.per_sequence) == pytest.approx((weights / 8, kv / 8))
    assert (sixteen.weights, sixteen.per_sequence) == pytest.approx((weights / 16, kv / 8))  # one KV head per device


def test_a_step_that_samples_nothing_reads_no_lm_head():
    c = find_preset("qwen3-8b")
    from rooftop.roofline.ops import SeqShape

    chunk = StepShape((SeqShape(512, 0, needs_logits=False),))
    assert "lm_head" not in [o.name for o in step_ops(c, BF16, chunk)]
    assert "lm_head" in [o.name for o in step_ops(c, BF16, StepShape.prefill(1, 512))]


def test_engine_steps_that_widen_quantized_weights_are_attributed_at_the_float_peak():
    """rooftop's CPU linears widen int4/int8 weights to float32 sgemm from WIDEN_ROWS tokens on (prefill); decode
    steps stay on the weight-only kernels: the attribution must use the peak each step really ran at."""
    from dataclasses import replace

    from rooftop.roofline.attribution import attribute_phases, attribute_step
    from rooftop.roofline.hardware import Hardware
    from rooftop.roofline.precision import WEIGHT_FORMATS

    widen = 96  # rooftop's CPU int4 without its kernels: group-32 weights, a float16 head with float32 math
    fp32 = precision("fp32", "fp32")
    p = replace(fp32, weights=WEIGHT_FORMATS["int4-g32"], widen_rows=widen, lm_head=WEIGHT_FORMATS["fp16-fp32"])
    assert p.at(1).compute == "int4_weight_only" and p.at(widen - 1).compute == "int4_weight_only"
    assert p.at(widen).compute == "fp32" and p.at(widen).weights.bits == 4  # still reads 4-bit weights
    assert fp32.at(10_000) == fp32
    hw = Hardware(
        "t", peak_flops={"fp32": 70e9, "bf16": 2e9, "int4_weight_only": 30e9}, memory_bandwidth=20e9, memory_bytes=1e9
    )
    config = find_preset("smollm2-135m")
    prefill = attribute_step(config, p, StepShape.prefill(1, 512), 1.0, hw)
    decode = attribute_step(config, p, StepShape.decode(1, 512), 0.01, hw)
    phases = attribute_phases([prefill, decode], hw)
    assert phases["prefill"].peak_flops == pytest.approx(70e9)  # widened linears and the float16 head: fp32 math
    # decode: the block linears on the int4 kernel's peak, the lm_head (fp16 weights, fp32 math) on fp32's
    assert 30e9 < phases["decode"].peak_flops < 40e9
    assert phases["decode"].peak_flops == pytest.approx(decode.predicted.flops / decode.predicted.compute_time_s)


def test_a_weights_choice_means_what_the_engine_runs_on_that_device():
    """One list for every command: on a datasheet device int8/int4 are per row / per 128; on this machine's probe
    they are the formats its engine's linears reported (Q8_0 / Q4_1 on rooftop's kernels); exact names are themselves."""
    from rooftop.roofline.precision import WEIGHT_CHOICES, weight_format

    assert WEIGHT_CHOICES[:4] == ("auto", "float", "int8", "int4") and "q4_0" in WEIGHT_CHOICES
    probed = {"float": "fp32", "int8": "q8_0", "int4": "q4_1"}
    assert [weight_format(c, None, {}) for c in ("float", "int8", "int4")] == ["bf16", "int8", "int4"]
    assert [weight_format(c, None, probed) for c in ("float", "int8", "int4")] == ["fp32", "q8_0", "q4_1"]
    assert weight_format(None, "q4_1", probed) == weight_format("auto", "q4_1", {}) == "q4_1"
    assert weight_format("auto", None, probed) == "bf16" and weight_format("q4_0", None, probed) == "q4_0"
    with pytest.raises(InvalidRequestError, match="unknown weight format 'int3'"):
        weight_format("int3", None, {})


def _quantized(quantization_config, tie=False, dtype="bfloat16"):
    from dataclasses import replace

    from rooftop.roofline.precision import checkpoint_weights

    config = replace(find_preset("qwen3-8b"), tie_word_embeddings=tie, torch_dtype=dtype)
    return checkpoint_weights(replace(config, quantization_config=quantization_config))


def _ct(weights, acts=None, ignore=("lm_head",), **groups):
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group, **groups}, "ignore": list(ignore)}


@pytest.mark.parametrize(
    "quantization_config, name, bits, compute, head",
    [
        (
            {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
            "awq-int4-g128",
            4.15625,
            "int4_weight_only",
            "bf16",
        ),
        (
            {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": False},
            "awq-int4-g64",
            4.25,
            "int4_weight_only",
            "bf16",
        ),
        (
            {"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False},
            "gptq-int4-per-row",
            4 + 20 / 4096,
            "int4_weight_only",
            "bf16",
        ),
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 32, "lm_head": True},
            "gptq-int4-g32",
            4.5,
            "int4_weight_only",
            "gptq-int4-g32",
        ),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8", 8 + 32 / 4096, "fp8", "bf16"),
        (
            _ct({"num_bits": 8, "type": "int", "strategy": "channel"}, {"num_bits": 8, "type": "int"}),
            "ct-w8a8-int8-channel",
            8 + 16 / 4096,
            "int8",
            "bf16",
        ),
        (
            _ct(
                {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": False},
                ignore=["re:.*lm_head"],
            ),
            "ct-w4a16-int4-g32",
            4.625,
            "int4_weight_only",
            "bf16",
        ),
        (
            _ct({"num_bits": 8, "type": "float", "strategy": "tensor"}, ignore=[]),
            "ct-w8a16-fp8-tensor",
            8,
            "fp8_weight_only",
            "ct-w8a16-fp8-tensor",
        ),
    ],
)
def test_quantization_configs_give_the_linears_format_and_keep_the_tables_in_floats(
    quantization_config, name, bits, compute, head
):
    held = _quantized(quantization_config)
    assert held.linears.name == name and held.linears.compute == compute
    assert held.linears.bits_per_weight(4096) == pytest.approx(bits)
    assert held.embedding.name == "bf16" and held.lm_head.name == head
    assert H200.peak(held.precision().compute) > 0  # every compute has a roof on a datasheet device


def test_a_tied_quantized_model_keeps_its_one_table_in_floats_and_odd_configs_are_refused():
    from rooftop.errors import UnsupportedModelError

    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}
    assert _quantized(gptq, tie=True).lm_head.name == "bf16"
    assert _quantized({"quant_method": "awq", "bits": 4}, dtype=None).lm_head.name == "fp16"  # AWQ's kernels' dtype
    assert _quantized({"quant_method": "fp8"}, dtype=None).lm_head.name == "bf16"
    for config, words in (
        ({"quant_method": "hqq"}, "quant_method 'hqq'"),
        ({"quant_method": "awq", "bits": 5}, "awq bits 5"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "malformed"),
        (
            _ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}),
            "strategy 'tensor_group'",
        ),
        (
            _ct({"num_bits": 4, "type": "int"}, group_1={"weights": {"num_bits": 8, "type": "int"}}),
            "one weights scheme",
        ),
    ):
        with pytest.raises(UnsupportedModelError, match=words):
            _quantized(config)
    with pytest.raises(UnsupportedModelError, match="dtype 'float64'"):
        _quantized(None, dtype="float64")


SMALL_TEXT = {k: v for k, v in SMALL.items() if k not in ("max_position_embeddings", "tie_word_embeddings")}


def test_a_wrapper_configs_quantization_and_dtype_reach_its_text_model():
    from rooftop.loading.hf_config import config_from_hf

    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    wrapper = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": SMALL_TEXT, "dtype": "bfloat16"}
    config = config_from_hf({**wrapper, "quantization_config": fp8}, {})
    assert config.quantization_config == fp8 and config.torch_dtype == "bfloat16"
    assert config_from_hf({**SMALL_TEXT, "torch_dtype": "float16"}, {}).torch_dtype == "float16"


def test_prompt_and_output_past_the_models_positions_are_refused():
    from rooftop.errors import PromptTooLongError

    c = find_preset("smollm2-135m")  # 8192 positions
    assert analyze(c, H200, BF16, 8000, 192).prompt_len == 8000
    with pytest.raises(PromptTooLongError, match=r"prompt 8000 \+ output 193 = 8193 tokens exceed .* 8192 positions"):
        analyze(c, H200, BF16, 8000, 193)


@pytest.mark.parametrize("weights, activations, peak", [("fp8", None, "bf16"), ("q4_1", "fp32", "fp32")])
def test_attention_runs_at_the_activations_peak_not_the_weights(weights, activations, peak):
    """Attention multiplies activations by activations: an fp8 model's is bf16 math (vLLM's FlashAttention on a
    bf16 cache), an int4 model's on a CPU float32 math; it was charged at the weights' peak (an 8B's 8k-token
    prefill on an H100 12% under its bound at fp8)."""
    p = precision(weights, activations=activations)
    ops = {op.name: op for op in step_ops(find_preset("llama-3.1-8b"), p, StepShape.prefill(1, 8192))}
    assert ops["attention"].compute == peak and ops["qkv_proj"].compute == p.compute != peak
    h100 = find_hardware("h100")
    assert ops["attention"].compute_time(h100) == pytest.approx(ops["attention"].flops / h100.peak_flops[peak])


def test_a_tied_lm_head_held_in_another_format_than_the_table_is_counted_beside_it():
    """The engine shares a tied table with its lm_head only where both hold one format (quant.linear.
    embedding_table): a Q6_K table beside the int4 policy's Q8_0 lm_head is two copies, which were counted as one
    (a 1B Q4_K_M's weight_bytes 107 MB under what its own decode step read)."""
    from rooftop.roofline.precision import WEIGHT_FORMATS

    c = find_preset("smollm2-135m")
    assert c.tie_word_embeddings
    q6, q8 = WEIGHT_FORMATS["q6_k"], WEIGHT_FORMATS["q8_0"]
    one = replace(precision("q4_1"), embedding=q6, lm_head=q6)
    two = replace(one, lm_head=q8)
    assert weight_bytes(c, two) - weight_bytes(c, one) == q8.linear_bytes(c.hidden_size, c.vocab_size)
    assert weight_bytes(c, one) == weight_bytes(c, replace(one, lm_head=None, embedding=None)) - (
        WEIGHT_FORMATS["q4_1"].linear_bytes(c.hidden_size, c.vocab_size) - q6.linear_bytes(c.hidden_size, c.vocab_size)
    )


def test_the_memory_roof_says_the_rate_it_runs_at_and_its_memory_efficiency():
    """--memory-efficiency halves the bandwidth the ops run at; the text still gave the unscaled rate (on a datasheet
    device as the datasheet's)."""
    from rooftop.roofline.hardware import Hardware
    from rooftop.roofline.predict import memory_roof

    assert memory_roof(H200) == f"4.8 TB/s: {H200.source}"
    assert memory_roof(H200.scaled(1.0, 0.5)) == f"2.4 TB/s, --memory-efficiency 0.5 of 4.8 TB/s: {H200.source}"
    read = "60.0 GB/s reading a 3 MB working set (DRAM: 20.0 GB/s)"
    probed = Hardware("cpu", {"fp32": 1e11}, 60e9, 1e9, notes={"read_bandwidth": read}, working_set=3e6)
    assert memory_roof(probed.scaled(1.0, 0.5)).startswith(f"30 GB/s, --memory-efficiency 0.5 of {read}: ")


def _explained(name: str, p, prompt: int, output: int) -> list[str]:
    from rooftop.roofline.explain import explain

    c = find_preset(name)
    return explain(analyze(c, H200, p, prompt, output), c, p).splitlines()


def test_explain_gives_each_reason_a_step_reads_fewer_weights_only_where_it_holds():
    """A 1024-token prefill of a 128-expert MoE touches every expert: only the embedding table's rows are unread
    (the step said its tokens reached only some experts)."""
    lines = _explained("qwen3-30b-a3b", BF16, 1024, 2)
    prefill, decode = lines[3], lines[5]
    assert "experts" not in prefill and "of the embedding table one row per token" in prefill
    assert "of the experts only those its tokens are routed to" in decode and "embedding table" in decode


def test_explain_with_one_output_token_has_no_decode_step_and_no_decode_lever():
    """With -n 1 step 5 said there is no TPOT while step 4 said each decode step must read the weights and the last
    line how to speed decode up."""
    lines = _explained("qwen3-8b", BF16, 1024, 1)
    assert lines[5].startswith("4. One output token needs no decode step; a second would make one token")
    assert "So decode would be memory-bound." in lines[5]
    assert lines[-1].startswith("What would move prefill: it is ") and "decode" not in lines[-1]
    assert "decode is memory-bound" in _explained("qwen3-8b", BF16, 1024, 2)[-1]


def test_explains_decode_lever_weighs_the_block_linears_bits_not_the_models_mean():
    """A Q4_1 model with a Q8_0 table has a mean of more than 5 bits per weight, but --weights int4 changes none of
    its linears: the lever takes the linears' bits, as bench's advice does."""
    from rooftop.roofline.precision import WEIGHT_FORMATS

    p = replace(precision("q4_1"), embedding=WEIGHT_FORMATS["q8_0"])
    last = _explained("smollm2-135m", p, 64, 4)[-1]
    assert "(the weights are 5 bits each already)" in last and "--weights int4" not in last


def test_the_converted_type_has_one_spelling_and_resolve_hardware_no_unused_probe():
    """The loader's CONVERTED_TO ("Q4_1") and the analyzer's ("q4_1") were two constants for one fact: the model's
    builder, which now makes the conversion, spells it from the analyzer's."""
    import inspect

    from rooftop.loading import gguf
    from rooftop.models import tensors
    from rooftop.roofline.api import resolve_hardware
    from rooftop.roofline.precision import CONVERTED_TO

    assert tensors.CONVERTED_UNDER["int4"] == CONVERTED_TO.upper() and not hasattr(gguf, "CONVERTED_TO")
    assert "probe" not in inspect.signature(resolve_hardware).parameters
