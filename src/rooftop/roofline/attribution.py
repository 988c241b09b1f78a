"""Measured against predicted: each recorded engine step goes through the analyzer's own op model (`time_step`
on its StepShape), and the measured time says what FLOP/s and bytes/s the run achieved, as % of this machine's roofs.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import StepShape, expected_experts_touched
from rooftop.roofline.precision import Precision
from rooftop.roofline.predict import StepTime, time_step
from rooftop.roofline.report import seconds


@dataclass(frozen=True)
class StepAttribution:
    shape: StepShape
    measured_s: float
    predicted: StepTime  # the analyzer's numbers for the same shape on the same hardware


def attribute_step(
    config: ModelConfig, p: Precision, shape: StepShape, seconds: float, hw: Hardware
) -> StepAttribution:
    return StepAttribution(shape, seconds, time_step(config, p.at(shape.tokens), shape, hw))


@dataclass(frozen=True)
class PhaseAttribution:
    """All steps of one phase of a run, summed: the work, the measured time, the achieved rates."""

    phase: Phase
    steps: int
    tokens: int
    measured_s: float
    predicted_s: float
    flops: float
    bytes: float
    compute_time_s: float  # Σ FLOPs / peak: what the math alone would take at the roof
    memory_time_s: float  # Σ bytes / bandwidth
    peak_flops: float
    bandwidth: float

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
    def bound(self) -> str:
        return "compute" if self.compute_time_s >= self.memory_time_s else "memory"

    @property
    def pct_of_bound_roof(self) -> float:
        return self.pct_of_compute_roof if self.bound == "compute" else self.pct_of_bandwidth_roof

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "measured_s": self.measured_s,
            "predicted_s": self.predicted_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "achieved_bytes_per_s": self.achieved_bytes_per_s,
            "pct_of_compute_roof": self.pct_of_compute_roof,
            "pct_of_bandwidth_roof": self.pct_of_bandwidth_roof,
            "bound": self.bound,
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
        phases[phase] = PhaseAttribution(
            phase=phase,
            steps=len(chosen),
            tokens=sum(s.shape.tokens for s in chosen),
            measured_s=sum(s.measured_s for s in chosen),
            predicted_s=sum(s.predicted.time_s for s in chosen),
            flops=sum(s.predicted.flops for s in chosen),
            bytes=sum(s.predicted.bytes for s in chosen),
            compute_time_s=sum(s.predicted.compute_time_s for s in chosen),
            memory_time_s=sum(s.predicted.memory_time_s for s in chosen),
            peak_flops=sum(s.predicted.flops for s in chosen) / sum(s.predicted.compute_time_s for s in chosen),
            bandwidth=hw.memory_bandwidth,
        )
    return phases


def gap_sentence(phases: dict[str, PhaseAttribution]) -> str:
    """One sentence per phase naming the distance to the roof, e.g. "decode reached 52% of memory bandwidth: ..."."""
    parts = []
    for name, p in phases.items():
        roof = "compute peak" if p.bound == "compute" else "memory bandwidth"
        per = f"for {p.tokens} tokens"
        if name == "decode":  # verify steps of speculative decoding compute several tokens each
            per = (
                f"per token, {p.steps} steps"
                if p.tokens == p.steps
                else f"per step, {p.steps} steps of {p.tokens} tokens"
            )
        if name == "decode":
            predicted, measured = p.predicted_s / p.steps, p.measured_s / p.steps
        else:
            predicted, measured = p.predicted_s, p.measured_s
        parts.append(
            f"{name} reached {p.pct_of_bound_roof:.0f}% of {roof}: predicted {seconds(predicted)}, measured {seconds(measured)} {per}"
        )
    return "; ".join(parts) + "."


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
