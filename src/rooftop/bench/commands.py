"""`rooftop bench`: the sweep (table, JSON, plots, HTML) or, with -p/-n/-pg/-d/-ub/-o or several -t counts,
llama-bench's tests (the quick mode); its subcommands `serve` and `report` load and report on any OpenAI-compatible
server."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rooftop.bench.quick import BenchTest
from rooftop.bench.quick_report import OUTPUTS, model_name, table, write_output
from rooftop.bench.serve import commands as serve_commands
from rooftop.cli_options import LLAMA_CPP_COMMON, refuse_foreign, with_run_config
from rooftop.config import RunConfig
from rooftop.console import check_output_file, check_output_folder, err, logged, user_errors
from rooftop.errors import InvalidRequestError
from rooftop.roofline.report import seconds

INTEGER = re.compile(r"-?[0-9]+")
RANGE = re.compile(
    r"([0-9]+)-([0-9]+)(?:([+*])([0-9]+))?"
)  # llama-bench's first-last, first-last+step, first-last*mult
MOST_VALUES = 1000  # a range's: a typo's billion values would fill the memory before the model loads


def _ints(text: str, name: str, least: int = 1, ranges: bool = True) -> list[int]:
    """Comma-separated integers, each a value or (`ranges`) one of llama-bench's ranges: `first-last` (every
    integer), `first-last+step`, `first-last*mult` (first, first*mult, ... up to last)."""
    values = []
    for item in (v.strip() for v in text.split(",")):
        if not item:
            continue
        if INTEGER.fullmatch(item):
            values.append(int(item))
            continue
        if not ranges or (found := RANGE.fullmatch(item)) is None:
            ranged = " or ranges (first-last, first-last+step, first-last*mult)" if ranges else ""
            raise InvalidRequestError(f"{name} must be comma-separated integers{ranged}, got {text!r}")
        first, last, by = int(found[1]), int(found[2]), int(found[4] or 1)
        times = found[3] == "*"
        if last < first or by < 1 or (times and (by < 2 or first < 1)):
            raise InvalidRequestError(
                f"{name}: the range {item!r} must go up from first to last, by a step >= 1 or a multiplier >= 2 "
                "from a first >= 1"
            )
        count = (last // first).bit_length() if times else (last - first) // by + 1
        if count > MOST_VALUES:
            raise InvalidRequestError(f"{name}: the range {item!r} has {count} values; at most {MOST_VALUES}")
        while first <= last:
            values.append(first)
            first = first * by if times else first + by
    if not values or min(values) < least:
        raise InvalidRequestError(f"{name} must be integers >= {least}, got {text!r}")
    return values


def _pairs(texts: list[str]) -> list[tuple[int, int]]:
    """-pg's values: each a prompt length and a generation length, `pp,tg`."""
    pairs = [_ints(text, "-pg", least=1, ranges=False) for text in texts]
    if any(len(pair) != 2 for pair in pairs):
        raise InvalidRequestError(f"-pg takes two integers, <pp>,<tg>, got {' '.join(texts)!r}")
    return [(pp, tg) for pp, tg in pairs]


