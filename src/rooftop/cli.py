"""The `rooftop` command: generate and chat on the bundled model or any GGUF / Hugging Face directory."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rooftop.bench import commands as bench_commands
from rooftop.cli_options import LlamaCppOptions, with_run_config
from rooftop.config import RunConfig
from rooftop.console import err, user_errors
from rooftop.engine.llm import LLM
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.outputs import RequestOutput
from rooftop.engine.sampling_params import SamplingParams
from rooftop.errors import RooftopError
from rooftop.roofline import commands as roofline_commands
from rooftop.roofline.calibration import ROWS_KEYED, TOKENS_KEYED
from rooftop.roofline.report import seconds
from rooftop.serve import commands as serve_commands

app = typer.Typer(
    help="LLM inference with prefill and decode made explicit.", no_args_is_help=True, pretty_exceptions_enable=False
)

MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="most tokens to generate")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "-t", help="0 is greedy")]
TopPOpt = Annotated[float, typer.Option(help="nucleus sampling mass, (0, 1]")]
TopKOpt = Annotated[int, typer.Option(help="keep the k most likely tokens (0: off)")]
MinPOpt = Annotated[float, typer.Option(help="drop tokens below min_p x the top probability (0: off)")]
RepPenaltyOpt = Annotated[float, typer.Option(help="penalize tokens already seen (1: off)")]
SeedOpt = Annotated[int | None, typer.Option(help="same seed, same output")]
StopOpt = Annotated[list[str] | None, typer.Option("--stop", help="stop before this string (repeatable)")]


STATE_NOTE = " with the linear layers' state"


def weight_formats_line(bytes_by_format: dict[str, int], conversions: dict[str, str]) -> str:
    """Which format the block linears ran in, by bytes (a Q4_K_M file has several), and what was converted at load."""
    total = sum(bytes_by_format.values())
    held = sorted(bytes_by_format.items(), key=lambda kv: -kv[1])
    line = (
        "block linears: " + ", ".join(f"{fmt} {100 * n / total:.0f}%" for fmt, n in held) + f" of {total / 1e6:.0f} MB"
    )
    if conversions:
        kinds = Counter(conversions.values())
        line += "; converted at load: " + ", ".join(
            f"{n} tensor{'' if n == 1 else 's'} {kind}" for kind, n in kinds.most_common()
        )
    return line


def load(run: RunConfig) -> LLM:
    t0 = time.perf_counter()
    llm = LLM.from_config(run)  # its own bar shows the layers built (engine/progress.py)
    c = llm.config
    dummy = f" (dummy weights, seed {run.dummy_seed})" if run.load_format == "dummy" else ""
    ranks = f" split over {llm.tensor_parallel_size} ranks" if llm.tensor_parallel_size > 1 else ""
    err.print(
        f"[dim]{escape(c.name or c.architecture)} ({c.architecture}, {c.num_layers} layers, d={c.hidden_size}) from "
        f"{escape(llm.model_path)}{dummy}, {str(llm.dtype).removeprefix('torch.')} on {llm.device}{ranks}, "
        f"weights {llm.precision.weights.name}, "
        f"loaded in {time.perf_counter() - t0:.1f} s[/]"
    )
    formats = llm.model.bytes_by_format()
    if len(formats) > 1 or llm.model.conversions:
        err.print(f"[dim]{escape(weight_formats_line(formats, llm.model.conversions))}[/]")
    for note in llm.load_notes:
        err.print(f"[dim]{escape(note)}[/]")
    stats = llm.engine.stats()
    caching = "on" if llm.engine.config.enable_prefix_caching else "off"
    hybrid = bool(c.num_linear_attention_layers)
    if hybrid:  # the engine turns it off: shared KV blocks do not hold the recurrent state
        caching += " (hybrid model: its linear layers' state is not in the shared KV blocks)"
    err.print(
        f"[dim]KV cache: {stats.kv_blocks_total} blocks of {stats.block_size} tokens = {stats.kv_cache_tokens} "
        f"tokens, {stats.kv_cache_dtype}, {stats.kv_cache_bytes / 2**20:.0f} MiB{STATE_NOTE if hybrid else ''}; "
        f"prefix caching {caching}[/]"
    )
    return llm


def print_report(m: RequestMetrics, finish_reason: str | None) -> None:
    """The short per-request report: tokens, TTFT, TPOT and the speed of each phase."""

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} tok/s"

    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("prompt tokens", str(m.prompt_tokens), "output tokens", f"{m.output_tokens} ({finish_reason})")
    table.add_row("TTFT", ms(m.ttft), "TPOT", ms(m.tpot))
    table.add_row("prefill", rate(m.prefill_tokens_per_s), "decode", rate(m.decode_tokens_per_s))
    table.add_row(
        "prefill time",
        f"{ms(m.prefill_time)} / {m.prefill_tokens} tok",
        "decode time",
        f"{ms(m.decode_time)} / {m.decode_steps} steps",
    )
    spec = m.spec_decode
    if spec.drafts:
        table.add_row(
            "speculative",
            f"{spec.accepted_tokens} / {spec.draft_tokens} drafts accepted ({100 * spec.acceptance_rate:.0f}%)",
            "accepted length",
            f"{spec.mean_accepted_length:.2f} tok / verify step ({spec.drafts} steps)",
        )
    err.print(table)
    err.print(
        "[dim]  prefill and decode: the model's forward passes alone; TTFT and TPOT include sampling and scheduling[/]"
    )


def print_phase_report(llm: LLM, since: float) -> None:
    """Attribute the steps run since `since` against this machine's measured roofs (probing once if needed) and its
    calibration (a quick one, once per model and format, if none is cached): bound, expected, the gap by part and
    the lever for each phase."""
    from rooftop.engine.calibrate import FULL, load_or_calibrate
    from rooftop.engine.probe import keep_decode_read, load_or_run_probe, probe_device
    from rooftop.roofline.attribution import advice, attribute_phases, attribute_step, experts_sentence, gap_sentence
    from rooftop.roofline.report import gap_bar, phase_table

    records = [r for r in llm.step_records if r.finished_at >= since]
    with err.status("measuring this machine's roofs (once; cached)..."):
        hw = load_or_run_probe(probe_device(llm.device), collectives=llm.lead).to_hardware(working_set=llm.weight_bytes)
    with err.status("calibrating this model's ops (once per model and format; cached)...") as status:
        calibration = load_or_calibrate(llm, hw, quick=True, on_progress=lambda s: status.update(f"calibrating: {s}"))
    p = llm.precision
    steps = [
        attribute_step(llm.config, p, r.shape, r.seconds, hw, r.around_seconds, calibration, r.draft_seconds)
        for r in records
    ]
    phases = attribute_phases(steps, hw)
    err.print(phase_table(phases))
    err.print(gap_sentence(phases))
    for name, phase in phases.items():
        if phase.gap is not None:
            err.print(gap_bar(name, phase.gap, phase.steps if name == "decode" else 1))
    for name, phase in phases.items():
        err.print(
            f"[dim]{escape(advice(name, phase, p.kv_bytes, p.weights.bits_per_weight(), llm.config.can_speculate))}[/]"
        )
    if "decode" in phases and (kept := keep_decode_read(llm, phases["decode"].achieved_bytes_per_s)):
        err.print(f"[dim]{escape(kept)}[/]")
    if experts := experts_sentence(llm.config, steps):
        err.print(experts)
    longest = max((s.cached + s.new for r in records for s in r.shape.seqs), default=0)
    if longest > 2 * (timed := calibration.timed_context):
        more = f"; `rooftop calibrate` times them to {FULL['long']}" if calibration.quick else ""
        err.print(
            f"[dim]expected times at up to {longest} tokens of context are carried from the calibration's shapes, "
            f"timed to {timed} tokens{more}[/]"
        )


def stream_to_stdout(llm: LLM, prompt: str, params: SamplingParams) -> RequestOutput:
    output = None
    for chunk in llm.stream(prompt, params):
        sys.stdout.write(chunk.delta)
        sys.stdout.flush()
        output = chunk.output
    sys.stdout.write("\n")
    return output


@app.command(cls=LlamaCppOptions)
@with_run_config
def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt; the chat template is applied unless --raw")],
    max_tokens: MaxTokensOpt = 256,
    temperature: TemperatureOpt = 0.2,
    top_p: TopPOpt = 0.9,
    top_k: TopKOpt = 0,
    min_p: MinPOpt = 0.0,
    repetition_penalty: RepPenaltyOpt = 1.0,
    seed: SeedOpt = None,
    stop: StopOpt = None,
    raw: Annotated[bool, typer.Option("--raw", help="send the prompt as is, without the chat template")] = False,
    roofline: Annotated[
        bool, typer.Option(help="attribute prefill and decode against this machine's measured roofs")
    ] = True,
    *,
    run: RunConfig,
) -> None:
    """Stream the model's answer to PROMPT, then report TTFT, TPOT and the speed of prefill and decode."""
    with user_errors():
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            stop=stop or [],
        )
        llm = load(run)
        if not prompt:
            raise RooftopError("the prompt is empty")
        text = (
            prompt
            if raw or not llm.tokenizer.chat_template
            else llm.apply_chat_template([{"role": "user", "content": prompt}])
        )
        started = time.perf_counter()
        output = stream_to_stdout(llm, text, params)
        print_report(output.metrics, output.finish_reason)
        if output.finish_reason == "error":  # the engine ended the request (e.g. non-finite logits): say why, exit 1
            raise RooftopError(f"generation failed: {output.error}")
        if roofline:
            print_phase_report(llm, started)


