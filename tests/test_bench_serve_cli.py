"""`rooftop bench serve` and `rooftop bench report` as a user runs them against the scripted server: the
table, the saved JSON, the plots, the re-printed report, a sweep, failures, and one-line errors."""

import json
import re
import socket
import subprocess

import pytest
from scripted_openai_server import MODEL, Script, ScriptedServer
from typer.testing import CliRunner

from rooftop.bench.serve.datasets import jsonl_requests, load_tokenizer
from rooftop.cli import app

PNG = b"\x89PNG\r\n\x1a\n"


def rooftop(*args):
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(Script(first_delay=0.03, gap=0.01)) as s:
        yield s


def test_run_prints_the_table_saves_json_and_plots_and_report_reprints_it(server, tmp_path):
    r = rooftop(
        "bench",
        "serve",
        "--base-url",
        server.base_url,
        "--input-len",
        16,
        "--output-len",
        4,
        "--num-prompts",
        6,
        "--max-concurrency",
        3,
        "--goodput",
        "ttft:1000",
        "tpot:1000",
        "--save-result",
        tmp_path / "r.json",
        "--plots",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    for row in (
        "Successful requests",
        "Failed requests",
        "Benchmark duration (s)",
        "Request throughput (req/s)",
        "Output token throughput (tok/s)",
        "Peak output token throughput (tok/s)",
        "Total token throughput (tok/s)",
        "Request goodput (req/s) [ttft <= 1000 ms, tpot <= 1000 ms]",
        "TTFT",
        "TPOT",
        "ITL",
        "E2E latency",
        "client overhead per chunk",
        MODEL,
    ):
        assert row in r.stdout, row
    data = json.loads((tmp_path / "r.json").read_text())
    s = data["summary"]
    assert (s["completed"], s["failed"], s["total_input_tokens"], s["total_output_tokens"]) == (6, 0, 96, 24)
    assert s["goodput_req_per_s"] == pytest.approx(6 / s["duration_s"])
    assert s["ttft_ms_p99"] >= s["ttft_ms_median"] >= 30 and s["peak_concurrent_requests"] <= 3
    assert data["config"]["max_concurrency"] == 3 and data["config"]["request_rate"] == "inf"
    assert len(data["requests"]) == 6
    for rec in data["requests"]:
        assert rec["error"] is None and rec["prompt_len"] == 16 and rec["output_tokens"] == 4 and len(rec["itl_s"]) == 3
        assert rec["send_time_s"] >= 0 and 0 < rec["ttft_s"] <= rec["e2el_s"]
    assert (tmp_path / "latency.png").read_bytes()[:8] == PNG
    again = rooftop("bench", "report", tmp_path / "r.json")
    assert again.returncode == 0 and again.stdout == r.stdout
    strict = rooftop("bench", "report", tmp_path / "r.json", "--goodput", "ttft:1", "e2el:5000")
    assert re.search(r"Request goodput \(req/s\) \[ttft <= 1 ms, e2el <= 5000 ms\] +0\.00 ", strict.stdout), (
        strict.stdout
    )


def test_api_key_is_sent_as_a_bearer_token(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server.authorizations.clear()
    r = rooftop(
        "bench", "serve", "--base-url", server.base_url, "--num-prompts", 2, "--input-len", 4, "--output-len", 2
    )
    assert r.returncode == 0, r.stderr
    assert server.authorizations == ["Bearer sk-test"] * 3  # the test request, then the two


def test_concurrency_sweep(server, tmp_path):
    r = rooftop(
        "bench",
        "serve",
        "--base-url",
        server.base_url,
        "--input-len",
        8,
        "--output-len",
        3,
        "--num-prompts",
        4,
        "--sweep-concurrency",
        "1,4",
        "--plots",
        tmp_path,
        "--save-result",
        tmp_path / "s.json",
    )
    assert r.returncode == 0, r.stderr
    assert "Concurrency sweep" in r.stdout
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["sweep_concurrency"] == [1, 4] and [run["config"]["max_concurrency"] for run in data["runs"]] == [1, 4]
    one, four = (run["summary"] for run in data["runs"])
    assert one["peak_concurrent_requests"] == 1 and four["peak_concurrent_requests"] == 4
    assert four["duration_s"] < one["duration_s"]
    assert (tmp_path / "concurrency.png").read_bytes()[:8] == PNG
    assert rooftop("bench", "report", tmp_path / "s.json").stdout == r.stdout


def test_vllms_bare_save_result_writes_into_result_dir(server, tmp_path, monkeypatch):
    """`vllm bench serve --save-result --result-dir D [--result-filename F]`: the flag alone, the file placed by
    the other two, named as vLLM names it where F is not given; the flag last writes into the current folder."""
    monkeypatch.chdir(tmp_path)
    args = ["bench", "serve", "--base-url", server.base_url, "--input-len", 4, "--output-len", 2, "--num-prompts", 2]
    named = rooftop(*args, "--save-result", "--result-dir", tmp_path / "out", "--result-filename", "r.json")
    assert named.returncode == 0, named.stderr
    assert json.loads((tmp_path / "out" / "r.json").read_text())["summary"]["completed"] == 2
    default = rooftop(*args, "--max-concurrency", 2, "--save-result")
    assert default.returncode == 0, default.stderr
    [written] = [p.name for p in tmp_path.glob("*.json")]
    assert re.fullmatch(rf"openai-infqps-concurrency2-{MODEL.split('/')[-1]}-\d{{8}}-\d{{6}}\.json", written), written
    assert f"results written to {tmp_path / written}" in default.stderr


def test_a_sweep_writes_plots_only_where_asked(server, tmp_path, monkeypatch):
    """Without --plots no PNG is written, not even concurrency.png into the current directory (as the engine's
    sweep, which writes its plots only into --plots DIR)."""
    monkeypatch.chdir(tmp_path)
    args = ["--input-len", 4, "--output-len", 2, "--num-prompts", 1, "--sweep-concurrency", "1"]
    r = rooftop("bench", "serve", "--base-url", server.base_url, *args)
    assert r.returncode == 0, r.stderr
    assert "Concurrency sweep" in r.stdout and list(tmp_path.iterdir()) == [] and "plot written" not in r.stderr


def test_failed_requests_are_reported_and_saved(server, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("ok a", "ok b", "FAIL500 c", "ok d")))
    tok = load_tokenizer(None)
    seed = next(
        s for s in range(10) if "FAIL" not in jsonl_requests(path, tok, 4, 3, s)[0].prompt
    )  # the test request is the first
    r = rooftop(
        "bench",
        "serve",
        "--base-url",
        server.base_url,
        "--dataset",
        "jsonl",
        "--dataset-path",
        path,
        "--num-prompts",
        4,
        "--output-len",
        3,
        "--seed",
        seed,
        "--save-result",
        tmp_path / "f.json",
    )
    assert r.returncode == 0, r.stderr
    assert "Failed requests at" not in r.stdout and 'HTTP 500: {"error": {"message": "scripted failure"}}' in r.stdout
    data = json.loads((tmp_path / "f.json").read_text())
    assert (data["summary"]["completed"], data["summary"]["failed"], data["summary"]["total_output_tokens"]) == (
        3,
        1,
        9,
    )
    [failed] = [rec for rec in data["requests"] if rec["error"]]
    assert failed["error"].startswith("HTTP 500") and failed["output_tokens"] is None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--goodput", "ttft=5"], ["--goodput takes NAME:MS"]),
        (["--goodput", "ttft:5", "bogus"], ["got 'bogus'"]),
        (["stray"], ["unexpected argument 'stray'"]),
        (["--sweep-concurrency", "1,x"], ["--sweep-concurrency takes integers"]),
        (["--sweep-concurrency", "1,2", "--max-concurrency", "2"], ["drop --max-concurrency"]),
        (["--endpoint", "embeddings"], ["--endpoint must be chat or completions"]),
        (["--base-url", "localhost:8000"], ["--base-url must look like"]),
        (["--request-rate", "0"], ["--request-rate must be > 0"]),
        (["--num-prompts", "0"], ["--num-prompts"]),
        (["--dataset", "parquet"], ["--dataset must be random, sharegpt or jsonl"]),
        (["--dataset", "jsonl"], ["needs --dataset-path"]),
        (["--dataset", "sharegpt", "--dataset-path", "/nonexistent.json"], ["/nonexistent.json: cannot read"]),
        (["--tokenizer", "/nonexistent.gguf"], ["--tokenizer /nonexistent.gguf: no such file"]),
        # before the load runs, not after it: its results would be lost
        (["--save-result", "/nonexistent/r.json"], ["--save-result /nonexistent/r.json: no folder /nonexistent"]),
        (["--plots", __file__], [f"--plots {__file__}: {__file__} is a file, not a folder"]),
        # vllm bench serve's options spelt otherwise here: named, with what to use
        (["--backend", "openai-chat"], ["vllm bench serve's --backend has no counterpart", "--endpoint chat"]),
        (["--host", "127.0.0.1", "--port", "8000"], ["--host has no counterpart", "--base-url http://HOST:PORT/v1"]),
        # vLLM's --result-dir and --result-filename place a bare --save-result's file, and nothing without it
        (["--result-dir", "out"], ["--result-dir and --result-filename say where --save-result writes"]),
        (["--save-result", "r.json", "--result-dir", "out"], ["--save-result r.json names the file itself"]),
        (["--save-result", "--result-filename", "a/r.json"], ["--result-filename a/r.json: a file's name, not a path"]),
        (["--save-result", "--result-dir", __file__], [f"--result-dir {__file__}: {__file__} is a file"]),
        (["--percentile-metrics=ttft"], ["--percentile-metrics has no counterpart", "p90 and p99"]),
    ],
)
def test_bad_input_is_one_line(args, words):
    r = rooftop("bench", "serve", "--num-prompts", 2, "--input-len", 4, *args)
    assert_user_error(r, *words)


def assert_user_error(r, *words):
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error:"), r.stderr
    for word in words:
        assert word in line, (word, line)


def test_unreachable_server_and_wrong_model(server, tmp_path):
    down = rooftop(
        "bench", "serve", "--base-url", f"http://127.0.0.1:{closed_port()}/v1", "--num-prompts", 1, "--input-len", 4
    )
    assert_user_error(down, "cannot reach", "/v1/models", "ConnectError")
    wrong = rooftop(
        "bench", "serve", "--base-url", server.base_url, "--model", "nope", "--num-prompts", 1, "--input-len", 4
    )
    assert_user_error(wrong, "the test request to", "failed: HTTP 404", "does not exist")
    bad = tmp_path / "bad.json"
    bad.write_text('{"summary": {}}')
    assert_user_error(rooftop("bench", "report", bad), "not a `rooftop bench serve` result")
    assert_user_error(rooftop("bench", "report", tmp_path / "missing.json"), "cannot read")
    (tmp_path / "sg.json").write_text("[{")
    sharegpt = rooftop(
        "bench", "serve", "--dataset", "sharegpt", "--dataset-path", tmp_path / "sg.json", "--num-prompts", 1
    )
    assert_user_error(sharegpt, "sg.json: not valid JSON")
