"""Shared fixtures: the bundled model (loaded once per session) and tiny GGUF files written on the fly."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from gguf_factory import write_tiny_gguf  # noqa: E402

pytest_plugins = ["serve_support"]  # the server tests' fixtures (long_gguf, server)


@pytest.fixture(scope="session", autouse=True)
def probe_cache(tmp_path_factory) -> Path:
    """Measured roofs for every test (and the CLI subprocesses it starts): a quick probe of this machine,
    cached where rooftop looks, so that attribution never spends a full probe's seconds inside the suite."""
    from rooftop.engine.probe import run_probe
    from rooftop.roofline.probe import cache_path

    os.environ["ROOFTOP_CACHE_DIR"] = str(tmp_path_factory.mktemp("rooftop-cache"))
    data = run_probe(quick=True).to_dict()
    data["quick"] = False  # let it answer the full requests the CLI makes
    cache_path().write_text(json.dumps(data))
    return cache_path()


@pytest.fixture(scope="session")
def bundled_llm():
    from rooftop import LLM

    return LLM(dtype="float32", weights="float")  # the reference: the file's values widened exactly


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
