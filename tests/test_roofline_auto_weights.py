"""`--weights auto` means in the analyzer what it means in the engine: a bf16 checkpoint's linears run on rooftop's
CPU kernels as bf16-fp32 (bfloat16 storage, float32 math), so the analyzer costs them at the float32 roof there, and
as bf16 on a datasheet device. The hardware is built by hand: nothing here depends on this host's speed or ISA."""

from dataclasses import replace

import pytest
from gguf import GGMLQuantizationType as T
from gguf_factory import write_tiny_gguf

from rooftop.roofline import predict
from rooftop.roofline.api import resolve_model, resolve_precision
from rooftop.roofline.catalog import find_hardware
from rooftop.roofline.precision import WEIGHT_FORMATS, auto_formats, weight_format
from rooftop.roofline.presets import find_preset
from rooftop.roofline.probe import ProbeResult

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
