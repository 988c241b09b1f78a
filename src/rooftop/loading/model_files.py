"""`load_model`: one entry point for a GGUF file, a Hugging Face directory or the bundled model."""

from __future__ import annotations

from pathlib import Path

import torch

from rooftop.config import RunConfig
from rooftop.errors import InvalidRequestError, ModelLoadError
from rooftop.loading.bundled import bundled_model_path
from rooftop.loading.dummy import find_source, load_dummy
from rooftop.loading.gguf import load_gguf
from rooftop.loading.hf import load_hf_dir
from rooftop.loading.loaded import LoadedModel
from rooftop.loading.tokenizer import Tokenizer
from rooftop.roofline.presets import PRESETS


def load_model(path: str | Path | None = None, tokenizer: Tokenizer | None = None) -> LoadedModel:
    """Load `path` (a .gguf file or an HF directory); None loads the bundled SmolLM2-135M-Instruct. `tokenizer`:
    what a directory without tokenizer files takes (a draft model's: the target's)."""
    path = Path(path) if path is not None else bundled_model_path()
    check_exists(path)
    if path.is_dir():
        return load_hf_dir(path, tokenizer)
    if path.suffix == ".safetensors" or path.name == "model.safetensors.index.json":  # one file of a directory
        raise ModelLoadError(f"{path}: one file of a Hugging Face checkpoint: pass its directory, {path.parent}")
    if path.suffix == ".json" and path.name.startswith(("tokenizer", "generation", "special_tokens")):
        raise ModelLoadError(f"{path}: not a model file: pass its checkpoint's directory, {path.parent}")
    if path.suffix == ".json":  # read as a GGUF, it failed on the magic: say what the file is and what runs it
        raise ModelLoadError(
            f"{path}: a model's config holds no weights (--load-format dummy runs its model with random weights; a "
            "Hugging Face directory with *.safetensors loads its weights)"
        )
    return load_gguf(path)


def check_exists(path: Path) -> None:
    """A model path that names nothing: refused naming it (and a preset's name pointed to dummy weights)."""
    if not path.exists():
        preset = (
            f" ({path} is a preset: --load-format dummy runs it with random weights)" if str(path) in PRESETS else ""
        )
        raise ModelLoadError(f"{path}: no such file or directory{preset}")


def check_source(run: RunConfig) -> None:
    """Refuse a run's model that names nothing loadable before anything waits on its load (a server's port): a
    missing path (the draft model's too), or for dummy weights a source without a config. The file itself is read by
    the load."""
    if run.load_format == "dummy":
        find_source(run.model)
    elif run.model is not None:
        check_exists(Path(run.model))
    spec = run.engine.speculative_config
    if spec is not None and spec.model is not None and not Path(spec.model).exists():
        raise InvalidRequestError(
            f"speculative_config model {spec.model}: no such file or directory", "speculative_config"
        )


def load_weights(run: RunConfig, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """The run's model as a LoadedModel (config, tokenizer, tensors read when the model asks): its file, or seeded
    random weights (load_format dummy)."""
    if run.load_format == "dummy":
        return load_dummy(run.model, run.weights, device, dtype, run.dummy_seed)
    return load_model(run.model)
