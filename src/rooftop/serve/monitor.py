"""Monitor: the engine thread reports each step and request to it; it feeds the Prometheus metrics, attributes every
step against this machine's roofs, and keeps the recent history the dashboard draws."""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass

from rooftop.config import ModelConfig
from rooftop.engine.outputs import EngineStats, RequestOutput, StepOutput, StepRecord
from rooftop.enums import FinishReason, Phase
from rooftop.roofline.attribution import attribute_step
from rooftop.roofline.calibration import Calibration
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.precision import Precision
from rooftop.serve.metrics import ServerMetrics

STEPS_WINDOW_S = 60.0  # the dashboard's timeline and roofline points: the steps of the last minute
STEPS_SHOWN = 600  # of them, at most this many sent (evenly thinned): a fast model runs hundreds a second
STEPS_PER_RATE = 32  # achieved FLOP/s and GB/s: over this many most recent steps of a phase
LATENCY_WINDOW_S = 300.0  # TTFT / TPOT percentiles over the last five minutes
THROUGHPUT_WINDOW_S = 10.0


@dataclass(frozen=True)
class StepPoint:
    finished_at: float  # time.perf_counter()
    seconds: float
    phase: Phase
    batch: int  # sequences in the step
    tokens: int  # tokens computed
    sampled: int  # tokens generated
    flops: float
    bytes: float
    bound: float  # the fused lower bound at this machine's roofs, seconds
    wall: float  # the whole step, scheduling and sampling included
    expected: float | None  # the calibration's time for the step, where the monitor has one


@dataclass(frozen=True)
class FinishedPoint:
    finished_at: float
    ttft: float | None
    tpot: float | None


