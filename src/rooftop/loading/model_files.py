"""LoadedModel and `load_model`: one entry point for a GGUF file, a Hugging Face directory or the bundled model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.config import ModelConfig
from rooftop.errors import ModelLoadError
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.weights import Weight


class LazyWeights(Mapping[str, Weight]):
    """Tensors read from the file when asked for, not before: the model builds each layer's linears from a few
    tensors at a time, so loading never holds the whole model widened to float32."""

    def __init__(self, readers: dict[str, Callable[[], Weight]]):
        self._readers = readers

    def __getitem__(self, name: str) -> Weight:
        return self._readers[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)


@dataclass
class LoadedModel:
    """What a model file holds: its config, its weights (Hugging Face names and layout; float tensors, or a
    GGUF's Q4_0/Q4_1/Q8_0 groups as they are), its tokenizer, and the weight format closest to the file."""

    config: ModelConfig
    weights: Mapping[str, Weight]
    tokenizer: Tokenizer
    source: str
    native_format: str = field(default="float")  # "int4" for a mostly-Q4 GGUF, "int8" for Q8_0, else "float"


def load_model(path: str | Path | None = None) -> LoadedModel:
    """Load `path` (a .gguf file or an HF directory); None loads the bundled SmolLM2-135M-Instruct."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf import load_gguf
    from rooftop.loading.hf import load_hf_dir

    path = Path(path) if path is not None else bundled_model_path()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory")
    if path.is_dir():
        return load_hf_dir(path)
    return load_gguf(path)