@app.command(cls=LlamaCppOptions)
@with_run_config
def chat(
    system: Annotated[str | None, typer.Option(help="system prompt")] = None,
    max_tokens: MaxTokensOpt = 512,
    temperature: TemperatureOpt = 0.2,
    top_p: TopPOpt = 0.9,
    top_k: TopKOpt = 0,
    min_p: MinPOpt = 0.0,
    repetition_penalty: RepPenaltyOpt = 1.0,
    seed: SeedOpt = None,
    stop: StopOpt = None,
    stats: Annotated[bool, typer.Option(help="print TTFT/TPOT after each answer")] = False,
    *,
    run: RunConfig,
) -> None:
    """Multi-turn chat with the model's chat template. /reset forgets the conversation; Ctrl-D or /exit ends."""
    with user_errors():
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            stop=stop or [],
        )
        llm = load(run)
        if not llm.tokenizer.chat_template:
            raise RooftopError("this model has no chat template; use `rooftop generate --raw`")
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    err.print("[dim]type a message; /reset clears the history, /exit or Ctrl-D quits[/]")
    typed = sys.stdin.isatty()  # piped input gets no prompts
    while True:
        try:
            if typed:  # on stderr, as python's REPL: stdout holds the answers alone, redirected or not
                sys.stderr.write(">>> ")
                sys.stderr.flush()
            line = input()
        except (EOFError, KeyboardInterrupt):
            err.print()
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip() == "/reset":
            messages = list(start)
            err.print("[dim]history cleared[/]")
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            output = stream_to_stdout(llm, llm.apply_chat_template(messages), params)
        except RooftopError as e:
            messages.pop()
            err.print(f"[bold red]error:[/] {escape(str(e))} (try /reset)")
            continue
        except KeyboardInterrupt:
            messages.pop()
            err.print("\n[dim]interrupted[/]")
            continue
        if output.finish_reason == "error":
            messages.pop()
            err.print(f"[bold red]error:[/] generation failed: {escape(str(output.error))} (try /reset)")
            continue
        messages.append({"role": "assistant", "content": output.text})
        if stats:
            print_report(output.metrics, output.finish_reason)


