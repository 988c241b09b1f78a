"""The analyzer's front door: names or paths in, a Prediction out (`rooftop.roofline.predict`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rooftop.config import ModelConfig
from rooftop.errors import InvalidRequestError, ModelLoadError
from rooftop.roofline.hardware import Hardware, custom_hardware
from rooftop.roofline.ops import check_tp, weight_bytes
from rooftop.roofline.precision import (
    DEFAULT_STATE_DTYPE,
    FLOAT_DTYPES,
    WEIGHT_FORMATS,
    Precision,
    WeightFormat,
    as_converted,
    as_format,
    as_run,
    check_weight_choice,
    checkpoint_weights,
    converted_types,
    mixed_format,
    precision,
    weight_format,
)
from rooftop.roofline.predict import DEFAULT_GPU_MEMORY_UTILIZATION, Prediction, analyze

if TYPE_CHECKING:
    from rooftop.loading.gguf_file import TensorInfo
    from rooftop.roofline.probe import ProbeResult

# GGUF's float types by the analyzer's names; its block types are named as in WEIGHT_FORMATS (Q4_K: "q4_k")
GGUF_FLOATS = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}


def resolve_model(model: str | Path | ModelConfig | None) -> tuple[ModelConfig, WeightFormat | None]:
    """A preset name, a GGUF file, an HF directory or a bare config.json -> (config, the file's weight format)."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf_config import config_from_gguf
    from rooftop.loading.gguf_file import read_gguf
    from rooftop.loading.hf_config import read_hf_config
    from rooftop.roofline.presets import find_preset

    if isinstance(model, ModelConfig):
        return model, None
    path = bundled_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InvalidRequestError(f"{path}: no config.json")
        return read_hf_config(path / "config.json"), None
    if path.is_file():
        if path.suffix == ".json":
            return read_hf_config(path), None
        gguf_file = read_gguf(path)
        return config_from_gguf(gguf_file), gguf_weights(gguf_file.tensors)
    try:
        return find_preset(str(model)), None
    except InvalidRequestError:
        if _names_a_path(str(model)):  # a typo in a path is not an unknown preset
            raise ModelLoadError(f"{model}: no such file or directory") from None
        raise


def gguf_weights(tensors: list[TensorInfo]) -> WeightFormat | None:
    """What a GGUF's transformer blocks hold, read from their matrices (a file's general.file_type names one type,
    and a Q4_K_M's names none the analyzer knew, which made it cost a K-quant file as bf16): each matrix in its own
    format as stored (gguf_format); several formats as their mix (mixed_format). None without block matrices."""
    bytes_by_format: dict[WeightFormat, float] = {}
    weights = 0
    for t in tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:  # matrices, and stacks of experts' matrices
            fmt = gguf_format(t)
            held = fmt.linear_bytes(t.shape[-1], t.numel // t.shape[-1])
            bytes_by_format[fmt] = bytes_by_format.get(fmt, 0.0) + held
            weights += t.numel
    return mixed_format(bytes_by_format, weights) if bytes_by_format else None


def gguf_format(t: TensorInfo) -> WeightFormat:
    """One GGUF tensor's format as stored: its float or block type as the analyzer names it (WEIGHT_FORMATS), or a
    type rooftop's loader converts (Q2_K, Q3_K, the IQ and ternary types: precision.as_converted) at its own bits
    per weight (gguf's block sizes), dequantized into 16-bit math by a weight-only kernel."""
    from gguf import GGML_QUANT_SIZES

    name = GGUF_FLOATS.get(t.qtype.name, t.qtype.name.lower())
    if name in WEIGHT_FORMATS:
        return WEIGHT_FORMATS[name]
    block, size = GGML_QUANT_SIZES[t.qtype]
    bits = size * 8 / block
    return WeightFormat(name, bits, "int4_weight_only" if bits < 5 else "int8_weight_only")


def file_tables(model: str | Path | ModelConfig | None) -> tuple[WeightFormat, WeightFormat] | None:
    """A GGUF's embedding table and lm_head in their own formats (the lm_head is the embedding table where the file
    has no output.weight: tied), which are often not its blocks' (the bundled Q4_1 file's table is Q8_0, a Q4_K_M's
    output Q6_K); None for any other source, or a GGUF without a token_embd."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf_file import read_gguf

    if isinstance(model, ModelConfig):
        return None
    path = bundled_model_path() if model is None else Path(model).expanduser()
    if not path.is_file() or path.suffix == ".json":
        return None
    tensors = {t.name: t for t in read_gguf(path).tensors}
    if "token_embd.weight" not in tensors:
        return None
    embedding = gguf_format(tensors["token_embd.weight"])
    head = tensors.get("output.weight")
    return embedding, embedding if head is None else gguf_format(head)


def _names_a_path(name: str) -> bool:
    """A name no preset has but a path has: a directory part, a leading . or ~, a file's suffix."""
    return "/" in name or os.sep in name or name.startswith((".", "~")) or name.endswith((".gguf", ".json"))


def resolve_hardware(
    hardware: str | Hardware | None = None,
    peak_tflops: float | None = None,
    bandwidth_tbs: float | None = None,
    memory_gb: float | None = None,
    interconnect_gbs: float | None = None,
) -> Hardware:
    """A catalog name, "this" (the cached probe of this machine, else the roofs torch measures alone; `resolve`
    takes another probe: the CLI passes rooftop.engine.probe's, which times the engine's kernels too), or numbers."""
    from rooftop.roofline.catalog import find_hardware

    if isinstance(hardware, Hardware):
        return hardware
    explicit = (peak_tflops, bandwidth_tbs, memory_gb)
    if any(v is not None for v in explicit):
        if hardware is not None:
            raise InvalidRequestError(
                "give either a hardware name or --peak-tflops/--bandwidth-tbs/--memory-gb, not both"
            )
        if any(v is None for v in explicit):
            raise InvalidRequestError("custom hardware needs all of --peak-tflops, --bandwidth-tbs and --memory-gb")
        return custom_hardware(peak_tflops, bandwidth_tbs, memory_gb, interconnect_gbs)
    if is_this(hardware):
        return _probe(None).to_hardware()
    return find_hardware(hardware)


def is_this(hardware: str | Hardware | None) -> bool:
    """Whether `hardware` names this machine: none given, or "this" in any case, as catalog names are."""
    return hardware is None or (isinstance(hardware, str) and hardware.strip().lower() == "this")


def _probe(probe: Callable[[], ProbeResult] | None) -> ProbeResult:
    """`probe`'s result, by default the cached probe of this machine; it measures on first use (seconds to minutes)."""
    if probe is None:
        from rooftop.roofline.probe import load_or_run_probe as probe  # torch: imported only for "this"
    return probe()


def resolve(
    model: str | Path | ModelConfig | None,
    hardware: str | Hardware | None = "this",
    weights: str | None = None,
    kv: str | None = None,
    tp: int = 1,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    probe: Callable[[], ProbeResult] | None = None,
) -> tuple[ModelConfig, Hardware, Precision]:
    """The model, the device and the precision the model runs in there. On this machine ("this", `probe`'s roofs)
    the memory roof is the probe's read of a working set the size of one device's weights at that precision
    (`ProbeResult.to_hardware`), the roof `rooftop bench` bounds the same model by: weights that stay partly in a
    cache read faster than DRAM."""
    config, file_format = resolve_model(model)
    check_tp(config, tp)  # before a probe of a group that could not split the model
    measured = _probe(probe) if is_this(hardware) else None
    hw = measured.to_hardware() if measured is not None else resolve_hardware(hardware)
    p = resolve_precision(weights, kv, file_format, hw, config, state_dtype, file_tables(model))
    if measured is not None:
        hw = measured.to_hardware(working_set=weight_bytes(config, p) / tp)
    return config, hw, p


def resolve_precision(
    weights: str | None,
    kv: str | None,
    file_format: WeightFormat | None,
    hw: Hardware,
    config: ModelConfig | None = None,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    tables: tuple[WeightFormat, WeightFormat] | None = None,
) -> Precision:
    """The one place the analyzer decides what the weights are: a `--weights` choice (WEIGHT_CHOICES) is the exact
    format it means on `hw`; none or auto is what the file holds: a GGUF's format, else what a config.json's
    quantization_config or torch_dtype says (checkpoint_weights), else bf16 (on a probed device the engine's dtype,
    which it loads a config that names no dtype in; presets are bf16 checkpoints), as the engine runs it on a probed
    device (`hw.engine_auto`: a bf16 checkpoint as bf16-fp32 on rooftop's CPU kernels). A GGUF type rooftop's loader
    converts (Q2_K, Q3_K, the IQ types) is the Q4_1 it becomes on a probed device, where rooftop's engine runs it,
    and as stored elsewhere (`as_converted`). The activations are what rooftop's engine computes in on a probed
    device (`hw.engine_dtype`; an exact float `--weights` there is the run's --dtype, which the engine requires),
    else of the weights' compute width; the KV cache is `kv` (default: the activations' width), a linear-attention state `state_dtype`. Under auto a GGUF's embedding table and lm_head are their own
    tensors' formats (`tables`, file_tables), as the engine holds them, but for a table on a probed GPU, which the
    engine widens to its float dtype (`hw.widens_tables`); under int8 or int4 they are not integer groups
    (`integer_tables`)."""
    auto = weights is None or check_weight_choice(weights) == "auto"
    converted: tuple[str, ...] = ()
    if hw.probed and file_format is not None:
        held = (file_format, *(tables or ()))
        converted = tuple(dict.fromkeys(name for fmt in held for name in converted_types(fmt)))
        file_format = as_converted(file_format)
        tables = None if tables is None else (as_converted(tables[0]), as_converted(tables[1]))
    held = checkpoint_weights(config) if auto and file_format is None and config is not None else None
    if auto and hw.probed and file_format is None and held is None and config is not None:
        file_format = WEIGHT_FORMATS[hw.engine_dtype]  # a config.json naming no dtype: the engine's own dtype
    activations = weights if hw.probed and weights in FLOAT_DTYPES.values() else hw.engine_dtype
    p = (
        held.as_run(hw.engine_auto).precision(kv, hw.engine_dtype)
        if held is not None
        else precision(weight_format(weights, file_format, hw.engine_formats, hw.engine_auto), kv, activations)
    )
    if not auto:
        return integer_tables(p, weights, hw, tables).with_state(state_dtype)
    if file_format is not None and tables is not None:
        embedding, head = (as_format(as_run(fmt, hw.engine_auto)) for fmt in tables)
        p = replace(p, embedding=WEIGHT_FORMATS[hw.engine_dtype] if hw.widens_tables else embedding, lm_head=head)
    return replace(p, converted=converted).with_state(state_dtype)


def integer_tables(
    p: Precision, weights: str, hw: Hardware, tables: tuple[WeightFormat, WeightFormat] | None
) -> Precision:
    """The embedding table and lm_head beside block linears of an integer `weights` choice, which they are not made
    into. On a device rooftop's engine was probed on (`hw.engine_formats`), as it holds them under its int8 or int4
    policy (an exact choice it runs as one of them): a GGUF's quantized table as stored (`tables`) on the CPU, any
    other table (a float one, or any on a GPU: `hw.widens_tables`) in the float policy's format; the lm_head in the
    int8 policy's (quant.linear.linear_kind: Q8_0 on rooftop's CPU and CUDA kernels; on x86 without them fp16 with
    float32 math, which the probe does not name). Elsewhere as an AWQ or GPTQ checkpoint of int8 or int4 holds them,
    which vLLM runs: both in the activations' float format."""
    if hw.engine_formats:
        if p.weights.name not in (hw.engine_formats.get("int8"), hw.engine_formats.get("int4")):
            return p
        table = WEIGHT_FORMATS[hw.engine_formats["float"]]
        if tables is not None and tables[0].name not in FLOAT_DTYPES.values() and not hw.widens_tables:
            table = tables[0]
        return replace(p, embedding=table, lm_head=WEIGHT_FORMATS[hw.engine_formats["int8"]])
    if weights not in ("int8", "int4"):
        return p
    floats = WEIGHT_FORMATS["fp32" if p.activation_bytes == 4 else "bf16"]
    return replace(p, embedding=floats, lm_head=floats)


def predict(
    model: str | Path | ModelConfig | None,
    hardware: str | Hardware | None = "this",
    prompt_len: int = 1024,
    output_len: int = 256,
    batch: int = 1,
    weights: str | None = None,
    kv: str | None = None,
    tp: int = 1,
    compute_efficiency: float = 1.0,
    memory_efficiency: float = 1.0,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    state_dtype: str = DEFAULT_STATE_DTYPE,
) -> Prediction:
    """Predict TTFT, TPOT, memory and crossovers, e.g. `predict("qwen3-8b", "h200", prompt_len=4096)`."""
    config, hw, p = resolve(model, hardware, weights, kv, tp, state_dtype)
    hw = hw.scaled(compute_efficiency, memory_efficiency)
    return analyze(config, hw, p, prompt_len, output_len, batch, tp, gpu_memory_utilization=gpu_memory_utilization)
