"""`rooftop bench serve` (load any OpenAI-compatible server, vLLM's options and metrics) and `rooftop bench
report` (re-print, or re-analyse with other SLOs, a saved result)."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

import rooftop
from rooftop.console import check_output_file, check_output_folder, err, user_errors
from rooftop.errors import InvalidRequestError, RooftopError

ENDPOINTS = {
    "chat": "chat",
    "completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
}

Opt = typer.Option


def serve(
    ctx: typer.Context,
    base_url: Annotated[
        str, Opt(help="the server's OpenAI API root (a bare http://host:port gets /v1)")
    ] = "http://127.0.0.1:8000/v1",
    model: Annotated[str | None, Opt(help="model name to send (default: the first id of GET /v1/models)")] = None,
    endpoint: Annotated[str, Opt(help="chat (/v1/chat/completions) or completions (/v1/completions)")] = "completions",
    dataset: Annotated[str, Opt("--dataset", "--dataset-name", help="random, sharegpt or jsonl")] = "random",
    dataset_path: Annotated[Path | None, Opt(help="ShareGPT JSON or JSONL file with a 'prompt' field per line")] = None,
    num_prompts: Annotated[int, Opt(help="requests to send")] = 1000,
    input_len: Annotated[int, Opt("--input-len", "--random-input-len", help="random: prompt tokens")] = 1024,
    output_len: Annotated[
        int | None,
        Opt("--output-len", "--random-output-len", help="max_tokens (default 128; ShareGPT: each reply's length)"),
    ] = None,
    range_ratio: Annotated[
        float, Opt("--range-ratio", "--random-range-ratio", help="random: lengths uniform in len x [1-r, 1+r]")
    ] = 0.0,
    request_rate: Annotated[float, Opt(help="requests per second, or inf for all at once")] = math.inf,
    burstiness: Annotated[
        float, Opt(help="gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 steadier")
    ] = 1.0,
    max_concurrency: Annotated[int | None, Opt(help="most requests in flight (default: no cap)")] = None,
    goodput: Annotated[list[str] | None, Opt(help="SLOs in ms, e.g. --goodput ttft:500 tpot:50 e2el:2000")] = None,
    seed: Annotated[int, Opt(help="seeds prompts and arrivals")] = 0,
    tokenizer: Annotated[
        str | None, Opt(help="GGUF file or HF directory for prompts and token counts (default: bundled SmolLM2)")
    ] = None,
    api_key: Annotated[
        str | None,
        Opt(
            envvar="OPENAI_API_KEY",
            show_envvar=False,
            help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)",
        ),
    ] = None,
    ignore_eos: Annotated[bool, Opt(help="send ignore_eos: true so every request makes max_tokens tokens")] = True,
    timeout: Annotated[float, Opt(help="seconds before a request counts as failed")] = 3600.0,
    save_result: Annotated[
        str | None,
        Opt(
            help="write the summary and every request's record as JSON: into FILE, or, given alone as vLLM's flag, "
            "into --result-dir as --result-filename"
        ),
    ] = None,
    result_dir: Annotated[Path | None, Opt(help="with a bare --save-result: the folder (default: here)")] = None,
    result_filename: Annotated[
        str | None,
        Opt(help="with a bare --save-result: the file's name (default: vLLM's, e.g. openai-infqps-MODEL-DATE.json)"),
    ] = None,
    plots: Annotated[Path | None, Opt(help="write PNG plots into this directory")] = None,
    sweep_concurrency: Annotated[
        str | None, Opt(help="run once per max concurrency, e.g. 1,2,4,8,16 (with --plots: plotted against it)")
    ] = None,
) -> None:
    """Load an OpenAI-compatible server with streamed requests; report TTFT, TPOT, ITL, E2E and throughput."""
    from rooftop.bench.serve.arrivals import arrival_offsets
    from rooftop.bench.serve.client import Target, api_base, server_model
    from rooftop.bench.serve.datasets import build_requests, load_tokenizer

    with user_errors():
        saved = _result_path(save_result, result_dir, result_filename)
        check_output_folder(plots, "--plots")
        slos = _slos(ctx, goodput)
        levels = _levels(sweep_concurrency) if sweep_concurrency else [max_concurrency]
        if sweep_concurrency and max_concurrency:
            raise InvalidRequestError("--sweep-concurrency sets each run's max concurrency: drop --max-concurrency")
        if num_prompts < 1 or (max_concurrency is not None and max_concurrency < 1) or not timeout > 0:
            raise InvalidRequestError("--num-prompts and --max-concurrency must be >= 1 and --timeout > 0")
        if endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"--endpoint must be chat or completions, got {endpoint!r}")
        base = api_base(base_url)
        offsets = arrival_offsets(num_prompts, request_rate, burstiness, seed)
        with err.status("loading the tokenizer and building the prompts..."):
            tok = load_tokenizer(tokenizer)
            requests = build_requests(dataset, dataset_path, tok, num_prompts, input_len, output_len, range_ratio, seed)
        chat = ENDPOINTS[endpoint] == "chat"
        name = asyncio.run(server_model(base, model, api_key))
        if saved is not None and saved.is_dir():  # vLLM's name, now that the model's is known
            saved = saved / _vllm_result_name(
                ENDPOINTS[endpoint], request_rate, sweep_concurrency, max_concurrency, name
            )
            check_output_file(saved, "--save-result")
        target = Target(
            f"{base}/{'chat/completions' if chat else 'completions'}", name, chat, ignore_eos, timeout, api_key
        )
        config = {
            "url": target.url,
            "model": target.model,
            "endpoint": ENDPOINTS[endpoint],
            "dataset": dataset,
            "dataset_path": str(dataset_path) if dataset_path else None,
            "num_prompts": num_prompts,
            "input_len": input_len if dataset == "random" else None,
            "output_len": output_len,
            "range_ratio": range_ratio,
            "request_rate": "inf" if math.isinf(request_rate) else request_rate,
            "burstiness": burstiness,
            "seed": seed,
            "ignore_eos": ignore_eos,
            "timeout_s": timeout,
            "tokenizer": tokenizer or "bundled SmolLM2-135M-Instruct",
            "rooftop": rooftop.__version__,
        }
        _test_request(target, requests[0], tok)
        runs = [
            _run(target, requests, offsets, level, tok, slos, {**config, "max_concurrency": level}) for level in levels
        ]
        result = {"sweep_concurrency": levels, "runs": runs} if sweep_concurrency else runs[0]
        from rooftop.bench.serve.report import print_result

        print_result(Console(highlight=False), result)
        if saved is not None:
            try:
                saved.write_text(json.dumps(result, indent=1))
            except OSError as e:
                raise RooftopError(f"cannot write {saved}: {e}") from None
            err.print(f"results written to {saved}")
        if plots:
            _write_plots(result, plots)


def _result_path(save_result: str | None, result_dir: Path | None, result_filename: str | None) -> Path | None:
    """Where the results go, checked before the run: --save-result FILE, or vLLM's bare --save-result (the empty
    string here: VllmBenchOptions) with --result-dir (made where missing) and --result-filename. A folder is returned
    where the file's name is vLLM's default, which needs the served model's name."""
    if save_result is None:
        if result_dir is not None or result_filename is not None:
            raise InvalidRequestError(
                "--result-dir and --result-filename say where --save-result writes: add --save-result"
            )
        return None
    if save_result:
        if result_dir is not None or result_filename is not None:
            raise InvalidRequestError(
                f"--save-result {save_result} names the file itself: drop --result-dir and --result-filename, or give "
                "--save-result alone"
            )
        check_output_file(Path(save_result), "--save-result")
        return Path(save_result)
    folder = result_dir or Path.cwd()
    check_output_folder(folder, "--result-dir")
    folder.mkdir(parents=True, exist_ok=True)
    if result_filename is None:
        return folder
    if Path(result_filename).name != result_filename:
        raise InvalidRequestError(f"--result-filename {result_filename}: a file's name, not a path (--result-dir)")
    check_output_file(folder / result_filename, "--result-filename")
    return folder / result_filename


