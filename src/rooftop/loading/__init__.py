"""Loading models: GGUF files, Hugging Face directories, the bundled default, and their tokenizers."""

import json
from pathlib import Path

from rooftop.errors import ModelLoadError


def read_json(path: Path):
    """A JSON file's contents, or a ModelLoadError naming the file."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
