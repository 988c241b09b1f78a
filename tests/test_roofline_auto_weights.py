"""`--weights` means in the analyzer what it means in the engine: under auto a bf16 checkpoint's linears run on
rooftop's CPU kernels as bf16-fp32 (bfloat16 storage, float32 math), so the analyzer costs them at the float32 roof
there, and as bf16 on a datasheet device; a GGUF's formats each as stored, or as the Q4_1 rooftop's loader converts
the rarer ones to where its engine runs them; int8 and int4 leave the tables out of integer groups. The hardware is
built by hand: nothing here depends on this host's speed or ISA."""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_factory import write_tiny_gguf

from rooftop.loading.gguf_file import TensorInfo
from rooftop.roofline import StepShape, analyze, predict, step_ops
from rooftop.roofline.api import gguf_weights, resolve_model, resolve_precision
from rooftop.roofline.catalog import find_hardware
from rooftop.roofline.precision import WEIGHT_FORMATS, auto_formats, weight_format
from rooftop.roofline.predict import memory_efficiency
from rooftop.roofline.presets import find_preset
from rooftop.roofline.probe import ProbeResult
from rooftop.roofline.report import weight_formats

CPU_FORMATS = {"float": "fp32", "int8": "q8_0", "int4": "q4_1"}  # what the engine's probe reports on its kernels


def probed(kernels: str = "rooftop 0123abcd in 2 MiB pages", device: str = "cpu", formats=None) -> ProbeResult:
    """A probe as the engine's would write it, with a CPU that emulates bf16 matmuls (its bf16 peak far below
    its float32 one)."""
    return ProbeResult(
        device=device,
        device_name="test cpu",
        cpu_model="test cpu",
        cpu_signature="test",
        cpu_count=2,
        torch_threads=2,
        torch_version="test",
        cuda_device=None,
        weight_only_kernels=kernels,
        memory_bytes=32e9,
        fp32_flops=100e9,
        bf16_flops=1e9,
        int8_weight_only_flops=200e9,
        int4_weight_only_flops=150e9,
        copy_bandwidth=20e9,
        read_bandwidth=20e9,
        date="2026-01-01T00:00:00+00:00",
        duration_s=1.0,
        quick=False,
        engine_formats=CPU_FORMATS if formats is None else formats,
    )


def test_auto_runs_a_bf16_file_as_bf16_fp32_on_rooftops_cpu_kernels():
    run = auto_formats("fp32", cpu_kernels=True)
    bf16 = WEIGHT_FORMATS["bf16"]
    assert weight_format("auto", bf16, CPU_FORMATS, run) == weight_format(None, None, CPU_FORMATS, run) == "bf16-fp32"
    assert weight_format("auto", WEIGHT_FORMATS["fp16"], CPU_FORMATS, run) == "fp32"  # widened to the run's dtype
    assert weight_format("auto", WEIGHT_FORMATS["q4_1"], CPU_FORMATS, run).name == "q4_1"  # runs as stored
    assert weight_format("bf16", None, CPU_FORMATS, run) == "bf16"  # an exact choice is itself
    assert auto_formats("fp32", cpu_kernels=False)["bf16"] == "fp32"  # FloatLinear without the kernels
    assert auto_formats(None, cpu_kernels=True) == {}  # no engine probed: the file's format as stored
    assert weight_format("auto", bf16, {}, {}) is bf16


def test_the_probe_says_what_auto_runs_as_on_its_device():
    assert probed().to_hardware().engine_auto["bf16"] == "bf16-fp32"
    assert probed(kernels="pytorch + onednn float32").to_hardware().engine_auto["bf16"] == "fp32"
    gpu = probed("pytorch tinygemm + rooftop triton 0123abcd", "cuda:0", {**CPU_FORMATS, "float": "bf16"})
    assert gpu.to_hardware().engine_auto == {"fp32": "bf16", "bf16": "bf16", "fp16": "bf16"}
    assert probed(kernels="none", formats={}).to_hardware().engine_auto == {}  # the analyzer's own probe
    assert probed().to_hardware().scaled(0.5, 0.5).engine_auto["bf16"] == "bf16-fp32"


