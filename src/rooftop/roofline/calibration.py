"""What this machine's engine takes for each kind of op, measured at the model's own shapes, and from it the expected
time of any step and the decomposition of a measured step's gap to its bound.

The op model gives every op's roofline time; a calibration (engine/calibrate.py times the engine's own linears,
attention and elementwise kernels inside real steps) maps, per phase and op class, the roofline time to the time the
engine took, and records the step's host time (Python, metadata and dispatch inside the forward pass; scheduling,
sampling and detokenizing around it) against the number of sequences (a prefill's inside the forward pass: against
its tokens). Plain data and arithmetic: no torch, no engine.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import SeqShape, StepShape
from rooftop.roofline.precision import Precision
from rooftop.roofline.predict import StepTime, step_bound, time_step

KERNEL_CLASSES = ("linears", "attention", "elementwise")  # the classes whose kernels have an inefficiency
CLASSES = (*KERNEL_CLASSES, "communication")
LINEARS = {
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "lm_head",
    "router",
    "experts_gate_up",
    "experts_down",
    "shared_gate_up",
    "shared_down",
    "linear_in_proj",
    "linear_out_proj",
}
TOKEN_MIXING = {"attention", "rope", "qk_norm", "linear_conv", "linear_recurrence"}
COMMUNICATION = {"all_reduce", "logits_gather", "plan_broadcast"}  # a tensor-parallel step's collectives
# Curves drawn against the step's rows instead of the class's roofline seconds: a decode step reads the same weight
# bytes at every batch, so its linears' roofline seconds barely move from 1 to 8 rows while the kernels' work per
# extra row does (a 5-row speculative verify step took ~1.6x one row's linears); against roofline seconds, batches
# 1, 2, 4 and 8 fell within a few percent of one another and the curve zig-zagged between their noisy times.
ROWS_KEYED = {"decode.linears"}
# Host curves drawn against the step's tokens instead of its sequences: what a prefill's forward pass spends outside
# its timed ops grows with the chunk (embedding, K/V writes, dispatch per op on larger tensors), and every prompt of
# the calibration is one sequence, so against sequences a 16-token prompt took the mean of its residual and that
# of prompts up to 2048 tokens (a 1B's pp16 was expected at 124 ms, measured 55: docs/BENCHMARKS.md).
TOKENS_KEYED = {"prefill.host"}


def op_class(name: str) -> str:
    """The class an op of the op model is timed under: linears, attention (the ops that mix tokens: attention with
    its RoPE and Q/K norm, the linear layers' conv and recurrence), communication, or elementwise (the rest)."""
    if name in LINEARS:
        return "linears"
    if name in TOKEN_MIXING:
        return "attention"
    return "communication" if name in COMMUNICATION else "elementwise"


def class_roofline(step: StepTime, hw: Hardware) -> dict[str, float]:
    """Each class's share of the step's roofline time (its ops one after another, each at its roof)."""
    shares = dict.fromkeys(CLASSES, 0.0)
    for op in step.ops:
        shares[op_class(op.name)] += op.time(hw)
    return shares


@dataclass(frozen=True)
class Curve:
    """Measured seconds against an input (a class's roofline seconds, or a step's number of sequences), ascending
    in the input: linear between points; below the first, the first point's time (the floor fixed costs set);
    above the last, the last point's ratio of time to input (the efficiency the largest shapes reached) or, for
    a cost that grows with the input but not in proportion to it (the host's per step), the last segment's slope."""

    points: tuple[tuple[float, float], ...]

    def at(self, x: float, proportional: bool = True) -> float:
        if not self.points:
            return 0.0
        xs = [p[0] for p in self.points]
        if x <= xs[0]:
            return self.points[0][1]
        if x >= xs[-1]:
            last_x, last_y = self.points[-1]
            if not proportional:
                if len(xs) == 1:
                    return last_y
                x0, y0 = self.points[-2]
                return last_y + (last_y - y0) / (last_x - x0) * (x - last_x)
            return last_y * x / last_x if last_x > 0 else last_y
        i = bisect.bisect_right(xs, x)
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    @classmethod
    def through(cls, samples: list[tuple[float, float]]) -> Curve:
        """A curve through (input, seconds) samples, equal inputs averaged."""
        merged: dict[float, list[float]] = {}
        for x, y in samples:
            merged.setdefault(round(x, 12), []).append(y)
        return cls(tuple((x, sum(ys) / len(ys)) for x, ys in sorted(merged.items())))


@dataclass(frozen=True)
class ExpectedStep:
    """A step's expected time, by part: each op class's calibrated time, the host time inside the forward pass,
    and the host time around it (scheduling, sampling, detokenizing)."""

    classes: dict[str, float]
    host_s: float
    around_s: float

    @property
    def forward_s(self) -> float:
        return sum(self.classes.values()) + self.host_s

    @property
    def total_s(self) -> float:
        return self.forward_s + self.around_s


@dataclass(frozen=True)
class Calibration:
    """Per "phase.class" (prefill.linears, decode.attention, ...) a curve of measured seconds against the class's
    roofline seconds (ROWS_KEYED: against the step's rows); per "phase.host" and "phase.around" a curve of seconds
    against the step's sequences (TOKENS_KEYED: its tokens). `identity` says for which machine, model, format and engine settings it was
    measured."""

    curves: dict[str, Curve]
    identity: dict[str, str] = field(default_factory=dict)
    quick: bool = False
    # the longest context its runs reached (prompt and output tokens): an expected time far past it is carried from
    # shorter shapes, whose kernels ran from the caches
    timed_context: int = 0

    def expected(
        self, config: ModelConfig, p: Precision, shape: StepShape, hw: Hardware, step: StepTime | None = None
    ) -> ExpectedStep:
        """The calibrated time of a step of `shape` (`step`: the op model's time of it, if the caller has it). A mixed
        step's prefill chunks and decodes run their own kernels (the chunks widen, the decodes do not): each part
        takes its phase's curves, the host its decodes'."""
        parts = _by_phase(shape)
        classes = dict.fromkeys(CLASSES, 0.0)
        for phase, sub in parts.items():
            timed = step if step is not None and len(parts) == 1 else time_step(config, p.at(sub.tokens), sub, hw)
            for name, value in class_roofline(timed, hw).items():
                key = f"{phase}.{name}"
                curve = self.curves.get(key)
                if curve is None:
                    classes[name] += value
                elif key in ROWS_KEYED:
                    classes[name] += curve.at(sub.tokens, proportional=False)
                else:
                    classes[name] += curve.at(value)
        host_phase = Phase.DECODE if Phase.DECODE in parts else Phase.PREFILL
        return ExpectedStep(classes, self._host(f"{host_phase}.host", shape), self._host(f"{host_phase}.around", shape))

    def _host(self, key: str, shape: StepShape) -> float:
        curve = self.curves.get(key)
        x = shape.tokens if key in TOKENS_KEYED else shape.num_seqs
        return 0.0 if curve is None else curve.at(x, proportional=False)

    def to_dict(self) -> dict:
        return {
            "identity": self.identity,
            "quick": self.quick,
            "timed_context": self.timed_context,
            "curves": {k: [list(p) for p in c.points] for k, c in self.curves.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        curves = {k: Curve(tuple((float(x), float(y)) for x, y in pts)) for k, pts in data["curves"].items()}
        identity, quick = dict(data.get("identity", {})), bool(data.get("quick", False))
        return cls(curves, identity, quick, int(data.get("timed_context", 0)))


def _by_phase(shape: StepShape) -> dict[Phase, StepShape]:
    """The step's prefill and decode sequences as steps of their own (the experts touched stay the step's)."""
    groups: dict[Phase, list[SeqShape]] = {}
    for s in shape.seqs:
        groups.setdefault(Phase.DECODE if s.phase is Phase.DECODE else Phase.PREFILL, []).append(s)
    return {phase: StepShape(tuple(seqs), shape.experts_touched, shape.tp) for phase, seqs in groups.items()}


@dataclass(frozen=True)
class Gap:
    """A measured step (or a phase's steps, summed) split into parts that add up to the measured time:
    `bound` (the step's fused lower bound, StepTime.bound_s: its kernels' ops, or a tensor-parallel step's
    collectives at the probed interconnect where they take longer), `unfused` (the kernels' ops one after another at
    their roofs, activations through memory, minus their own bound), each kernel class's inefficiency (calibrated
    time minus its roofline share), `communication` (a tensor-parallel step's collectives as calibrated, the time it
    waits on the other ranks, less what of it the bound already counts), `drafting` (speculative decoding's
    proposals before the verify step, as measured), `host` (inside the forward pass), `around`
    (scheduling, sampling, detokenizing: the step's own record), and `unexplained` (what the calibration did not
    predict of the forward pass: noise, a busier memory bus, a colder cache)."""

    measured_s: float
    bound_s: float
    unfused_s: float
    inefficiency: dict[str, float]
    host_s: float
    around_s: float
    unexplained_s: float
    communication_s: float = 0.0  # the collectives' calibrated time, whole
    kernels_bound_s: float | None = None  # the kernels' ops' own fused bound (None: bound_s, no collectives)
    drafting_s: float = 0.0  # speculative decoding's proposals (a draft model's forward passes), as measured

    def parts(self) -> dict[str, float]:
        """The parts in the order a stacked bar draws them."""
        counted = self.bound_s - self.kernels  # what the bound already counts of the collectives
        return {
            "bound": self.bound_s,
            "unfused ops": self.unfused_s,
            **{f"{name} inefficiency": v for name, v in self.inefficiency.items()},
            "communication": self.communication_s - counted,
            "drafting": self.drafting_s,
            "host (forward)": self.host_s,
            "host (sampling, scheduling)": self.around_s,
            "unexplained": self.unexplained_s,
        }

    def __add__(self, other: Gap) -> Gap:
        return Gap(
            self.measured_s + other.measured_s,
            self.bound_s + other.bound_s,
            self.unfused_s + other.unfused_s,
            {k: self.inefficiency[k] + other.inefficiency[k] for k in self.inefficiency},
            self.host_s + other.host_s,
            self.around_s + other.around_s,
            self.unexplained_s + other.unexplained_s,
            self.communication_s + other.communication_s,
            self.kernels + other.kernels,
            self.drafting_s + other.drafting_s,
        )

    @property
    def kernels(self) -> float:
        """The kernels' ops' own fused bound."""
        return self.bound_s if self.kernels_bound_s is None else self.kernels_bound_s

    def to_dict(self) -> dict:
        return {"measured_s": self.measured_s, "bound_s": self.bound_s, "parts_s": self.parts()}


def step_gap(
    predicted: StepTime,
    expected: ExpectedStep,
    forward_s: float,
    around_s: float,
    hw: Hardware,
    drafting_s: float = 0.0,
) -> Gap:
    """Decompose one recorded step: `forward_s` its forward pass as the engine timed it, `around_s` the rest of the
    step (measured); `expected` the calibration's parts for its shape. The bound and the unfused ops are those of
    the step's (the report's); a tensor-parallel step's collectives are a part of their own, at their calibrated
    time beyond what the bound counts of them."""
    roof = class_roofline(predicted, hw)
    kernels = [op for op in predicted.ops if op_class(op.name) != "communication"]
    bound = step_bound(kernels, hw)
    return Gap(
        measured_s=forward_s + drafting_s + around_s,
        bound_s=predicted.bound_s,
        unfused_s=sum(op.time(hw) for op in kernels) - bound,
        inefficiency={name: expected.classes[name] - roof[name] for name in KERNEL_CLASSES},
        host_s=expected.host_s,
        around_s=around_s,
        unexplained_s=forward_s - expected.forward_s,
        communication_s=expected.classes["communication"],
        kernels_bound_s=bound,
        drafting_s=drafting_s,
    )
