"""Rendering a Prediction for people: the per-op tables of one prefill and one decode step, and the summary."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rooftop.roofline.precision import CONVERTED_TO
from rooftop.roofline.predict import Prediction, StepTime, memory_roof
from rooftop.roofline.speculative import SpeculativePrediction


def si(value: float | None, unit: str) -> str:
    """1.2e12, "FLOP" -> "1.20 TFLOP"."""
    if value is None:
        return "-"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0:
        return "-" + seconds(-value)
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    if value >= 1e-6:
        return f"{value * 1e6:.3g} µs"
    return f"{value * 1e9:.3g} ns"


# TPOT is (E2E - TTFT) / (output tokens - 1): none for one output token, as bench reports none for tg <= 1
NO_DECODE = "none: one output token is the prefill's, and no decode step follows (TPOT needs two)"


def decode_lever(
    kv_share: float, kv_value_bytes: float, batch: float, weight_bits: float = 16, speculative: bool = True
) -> str:
    """What would move a memory-bound decode step, from what its bytes are: the KV cache (`kv_share` of the bytes
    no fusion avoids, stored at `kv_value_bytes` per value) or the weights (`weight_bits` each: a 4-bit format is
    not told to read 4 bits); at one sequence per step, speculative decoding shares the weights' read across
    several of its tokens, where it runs and would speed the step up (`speculative`)."""
    if kv_share >= 0.5 and kv_value_bytes > 1:
        lever = (
            f"the KV cache is {100 * kv_share:.0f}% of each step's bytes, so store it in fewer "
            f"(--kv-cache-dtype int8 takes about {100 / kv_value_bytes:.0f}% of the bytes it takes now)"
        )
    else:
        lever = "each step reads its weights once for all its sequences, so batch more sequences (--max-num-seqs) to share that read"
        lever += (
            " or read fewer bytes per weight (--weights int4)"
            if weight_bits > 5
            else f" (the weights are {weight_bits:.2g} bits each already)"
        )
    if batch < 1.5 and speculative:
        lever += (
            "; with one sequence, speculative decoding (--speculative-config, ngram where the output quotes the "
            "input) verifies several tokens per read"
        )
    return lever


def weight_formats(pred: Prediction) -> str:
    """The linears' format, and the tables' where they differ: "awq-int4-g128; embedding and lm_head fp16"; and
    the file's types rooftop's loader converted: "q4_1; q2_k converted to q4_1 at load, as rooftop's engine runs it"."""
    tables: dict[str, list[str]] = {}
    for table, fmt in (("embedding", pred.embedding_format), ("lm_head", pred.lm_head_format)):
        if fmt and fmt != pred.weights_format:
            tables.setdefault(fmt, []).append(table)
    formats = [pred.weights_format, *(f"{' and '.join(names)} {fmt}" for fmt, names in tables.items())]
    if pred.converted_formats:
        formats.append(
            f"{', '.join(pred.converted_formats)} converted to {CONVERTED_TO} at load, as rooftop's engine runs it"
        )
    return "; ".join(formats)


def op_table(title: str, step: StepTime, pred: Prediction) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("op", "FLOPs", "bytes", "FLOP/byte", "time", "bound"):
        table.add_column(column, justify="left" if column in ("op", "bound") else "right")
    for op in step.ops:
        moved = op.bytes + op.comm_bytes
        table.add_row(
            op.name,
            si(op.flops, "FLOP"),
            si(moved, "B"),
            f"{op.intensity:.3g}",
            seconds(op.time(pred.hw)),
            op.bound(pred.hw),
        )
    table.add_row(
        "[bold]step[/]",
        si(step.flops, "FLOP"),
        si(step.bytes, "B"),
        f"{step.intensity:.3g}",
        f"[bold]{seconds(step.time_s)}[/]",
        f"[bold]{step.bound}[/]",
    )
    return table


def _expected(pred: Prediction) -> str:
    hw = pred.hw
    if hw.compute_efficiency != 1.0 or hw.memory_efficiency != 1.0:
        return (
            f"the rows above, at the efficiencies given ({hw.compute_efficiency:.3g} of the compute peaks, "
            f"{hw.memory_efficiency:.3g} of the memory roof), in place of those published engines reach"
        )
    if pred.expected_ttft_s is None:
        return (
            "no published efficiencies for this device: --compute-efficiency/--memory-efficiency set them "
            "(the rows above are then at those shares of the roofs)"
        )
    tpot = "" if pred.expected_tpot_s is None else f", TPOT {seconds(pred.expected_tpot_s)}"
    return f"TTFT {seconds(pred.expected_ttft_s)}{tpot} at the efficiencies published engines reach here"


def summary_table(pred: Prediction) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    params = pred.parameters
    active = f" ({si(params.active, '')} active per token)" if params.active != params.total else ""
    prefill_x, decode_x = pred.prefill_compute_bound_from_tokens, pred.decode_compute_bound_from_batch
    rows = [
        ("parameters", f"{si(params.total, '')}{active}"),
        ("weights", f"{si(pred.weight_bytes, 'B')} ({weight_formats(pred)})"),
        ("KV cache per token", si(pred.kv_bytes_per_token, "B")),
        (
            "recurrent state per sequence",
            f"{si(pred.state_bytes_per_sequence, 'B')} ({pred.state_bytes_per_value} B/value)"
            if pred.state_bytes_per_sequence
            else "none",
        ),
        (
            "TTFT",
            f"{seconds(pred.ttft_s)} with each op at its roof; bound {seconds(pred.ttft_bound_s)} fused "
            f"(prefill {pred.prefill.bound}-bound)",
        ),
        (
            "TPOT",
            NO_DECODE
            if pred.tpot_s is None
            else f"{seconds(pred.tpot_s)} mean: {seconds(pred.decode_first.time_s)} at the first token, "
            f"{seconds(pred.decode_last.time_s)} at the last; bound {seconds(pred.tpot_bound_s)} fused "
            f"(decode {pred.decode_first.bound}-bound)",
        ),
        ("expected", _expected(pred)),
        ("end-to-end", seconds(pred.e2e_s)),
        (
            "decode tok/s",
            "none (no decode step)"
            if pred.tpot_s is None
            else f"{pred.decode_tokens_per_s_per_seq:.4g} per sequence, {pred.decode_tokens_per_s_total:.4g} in total "
            "(1 / TPOT)",
        ),
        ("output tok/s", f"{pred.output_tokens_per_s:.4g} (all output tokens over the end-to-end time)"),
        (
            "memory",
            f"{si(pred.memory_needed_bytes, 'B')} needed (prefill activations {si(pred.activation_bytes, 'B')} of it) "
            f"of {si(pred.memory_available_bytes, 'B')} usable ({pred.gpu_memory_utilization:g} of "
            f"{si(pred.device_memory_bytes, 'B')}); the largest batch that fits is {pred.max_batch}",
        ),
        ("prefill compute-bound", "never" if prefill_x is None else f"from {prefill_x} prompt tokens"),
        (
            "decode compute-bound",
            f"never at this context (each sequence's KV reads{' and all-reduces' if pred.tp > 1 else ''} grow with "
            "the batch)"
            if decode_x is None
            else f"from batch {decode_x}",
        ),
        ("ridge point", f"{pred.ridge_point_flops_per_byte:.3g} FLOP/byte"),
        ("memory roof", memory_roof(pred.hw)),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


def print_prediction(pred: Prediction, console: Console) -> None:
    tp = f", tp={pred.tp}" if pred.tp > 1 else ""
    console.print(
        f"[bold]{pred.model}[/] on [bold]{pred.hw.name}[/]{tp}: batch {pred.batch}, {pred.prompt_len} prompt tokens, "
        f"{pred.output_len} output tokens, weights {weight_formats(pred)}, KV {pred.kv_bytes_per_value} B/value"
    )
    console.print(op_table(f"prefill step ({pred.batch} x {pred.prompt_len} tokens)", pred.prefill, pred))
    decode = f"decode step (batch {pred.batch}, {pred.prompt_len} cached)"
    if pred.tpot_s is None:
        decode += ": none runs for one output token; what a second would take"
    console.print(op_table(decode, pred.decode_first, pred))
    console.print(summary_table(pred))


def phase_table(phases: dict) -> Table:
    """PREFILL | DECODE side by side: the work each phase did, the rates it reached, its bound and expected time."""
    names = list(phases)
    table = Table(*([""] + [n.upper() for n in names]), box=None, padding=(0, 2))
    rows = [
        ("steps / tokens", lambda p: f"{p.steps} / {p.tokens}"),
        ("time measured", lambda p: seconds(p.measured_s)),
        ("time expected", lambda p: seconds(p.expected_s) if p.expected_s is not None else "- (not calibrated)"),
        ("time bound", lambda p: f"{seconds(p.bound_s)} (fused roofline)"),
        ("ops at their roofs", lambda p: seconds(p.predicted_s)),
        ("FLOPs", lambda p: si(p.flops, "FLOP")),
        ("bytes moved", lambda p: si(p.bytes, "B")),
        ("achieved", lambda p: f"{si(p.achieved_flops_per_s, 'FLOP/s')}, {si(p.achieved_bytes_per_s, 'B/s')}"),
        ("% of compute roof", lambda p: f"{p.pct_of_compute_roof:.1f}% of {si(p.peak_flops, 'FLOP/s')}"),
        ("% of bandwidth roof", lambda p: f"{p.pct_of_bandwidth_roof:.1f}% of {si(p.bandwidth, 'B/s')}"),
        ("bound", lambda p: p.bound),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(phases[n]) for n in names))
    return table


GAP_COLOURS = {
    "bound": "green",
    "unfused ops": "cyan",
    "linears inefficiency": "blue",
    "attention inefficiency": "magenta",
    "elementwise inefficiency": "bright_magenta",
    "communication": "bright_blue",
    "drafting": "red",
    "host (forward)": "yellow",
    "host (sampling, scheduling)": "bright_yellow",
    "unexplained": "bright_black",
}


def gap_bar(name: str, gap, per: int, width: int = 48) -> Text:
    """One phase's measured time as a stacked bar of its parts (those that take time; a part below zero, a class
    faster than its roofline share, is only in the legend), each part per token (decode) or for the phase."""
    parts = gap.parts()
    total = sum(v for v in parts.values() if v > 0)
    bar = Text(f"{name:<8}")
    for part, value in parts.items():
        if value > 0 and total > 0:
            bar.append("█" * round(width * value / total), style=GAP_COLOURS[part])
    legend = " · ".join(f"{part} {seconds(value / per)}" for part, value in parts.items() if abs(value) / per >= 1e-6)
    bar.append(f"  {legend}")
    return bar


def speculative_sentence(spec: SpeculativePrediction) -> str:
    """What speculative decoding's prediction says, in one sentence."""
    k, a = spec.num_speculative_tokens, spec.acceptance
    return (
        f"speculative decoding, {k} draft token{'' if k == 1 else 's'} accepted at {a:.0%} each: {spec.tokens_per_step:.2f} tokens per "
        f"verify step of {seconds(spec.verify.time_s)} (a decode step: {seconds(spec.decode.time_s)}, "
        f"{spec.context} tokens deep), TPOT {seconds(spec.tpot_s)} instead of {seconds(spec.decode_tpot_s)}: "
        f"{spec.speedup:.2f}x"
    )