def test_a_bf16_preset_prefills_at_the_float32_roof_on_a_probed_cpu():
    hw = probed().to_hardware()
    auto = predict("qwen3-0.6b", hw, prompt_len=64, output_len=8)
    assert auto.weights_format == "bf16-fp32" and auto.kv_bytes_per_value == 4
    exact = predict("qwen3-0.6b", hw, prompt_len=64, output_len=8, weights="bf16-fp32")
    assert auto.ttft_s == pytest.approx(exact.ttft_s) and auto.decode_total_s == pytest.approx(exact.decode_total_s)
    as_bf16 = predict("qwen3-0.6b", hw, prompt_len=64, output_len=8, weights="bf16")
    assert auto.ttft_s < as_bf16.ttft_s / 10  # not at the emulated bf16 peak
    p = resolve_precision(None, None, None, hw, find_preset("qwen3-0.6b"))
    assert p.compute == "fp32" and p.embedding_format.bits == p.head().weights.bits == 16


def test_exact_float_weights_on_a_probed_device_compute_and_cache_in_their_dtype():
    """The engine runs --weights bf16 (or fp16) only with that --dtype, so its KV cache is 2 bytes a value, not the
    probe's float32 engine's 4; on a datasheet device the KV follows the activations as before."""
    hw = probed().to_hardware()
    for weights in ("bf16", "fp16"):
        p = resolve_precision(weights, None, None, hw, find_preset("qwen3-0.6b"))
        assert (p.activation_bytes, p.kv_bytes) == (2, 2), weights
    p = resolve_precision("fp32", None, None, hw, find_preset("qwen3-0.6b"))
    assert (p.activation_bytes, p.kv_bytes) == (4, 4)
    assert resolve_precision("int8", None, None, hw, find_preset("qwen3-0.6b")).kv_bytes == 4  # the probe's fp32


def test_a_config_jsons_bf16_checkpoint_runs_as_bf16_fp32_and_a_quantized_one_as_it_says():
    hw = probed().to_hardware()
    config = replace(find_preset("qwen3-0.6b"), torch_dtype="bfloat16", tie_word_embeddings=False)
    p = resolve_precision(None, None, None, hw, config)
    assert (p.weights.name, p.embedding_format.name, p.head().weights.name) == ("bf16-fp32",) * 3
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    q = resolve_precision(None, None, None, hw, replace(config, quantization_config=awq))
    assert q.weights.name == "awq-int4-g128" and q.embedding_format.name == "bf16"


def test_a_datasheet_gpu_keeps_a_bf16_checkpoint_in_bf16():
    hw = find_hardware("h200")
    assert predict("qwen3-0.6b", hw, prompt_len=64, output_len=8).weights_format == "bf16"
    assert resolve_precision("auto", None, WEIGHT_FORMATS["bf16"], hw).weights.name == "bf16"


def test_a_bf16_gguf_is_costed_as_the_engine_runs_it(tmp_path):
    path = tmp_path / "bf16.gguf"
    write_tiny_gguf(path, qtype=T.BF16)
    config, file_format = resolve_model(path)
    assert file_format.name == "bf16"
    assert resolve_precision(None, None, file_format, probed().to_hardware(), config).weights.name == "bf16-fp32"
    assert resolve_precision(None, None, file_format, find_hardware("h100"), config).weights.name == "bf16"


@pytest.mark.parametrize("qtype", [T.BF16, T.F16])
def test_the_analyzer_and_the_engine_agree_on_a_float_file_here(tmp_path, qtype):
    """Whatever this host builds (rooftop's kernels or not), the analyzer's auto format on its probe is the format
    the engine's linears report for the same file."""
    from rooftop import LLM
    from rooftop.engine.probe import load_or_run_probe

    path = tmp_path / "float.gguf"
    write_tiny_gguf(path, qtype=qtype)
    config, file_format = resolve_model(path)
    analyzer = resolve_precision(None, None, file_format, load_or_run_probe().to_hardware(), config)
    assert analyzer.weights.name == LLM(model=path).precision.weights.name


def blocks(types: dict[str, T], layers: int = 2) -> list[TensorInfo]:
    """A GGUF's block matrices, headers only (rows, inputs), of the tiny Llama's shapes: q, o, gate, up and down
    256 x 256, k and v 128 x 256; `types` names each matrix's type by its GGUF name (attn_v, ffn_down, ...)."""
    shapes = {"attn_q": (256, 256), "attn_k": (128, 256), "attn_v": (128, 256), "attn_output": (256, 256)}
    shapes |= {"ffn_gate": (256, 256), "ffn_up": (256, 256), "ffn_down": (256, 256)}
    return [
        TensorInfo(f"blk.{i}.{name}.weight", shape, types[name], np.empty(0))
        for i in range(layers)
        for name, shape in shapes.items()
    ]


