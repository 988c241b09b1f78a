"""Measured against predicted: each recorded engine step goes through the analyzer's own op model (`time_step`
on its StepShape), and the measured time says what FLOP/s and bytes/s the run achieved, as % of this machine's roofs.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.roofline.calibration import Calibration, ExpectedStep, Gap, step_gap
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import StepShape, expected_experts_touched
from rooftop.roofline.precision import Precision
from rooftop.roofline.predict import StepTime, time_step
from rooftop.roofline.report import decode_lever, seconds, si


@dataclass(frozen=True)
class StepAttribution:
    """One recorded step beside the analyzer: `forward_s` the forward pass as the engine timed it, `around_s` the
    rest of the step (scheduling, sampling, detokenizing), `drafting_s` speculative decoding's proposals before it
    (a draft model's forward passes, which the op model of the verify step leaves out); the op model's numbers for
    its shape on the same hardware; with a calibration, the expected time by part and the gap decomposed."""

    shape: StepShape
    forward_s: float
    predicted: StepTime
    around_s: float = 0.0
    expected: ExpectedStep | None = None
    drafting_s: float = 0.0

    @property
    def measured_s(self) -> float:
        """The step's wall time: what it took from its drafts to its tokens."""
        return self.forward_s + self.drafting_s + self.around_s

    def gap(self, hw: Hardware) -> Gap | None:
        if self.expected is None:
            return None
        return step_gap(self.predicted, self.expected, self.forward_s, self.around_s, hw, self.drafting_s)


def attribute_step(
    config: ModelConfig,
    p: Precision,
    shape: StepShape,
    seconds: float,
    hw: Hardware,
    around_s: float = 0.0,
    calibration: Calibration | None = None,
    drafting_s: float = 0.0,
) -> StepAttribution:
    predicted = time_step(config, p.at(shape.tokens), shape, hw)
    expected = None if calibration is None else calibration.expected(config, p, shape, hw, predicted)
    return StepAttribution(shape, seconds, predicted, around_s, expected, drafting_s)


@dataclass(frozen=True)
class PhaseAttribution:
    """All steps of one phase of a run, summed: the work, the measured time, the achieved rates."""

    phase: Phase
    steps: int
    tokens: int
    measured_s: float  # wall time of the steps
    predicted_s: float  # the op model's roofline, ops one after another
    bound_s: float  # the fused lower bound (StepTime.bound_s)
    flops: float
    bytes: float
    compute_time_s: float  # Σ FLOPs / peak: what the math alone would take at the roof
    memory_time_s: float  # Σ bytes / bandwidth
    peak_flops: float
    bandwidth: float
    expected_s: float | None = None  # the calibrated time of the steps, with a calibration
    gap: Gap | None = None  # the steps' gaps summed, with a calibration
    kv_share: float = 0.0  # the KV cache's share of the bytes no fusion avoids (weights, KV cache, state)
    comm_time_s: float = 0.0  # Σ the tensor-parallel collectives at the probed latency and interconnect bandwidth

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / self.measured_s

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.bytes / self.measured_s

    @property
    def pct_of_compute_roof(self) -> float:
        return 100 * self.achieved_flops_per_s / self.peak_flops

    @property
    def pct_of_bandwidth_roof(self) -> float:
        return 100 * self.achieved_bytes_per_s / self.bandwidth

    @property
    def roof(self) -> str:
        """The roof the phase's work meets first: compute or memory."""
        return "compute" if self.compute_time_s >= self.memory_time_s else "memory"

    @property
    def bound(self) -> str:
        """What bounds the phase, by the largest part of its time: its roof, or drafting when speculative
        decoding's proposals are over half of it, the host when the host's time (in and around the forward pass)
        is, or communication when a tensor-parallel step's collectives are."""
        if self.gap is not None and self.gap.drafting_s > self.measured_s / 2:
            return "drafting"
        if self.gap is not None and self.gap.host_s + self.gap.around_s > self.measured_s / 2:
            return "host"
        if self.gap is not None and self.gap.communication_s > self.measured_s / 2:
            return "communication"
        return self.roof

    @property
    def pct_of_bound_roof(self) -> float:
        return self.pct_of_compute_roof if self.roof == "compute" else self.pct_of_bandwidth_roof

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "measured_s": self.measured_s,
            "predicted_s": self.predicted_s,
            "bound_s": self.bound_s,
            "expected_s": self.expected_s,
            "gap_s": None if self.gap is None else self.gap.parts(),
            "flops": self.flops,
            "bytes": self.bytes,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "achieved_bytes_per_s": self.achieved_bytes_per_s,
            "pct_of_compute_roof": self.pct_of_compute_roof,
            "pct_of_bandwidth_roof": self.pct_of_bandwidth_roof,
            "bound": self.bound,
            "roof": self.roof,
            "pct_of_bound_roof": self.pct_of_bound_roof,
            "roof_flops_per_s": self.peak_flops,
            "roof_bytes_per_s": self.bandwidth,
        }


