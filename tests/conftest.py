"""Shared fixtures: the bundled model (loaded once per session) and tiny GGUF files written on the fly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from gguf_factory import write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="session")
def bundled_llm():
    from rooftop import LLM

    return LLM(dtype="float32")


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A 2-layer Llama GGUF with float32 weights, a byte vocabulary, ChatML and a 64-token context."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="session")
def tiny_llm(tiny_gguf):
    from rooftop import LLM

    return LLM(model=tiny_gguf)
