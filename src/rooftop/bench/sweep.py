"""`rooftop bench`: TTFT against prompt length and TPOT / throughput against batch size, measured and predicted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

from rooftop.bench.measure import run_batch, synthetic_prompt
from rooftop.engine.llm import LLM
from rooftop.roofline.attribution import advice, attribute_phases, attribute_step
from rooftop.roofline.calibration import Calibration
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import StepShape
from rooftop.roofline.predict import decode_time


@dataclass
class StepPoint:
    """One measured step on the roofline chart, with the analyzer's point for the same shape."""

    phase: str
    label: str
    intensity: float
    achieved_flops_per_s: float
    predicted_flops_per_s: float


@dataclass
class SweepResult:
    ttft: list[dict] = field(default_factory=list)
    decode: list[dict] = field(default_factory=list)
    points: list[StepPoint] = field(default_factory=list)
    gaps: list[tuple[str, dict[str, float]]] = field(default_factory=list)  # (label, a step's gap by part, seconds)


def sweep(
    llm: LLM,
    hw: Hardware,
    calibration: Calibration,
    prompt_lens: list[int],
    batch_sizes: list[int],
    output_len: int,
    reps: int,
    on_progress: Callable[[str], None] = lambda _: None,
    decode_context: int | None = None,
) -> SweepResult:
    """TTFT at each prompt length (batch 1), then decode at each batch size, its sequences `decode_context` tokens
    deep (default: the shortest prompt's length). The repetitions are passes over the whole sweep, each row's time
    the median of its passes (pass 0 warms up): on a shared host one minute's read can be half the next one's
    (docs/PERFORMANCE.md), and a row's repetitions taken back to back would all be one minute's, where spread over
    the sweep they are its typical minute, as the calibration's passes are."""
    context = decode_context or min(prompt_lens)  # the batch, not the context, varies
    prefills: dict[int, list] = {S: [] for S in prompt_lens}  # per prompt length: (TTFT, its prefill step)
    decodes: dict[int, list] = {B: [] for B in batch_sizes}  # per batch: median forward, around and drafting
    for rep in range(reps + 1):
        progress = "warm-up" if rep == 0 else f"pass {rep} of {reps}"
        for S in prompt_lens:
            on_progress(f"prefill of {S} tokens ({progress})")
            run = run_batch(llm, [synthetic_prompt(llm, S, rep)], 1)
            if rep:
                prefills[S].append((run.ttft_s[0], next(r for r in run.records if r.phase == "prefill")))
        for B in batch_sizes:
            on_progress(f"decode at batch {B} ({progress})")
            run = run_batch(llm, [synthetic_prompt(llm, context, 1000 * rep + i) for i in range(B)], output_len)
            steps = [r for r in run.records if r.phase == "decode" and r.shape.num_seqs == B]
            if rep and steps:
                parts = [(r.seconds, r.around_seconds, r.draft_seconds) for r in steps]
                decodes[B].append(tuple(median(part) for part in zip(*parts, strict=True)))
    result = SweepResult()
    for S, taken in prefills.items():
        _add_prefill(result, llm, hw, calibration, S, taken)
    for B, taken in decodes.items():
        _add_decode(result, llm, hw, calibration, B, context, output_len, taken)
    return result


def _add_prefill(result: SweepResult, llm: LLM, hw: Hardware, calibration: Calibration, S: int, taken: list) -> None:
    """The row of a prompt of S tokens from its passes' (TTFT, prefill step record)."""
    p = llm.precision
    forward = median(step.seconds for _, step in taken)
    around = median(step.around_seconds for _, step in taken)
    att = attribute_step(llm.config, p, StepShape.prefill(1, S), forward, hw, around, calibration)
    phase = attribute_phases([att], hw)["prefill"]
    result.ttft.append(
        {
            "prompt_tokens": S,
            "measured_ttft_s": median(ttft for ttft, _ in taken),
            "measured_prefill_step_s": att.measured_s,
            "expected_prefill_step_s": att.expected.total_s,
            "bound_prefill_step_s": att.predicted.bound_s,
            "predicted_ttft_s": att.predicted.time_s,
            "achieved_flops_per_s": phase.achieved_flops_per_s,
            "pct_of_compute_roof": phase.pct_of_compute_roof,
            "prefill_tokens_per_s": S / att.measured_s,
            "advice": advice("prefill", phase, p.kv_bytes, p.weights.bits_per_weight(), llm.config.can_speculate),
        }
    )
    result.points.append(_point("prefill", f"pp{S}", att, hw))
    result.gaps.append((f"pp{S}", att.gap(hw).parts()))


def _add_decode(
    result: SweepResult,
    llm: LLM,
    hw: Hardware,
    calibration: Calibration,
    B: int,
    context: int,
    output_len: int,
    taken: list[tuple[float, float, float]],
) -> None:
    """The row of a decode at batch B from its passes' (median forward, around, drafting) seconds per step."""
    p = llm.precision
    predicted = decode_time(llm.config, p, hw, B, context, output_len) / (output_len - 1)
    mid = StepShape.decode(B, context + output_len // 2)
    forward, around, drafting = (median(part) for part in zip(*taken, strict=True))
    att = attribute_step(llm.config, p, mid, forward, hw, around, calibration, drafting)
    measured = att.measured_s
    phase = attribute_phases([att], hw)["decode"]
    expected = att.expected.total_s + att.drafting_s
    result.decode.append(
        {
            "batch": B,
            "context_tokens": context,
            "measured_tpot_s": measured,
            "expected_tpot_s": expected,
            "bound_tpot_s": att.predicted.bound_s,
            "expected_tokens_per_s_total": B / expected,
            "predicted_tpot_s": predicted,
            "measured_tokens_per_s_total": B / measured,
            "predicted_tokens_per_s_total": B / predicted,
            "achieved_bytes_per_s": phase.achieved_bytes_per_s,
            "pct_of_bandwidth_roof": phase.pct_of_bandwidth_roof,
            "advice": advice("decode", phase, p.kv_bytes, p.weights.bits_per_weight(), llm.config.can_speculate),
        }
    )
    result.points.append(_point("decode", f"b{B}", att, hw))
    result.gaps.append((f"b{B}", att.gap(hw).parts()))


def _point(phase: str, label: str, att, hw: Hardware) -> StepPoint:
    step = att.predicted
    return StepPoint(phase, label, step.intensity, step.flops / att.measured_s, step.flops / step.time_s)
