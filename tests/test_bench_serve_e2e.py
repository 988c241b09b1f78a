"""`rooftop bench serve` against the real `rooftop serve` on a loopback port (tiny model): a short run
completes with no failures and numbers that agree with each other and with the server's usage.

The tiny model's random weights emit bytes that are often not UTF-8; the server holds them back until they make
characters, so a request can get all its text in one chunk (E2E = TTFT, TPOT 0): the client can only time what
it receives."""

import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from rooftop.cli import app

pytest.importorskip("rooftop.serve.commands", reason="awaits `rooftop serve` (src/rooftop/serve)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rooftop_server(tiny_gguf):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rooftop", "serve", "--model", str(tiny_gguf), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "rooftop serve did not become healthy in 120 s"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield f"{url}/v1"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def check_run(data: dict, n: int, output_len: int, chat: bool) -> None:
    s = data["summary"]
    assert (s["completed"], s["failed"], s["errors"]) == (n, 0, {})
    assert s["total_output_tokens"] == n * output_len
    assert 0 < s["ttft_ms_median"] <= s["e2el_ms_median"] and s["tpot_ms_mean"] > 0 and s["itl_ms_mean"] > 0
    for r in data["requests"]:
        assert 0 < r["ttft_s"] <= r["e2el_s"] and r["send_time_s"] >= 0
        assert r["e2el_s"] == pytest.approx(r["ttft_s"] + sum(r["itl_s"]))
        if r["itl_s"]:  # text in two chunks or more: TPOT > 0
            assert (r["e2el_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) > 0
        # ignore_eos: every request makes max_tokens tokens, as the server's usage says
        assert (r["output_tokens"], r["output_tokens_from"]) == (output_len, "usage")
        if chat:  # the chat template's tokens come on top of the prompt's
            assert r["server_prompt_tokens"] > r["prompt_len"]
        else:  # the same tokenizer on both sides
            assert r["server_prompt_tokens"] == r["prompt_len"]


def test_completions_through_the_real_command(rooftop_server, tiny_gguf, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rooftop",
            "bench",
            "serve",
            "--base-url",
            rooftop_server,
            "--tokenizer",
            str(tiny_gguf),
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--num-prompts",
            "8",
            "--max-concurrency",
            "4",
            "--save-result",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "Successful requests" in r.stdout and "Traceback" not in r.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["config"]["model"] == "tiny"  # asked of GET /v1/models: the file's name, never its path
    check_run(data, 8, 6, chat=False)
    assert data["summary"]["peak_concurrent_requests"] <= 4


def test_chat_at_a_poisson_rate(rooftop_server, tiny_gguf, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "serve",
            "--base-url",
            rooftop_server,
            "--endpoint",
            "chat",
            "--tokenizer",
            str(tiny_gguf),
            "--input-len",
            "6",
            "--output-len",
            "5",
            "--num-prompts",
            "6",
            "--request-rate",
            "20",
            "--save-result",
            str(tmp_path / "c.json"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    check_run(json.loads((tmp_path / "c.json").read_text()), 6, 5, chat=True)
