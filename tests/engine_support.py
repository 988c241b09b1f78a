"""Driving an engine by hand in tests: requests in, steps until done, the final outputs."""

from __future__ import annotations

from rooftop import SamplingParams
from rooftop.engine.llm_engine import LLMEngine


def run(eng: LLMEngine, requests: list[tuple[str, str, SamplingParams]], arrive_every: int = 0) -> dict:
    """Add the requests (one more every `arrive_every` steps, else all at once), step until done; the final
    outputs by request id."""
    pending, outputs, step = list(requests), {}, 0
    while pending or eng.has_unfinished():
        while pending and (arrive_every == 0 or step % arrive_every == 0):
            eng.add_request(*pending.pop(0))
            if arrive_every:
                break
        for delta in eng.step().deltas:
            if delta.finished:
                outputs[delta.request_id] = delta.output
        step += 1
    return outputs