def q4_k_m() -> dict[str, T]:
    """A Q4_K_M's layout in small: V and down in Q6_K (98,304 weights a layer), the rest Q4_K (294,912): 1:3."""
    return {
        name: T.Q6_K if name in ("attn_v", "ffn_down") else T.Q4_K
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    }


def test_a_mixed_ggufs_formats_each_do_their_share_of_the_math_at_their_own_peak():
    """A Q4_K_M's Q4_K and Q6_K were costed as one format of their mean bits at the Q4_K kernels' peak; its Q6_K
    quarter of the weights runs on another kernel (here the int8 one: 200 GFLOP/s against the int4's 150)."""
    fmt = gguf_weights(blocks(q4_k_m()))
    q4_k, q6_k = WEIGHT_FORMATS["q4_k"], WEIGHT_FORMATS["q6_k"]
    assert fmt.name == "q4_k+q6_k" and fmt.parts == ((q4_k, 0.75), (q6_k, 0.25))
    assert fmt.bits == 0.75 * 4.5 + 0.25 * 6.5625  # the file's bytes, over every block weight
    assert fmt.compute_shares == (("int4_weight_only", 0.75), ("int8_weight_only", 0.25))
    hw = probed().to_hardware()
    p = resolve_precision(None, None, fmt, hw)
    qkv = next(op for op in step_ops(find_preset("smollm2-135m"), p, StepShape.prefill(1, 64)) if op.name == "qkv_proj")
    assert qkv.compute_time(hw) == pytest.approx(qkv.flops * (0.75 / 150e9 + 0.25 / 200e9))
    widened = replace(p, widen_rows=32).at(64).weights  # a chunk that widens to floats: all of it at the fp32 peak
    assert widened.compute_shares == (("fp32", 1.0),)
    # expected times on a catalog GPU: each format's bytes at its kernels' share of the bandwidth
    eff = find_hardware("h100").efficiency
    bytes_q4, bytes_q6 = 0.75 * 4.5, 0.25 * 6.5625
    mixed = (bytes_q4 + bytes_q6) / (bytes_q4 / eff.memory_4bit + bytes_q6 / eff.memory)
    assert memory_efficiency(fmt, eff) == pytest.approx(mixed)


@pytest.mark.parametrize("qtype, bits", [(T.Q2_K, 2.625), (T.Q3_K, 3.4375), (T.IQ4_NL, 4.5), (T.IQ4_XS, 4.25)])
def test_a_type_the_loader_converts_is_costed_as_stored_on_a_datasheet_and_as_its_q4_1_here(qtype, bits):
    """rooftop's loader converts Q2_K, Q3_K and the IQ types to Q4_1 (5 bits), and the analyzer costed them so on
    every device; another engine runs them as stored (gguf's block sizes: Q2_K 84 bytes per 256 weights, Q3_K 110
    per 256, IQ4_NL 18 per 32, IQ4_XS 136 per 256)."""
    name = qtype.name.lower()
    fmt = gguf_weights(blocks(dict.fromkeys(q4_k_m(), qtype)))
    assert fmt.name == name and fmt.bits_per_weight() == bits
    stored = resolve_precision(None, None, fmt, find_hardware("h100"))
    assert stored.weights == fmt and stored.converted == ()
    here = resolve_precision(None, None, fmt, probed().to_hardware())
    assert here.weights == WEIGHT_FORMATS["q4_1"] and here.converted == (name,)
    pred = analyze(find_preset("smollm2-135m"), probed().to_hardware(), here, 16, 4)
    assert weight_formats(pred) == f"q4_1; {name} converted to q4_1 at load, as rooftop's engine runs it"


def test_a_mix_with_a_converted_type_is_the_mix_the_loader_makes():
    """A Q3_K_M-like file: three quarters of the weights Q3_K (3.4375 bits), V and down Q6_K (6.5625)."""
    types = {name: T.Q6_K if t == T.Q6_K else T.Q3_K for name, t in q4_k_m().items()}
    fmt = gguf_weights(blocks(types))
    assert fmt.name == "q3_k+q6_k" and fmt.bits == 0.75 * 3.4375 + 0.25 * 6.5625
    here = resolve_precision(None, None, fmt, probed().to_hardware()).weights
    assert here.name == "q4_1+q6_k" and here.bits == pytest.approx(0.75 * 5 + 0.25 * 6.5625)
    assert here.parts == ((WEIGHT_FORMATS["q4_1"], pytest.approx(0.75)), (WEIGHT_FORMATS["q6_k"], pytest.approx(0.25)))