def attribute_phases(steps: list[StepAttribution], hw: Hardware) -> dict[str, PhaseAttribution]:
    """Group steps by phase ("prefill", "decode", "mixed") and sum them. A phase's compute roof is the peak its
    steps' math ran at (FLOP-weighted: Σ FLOPs / Σ FLOPs-at-peak time), since kernels can differ by step size."""
    phases: dict[str, PhaseAttribution] = {}
    for phase in Phase:
        chosen = [s for s in steps if s.shape.phase == phase]
        if not chosen:
            continue
        gaps = [s.gap(hw) for s in chosen]
        phases[phase] = PhaseAttribution(
            phase=phase,
            steps=len(chosen),
            tokens=sum(s.shape.tokens for s in chosen),
            measured_s=sum(s.measured_s for s in chosen),
            predicted_s=sum(s.predicted.time_s for s in chosen),
            bound_s=sum(s.predicted.bound_s for s in chosen),
            flops=sum(s.predicted.flops for s in chosen),
            bytes=sum(s.predicted.bytes for s in chosen),
            compute_time_s=sum(s.predicted.compute_time_s for s in chosen),
            memory_time_s=sum(s.predicted.memory_time_s for s in chosen),
            peak_flops=sum(s.predicted.flops for s in chosen) / sum(s.predicted.compute_time_s for s in chosen),
            bandwidth=hw.memory_bandwidth,
            # the drafts as measured: the calibration has no model of a draft model's passes
            expected_s=None if None in gaps else sum(s.expected.total_s + s.drafting_s for s in chosen),
            gap=None if None in gaps else functools.reduce(operator.add, gaps),
            kv_share=sum(s.predicted.kv_share * s.predicted.essential_bytes for s in chosen)
            / max(sum(s.predicted.essential_bytes for s in chosen), 1.0),
            comm_time_s=sum(s.predicted.comm_time_s for s in chosen),
        )
    return phases


def gap_sentence(phases: dict[str, PhaseAttribution]) -> str:
    """One sentence per phase: the distance to the roof, and the measured, expected and bound times, e.g.
    "decode reached 38% of memory bandwidth: measured 5.2 ms, expected 5.1 ms, bound 1.9 ms per token, 47 steps"."""
    parts = []
    for name, p in phases.items():
        roof = "compute peak" if p.roof == "compute" else "memory bandwidth"
        per = f"for {p.tokens} tokens"
        if name == "decode":  # verify steps of speculative decoding compute several tokens each
            per = (
                f"per token, {p.steps} steps"
                if p.tokens == p.steps
                else f"per step, {p.steps} steps of {p.tokens} rows (verify steps: their drafts checked, kept or not)"
            )
        scale = p.steps if name == "decode" else 1
        expected = "-" if p.expected_s is None else seconds(p.expected_s / scale)
        parts.append(
            f"{name} reached {p.pct_of_bound_roof:.0f}% of {roof}: measured {seconds(p.measured_s / scale)}, "
            f"expected {expected}, bound {seconds(p.bound_s / scale)} {per}"
        )
    return "; ".join(parts) + "."