class Monitor:
    """Written by the engine thread, read by HTTP handlers (`snapshot`): the history sits behind a lock."""

    def __init__(
        self,
        metrics: ServerMetrics,
        config: ModelConfig,
        precision: Precision,
        hardware: Hardware,
        calibration: Calibration | None = None,
    ):
        self.metrics, self.config, self.precision, self.hardware = metrics, config, precision, hardware
        self.calibration = calibration  # each step's expected time, beside its bound
        self.lock = threading.Lock()
        self.steps: deque[StepPoint] = deque()  # the last STEPS_WINDOW_S of them
        self.rate_steps = {phase: deque(maxlen=STEPS_PER_RATE) for phase in Phase}
        self.finished: deque[FinishedPoint] = deque(maxlen=10_000)
        self.state = {"running": 0, "waiting": 0, "kv_blocks_used": 0, "kv_blocks_total": 0, "kv_cache_dtype": None}
        # how requests ended, and those the server refused (429: rejected, another 4xx: invalid), as /metrics counts
        self.outcomes = {**{outcome: 0 for outcome in FinishReason}, "rejected": 0, "invalid": 0}
        # the engine's prefix queries, prefix hits, preemptions and speculative decoding counts already counted
        self._counted = (0, 0, 0, 0, 0, 0)
        self._counted_per_pos: list[int] = []
        # quantized weights: decode runs the weight-only kernels, large (prefill) steps widen them to float matmuls
        # where the engine widens (rooftop's CPU kernels: on hosts with AMX)
        computes = sorted({precision.compute, precision.at(1 << 30).compute})
        self.peaks = {compute: hardware.peak(compute) for compute in computes}
        for compute, peak in self.peaks.items():
            metrics.roof_flops.labels(compute=compute).set(peak)
        metrics.roof_bytes.set(hardware.memory_bandwidth)

    def on_step(self, step: StepOutput) -> None:
        if step.record is not None:
            self._record_step(step.record, sum(len(d.new_token_ids) for d in step.deltas))
        m = self.metrics
        for d in step.deltas:
            rm = d.metrics
            new, total = len(d.new_token_ids), rm.output_tokens
            m.generation_tokens.inc(new)
            if total and total == new:  # the request's first token: its prefill is done
                m.prompt_tokens.inc(rm.prompt_tokens)
                m.ttft.observe(rm.ttft)
                if rm.queue_time is not None:
                    m.queue_time.observe(rm.queue_time)
            if new and total > new:  # one gap a step, as vLLM's: a verify step's accepted drafts share its time
                m.itl.observe(rm.token_times[total - 1] - rm.token_times[total - new - 1])
            if d.output is not None:
                self._record_finish(d.output, d.finish_reason)

    def on_abort(self, output: RequestOutput, outcome: FinishReason) -> None:
        self._record_finish(output, outcome)

    def on_refused(self, outcome: str) -> None:
        """A request the server refused before the engine saw it ("rejected" or "invalid")."""
        self.metrics.requests.labels(outcome=outcome).inc()
        with self.lock:
            self.outcomes[outcome] += 1

    def on_state(self, stats: EngineStats) -> None:
        m = self.metrics
        m.running.set(stats.running)
        m.waiting.set(stats.waiting)
        m.kv_cache_usage.set(stats.kv_cache_usage)
        m.cache_config.labels(cache_dtype=stats.kv_cache_dtype, block_size=str(stats.block_size)).set(1)
        spec = stats.spec_decode
        now = (
            stats.prefix_queries,
            stats.prefix_hits,
            stats.preemptions,
            spec.drafts,
            spec.draft_tokens,
            spec.accepted_tokens,
        )
        counters = (
            m.prefix_cache_queries,
            m.prefix_cache_hits,
            m.preemptions,
            m.spec_decode_num_drafts,
            m.spec_decode_num_draft_tokens,
            m.spec_decode_num_accepted_tokens,
        )
        for counter, value, counted in zip(counters, now, self._counted, strict=True):
            counter.inc(value - counted)
        self._counted = now
        counted = self._counted_per_pos + [0] * (len(spec.accepted_per_pos) - len(self._counted_per_pos))
        for position, (value, before) in enumerate(zip(spec.accepted_per_pos, counted, strict=True)):
            m.spec_decode_num_accepted_tokens_per_pos.labels(position=position).inc(value - before)
        self._counted_per_pos = list(spec.accepted_per_pos)
        with self.lock:
            self.state = {
                "running": stats.running,
                "waiting": stats.waiting,
                "kv_blocks_used": stats.kv_blocks_used,
                "kv_blocks_total": stats.kv_blocks_total,
                "kv_cache_dtype": stats.kv_cache_dtype,
            }

    def _record_step(self, record: StepRecord, sampled: int) -> None:
        a = attribute_step(
            self.config,
            self.precision,
            record.shape,
            record.seconds,
            self.hardware,
            record.around_seconds,
            self.calibration,
            record.draft_seconds,
        )
        point = StepPoint(
            record.finished_at,
            record.seconds,
            record.phase,
            record.shape.num_seqs,
            record.shape.tokens,
            sampled,
            a.predicted.flops,
            a.predicted.bytes,
            a.predicted.bound_s,
            a.measured_s,
            None if a.expected is None else a.expected.total_s + a.drafting_s,
        )
        with self.lock:
            self.steps.append(point)
            while self.steps[0].finished_at < point.finished_at - STEPS_WINDOW_S:
                self.steps.popleft()
        self.rate_steps[record.phase].append(point)
        recent = list(self.rate_steps[record.phase])
        seconds = sum(s.seconds for s in recent)
        self.metrics.steps.labels(phase=record.phase).inc()
        if seconds > 0:
            self.metrics.achieved_flops.labels(phase=record.phase).set(sum(s.flops for s in recent) / seconds)
            self.metrics.achieved_bytes.labels(phase=record.phase).set(sum(s.bytes for s in recent) / seconds)
        self.metrics.step_seconds.labels(phase=record.phase).set(sum(s.wall for s in recent) / len(recent))
        self.metrics.step_bound_seconds.labels(phase=record.phase).set(sum(s.bound for s in recent) / len(recent))
        if point.expected is not None:
            expected = [s.expected for s in recent if s.expected is not None]
            self.metrics.step_expected_seconds.labels(phase=record.phase).set(sum(expected) / len(expected))

    def _record_finish(self, output: RequestOutput, outcome: FinishReason) -> None:
        m, rm = self.metrics, output.metrics
        m.requests.labels(outcome=outcome).inc()
        if rm.e2e is not None:
            m.e2e.observe(rm.e2e)
        if rm.tpot is not None:
            m.tpot.observe(rm.tpot)
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if outcome in (FinishReason.STOP, FinishReason.LENGTH):
                self.finished.append(FinishedPoint(time.perf_counter(), rm.ttft, rm.tpot))

    def snapshot(self) -> dict:
        """What the dashboard shows, as JSON-ready numbers (seconds in ms, times as ages)."""
        now = time.perf_counter()
        with self.lock:
            steps, finished = list(self.steps), [f for f in self.finished if now - f.finished_at <= LATENCY_WINDOW_S]
            state, outcomes = dict(self.state), dict(self.outcomes)
        recent = [s for s in steps if now - s.finished_at <= THROUGHPUT_WINDOW_S]
        hw = self.hardware
        return {
            **state,
            "kv_cache_usage": state["kv_blocks_used"] / state["kv_blocks_total"] if state["kv_blocks_total"] else 0.0,
            "requests": outcomes,
            "latency_window_s": LATENCY_WINDOW_S,
            "ttft_ms": _percentiles([f.ttft for f in finished]),
            "tpot_ms": _percentiles([f.tpot for f in finished]),
            "generation_tokens_per_s": sum(s.sampled for s in recent) / THROUGHPUT_WINDOW_S,
            "steps": [
                {
                    "age_s": now - s.finished_at,
                    "ms": s.seconds * 1e3,
                    "phase": s.phase,
                    "batch": s.batch,
                    "tokens": s.tokens,
                }
                for s in steps[:: -(-len(steps) // STEPS_SHOWN) or 1]
            ],
            "roofline": {
                "hardware": hw.name,
                "peaks": [{"compute": c, "flops_per_s": peak} for c, peak in self.peaks.items()],
                "bandwidth_bytes_per_s": hw.memory_bandwidth,
                "points": [
                    {
                        "intensity": s.flops / s.bytes,
                        "flops_per_s": s.flops / s.seconds,
                        "phase": s.phase,
                        "batch": s.batch,
                    }
                    for s in steps
                    if s.bytes > 0 and s.seconds > 0
                ],
                "achieved": {p: self._achieved(steps, p) for p in Phase if any(s.phase == p for s in steps)},
            },
        }

    @staticmethod
    def _achieved(steps: list[StepPoint], phase: str) -> dict:
        recent = [s for s in steps if s.phase == phase][-STEPS_PER_RATE:]
        seconds = sum(s.seconds for s in recent) or float("inf")
        return {
            "flops_per_s": sum(s.flops for s in recent) / seconds,
            "bytes_per_s": sum(s.bytes for s in recent) / seconds,
            "step_ms": sum(s.wall for s in recent) / len(recent) * 1e3,
            "bound_ms": sum(s.bound for s in recent) / len(recent) * 1e3,
            "expected_ms": (
                sum(s.expected for s in recent) / len(recent) * 1e3
                if all(s.expected is not None for s in recent)
                else None
            ),
        }


def _percentiles(values: list[float | None]) -> dict | None:
    """p50 / p90 / p99 / mean in milliseconds, or None without data."""
    values = sorted(v * 1e3 for v in values if v is not None)
    if not values:
        return None
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return {"p50": q[49], "p90": q[89], "p99": q[98], "mean": statistics.fmean(values), "count": len(values)}