def curve_cell(key: str, x: float, y: float) -> str:
    """One point of a calibration curve as its table shows it: the measured seconds at what the curve is drawn
    against (a decode's linears: its rows; a prefill's host time: its tokens; the other host curves: sequences; the
    op classes: their roofline seconds)."""
    noun = "row" if key in ROWS_KEYED else "token" if key in TOKENS_KEYED else "seq"
    if key in ROWS_KEYED or key in TOKENS_KEYED or key.endswith(("host", "around")):
        return f"{seconds(y)} at {x:g} {noun}{'' if x == 1 else 's'}"
    return f"{seconds(y)} (roofline {seconds(x)})"


@app.command()
@with_run_config
def calibrate(
    quick: Annotated[
        bool, typer.Option(help="a few shapes only (seconds): what generate runs when none is cached")
    ] = False,
    force: Annotated[bool, typer.Option(help="calibrate again even if a calibration is cached")] = False,
    *,
    run: RunConfig,
) -> None:
    """Time the engine's linears, attention, elementwise ops and host work inside real steps of this model, at
    decode batches and prompt lengths within the engine's limits, and cache the result: what `generate` and `bench`
    compute their expected times from."""
    from rooftop.engine.calibrate import cache_path, cached_calibration, load_or_calibrate, serves
    from rooftop.engine.probe import load_or_run_probe, probe_device

    with user_errors():
        llm = load(run)
        with err.status("measuring this machine's roofs (once; cached)..."):
            probe = load_or_run_probe(probe_device(llm.device), collectives=llm.lead)
            hw = probe.to_hardware(working_set=llm.weight_bytes)
        reused = not force and serves(cached_calibration(llm, hw, llm.engine), quick)
        with err.status("calibrating...") as status:
            cal = load_or_calibrate(llm, hw, force, quick, lambda s: status.update(f"calibrating: {s}"))
    table = Table("curve", "points", "first point: measured", "last point: measured")
    for key, curve in sorted(cal.curves.items()):
        table.add_row(
            key, str(len(curve.points)), *(curve_cell(key, x, y) for x, y in (curve.points[0], curve.points[-1]))
        )
    err.print(table)
    where = "read from the cache (`--force` calibrates again): " if reused else "measured and cached in "
    err.print(f"[dim]{where}{cache_path(llm, hw)}{' (quick)' if cal.quick else ''}[/]")


app.add_typer(bench_commands.app, name="bench")
app.command("roofline")(roofline_commands.roofline)
app.command("probe")(roofline_commands.probe)
app.command("explain")(roofline_commands.explain)
app.command("serve", cls=LlamaCppOptions)(serve_commands.serve)
