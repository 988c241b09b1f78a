"""Hugging Face model directories: config.json + safetensors (one file or sharded) + tokenizer.json."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from safetensors import safe_open

from rooftop.config import check_runnable
from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.hf_config import read_hf_config, read_json
from rooftop.loading.loaded import LazyWeights, LoadedModel
from rooftop.loading.shard import Shard
from rooftop.loading.tokenizer import Tokenizer


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing or not shards:
            raise ModelLoadError(f"{path}: shards listed in {index.name} are missing: {missing or 'none listed'}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        config = (path / "config.json").is_file()
        hint = " (it has a config.json: --load-format dummy runs its model with random weights)" if config else ""
        raise ModelLoadError(f"{path}: no *.safetensors weights{hint}")
    return files


def _read(f: Path, name: str, shard: Shard | None = None) -> torch.Tensor:
    """A tensor as float32, bfloat16 as it is (the model's tensors widen it where they hold float32: models/tensors.py),
    or only its rows or columns `shard` (safetensors reads just those bytes)."""
    with safe_open(f, framework="pt") as opened:
        if shard is None:
            return _widened(opened.get_tensor(name), name)
        part = opened.get_slice(name)
        size = part.get_shape()[shard.dim]
        if size != shard.total:
            raise ModelLoadError(
                f"tensor {name} has {size} along dimension {shard.dim}, the config implies {shard.total}"
            )
        rows = slice(shard.start, shard.stop)
        return _widened(part[rows] if shard.dim == 0 else part[:, rows], name)


def _widened(t: torch.Tensor, name: str) -> torch.Tensor:
    """A float tensor widened to float32 (bfloat16 kept); an integer or fp8 one is a quantized checkpoint's, whose
    values mean nothing without its scales: refused."""
    if not t.is_floating_point() or t.element_size() == 1:
        raise UnsupportedModelError(
            f"tensor {name} is {str(t.dtype).removeprefix('torch.')}: the engine reads float16, "
            "bfloat16 and float32 safetensors"
        )
    return t if t.dtype == torch.bfloat16 else t.float()


# A multimodal checkpoint (Qwen3.5's Qwen3_5ForConditionalGeneration) keeps its language model under this prefix,
# beside a vision tower (model.visual.*) and a multi-token-prediction head (mtp.*) that rooftop does not run.
TEXT_PREFIX = "model.language_model."
NOT_TEXT = ("model.visual.", "mtp.")


def text_model_name(name: str) -> str | None:
    """A tensor's name as the text model's (`model.language_model.layers.0...` -> `model.layers.0...`); None for the
    vision tower's and the multi-token-prediction layer's tensors, which are not read."""
    if name.startswith(NOT_TEXT):
        return None
    return "model." + name.removeprefix(TEXT_PREFIX) if name.startswith(TEXT_PREFIX) else name


def _says_untied(config_file: Path) -> bool:
    """Whether config.json itself (or its text_config) sets tie_word_embeddings false: without the field a file with
    no lm_head is read as tied, as transformers' default for such files is."""
    raw = read_json(config_file)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    return raw.get("tie_word_embeddings", text.get("tie_word_embeddings")) is False


def load_hf_dir(path: Path, tokenizer: Tokenizer | None = None) -> LoadedModel:
    """Load an HF directory's config and tokenizer (`tokenizer` where it has no tokenizer files); its tensors are
    read (as float32, or bfloat16) when the model asks."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: no config.json (is this a Hugging Face model directory?)")
    generation = read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    config = read_hf_config(path / "config.json", generation)
    check_runnable(config)  # before reading gigabytes of weights the engine could not use
    if config.quantization_config:
        method = config.quantization_config.get("quant_method", "unnamed")
        raise UnsupportedModelError(
            f"{path}: a {method}-quantized checkpoint (config.json's quantization_config): the engine reads float "
            "safetensors and GGUF files; `rooftop roofline` analyzes it, and --load-format dummy runs its shapes"
        )
    readers, file_names, skipped = {}, {}, 0
    for f in _weight_files(path):
        try:
            with safe_open(f, framework="pt") as opened:
                names = list(opened.keys())
        except Exception as e:  # safetensors raises its own error types on a bad header or short file
            raise ModelLoadError(f"{f}: unreadable safetensors file ({e})") from None
        for name in names:
            if (text := text_model_name(name)) is not None:
                readers[text], file_names[text] = partial(_read, f, name), name
        skipped += sum(1 for name in names if text_model_name(name) is None)
    if "lm_head.weight" not in readers:
        if _says_untied(path / "config.json"):
            raise ModelLoadError(f"{path}: no tensor lm_head.weight, and config.json says tie_word_embeddings false")
        config.tie_word_embeddings = True
    if tokenizer is None or (path / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_hf_dir(path, config.eos_token_ids)
    if not config.eos_token_ids:
        config.eos_token_ids = tokenizer.eos_token_ids
    notes = (
        [f"text model only: {skipped} tensors of the vision tower and multi-token prediction not read"]
        if skipped
        else []
    )
    return LoadedModel(
        config=config,
        weights=LazyWeights(readers, file_names=file_names),
        tokenizer=tokenizer,
        source=str(path),
        notes=notes,
        file_format="bf16" if config.torch_dtype == "bfloat16" else None,  # the float checkpoint auto keeps as stored
    )
