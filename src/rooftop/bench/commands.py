"""`rooftop bench`: the sweep (table, JSON, plots, HTML) or, with --pp/--tg, the llama-bench-style quick mode;
its subcommands `serve` and `report` load and report on any OpenAI-compatible server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rooftop.bench.serve import commands as serve_commands
from rooftop.cli_options import with_run_config
from rooftop.config import RunConfig
from rooftop.console import err, user_errors
from rooftop.errors import InvalidRequestError
from rooftop.roofline.report import seconds


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidRequestError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise InvalidRequestError(f"{name} must be integers >= 1, got {text!r}")
    return values


@with_run_config
def bench(
    ctx: typer.Context,
    prompt_lens: Annotated[str, typer.Option(help="prompt lengths for the TTFT sweep")] = "16,64,256,1024",
    batch_sizes: Annotated[str, typer.Option(help="batch sizes for the decode sweep")] = "1,2,4,8,16,32",
    output_len: Annotated[int, typer.Option(help="tokens generated per sequence in the decode sweep")] = 32,
    pp: Annotated[int | None, typer.Option(help="quick mode: prompt tokens (llama-bench's -p)")] = None,
    tg: Annotated[int | None, typer.Option(help="quick mode: generated tokens (llama-bench's -n)")] = None,
    reps: Annotated[
        int, typer.Option(help="measured repetitions after a warm-up (a sweep's: passes over its rows)")
    ] = 3,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the results as JSON")] = None,
    plots: Annotated[Path | None, typer.Option(help="write PNG plots into this directory")] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="write a self-contained HTML report")] = None,
    *,
    run: RunConfig,
) -> None:
    """Measure TTFT, TPOT and throughput on this machine beside the roofline's predictions. Each measurement runs on
    a fresh engine with the engine options given, except four it sets itself: prefix caching off, the token budget
    and the prefill chunk raised to the longest prompt (one prefill step per prompt) and the sequence count to the
    largest batch measured. `rooftop bench serve` loads a running OpenAI-compatible server instead."""
    if ctx.invoked_subcommand is not None:
        return
    from rooftop.bench.measure import fresh_engine, machine_info
    from rooftop.engine.calibrate import load_or_calibrate
    from rooftop.engine.llm import LLM
    from rooftop.engine.probe import keep_decode_read, load_or_run_probe, probe_device

    with user_errors():
        if reps < 1 or output_len < 2:
            raise InvalidRequestError("--reps must be >= 1 and --output-len >= 2")
        quick = pp is not None or tg is not None
        lens, batches = _ints(prompt_lens, "--prompt-lens"), _ints(batch_sizes, "--batch-sizes")
        llm = LLM.from_config(run)  # its own bar shows the layers built (engine/progress.py)
        needed = (pp or 512) + (tg or 128) if quick else max(max(lens) + 1, min(lens) + output_len)
        if needed > llm.max_model_len:
            raise InvalidRequestError(
                f"the benchmark needs {needed} tokens of context; the model has {llm.max_model_len}"
            )
        with err.status("reading this machine's roofs (measured once, then cached)..."):
            probe = load_or_run_probe(probe_device(llm.device), collectives=llm.lead)
            hw = probe.to_hardware(working_set=llm.weight_bytes)
        with err.status("calibrating this model's ops (once per model and format; cached)...") as status:
            # on an engine set up as the measurements' are (no chunking of the longest prompt, room for the largest
            # batch); quick mode measures batch 1 only: the quick calibration's shapes and its own prompt, decoded
            engine = fresh_engine(llm, (pp or 512) if quick else max(lens), 1 if quick else max(batches))
            calibration = load_or_calibrate(
                llm,
                hw,
                quick=quick,
                on_progress=lambda s: status.update(f"calibrating: {s}"),
                engine=engine,
                at_prompt=(pp or 512) if quick else None,
            )
            del engine  # its KV pool
        report = {"machine": machine_info(llm, hw, probe.cpu_model)}
        console = Console(highlight=False)
        with Progress(console=err, transient=True) as progress:
            if quick:
                from rooftop.bench.quick import quick_bench

                task = progress.add_task("bench", total=reps + 1)
                summary, phases = quick_bench(
                    llm,
                    hw,
                    calibration,
                    pp or 512,
                    tg or 128,
                    reps,
                    lambda what: progress.update(task, description=what, advance=1),
                )
            else:
                from rooftop.bench.sweep import sweep

                task = progress.add_task("bench", total=(reps + 1) * (len(lens) + len(batches)))
                result = sweep(
                    llm,
                    hw,
                    calibration,
                    lens,
                    batches,
                    output_len,
                    reps,
                    lambda what: progress.update(task, description=what, advance=1),
                )
        moved = 0.0  # the fastest decode's bytes per second, which may raise this machine's read
        if quick:
            from rooftop.roofline.attribution import advice, gap_sentence
            from rooftop.roofline.report import gap_bar, phase_table

            _print_quick(console, report["machine"], summary)
            console.print(phase_table(phases))
            console.print(gap_sentence(phases))
            for name, phase in phases.items():
                console.print(gap_bar(name, phase.gap, phase.steps if name == "decode" else 1))
                console.print(advice(name, phase, llm.precision.kv_bytes, llm.precision.weights.bits_per_weight()))
            report.update(summary)
            report.update({name: phase.to_dict() for name, phase in phases.items()})
            if "decode" in phases:
                d = phases["decode"]
                report["decode"].update(measured_tpot_s=summary["tpot_s"], predicted_tpot_s=d.predicted_s / d.steps)
                moved = d.achieved_bytes_per_s
        else:
            report.update(
                ttft=result.ttft,
                decode=result.decode,
                steps=[vars(p) for p in result.points],
                gaps=[{"step": label, **{f"{k}_s": v for k, v in parts.items()}} for label, parts in result.gaps],
            )
            console.print(
                f"{_model_name(report['machine'])}: weights {report['machine']['weights_format']}, KV cache "
                f"{report['machine']['kv_cache_dtype']}, {report['machine']['threads']} threads"
            )
            _print_sweep(console, result)
            moved = max((r["achieved_bytes_per_s"] for r in result.decode), default=0.0)
            written = _write_plots(
                result, hw, llm.precision.compute, plots or (html_path.parent if html_path else None)
            )
            if html_path:
                from rooftop.bench.html import write_html

                err.print(f"report written to {write_html(report, written, html_path)}")
        if kept := keep_decode_read(llm, moved):
            err.print(kept)
        if json_path:
            json_path.write_text(json.dumps(report, indent=2))
            err.print(f"results written to {json_path}")


def _model_name(machine: dict) -> str:
    return machine["model"] + (" (dummy weights)" if machine["load_format"] == "dummy" else "")


def _print_quick(console: Console, machine: dict, s: dict) -> None:
    table = Table("model", "weights", "KV cache", "threads", "test", "t/s", "TPOT")
    name, kv = _model_name(machine), machine["kv_cache_dtype"]
    table.add_row(
        name,
        machine["weights_format"],
        kv,
        str(machine["threads"]),
        f"pp{s['prompt_tokens']}",
        f"{s['prefill_tokens_per_s']:.2f} ± {s['prefill_tokens_per_s_stdev']:.2f}",
        "",
    )
    if s["decode_tokens_per_s"]:
        table.add_row(
            name,
            machine["weights_format"],
            kv,
            str(machine["threads"]),
            f"tg{s['output_tokens']}",
            f"{s['decode_tokens_per_s']:.2f} ± {s['decode_tokens_per_s_stdev']:.2f}",
            seconds(s["tpot_s"]),
        )
    console.print(table)


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


def _write_plots(result, hw, compute: str, directory: Path | None) -> list[Path]:
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
    err.print(f"plots written to {directory}")
    return written


app = typer.Typer(pretty_exceptions_enable=False)
app.callback(invoke_without_command=True)(bench)
extra_goodput_values = {"allow_extra_args": True}  # vLLM's `--goodput ttft:500 tpot:50`
app.command("serve", context_settings=extra_goodput_values)(serve_commands.serve)
app.command("report", context_settings=extra_goodput_values)(serve_commands.report)
