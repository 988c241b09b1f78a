"""LoadedModel and `load_model`: one entry point for a GGUF file, a Hugging Face directory or the bundled model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rooftop.config import ModelConfig
from rooftop.errors import ModelLoadError
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.linear import Int4Weight


@dataclass
class LoadedModel:
    """What a model file holds: its config, its weights (float, Hugging Face names and layout), its tokenizer."""

    config: ModelConfig
    weights: dict[str, torch.Tensor | Int4Weight]
    tokenizer: Tokenizer
    source: str


def load_model(path: str | Path | None = None, keep_int4: bool = False) -> LoadedModel:
    """Load `path` (a .gguf file or an HF directory); None loads the bundled SmolLM2-135M-Instruct.
    `keep_int4`: a GGUF's Q4_0/Q4_1 tensors stay 4-bit (Int4Weight) instead of being decoded to float32."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf import load_gguf
    from rooftop.loading.hf import load_hf_dir

    path = Path(path) if path is not None else bundled_model_path()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory")
    if path.is_dir():
        return load_hf_dir(path)
    return load_gguf(path, keep_int4)
