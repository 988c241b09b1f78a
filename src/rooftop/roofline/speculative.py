"""Speculative decoding's roofline: what a verify step costs and how many tokens it yields, so TPOT for a given
per-token acceptance rate and number of draft tokens.

A verify step computes 1 + k tokens of each sequence over its cache, the shape a decode of k + 1 new tokens has
(`SeqShape(new=k+1, cached=c, phase=DECODE)`): it reads the weights once, like a decode step, and does k + 1
times its math. With each draft token accepted with probability a, independently, the step yields the accepted
prefix plus one token: E = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens. TPOT is the verify step's
time over E. The proposer's own time (n-gram lookup: none worth counting; a draft model: its steps) is not in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import SeqShape, StepShape
from rooftop.roofline.precision import Precision
from rooftop.roofline.predict import StepTime, time_step


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """Tokens one verify step of k draft tokens yields when each is accepted with probability `acceptance`."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def check_speculative(k: int, acceptance: float) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise InvalidRequestError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
    if not 0.0 <= acceptance <= 1.0:
        raise InvalidRequestError(f"acceptance must be in [0, 1], got {acceptance!r}")


@dataclass(frozen=True)
class SpeculativePrediction:
    """A verify step against a plain decode step at the same context, and the TPOT each gives."""

    num_speculative_tokens: int
    acceptance: float
    context: int
    tokens_per_step: float
    verify: StepTime
    decode: StepTime

    @property
    def tpot_s(self) -> float:
        return self.verify.time_s / self.tokens_per_step

    @property
    def decode_tpot_s(self) -> float:
        return self.decode.time_s

    @property
    def speedup(self) -> float:
        return self.decode_tpot_s / self.tpot_s

    def to_dict(self) -> dict:
        return {
            "num_speculative_tokens": self.num_speculative_tokens,
            "acceptance": self.acceptance,
            "context_tokens": self.context,
            "tokens_per_verify_step": self.tokens_per_step,
            "verify_step_s": self.verify.time_s,
            "decode_step_s": self.decode.time_s,
            "tpot_s": self.tpot_s,
            "decode_tpot_s": self.decode_tpot_s,
            "speedup": self.speedup,
        }


def predict_speculative(
    config: ModelConfig,
    p: Precision,
    hw: Hardware,
    k: int,
    acceptance: float,
    context: int,
    batch: int = 1,
    tp: int = 1,
) -> SpeculativePrediction:
    """TPOT with k draft tokens accepted at `acceptance` each, for `batch` sequences `context` tokens deep."""
    check_speculative(k, acceptance)
    verify = StepShape((SeqShape(k + 1, context, count=batch, phase=Phase.DECODE),), tp=tp)
    return SpeculativePrediction(
        num_speculative_tokens=k,
        acceptance=acceptance,
        context=context,
        tokens_per_step=expected_tokens_per_step(acceptance, k),
        verify=time_step(config, p, verify, hw),
        decode=time_step(config, p, StepShape.decode(batch, context, tp), hw),
    )
