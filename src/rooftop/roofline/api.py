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
from rooftop.roofline.precision import (
    DEFAULT_STATE_DTYPE,
    WEIGHT_FORMATS,
    Precision,
    WeightFormat,
    as_run,
    check_weight_choice,
    checkpoint_weights,
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
    format, or in Q4_1 for a type outside WEIGHT_FORMATS (the 2- and 3-bit K-quants, the IQ types), which the loader
    converts it to (loading.gguf.CONVERTED_TO); several formats as their mix by bytes. None without block matrices."""
    bytes_by_format: dict[str, float] = {}
    weights = 0
    for t in tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:  # matrices, and stacks of experts' matrices
            fmt = gguf_format(t)
            bytes_by_format[fmt.name] = bytes_by_format.get(fmt.name, 0.0) + fmt.linear_bytes(
                t.shape[-1], t.numel // t.shape[-1]
            )
            weights += t.numel
    return mixed_format(bytes_by_format, weights) if bytes_by_format else None


def gguf_format(t: TensorInfo) -> WeightFormat:
    """One GGUF tensor's format as the analyzer names it: its float or block type, or Q4_1 for a type outside
    WEIGHT_FORMATS, which the loader converts it to (loading.gguf.CONVERTED_TO)."""
    return WEIGHT_FORMATS.get(GGUF_FLOATS.get(t.qtype.name, t.qtype.name.lower()), WEIGHT_FORMATS["q4_1"])


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
    probe: Callable[[], ProbeResult] | None = None,
) -> Hardware:
    """A catalog name, "this" (`probe`'s measurements of this machine: by default the cached probe, else the roofs
    torch measures alone; the CLI passes rooftop.engine.probe's, which times the engine's kernels too), or numbers."""
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
    if hardware is None or hardware == "this":
        if probe is None:
            from rooftop.roofline.probe import load_or_run_probe as probe  # torch: imported only for "this"

        return probe().to_hardware()  # measures on first use: seconds to minutes of work
    return find_hardware(hardware)


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
    quantization_config or torch_dtype says (checkpoint_weights), else bf16, as the engine runs it on a probed
    device (`hw.engine_auto`: a bf16 checkpoint as bf16-fp32 on rooftop's CPU kernels). The activations are what
    rooftop's engine computes in on a probed device (`hw.engine_dtype`), else of the weights' compute width; the KV
    cache is `kv` (default: the activations' width), a linear-attention state `state_dtype`. Under auto a GGUF's
    embedding table and lm_head are their own tensors' formats (`tables`, file_tables), as the engine holds them."""
    auto = weights is None or check_weight_choice(weights) == "auto"
    held = checkpoint_weights(config) if auto and file_format is None and config is not None else None
    p = (
        held.as_run(hw.engine_auto).precision(kv, hw.engine_dtype)
        if held is not None
        else precision(weight_format(weights, file_format, hw.engine_formats, hw.engine_auto), kv, hw.engine_dtype)
    )
    if auto and file_format is not None and tables is not None:
        embedding, head = (WEIGHT_FORMATS[as_run(fmt, hw.engine_auto).name] for fmt in tables)
        p = replace(p, embedding=embedding, lm_head=head)
    return p.with_state(state_dtype)


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
    config, file_format = resolve_model(model)
    hw = resolve_hardware(hardware).scaled(compute_efficiency, memory_efficiency)
    p = resolve_precision(weights, kv, file_format, hw, config, state_dtype, file_tables(model))
    return analyze(config, hw, p, prompt_len, output_len, batch, tp, gpu_memory_utilization=gpu_memory_utilization)