def test_a_float_ggufs_tables_are_costed_as_the_engine_runs_them_on_its_probe():
    """A BF16 GGUF's tables under auto on the probe: `rooftop roofline -H this` failed on one (an AttributeError)."""
    bf16 = WEIGHT_FORMATS["bf16"]
    p = resolve_precision(None, None, bf16, probed().to_hardware(), tables=(bf16, bf16))
    assert (p.weights.name, p.embedding_format.name, p.head().weights.name) == ("bf16-fp32",) * 3


def test_integer_weights_leave_the_tables_in_floats_as_engines_hold_them():
    """AWQ and GPTQ checkpoints of int4 and int8 keep the embedding table and lm_head in 16-bit floats, and vLLM
    runs them so: --weights int4 made them int4 too. Rooftop's engine, on its probe, holds a float table in its
    float format (fp32 on the CPU), a GGUF's quantized one as stored, and the lm_head as Q8_0."""
    config = find_preset("qwen3-8b")  # untied: a 151,936 x 4,096 table and lm_head
    for weights in ("int4", "int8"):
        p = resolve_precision(weights, None, None, find_hardware("h100"), config)
        assert (p.weights.name, p.embedding_format.name, p.head().weights.name) == (weights, "bf16", "bf16")
    head = next(op for op in step_ops(config, p, StepShape.decode(1, 64)) if op.name == "lm_head")
    assert head.essential_bytes == 151_936 * 4096 * 2
    assert resolve_precision("q4_1", None, None, find_hardware("h100"), config).head().weights.name == "q4_1"
    hw = probed().to_hardware()
    p = resolve_precision("int4", None, None, hw, config)
    assert (p.weights.name, p.embedding_format.name, p.head().weights.name) == ("q4_1", "fp32", "q8_0")
    q8_0 = WEIGHT_FORMATS["q8_0"]
    p = resolve_precision("int4", None, WEIGHT_FORMATS["q4_1"], hw, config, tables=(q8_0, q8_0))  # the bundled file
    assert (p.embedding_format.name, p.head().weights.name) == ("q8_0", "q8_0")
    p = resolve_precision("float", None, None, hw, config)
    assert p.embedding is None and p.lm_head is None and p.weights.name == "fp32"


def test_a_ggufs_table_is_costed_in_the_engines_float_dtype_on_a_probed_gpu():
    """rooftop's loader widens the embedding table to the model's dtype on any device but the CPU (only CPU tensors
    look rows up from groups): the analyzer costed a GGUF's Q8_0 table as stored on a probed GPU too."""
    config = find_preset("qwen3-8b")
    q4_1, q8_0 = WEIGHT_FORMATS["q4_1"], WEIGHT_FORMATS["q8_0"]
    gpu_formats = {"float": "bf16", "int8": "int8", "int4": "int4-g32"}
    gpu = probed(device="cuda", formats=gpu_formats).to_hardware()
    assert gpu.widens_tables and not probed().to_hardware().widens_tables
    assert not find_hardware("h100").widens_tables
    for weights in (None, "int4"):
        p = resolve_precision(weights, None, q4_1, gpu, config, tables=(q8_0, q8_0))
        assert p.embedding_format.name == "bf16", weights
        p = resolve_precision(weights, None, q4_1, probed().to_hardware(), config, tables=(q8_0, q8_0))
        assert p.embedding_format.name == "q8_0", weights  # on the CPU as stored
    assert resolve_precision(None, None, q4_1, find_hardware("h100"), config, tables=(q8_0, q8_0)).embedding is q8_0


def test_a_tied_bf16_table_that_is_the_lm_heads_matrix_is_counted_once(tmp_path):
    """On rooftop's CPU kernels a tied bf16 lm_head (bf16-fp32) holds the table's one bfloat16 matrix: the engine
    named the table bf16 beside a bf16-fp32 head, so its weight bytes counted that matrix twice once a tied head in
    another format than the table's counts as a second copy."""
    from rooftop import LLM
    from rooftop.engine.probe import load_or_run_probe
    from rooftop.roofline.api import resolve
    from rooftop.roofline.ops import weight_bytes

    path = tmp_path / "tied.gguf"
    write_tiny_gguf(path, qtype=lambda name: T.F32 if "norm" in name else T.BF16)  # no output.weight: tied
    llm = LLM(model=path)
    if llm.precision.weights.name != "bf16-fp32":
        pytest.skip("the engine holds bf16 as bf16-fp32 only on rooftop's CPU kernels")
    assert llm.precision.embedding_format == llm.precision.head().weights
    config, _, p = resolve(path, "this", probe=load_or_run_probe)
    assert llm.weight_bytes == weight_bytes(config, p)