def _vllm_result_name(
    endpoint: str, request_rate: float, sweep_concurrency: str | None, max_concurrency: int | None, model: str
) -> str:
    """`vllm bench serve`'s file name: backend (openai, or openai-chat), rate, concurrency, model, date and time."""
    backend = "openai-chat" if endpoint == "chat" else "openai"
    levels = sweep_concurrency.replace(",", "-") if sweep_concurrency else max_concurrency
    concurrency = f"-concurrency{levels}" if levels is not None else ""
    when = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{backend}-{request_rate}qps{concurrency}-{model.rstrip('/').split('/')[-1]}-{when}.json"


def report(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="a JSON file written by `rooftop bench serve --save-result`")],
    goodput: Annotated[
        list[str] | None, Opt(help="re-judge against these SLOs in ms, e.g. --goodput ttft:500 tpot:50")
    ] = None,
    plots: Annotated[Path | None, Opt(help="redraw the PNG plots into this directory")] = None,
) -> None:
    """Recompute and print the tables of a saved `rooftop bench serve` result from its request records."""
    from rooftop.bench.serve.metrics import RequestRecord, summarize
    from rooftop.bench.serve.report import print_result

    with user_errors():
        check_output_folder(plots, "--plots")
        slos = _slos(ctx, goodput)
        try:
            result = json.loads(path.read_text())
            runs = result["runs"] if "sweep_concurrency" in result else [result]
            for run in runs:
                records = [RequestRecord.from_dict(r) for r in run["requests"]]
                saved = run["summary"]
                run["summary"] = {**saved, **summarize(records, saved["duration_s"], slos or saved["goodput_slos_ms"])}
        except (OSError, UnicodeDecodeError) as e:
            raise RooftopError(f"{path}: cannot read ({e})") from None
        except (ValueError, KeyError, TypeError) as e:
            raise RooftopError(f"{path}: not a `rooftop bench serve` result ({type(e).__name__}: {e})") from None
        print_result(Console(highlight=False), result)
        if plots:
            _write_plots(result, plots)