def advice(
    name: str, p: PhaseAttribution, kv_value_bytes: float = 4, weight_bits: float = 16, speculative: bool = True
) -> str:
    """The lever that would move this phase, chosen from what its time went to (its gap's largest part) and, for
    a memory-bound decode, from what its bytes are (the KV cache is stored at `kv_value_bytes` per value, the
    weights at `weight_bits` each); speculative decoding only where the model runs it (`ModelConfig.can_speculate`)."""
    if p.measured_s < p.bound_s:
        return beat_bound(name, p)
    if p.bound == "host":
        host = p.gap.host_s + p.gap.around_s
        return (
            f"{name} is host-bound: {100 * host / p.measured_s:.0f}% of its time is Python, step metadata, "
            "scheduling and sampling; more sequences per step (--max-num-seqs) spread that cost over more tokens"
        )
    if p.bound == "drafting":
        return (
            f"{name} is drafting-bound: {100 * p.gap.drafting_s / p.measured_s:.0f}% of its time proposes drafts "
            "(a draft model's forward passes) before each verify step; a smaller draft (fewer draft_layers), fewer "
            "num_speculative_tokens, ngram, or no speculative decoding"
        )
    if p.bound == "communication":
        share = p.gap.communication_s / (p.expected_s or p.measured_s)
        stale = (
            f"; the calibration timed them at {seconds(p.gap.communication_s)}, under the {seconds(p.comm_time_s)} "
            "the group's probe gives them (the bound counts the probe's), so `rooftop probe --force` with this "
            "run's --tensor-parallel-size measures the group again"
            if p.gap.communication_s < p.comm_time_s
            else ""
        )
        return (
            f"{name} is communication-bound: {100 * share:.0f}% of its expected time waits on the tensor-parallel "
            "collectives (two all-reduces per layer); fewer ranks (--tensor-parallel-size), a faster interconnect, "
            f"or more tokens per step to spread each collective's latency{stale}"
        )
    linears = p.gap.inefficiency["linears"] if p.gap else 0.0
    if p.gap is not None and linears > p.gap.bound_s:
        return (
            f"{name}: the linears took {seconds(linears / max(1, p.steps if name == 'decode' else 1))} beyond their "
            "roof, more than the bound itself: their kernels, not the hardware, set the pace; another weight "
            "format (--weights) runs other kernels"
        )
    if p.roof == "memory" and name == "decode":
        return "decode is memory-bound: " + decode_lever(
            p.kv_share, kv_value_bytes, p.tokens / p.steps, weight_bits, speculative
        )
    if p.roof == "memory":
        return f"{name} is memory-bound (few tokens per step): longer chunks or more prompts per step share the weights' read"
    return (
        f"{name} is compute-bound: a faster matmul format (--dtype bfloat16 where the CPU multiplies it natively) "
        "or fewer FLOPs per token would move it"
    )


def beat_bound(name: str, p: PhaseAttribution) -> str:
    """A phase that ran faster than its bound did more per second than the probe measured this machine doing: the
    roof came from a slower minute (a shared host's read moves by half between minutes, docs/PERFORMANCE.md), and
    the lever is to measure it again, not a setting of the run. Where the collectives bound it, their probed time
    was slower than they ran."""
    if p.comm_time_s >= max(p.compute_time_s, p.memory_time_s):
        return (
            f"{name} ran faster than its bound: {seconds(p.measured_s)} against {seconds(p.comm_time_s)} for its "
            "tensor-parallel collectives at the probed all-reduce latency and bandwidth, so the group's all-reduce "
            "was faster now than when it was probed; `rooftop probe --force` with this run's --tensor-parallel-size "
            "measures it again"
        )
    if p.roof == "memory":
        done, roof = si(p.achieved_bytes_per_s, "B/s"), f"the probe's read of {si(p.bandwidth, 'B/s')}"
    else:
        done, roof = si(p.achieved_flops_per_s, "FLOP/s"), f"the probe's peak of {si(p.peak_flops, 'FLOP/s')}"
    return (
        f"{name} ran faster than its bound: it moved {done}, above {roof}, so this machine was faster now than when "
        "it was probed; `rooftop probe --force` measures again and keeps the fastest roofs it has seen"
    )


def experts_sentence(config: ModelConfig, steps: list[StepAttribution]) -> str | None:
    """For a mixture-of-experts run, the distinct experts each layer touched per step, measured (the engine's
    record) beside the op model's expectation for the same token counts, by phase; None for a dense model."""
    if not config.is_moe:
        return None
    parts = []
    for phase in Phase:
        chosen = [s.shape for s in steps if s.shape.phase == phase and s.shape.experts_touched is not None]
        if not chosen:
            continue
        measured = sum(s.experts_touched for s in chosen) / len(chosen)
        expected = sum(
            expected_experts_touched(config.num_experts, config.num_experts_per_tok, s.tokens) for s in chosen
        ) / len(chosen)
        parts.append(f"{phase} {measured:.1f} (expected {expected:.1f})")
    if not parts:
        return None
    return f"experts touched per layer and step, of {config.num_experts}: " + ", ".join(parts) + "."
