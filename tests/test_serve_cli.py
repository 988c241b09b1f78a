"""`rooftop serve` as a user runs it: a process that serves, stops gracefully on SIGTERM with exit status 0, and
refuses a bad model with one line and exit status 1."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gguf_factory import write_tiny_gguf
from serve_support import sse_events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `python -m rooftop serve ...`, with its engine's steps held and paced for the test, which then decides when the
# requests may go on instead of guessing how fast this host generates. Until the release file exists, a step does
# nothing once every request has its first token (the engine thread still takes new requests and the stop in
# between); after, each step first waits 5 ms, so 8000 tokens take over 40 s, ten grace periods, on any host.
HELD_SERVE = """
import os, time
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.outputs import StepOutput

release, step = os.environ["ROOFTOP_TEST_RELEASE"], LLMEngine.step

def held_step(self):  # white-box: the engine's own request table says who has a first token
    if not os.path.exists(release):
        if self._requests and all(seq.output_token_ids for seq in self._requests.values()):
            time.sleep(0.01)
            return StepOutput()
    else:
        time.sleep(0.005)
    return step(self)

LLMEngine.step = held_step
from rooftop.cli import app
app(prog_name="rooftop")
"""


def start_held(release: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HELD_SERVE, "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ROOFTOP_TEST_RELEASE": str(release)},
    )


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 90.0) -> list[int]:
    """Poll /health until 200; returns the statuses seen on the way."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            seen.append(httpx.get(f"{url}/health").status_code)
        except httpx.TransportError:
            pass
        if seen and seen[-1] == 200:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"not healthy within {timeout} s")


def read_stream(url: str, body: dict, into: list, started: threading.Event) -> None:
    """The request's events into `into`; `started` is set at its first event (or when it fails before one)."""
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            for event in sse_events(response.iter_lines()):
                into.append(event)
                started.set()
    except httpx.TransportError as e:
        into.append(f"cut: {e!r}")
    finally:
        started.set()


def wait_refused(port: int, timeout: float = 30.0) -> None:
    """Until the port refuses connections: the server has closed its socket, its shutdown has begun."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return
        time.sleep(0.01)
    raise AssertionError(f"port {port} still accepts connections after {timeout} s")


def test_sigterm_finishes_short_requests_aborts_long_ones_and_exits_0(tmp_path):
    """Both requests are held in flight until the server has begun to stop; then the short one needs at most 7 more
    steps and the long one at least 7998, each over 5 ms: it cannot finish within the 4 s grace period, however
    fast the host."""
    model = tmp_path / "tiny-8k.gguf"
    write_tiny_gguf(model, context_length=8192)
    port, release = free_port(), tmp_path / "release"
    url = f"http://127.0.0.1:{port}"
    process = start_held(
        release,
        "--model",
        str(model),
        "--port",
        str(port),
        "--shutdown-timeout",
        "4",
        "--kv-cache-bytes",
        str(64 << 20),
    )
    try:
        statuses = wait_healthy(url, process)
        assert set(statuses) <= {503, 200}
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny-8k"  # the file's name, not its path
        short, long, started = [], [], [threading.Event(), threading.Event()]
        greedy = {"temperature": 0, "ignore_eos": True, "stream": True, "logprobs": 1}  # an event for every token
        bodies = [{"prompt": "short", "max_tokens": 8, **greedy}, {"prompt": "long", "max_tokens": 8000, **greedy}]
        threads = [
            threading.Thread(target=read_stream, args=(url, body, into, event))
            for body, into, event in zip(bodies, (short, long), started, strict=True)
        ]
        for t in threads:
            t.start()
        assert all(event.wait(60) for event in started)
        assert "[DONE]" not in short + long  # both in flight, held there
        process.send_signal(signal.SIGTERM)
        wait_refused(port)
        release.touch()
        _, stderr = process.communicate(timeout=60)
        for t in threads:
            t.join(60)
    finally:
        release.touch()
        process.kill()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert short[-1] == "[DONE]" and '"finish_reason": "length"' in short[-2]  # finished within the grace period
    assert long[-1] == "[DONE]" and "the server shut down" in long[-2]  # aborted when the grace period ran out
    assert not any('"finish_reason": "length"' in event for event in long)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_exits_at_once_without_abort(tmp_path, sig):
    """A stream is held in flight and the grace period is a minute: only the second signal can end the server
    within the test's bounds, with 128 + the signal's number and no C++ runtime dying on the way out."""
    model = tmp_path / "tiny-long.gguf"
    write_tiny_gguf(model, context_length=2048)
    port, release = free_port(), tmp_path / "release"  # never released: the stream stays in flight
    url = f"http://127.0.0.1:{port}"
    process = start_held(release, "--model", str(model), "--port", str(port), "--shutdown-timeout", "60")
    try:
        wait_healthy(url, process)
        events, started = [], threading.Event()
        body = {"prompt": "long", "max_tokens": 2000, "stream": True, "ignore_eos": True, "logprobs": 1}
        reader = threading.Thread(target=read_stream, args=(url, body, events, started))
        reader.start()
        assert started.wait(60) and "[DONE]" not in events
        process.send_signal(sig)
        wait_refused(port)  # the graceful stop has begun, the stream still runs
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=20)
        reader.join(60)
    finally:
        process.kill()
    assert process.returncode == 128 + sig, stderr
    assert "exiting now" in stderr
    assert "terminate called" not in stderr and "Traceback" not in stderr
    assert "[DONE]" not in events


def serve_in_process(*args: str):
    """`rooftop serve` in this process. Its logging config (uvicorn's, with rooftop's logger) binds handlers to the
    runner's stderr, which is closed when the runner returns: the loggers are put back as they were, so that later
    tests' log lines do not go to a closed stream."""
    from typer.testing import CliRunner

    from rooftop.cli import app

    names = ["rooftop", "uvicorn", "uvicorn.error", "uvicorn.access"]
    saved = {n: (lg.handlers[:], lg.level, lg.propagate) for n, lg in ((n, logging.getLogger(n)) for n in names)}
    try:
        return CliRunner(env={"COLUMNS": "250"}).invoke(app, ["serve", *args])
    finally:
        for name, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


def test_a_model_that_cannot_load_ends_with_one_line_and_exit_1(tmp_path):
    """A missing path is refused before the server starts (it said it was up, then stopped); a file that is there but
    not a model fails in the load, after it, with the same one line."""
    missing = serve_in_process("--model", str(tmp_path / "missing.gguf"), "--port", str(free_port()))
    assert missing.exit_code == 1
    assert "error:" in missing.stderr and "missing.gguf: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr and "Uvicorn running" not in missing.stderr
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file" * 10)
    result = serve_in_process("--model", str(broken), "--port", str(free_port()))
    assert result.exit_code == 1
    assert "error:" in result.stderr and "broken.gguf" in result.stderr and "Traceback" not in result.stderr


def test_a_port_in_use_is_refused_before_loading():
    """uvicorn binds after the app's start, which loads the model: a port another process holds failed only then."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        result = serve_in_process("--port", str(taken))
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{taken}" in result.stderr
    assert "loading" not in result.stderr


def test_bad_options_are_refused_before_loading():
    result = serve_in_process("--max-num-seqs", "0")
    assert result.exit_code == 1 and "max_num_seqs must be an integer >= 1" in result.stderr
    result = serve_in_process("--port", "70000")
    assert result.exit_code == 1 and "port must be in [0, 65535]" in result.stderr
