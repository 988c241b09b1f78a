"""LoadedModel: what a model file holds (config, lazily read weights, tokenizer), whichever loader read it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from rooftop.config import ModelConfig
from rooftop.loading.shard import Shard
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.weights import Weight


class LazyWeights(Mapping[str, Weight]):
    """Tensors read from the file when asked for, not before: the model builds each layer's linears from a few
    tensors at a time, so loading never holds the whole model widened to float32. Each reader takes the part of
    its tensor to read (a `Shard`, under tensor parallelism) or None for all of it. `file_names`: the file's own
    name of each tensor where it differs (a GGUF's `blk.0.attn_q.weight`), for errors that point into the file."""

    def __init__(
        self,
        readers: dict[str, Callable[[Shard | None], Weight]],
        release: Callable[[], None] | None = None,
        file_names: dict[str, str] | None = None,
    ):
        self._readers, self._release, self._file_names = readers, release, file_names or {}
        self._taken: set[str] = set()

    def untaken(self) -> list[str]:
        """The file's tensors no one has read: after a model is built, those it does not use."""
        return [name for name in self._readers if name not in self._taken]

    def described(self, name: str) -> str:
        """`name` as a user finds it in the file: the file's name, with the model's beside it where they differ."""
        file_name = self._file_names.get(name, name)
        return name if file_name == name else f"{file_name} ({name})"

    def release_pages(self) -> None:
        """Let go of the file's pages that reading mapped (a GGUF's tiles are made from views of its mapping):
        called as each layer is built, so a load holds one layer's pages of the file, not the whole file beside
        the model. Nothing changes for a view read after: its pages are mapped again from the page cache."""
        if self._release is not None:
            self._release()

    def __getitem__(self, name: str) -> Weight:
        self._taken.add(name)
        return self._readers[name](None)

    def read(self, name: str, shard: Shard | None) -> Weight:
        """Tensor `name`, or only its part `shard` (its other rows or columns are never read)."""
        self._taken.add(name)
        return self._readers[name](shard)

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)

    def __contains__(self, name: object) -> bool:  # without reading the tensor, as Mapping's default would
        return name in self._readers


@dataclass
class LoadedModel:
    """What a model file holds: its config, its weights (Hugging Face names and layout; float tensors, or a
    a GGUF's quantized blocks as they are), its tokenizer, and the weight format closest to the file."""

    config: ModelConfig
    weights: Mapping[str, Weight]
    tokenizer: Tokenizer
    source: str
    native_format: str = field(default="float")  # "int4" for a mostly 4-6-bit GGUF, "int8" for Q8_0, else "float"
    # HF name -> the GGUF type ("Q3_K") of each matrix the kernels do not run: the builder holds it as the weight
    # policy's groups (models/tensors.py)
    converted_types: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the loader left out, for the run's report
    # Gated DeltaNet value heads: "grouped" by key head (Hugging Face's) or "tiled" (llama.cpp's Qwen3.5 GGUFs:
    # value head j reads key head j % key heads)
    linear_value_order: str = "grouped"
    # what the file's transformer blocks hold, by the analyzer's name ("q4_k", "q4_k+q6_k", "bf16"); None where unknown
    file_format: str | None = None
