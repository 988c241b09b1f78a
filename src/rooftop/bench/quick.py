"""llama-bench's tests on the engine: ppN prefills an N-token prompt, tgN decodes N tokens from a 1-token context,
ppN+tgM does both, each after -d's tokens of context. A test's rate is its tokens over the wall time of the steps it
timed, and the phase report attributes the same steps, so the table, the JSON and the report are one measurement."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from rooftop.bench.measure import run_batch, synthetic_prompt
from rooftop.engine.llm import LLM
from rooftop.engine.outputs import StepRecord
from rooftop.enums import Phase
from rooftop.roofline.attribution import PhaseAttribution, attribute_phases, attribute_step
from rooftop.roofline.calibration import Calibration
from rooftop.roofline.hardware import Hardware


@dataclass
class BenchTest:
    """One test and its repetitions: llama-bench's ppN (`n_prompt` tokens prefilled in one step, which samples the
    token after it, as llama-bench computes the last position's logits), tgN (`n_gen` decode steps after a 1-token
    prompt, whose prefill is not timed: llama-bench's tg decodes from an empty context, independent of -p) or
    ppN+tgM (-pg: the prefill, then the decode steps, timed together), each after `n_depth` tokens of context (-d)
    that are prefilled first and not timed. A prompt is prefilled in chunks of `n_ubatch` tokens, each a step
    (llama-bench's -ub), where given. Each sample is the wall time of the timed steps (forward pass, scheduling and
    greedy sampling: what a request waits for; llama-bench samples nothing)."""

    n_prompt: int
    n_gen: int
    n_depth: int = 0
    samples_s: list[float] = field(default_factory=list)
    n_ubatch: int | None = None  # None: the prompt in one step

    @property
    def name(self) -> str:
        parts = [f"{kind}{n}" for kind, n in (("pp", self.n_prompt), ("tg", self.n_gen)) if n]
        return "+".join(parts) + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def chunk(self) -> int | None:
        """The prompt's tokens per step (llama-bench's n_ubatch): -ub's, else the whole prompt (or the depth, which is
        then one step too); None for a tg test, which has no prompt to chunk."""
        return (self.n_ubatch or max(self.n_depth, self.n_prompt)) if self.n_prompt else None

    @property
    def tokens(self) -> int:
        return self.n_prompt + self.n_gen

    @property
    def context(self) -> int:
        """The tokens of context the test needs: its depth, its prompt (tg's is one token) and the tokens it samples."""
        return self.n_depth + max(self.n_prompt, 0 if self.n_depth else 1) + self.n_gen + 1

    @property
    def samples_tokens_per_s(self) -> list[float]:
        return [self.tokens / s for s in self.samples_s]

    @property
    def mean_s(self) -> float:
        return statistics.mean(self.samples_s)

    @property
    def tokens_per_s(self) -> float:
        """The test's t/s: its tokens over the repetitions' mean time, so that it is 1 / TPOT and the rate of the
        phase report's measured time. llama-bench averages the repetitions' rates instead: the same while the
        repetitions agree, higher when they differ."""
        return self.tokens / self.mean_s

    @property
    def tokens_per_s_stdev(self) -> float:
        """The spread of the repetitions' rates, llama-bench's ±."""
        return statistics.stdev(self.samples_tokens_per_s) if len(self.samples_s) > 1 else 0.0

    @property
    def tpot_s(self) -> float | None:
        """A tg test's mean time per token, 1 / its t/s: the phase report's measured decode time per token when
        the run has one decode test."""
        return None if self.n_prompt else self.mean_s / self.n_gen

    def to_dict(self) -> dict:
        return {
            "test": self.name,
            "n_prompt": self.n_prompt,
            "n_gen": self.n_gen,
            "n_depth": self.n_depth,
            "n_ubatch": self.chunk,
            "tokens": self.tokens,
            "samples_s": self.samples_s,
            "samples_tokens_per_s": self.samples_tokens_per_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_stdev": self.tokens_per_s_stdev,
            "mean_s": self.mean_s,
            "tpot_s": self.tpot_s,
        }


def timed_steps(llm: LLM, test: BenchTest, variant: int) -> list[StepRecord]:
    """Run the test once on a fresh engine; the steps it times. A prompt at a depth starts at a chunk's start: the
    engine prefills in chunks of the test's `chunk` from the first token (the depth without -ub: the context in one
    step, the prompt the next), and a depth is 0 or a multiple of -ub and at least the prompt without it
    (commands.py checks), so the prompt's steps are those past the context."""
    if not test.n_prompt:  # the prefill's sampled token, then one decode step per token
        run = run_batch(llm, [synthetic_prompt(llm, max(test.n_depth, 1), variant)], test.n_gen + 1)
        return [r for r in run.records if r.phase is Phase.DECODE]
    prompt = synthetic_prompt(llm, test.n_depth + test.n_prompt, variant)
    run = run_batch(llm, [prompt], test.n_gen + 1, chunk=test.chunk)
    prefill = [r for r in run.records if r.phase is Phase.PREFILL and r.shape.seqs[0].cached >= test.n_depth]
    return [*prefill, *(r for r in run.records if r.phase is Phase.DECODE)]


def quick_bench(
    llm: LLM,
    hw: Hardware,
    calibration: Calibration | None,
    tests: list[BenchTest],
    reps: int,
    on_progress: Callable[[str], None] = lambda _: None,
) -> dict[str, PhaseAttribution]:
    """A warm-up pass over the tests, then `reps` passes, each adding one sample to every test (a slow minute of a
    shared host is then one sample of each test, not all of one's); the phase attribution of every timed step."""
    p = llm.precision
    steps = []
    for rep in range(reps + 1):
        for test in tests:
            on_progress(f"{test.name} ({f'repetition {rep} of {reps}' if rep else 'warm-up'})")
            records = timed_steps(llm, test, rep)
            if rep:
                test.samples_s.append(sum(r.wall_seconds for r in records))
                steps += [
                    attribute_step(
                        llm.config, p, r.shape, r.seconds, hw, r.around_seconds, calibration, r.draft_seconds
                    )
                    for r in records
                ]
    return attribute_phases(steps, hw)