def _slos(ctx: typer.Context, goodput: list[str] | None) -> dict[str, float]:
    """vLLM's `--goodput ttft:500 tpot:50`: the values after the first reach the command as extra arguments."""
    from rooftop.bench.serve.metrics import parse_goodput

    if ctx.args and not goodput:
        raise InvalidRequestError(f"unexpected argument {ctx.args[0]!r}")
    return parse_goodput([*(goodput or []), *ctx.args])


def _levels(text: str) -> list[int]:
    try:
        levels = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise InvalidRequestError(f"--sweep-concurrency takes integers >= 1 like 1,2,4,8, got {text!r}")
    return levels


def _test_request(target, request, tok) -> None:
    """One request before the run, as vLLM's bench sends: a wrong model name or endpoint fails here, once."""
    from rooftop.bench.serve.runner import run_load

    with err.status("sending a test request..."):
        record = asyncio.run(run_load(target, [request], [0.0], 1, tok)).records[0]
    if not record.ok:
        raise RooftopError(f"the test request to {target.url} failed: {record.error}")


def _run(target, requests, offsets, level, tok, slos, config) -> dict:
    """One run at one concurrency level, with a progress bar; the saved form of its result."""
    from rooftop.bench.serve.metrics import summarize
    from rooftop.bench.serve.runner import run_load

    config["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    failed = 0
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task(f"concurrency {level or 'unlimited'}", total=len(requests))

        def done(record) -> None:
            nonlocal failed
            failed += not record.ok
            progress.update(task, advance=1, description=f"concurrency {level or 'unlimited'}, {failed} failed")

        out = asyncio.run(run_load(target, requests, offsets, level, tok, done))
    summary = {**summarize(out.records, out.duration_s, slos), **out.client}
    return {"config": config, "summary": summary, "requests": [r.to_dict() for r in out.records]}


def _write_plots(result: dict, directory: Path) -> None:
    from rooftop.bench.serve.metrics import RequestRecord
    from rooftop.bench.serve.plots import concurrency_plot, latency_plot

    try:
        directory.mkdir(parents=True, exist_ok=True)
        if "sweep_concurrency" in result:
            summaries = [r["summary"] for r in result["runs"]]
            path = concurrency_plot(result["sweep_concurrency"], summaries, directory / "concurrency.png")
        else:
            path = latency_plot([RequestRecord.from_dict(r) for r in result["requests"]], directory / "latency.png")
    except OSError as e:
        raise RooftopError(f"cannot write the plots into {directory}: {e}") from None
    err.print(f"plot written to {path}")
