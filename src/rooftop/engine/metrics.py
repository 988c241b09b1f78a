"""Per-request timings, with the definitions of the README's Metrics section (all times are time.perf_counter seconds)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeCounts:
    """Speculative decoding's counts (vLLM's spec_decode metrics): verify steps that checked drafts, the draft
    tokens they checked, those accepted, and the accepted ones by position in the draft."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, drafted: int, accepted: int) -> None:
        """One verify step that checked `drafted` draft tokens and accepted the first `accepted`."""
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.accepted_per_pos += [0] * (drafted - len(self.accepted_per_pos))
        for pos in range(accepted):
            self.accepted_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify step, the one the model adds after the accepted drafts included (vLLM's mean
        acceptance length)."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None


@dataclass
class RequestMetrics:
    """When each thing happened to one request, and how long its prefill and decode work took."""

    arrival_time: float
    prompt_tokens: int = 0
    prefix_cache_hit_tokens: int = 0  # prompt tokens whose K/V were found in the prefix cache
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each output token was ready
    finished_time: float | None = None
    prefill_time: float = 0.0  # seconds in prefill forward passes (device-synchronized, sampling excluded)
    prefill_tokens: int = 0
    decode_time: float = 0.0  # seconds in decode forward passes, a draft model's included (sampling excluded)
    decode_steps: int = 0
    decode_tokens: int = 0  # output tokens of decode steps (several per verify step with speculative decoding)
    spec_decode: SpecDecodeCounts = field(default_factory=SpecDecodeCounts)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Time to first token: first output token − arrival (queueing included)."""
        return None if not self.token_times else self.token_times[0] - self.arrival_time

    @property
    def e2e(self) -> float | None:
        """End to end: last output token − arrival."""
        return None if not self.token_times else self.token_times[-1] - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: each gap between consecutive output tokens."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (E2E − TTFT) / (n − 1); None below 2 tokens."""
        n = self.output_tokens
        return None if n < 2 else (self.e2e - self.ttft) / (n - 1)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.prefill_tokens / self.prefill_time if self.prefill_time > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_time if self.decode_time > 0 else None
