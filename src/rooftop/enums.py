"""The names every layer shares: a step's phase and a request's finish reason (strings on the wire, enums in code)."""

from __future__ import annotations

import enum


class _Name(str, enum.Enum):
    """Compares, hashes, formats and serializes as its value, so `phase == "decode"` and JSON keep working."""

    def __str__(self) -> str:
        return self.value


class Phase(_Name):
    """A scheduled sequence's phase, decided once by the scheduler; a step holding both kinds is `MIXED`.

    PREFILL computes prompt tokens (or recomputes a preempted sequence) and yields its next token from the last one;
    DECODE computes the one token sampled in the previous step of a running sequence."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


class FinishReason(_Name):
    """Why a request ended: OpenAI's `stop` and `length`, vLLM's `abort`, and `error` (its step failed)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
