"""`rooftop serve` as a user runs it: a process that serves, stops gracefully on SIGTERM with exit status 0, and
refuses a bad model with one line and exit status 1."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
from gguf_factory import write_tiny_gguf
from serve_support import sse_events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rooftop", "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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


def read_stream(url: str, body: dict, into: list) -> None:
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            into.extend(sse_events(response.iter_lines()))
    except httpx.TransportError as e:
        into.append(f"cut: {e!r}")


def test_sigterm_finishes_short_requests_aborts_long_ones_and_exits_0(tmp_path):
    model = tmp_path / "tiny-8k.gguf"
    write_tiny_gguf(model, context_length=8192)  # 8000 tokens take far longer than the grace period, anywhere
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(
        "--model", str(model), "--port", str(port), "--shutdown-timeout", "4", "--kv-cache-bytes", str(64 << 20)
    )
    try:
        statuses = wait_healthy(url, process)
        assert set(statuses) <= {503, 200}
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == str(model)
        short, long = [], []
        greedy = {"temperature": 0, "ignore_eos": True, "stream": True}
        threads = [
            threading.Thread(target=read_stream, args=(url, {"prompt": "short", "max_tokens": 8, **greedy}, short)),
            threading.Thread(target=read_stream, args=(url, {"prompt": "long", "max_tokens": 8000, **greedy}, long)),
        ]
        for t in threads:
            t.start()
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        for t in threads:
            t.join(60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert short[-1] == "[DONE]" and '"finish_reason": "length"' in short[-2]  # finished within the grace period
    assert long[-1] == "[DONE]" and "the server shut down" in long[-2]  # aborted when the grace period ran out
    assert not any('"finish_reason": "length"' in event for event in long)


def serve_in_process(*args: str):
    from typer.testing import CliRunner

    from rooftop.cli import app

    return CliRunner(env={"COLUMNS": "250"}).invoke(app, ["serve", *args])


def test_a_model_that_cannot_load_ends_with_one_line_and_exit_1(tmp_path):
    result = serve_in_process("--model", str(tmp_path / "missing.gguf"), "--port", str(free_port()))
    assert result.exit_code == 1
    assert "error:" in result.stderr and "missing.gguf" in result.stderr and "Traceback" not in result.stderr


def test_bad_options_are_refused_before_loading():
    result = serve_in_process("--max-num-seqs", "0")
    assert result.exit_code == 1 and "max_num_seqs must be an integer >= 1" in result.stderr
    result = serve_in_process("--port", "70000")
    assert result.exit_code == 1 and "port must be in [0, 65535]" in result.stderr