def _tests(
    pp: list[str] | None, tg: list[str] | None, pg: list[str], depths: list[str], ubatches: list[str] | None = None
) -> list[BenchTest]:
    """llama-bench's tests: a ppN per prompt length, a tgN per generation length, a ppN+tgM per -pg pair (each
    option repeatable and comma-separated; 0 runs none; the one of -p and -n not given takes llama-bench's default,
    512 or 128), each at every depth of -d (default 0), a test with a prompt at every -ub (default: the prompt in one
    step)."""
    prompts = [n for text in pp or ["512"] for n in _ints(text, "-p/--n-prompt", least=0)]
    gens = [n for text in tg or ["128"] for n in _ints(text, "-n/--n-gen", least=0)]
    lengths = [*((n, 0) for n in prompts), *((0, n) for n in gens), *_pairs(pg)]
    ds = [d for text in depths or ["0"] for d in _ints(text, "-d/--n-depth", least=0)]
    sizes = [n for text in ubatches or [] for n in _ints(text, "-ub/--ubatch-size")] or [None]
    tests = [  # a tgN has no prompt to chunk: it runs once
        BenchTest(p, g, d, n_ubatch=size if p else None)
        for size in sizes
        for d in ds
        for p, g in lengths
        if p or (g and size == sizes[0])
    ]
    if not tests:
        raise InvalidRequestError("nothing to run: -p and -n are both 0")
    for t in tests:
        if t.n_ubatch is not None and t.n_prompt and t.n_depth % t.n_ubatch:
            raise InvalidRequestError(
                f"{t.name}: with -ub {t.n_ubatch} a depth must be a multiple of it (the context is prefilled in "
                "chunks of -ub from the first token, and the prompt, timed, starts at a chunk's start)"
            )
        if t.n_ubatch is None and 0 < t.n_depth < t.n_prompt:
            raise InvalidRequestError(
                f"{t.name}: a depth must be 0 or at least the prompt's {t.n_prompt} tokens (the context is "
                "prefilled as one chunk and the prompt, timed, as the next)"
            )
    return tests


def _thread_counts(texts: list[str] | None) -> list[int]:
    """-t's counts (llama-bench's lists and ranges, repeatable); none given: the engine's default."""
    return [n for text in texts or [] for n in _ints(text, "-t/--threads")]


PROMPT_LENS, BATCH_SIZES, OUTPUT_LEN = "16,64,256,1024", "1,2,4,8,16,32", 32  # the sweep's defaults


