"""Fixtures and helpers of the server tests: a tiny model with a long context, a real server on a loopback port."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from reliability_support import parse_metrics

from rooftop.engine.outputs import StepOutput

KV_BYTES = 64 << 20


@pytest.fixture(scope="session")
def long_gguf(tmp_path_factory) -> Path:
    """The tiny random Llama with a 2048-token context, so one request can run long enough to be interrupted."""
    path = tmp_path_factory.mktemp("serve") / "tiny-long.gguf"
    write_tiny_gguf(path, context_length=2048)
    return path


@contextlib.contextmanager
def running_server(model: Path, engine: dict | None = None, llm=None, **config) -> Iterator[str]:
    """A real server for `model` (or an already loaded `llm`) on a free loopback port; yields its base URL."""
    from rooftop import LLM
    from rooftop.serve.app import create_app
    from rooftop.serve.config import ServeConfig
    from rooftop.serve.server import serve_in_thread

    llm = llm or LLM(model=model, kv_cache_bytes=KV_BYTES, **(engine or {}))
    app = create_app(ServeConfig(**config), llm)
    with serve_in_thread(app) as url:
        yield url


class HeldEngine:
    """An LLM's engine held by the test, so that no request can finish before the test has done its part, however
    fast the host: the first `steps` steps run, then each step does nothing until `release()` (the engine thread
    stays free to take commands between them: new requests, a client's abort). `held` is set once it holds."""

    def __init__(self, llm, steps: int = 1):
        self.step, self.steps, self.ran = llm.engine.step, steps, 0
        self.held, self.released = threading.Event(), threading.Event()
        llm.engine.step = self._step

    def _step(self):
        if self.ran >= self.steps and not self.released.is_set():
            self.held.set()
            self.released.wait(0.01)  # then back to the engine loop, which reads its commands
            return StepOutput()
        self.ran += 1
        return self.step()

    def release(self) -> None:
        self.released.set()


@contextlib.contextmanager
def held_server(
    model: Path, steps: int = 1, engine: dict | None = None, **config
) -> Iterator[tuple[str, object, HeldEngine]]:
    """A real server for `model` whose engine holds after `steps` steps (see HeldEngine); yields the URL, the LLM
    and the hold. The hold is released on the way out, whatever happened."""
    from rooftop import LLM

    llm = LLM(model=model, kv_cache_bytes=KV_BYTES, **(engine or {}))
    hold = HeldEngine(llm, steps)
    with running_server(model, llm=llm, **config) as url:
        try:
            yield url, llm, hold
        finally:
            hold.release()


@contextlib.contextmanager
def spied_server(model: Path, **config) -> Iterator[tuple[str, list[int]]]:
    """A real server for `model` (256-token context, 64 KiB bodies) whose tokenizer records the length of each text
    it encodes; yields the URL and that list."""
    from rooftop import LLM

    llm = LLM(model=model, kv_cache_bytes=KV_BYTES, max_model_len=256)
    encode, seen = llm.tokenizer.encode, []

    def spy(text, *args):
        seen.append(len(text))
        return encode(text, *args)

    llm.tokenizer.encode = spy
    with running_server(model, llm=llm, **{"max_body_bytes": 64 << 10, **config}) as url:
        yield url, seen


@pytest.fixture(scope="module")
def server(long_gguf) -> Iterator[str]:
    """The shared server of a test module: the tiny model, a 256-token context, at most 64 requests in a step,
    prefill chunks of one block (so the prefix cache is reused block by block, as batch invariance allows then)."""
    with running_server(long_gguf, {"max_model_len": 256, "chunked_prefill_size": 16}, max_body_bytes=64 << 10) as url:
        yield url


def metrics(url: str) -> dict[str, float]:
    """Every sample of GET /metrics, parsed by prometheus-client: {'name{label="v"}': value}."""
    return parse_metrics(httpx.get(f"{url}/metrics").text)


def api_error(response: httpx.Response, status: int) -> dict:
    """The OpenAI-style error of `response`, which must have `status`."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and set(error) == {"message", "type", "param", "code"}
    return error


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event."""
    for line in lines:
        if line.startswith("data: "):
            yield line.removeprefix("data: ")