@with_run_config(run_fields={"threads": lambda texts: next(iter(_thread_counts(texts)), None)})
def bench(
    ctx: typer.Context,
    prompt_lens: Annotated[
        str, typer.Option(help="prompt lengths for the TTFT sweep, comma-separated or ranges as -p's")
    ] = PROMPT_LENS,
    batch_sizes: Annotated[
        str, typer.Option(help="batch sizes for the decode sweep, comma-separated or ranges as -p's")
    ] = BATCH_SIZES,
    output_len: Annotated[int, typer.Option(help="tokens generated per sequence in the decode sweep")] = OUTPUT_LEN,
    pp: Annotated[
        list[str] | None,
        typer.Option(
            "--pp",
            "-p",
            "--n-prompt",
            metavar="<int,...>",
            help="quick mode (llama-bench's -p): a ppN test per N, a prefill of N prompt tokens; comma-separated, "
            "repeated or ranges (first-last, first-last+step, first-last*mult), 0 for none (default 512)",
        ),
    ] = None,
    tg: Annotated[
        list[str] | None,
        typer.Option(
            "--tg",
            "-n",
            "--n-gen",
            metavar="<int,...>",
            help="quick mode (llama-bench's -n): a tgN test per N, N tokens decoded one step each after a 1-token "
            "prompt; comma-separated, repeated or ranges as -p's, 0 for none (default 128)",
        ),
    ] = None,
    pg: Annotated[
        list[str] | None,
        typer.Option(
            "-pg",
            metavar="<pp,tg>",
            help="quick mode (llama-bench's -pg): a ppN+tgM test, N prompt tokens prefilled then M decoded, timed "
            "together; repeatable",
        ),
    ] = None,
    depth: Annotated[
        list[str] | None,
        typer.Option(
            "--n-depth",
            "-d",
            metavar="<int,...>",
            help="quick mode (llama-bench's -d): run every test after this many tokens of context, prefilled first "
            "and not timed (0, or at least the test's prompt); comma-separated, repeated or ranges as -p's (default 0)",
        ),
    ] = None,
    ubatch: Annotated[
        list[str] | None,
        typer.Option(
            "--ubatch-size",
            "-ub",
            metavar="<int,...>",
            help="quick mode (llama-bench's -ub): a test with a prompt prefills it in chunks of this many tokens, "
            "each a step, all timed (a depth then a multiple of it); comma-separated, repeated or ranges as -p's, "
            "each a run of those tests (default: the prompt in one step)",
        ),
    ] = None,
    reps: Annotated[
        int,
        typer.Option(
            "--reps",
            "-r",
            "--repetitions",
            help="measured repetitions after a warm-up, as passes over all tests (a sweep's: over its rows)",
        ),
    ] = 3,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="quick mode: print the results to stdout as llama-bench's -o does, md, csv, json, jsonl or sql, instead "
            "of the table; the phase report then goes to stderr",
        ),
    ] = None,
    threads: Annotated[
        list[str] | None,
        typer.Option(
            "--threads",
            "-t",
            metavar="<int,...>",
            help="CPU threads for the model's ops (default: the cores this process may use); several, comma-separated, "
            "repeated or ranges as -p's, run llama-bench's tests at each (its -t), each against its own roofs",
        ),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="write the results as JSON (several -t counts: one report per count, in runs)"),
    ] = None,
    plots: Annotated[Path | None, typer.Option(help="write PNG plots into this directory")] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="write a self-contained HTML report")] = None,
    *,
    run: RunConfig,
) -> None:
    """Measure TTFT, TPOT and throughput on this machine beside the roofline's predictions. Each measurement runs on
    a fresh engine with the engine options given, except four it sets itself: prefix caching off, the token budget
    and the prefill chunk raised to the longest prompt (one prefill step per prompt) and the sequence count to the
    largest batch measured. With -p, -n, -pg, -d, -ub, -o or several -t counts, llama-bench's tests instead (ppN, tgN,
    ppN+tgM, at depths; its t/s), at each thread count. `rooftop bench serve` loads a running OpenAI-compatible
    server."""
    if ctx.invoked_subcommand is not None:
        return

    with user_errors():
        if reps < 1:
            raise InvalidRequestError(f"-r/--reps must be at least 1, got {reps}")
        if output_len < 2:
            raise InvalidRequestError(
                f"--output-len must be at least 2 (a decode step after the prefill's token), got {output_len}"
            )
        check_output_file(json_path, "--json")
        check_output_folder(plots, "--plots")
        check_output_file(html_path, "--html")
        if output is not None and output not in OUTPUTS:
            raise InvalidRequestError(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        counts = _thread_counts(threads)  # the first is the engine's already (run.threads)
        if len(counts) > 1 and run.tensor_parallel_size > 1:
            raise InvalidRequestError("-t/--threads takes one count with --tensor-parallel-size (each rank's)")
        quick = len(counts) > 1 or any(option is not None for option in (pp, tg, pg, depth, ubatch, output))
        sweep_only = {
            "--prompt-lens": prompt_lens != PROMPT_LENS,
            "--batch-sizes": batch_sizes != BATCH_SIZES,
            "--output-len": output_len != OUTPUT_LEN,
            "--plots": plots is not None,
            "--html": html_path is not None,
        }
        if quick and any(sweep_only.values()):
            given = ", ".join(name for name, set_ in sweep_only.items() if set_)
            raise InvalidRequestError(
                f"{given}: the sweep's options; llama-bench's tests (-p, -n, -pg, -d, -ub, -o or several -t counts) "
                "take none of them"
            )
        more = ctx.meta.get(MORE_MODELS, [])
        if more and not quick:
            raise InvalidRequestError(
                "several -m/--model: llama-bench's tests (-p, -n, -pg, -d, -ub, -o) run each model in turn; the sweep "
                "takes one"
            )
        if not quick and run.engine.speculative_config is not None:
            raise InvalidRequestError(
                "--speculative-config: the sweep times one-token decode steps against the roofline, and a verify "
                "step is not one; llama-bench's tests (-p, -n, -pg) time speculative decoding, as does "
                "benchmarks/speculative.py"
            )
        if more and run.tensor_parallel_size > 1:
            raise InvalidRequestError("several -m/--model run on one device: --tensor-parallel-size takes one model")
        from rooftop.loading.model_files import check_source

        for model in more:  # a mistyped path refused now, not after the first model's minutes
            check_source(replace(run, model=model))
        tests = _tests(pp, tg, pg or [], depth or [], ubatch) if quick else []
        lens, batches = _ints(prompt_lens, "--prompt-lens"), _ints(batch_sizes, "--batch-sizes")
        console = Console(highlight=False)
        if not quick:
            needs = {
                f"--prompt-lens {max(lens)}": max(lens) + 1,
                f"--output-len {output_len} after --prompt-lens {min(lens)}": min(lens) + output_len,
            }
            llm = _engine(run, needs)
            check_batches(llm, batches, min(lens) + output_len)
            _sweep(console, llm, lens, batches, output_len, reps, plots, html_path, json_path)
            return
        runs = []  # per model and thread count: its report, tests, phases, precision and whether it speculates
        for model in [run.model, *more]:  # llama-bench's order: each model at every count
            llm = _engine(replace(run, model=model), {"the longest test (-p, -n, -d)": max(t.context for t in tests)})
            for count in counts if len(counts) > 1 else [None]:  # one count: the engine's already
                if count is not None:
                    torch.set_num_threads(count)
                runs.append(
                    (
                        *_quick_run(llm, _tests(pp, tg, pg or [], depth or [], ubatch), reps),
                        llm.precision,
                        llm.config.can_speculate,
                    )
                )
            llm.close()
            del llm  # its weights and KV cache, before the next model's
        _print_quick(console, runs, output)
        if json_path:
            reports = [report for report, *_ in runs]
            json_path.write_text(json.dumps(reports[0] if len(reports) == 1 else {"runs": reports}, indent=2))
            err.print(f"results written to {json_path}")


def _engine(run: RunConfig, needs: dict[str, int]):
    """The run's engine (its own bar shows the layers built: engine/progress.py), refused where its context cannot
    hold what an option needs (`needs`: the options, as the error names them, and the tokens each needs)."""
    from rooftop.engine.llm import LLM

    llm = LLM.from_config(run)
    for what, needed in needs.items():
        if needed > llm.max_model_len:
            raise InvalidRequestError(
                f"{what} needs {needed} tokens of context; the model's context holds {llm.max_model_len}"
            )
    return llm


def check_batches(llm, batches: list[int], tokens: int) -> None:
    """Refuse a decode batch whose sequences of `tokens` tokens the KV pool cannot hold at once: its steps would
    preempt sequences and never run at that batch."""
    block = llm.engine.config.block_size
    pool = llm.engine.kv_cache_tokens // block
    per_sequence = -(-tokens // block)
    largest = pool // per_sequence
    if too_many := [b for b in batches if b > largest]:
        raise InvalidRequestError(
            f"--batch-sizes {too_many[0]}: {too_many[0]} sequences of {tokens} tokens need {too_many[0] * per_sequence} "
            f"KV blocks of {block}, and the pool holds {pool} (batch {largest} at most; --kv-cache-bytes or "
            "--num-kv-blocks makes it larger)",
            "batch_sizes",
        )


def _roofs_and_calibration(llm, quick: bool, longest: int | None, batch: int):
    """This machine's roofs at the process's thread count (measured once, then cached) and the model's calibration
    on an engine set up as the measurements' are (no chunking of the longest prompt, room for the largest batch)."""
    from rooftop.bench.measure import fresh_engine
    from rooftop.engine.calibrate import load_or_calibrate
    from rooftop.engine.probe import load_or_run_probe, probe_device

    threads = f" at {torch.get_num_threads()} threads" if llm.device.type == "cpu" else ""
    with err.status(f"reading this machine's roofs{threads} (measured once, then cached)..."):
        probe = load_or_run_probe(probe_device(llm.device), collectives=llm.lead)
        hw = probe.to_hardware(working_set=llm.weight_bytes)
    with err.status("calibrating this model's ops (once per model and format; cached)...") as status:
        engine = fresh_engine(llm, longest or 1, batch)
        calibration = load_or_calibrate(
            llm,
            hw,
            quick=quick,
            on_progress=logged(lambda s: status.update(f"calibrating: {s}")),
            engine=engine,
            at_prompt=longest if quick else None,
        )
        del engine  # its KV pool
    return probe, hw, calibration


def _quick_run(llm, tests: list[BenchTest], reps: int) -> tuple[dict, list[BenchTest], dict]:
    """llama-bench's tests at the process's thread count: the JSON report's dict (machine, tests, each phase's
    numbers), the tests with their samples and the phases' attribution. The quick calibration measures batch 1 only,
    its shapes and the longest prompt's."""
    from rooftop.bench.measure import machine_info
    from rooftop.bench.quick import quick_bench
    from rooftop.engine.probe import keep_decode_read

    longest = max((t.n_prompt for t in tests if t.n_prompt), default=None)  # None: tg tests alone
    probe, hw, calibration = _roofs_and_calibration(llm, True, longest, 1)
    machine = machine_info(llm, hw, probe.cpu_model)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("bench", total=(reps + 1) * len(tests))
        phases = quick_bench(
            llm, hw, calibration, tests, reps, lambda what: progress.update(task, description=what, advance=1)
        )
    if "decode" in phases and (kept := keep_decode_read(llm, phases["decode"].achieved_bytes_per_s)):
        err.print(kept)
    report = {"machine": machine, "repetitions": reps, "tests": [t.to_dict() for t in tests]}
    for name, phase in phases.items():
        report[name] = phase.to_dict()
    if "decode" in phases:  # per step, as the phase's sentence says it: per token unless speculation verified several
        d = phases["decode"]
        report["decode"].update(measured_tpot_s=d.measured_s / d.steps, predicted_tpot_s=d.predicted_s / d.steps)
    return report, tests, phases


def _sweep(
    console: Console,
    llm,
    lens: list[int],
    batches: list[int],
    output_len: int,
    reps: int,
    plots: Path | None,
    html_path: Path | None,
    json_path: Path | None,
) -> None:
    """The TTFT and decode sweep: its tables, plots, HTML and JSON."""
    from rooftop.bench.measure import machine_info
    from rooftop.bench.sweep import sweep
    from rooftop.engine.probe import keep_decode_read

    probe, hw, calibration = _roofs_and_calibration(llm, False, max(lens), max(batches))
    report = {"machine": machine_info(llm, hw, probe.cpu_model)}
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("bench", total=(reps + 1) * (len(lens) + len(batches)))
        result = sweep(
            llm,
            hw,
            calibration,
            lens,
            batches,
            output_len,
            reps,
            logged(lambda what: progress.update(task, description=what, advance=1)),
        )
    report.update(
        ttft=result.ttft,
        decode=result.decode,
        steps=[vars(p) for p in result.points],
        gaps=[{"step": label, **{f"{k}_s": v for k, v in parts.items()}} for label, parts in result.gaps],
    )
    machine = report["machine"]
    console.print(
        f"{model_name(machine)}: weights {machine['weights_format']}, KV cache {machine['kv_cache_dtype']}, "
        f"{machine['threads']} threads"
    )
    _print_sweep(console, result)
    written = _write_plots(result, hw, llm.precision.compute, plots)
    if html_path:
        from rooftop.bench.html import write_html

        with tempfile.TemporaryDirectory() as drawn:  # without --plots the page's own, not left beside it
            pictures = written or _write_plots(result, hw, llm.precision.compute, Path(drawn), say=False)
            err.print(f"report written to {write_html(report, pictures, html_path)}")
    if kept := keep_decode_read(llm, max((r["achieved_bytes_per_s"] for r in result.decode), default=0.0)):
        err.print(kept)
    if json_path:
        json_path.write_text(json.dumps(report, indent=2))
        err.print(f"results written to {json_path}")


def _print_quick(console: Console, runs: list, output: str | None) -> None:
    """The tests' table of every model's and thread count's run, or llama-bench's `output` on stdout (the phase
    report then on stderr), and the phase report of each run's steps."""
    from rooftop.roofline.attribution import advice, gap_sentence
    from rooftop.roofline.report import gap_bar, phase_table

    measured = [(report["machine"], tests) for report, tests, *_ in runs]
    if output is None:  # at its full width where no terminal narrows it: a log keeps each test on one line
        shown = table(measured)
        full = console.measure(shown, options=console.options.update_width(1000)).maximum
        (console if console.is_terminal else Console(highlight=False, width=full)).print(shown)
    else:
        write_output(output, measured, sys.stdout)
        sys.stdout.flush()
    out = console if output is None else err
    for report, _, phases, precision, speculative in runs:
        if len(runs) > 1:
            count = report["machine"]["threads"]
            out.print(f"\n{model_name(report['machine'])}, {count} thread{'' if count == 1 else 's'}:")
        out.print(phase_table(phases))
        out.print(gap_sentence(phases))
        for name, phase in phases.items():
            out.print(gap_bar(name, phase.gap, phase.steps if name == "decode" else 1))
            out.print(advice(name, phase, precision.kv_bytes, precision.weights.bits_per_weight(), speculative))


def _print_sweep(console: Console, result) -> None:
    table = Table(
        "prompt tokens",
        "TTFT measured",
        "prefill step expected",
        "bound",
        "prefill tok/s",
        "% of compute roof",
        title="TTFT",
    )
    for r in result.ttft:
        table.add_row(
            str(r["prompt_tokens"]),
            seconds(r["measured_ttft_s"]),
            f"{seconds(r['expected_prefill_step_s'])} (measured {seconds(r['measured_prefill_step_s'])})",
            seconds(r["bound_prefill_step_s"]),
            f"{r['prefill_tokens_per_s']:.0f}",
            f"{r['pct_of_compute_roof']:.1f}%",
        )
    console.print(table)
    _print_advice(console, [(f"pp{r['prompt_tokens']}", r["advice"]) for r in result.ttft])
    table = Table(
        "batch",
        "TPOT measured",
        "TPOT expected",
        "TPOT bound",
        "tok/s measured",
        "tok/s expected",
        "% of bandwidth roof",
        title="decode",
    )
    for r in result.decode:
        table.add_row(
            str(r["batch"]),
            seconds(r["measured_tpot_s"]),
            seconds(r["expected_tpot_s"]),
            seconds(r["bound_tpot_s"]),
            f"{r['measured_tokens_per_s_total']:.1f}",
            f"{r['expected_tokens_per_s_total']:.1f}",
            f"{r['pct_of_bandwidth_roof']:.1f}%",
        )
    console.print(table)
    _print_advice(console, [(f"b{r['batch']}", r["advice"]) for r in result.decode])


def _print_advice(console: Console, rows: list[tuple[str, str]]) -> None:
    """Each run of consecutive rows that share a lever, once: "pp16-pp256: <advice>"."""
    runs: list[list] = []
    for label, said in rows:
        if runs and runs[-1][2] == said:
            runs[-1][1] = label
        else:
            runs.append([label, label, said])
    for first, last, said in runs:
        console.print(f"{first if first == last else f'{first}-{last}'}: {said}")


def _write_plots(result, hw, compute: str, directory: Path | None, say: bool = True) -> list[Path]:
    if directory is None:
        return []
    from rooftop.bench.plots import batch_plot, gap_plot, roofline_plot, ttft_plot

    directory.mkdir(parents=True, exist_ok=True)
    written = [
        roofline_plot(result, hw, compute, directory / "roofline.png"),
        gap_plot(result, directory / "gap.png"),
        ttft_plot(result, directory / "ttft.png"),
        batch_plot(result, directory / "batch.png"),
    ]
    if say:
        err.print(f"plots written to {directory}")
    return written


# llama-bench's options that rooftop bench has no counterpart for, each with what to do instead. Click would read
# "-ngl 99" as -n with "gl" and 99 as a command, and say so.
LLAMA_BENCH_ONLY = LLAMA_CPP_COMMON | {
    ("-b", "--batch-size"): "rooftop has no logical batch beside the physical one: -ub prefills a prompt in chunks",
    ("-mg", "--main-gpu", "-sm", "--split-mode", "-ts", "--tensor-split"): "--device cuda runs one GPU, and "
    "--tensor-parallel-size splits the model over several",
    ("-nkvo", "--no-kv-offload"): "the KV cache lives on --device with the model",
    ("-mmp", "--mmap"): "a GGUF's tensors are always read from its memory map",
    ("-embd", "--embeddings"): "rooftop bench times generation only",
}


# `vllm bench serve`'s options that `rooftop bench serve` spells otherwise or has no counterpart for
VLLM_BENCH_ONLY = {
    ("--backend",): "--endpoint chat or completions picks the API (vLLM's --endpoint path works too)",
    ("--host", "--port"): "--base-url http://HOST:PORT/v1 names the server",
    ("--percentile-metrics", "--metric-percentiles"): "every latency is reported with its mean, median, std, p90 "
    "and p99",
}


class VllmBenchOptions(typer.core.TyperCommand):
    """`rooftop bench serve`'s arguments as `vllm bench serve` users write them (VLLM_BENCH_ONLY)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        refuse_foreign(args, VLLM_BENCH_ONLY, "vllm bench serve", "rooftop bench serve", self.params)
        return super().parse_args(ctx, bare_save_result(args))


def bare_save_result(args: list[str]) -> list[str]:
    """vLLM's --save-result is a flag (--result-dir and --result-filename place the file) where rooftop's also takes
    the file: given alone (last, or before another option) it becomes `--save-result=`, the empty file."""
    return [
        "--save-result=" if arg == "--save-result" and (i + 1 == len(args) or args[i + 1].startswith("-")) else arg
        for i, arg in enumerate(args)
    ]


class LlamaBenchOptions(typer.core.TyperGroup):
    """`rooftop bench`'s arguments as llama-bench users write them: its options without a counterpart refused by name
    with what to use instead, -h for help, and several -m run one after the other (llama-bench's order)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args and args[0] in self.commands:  # `rooftop bench serve ...`: its own options
            return super().parse_args(ctx, args)
        refuse_foreign(args, LLAMA_BENCH_ONLY, "llama-bench", "rooftop bench", self.params)
        models, rest = _models(args)
        ctx.meta[MORE_MODELS] = models[1:]
        return super().parse_args(ctx, rest if not models else ["-m", models[0], *rest])


MORE_MODELS = "rooftop.bench.more_models"  # the -m values after the first, which the engine's RunConfig does not hold


def _models(args: list[str]) -> tuple[list[str], list[str]]:
    """Every -m/--model value in `args`, in order, and the other arguments."""
    models, rest, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("-m", "--model") and i + 1 < len(args):
            models.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--model="):
            models.append(arg.removeprefix("--model="))
        else:
            rest.append(arg)
        i += 1
    return models, rest


app = typer.Typer(
    cls=LlamaBenchOptions, pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]}
)
app.callback(invoke_without_command=True)(bench)
extra_goodput_values = {"allow_extra_args": True}  # vLLM's `--goodput ttft:500 tpot:50`
app.command("serve", cls=VllmBenchOptions, context_settings=extra_goodput_values)(serve_commands.serve)
app.command("report", context_settings=extra_goodput_values)(serve_commands.report)
