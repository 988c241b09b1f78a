"""llama-bench-style numbers: prefill tok/s of a pp-token prompt and decode tok/s of tg tokens, as medians."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from rooftop.bench.measure import run_batch, synthetic_prompt
from rooftop.engine.llm import LLM
from rooftop.roofline.attribution import PhaseAttribution, attribute_phases, attribute_step
from rooftop.roofline.calibration import Calibration
from rooftop.roofline.hardware import Hardware


def quick_bench(
    llm: LLM,
    hw: Hardware,
    calibration: Calibration,
    pp: int,
    tg: int,
    reps: int,
    on_progress: Callable[[str], None] = lambda _: None,
) -> tuple[dict, dict[str, PhaseAttribution]]:
    """Run `reps` single-sequence generations (after one warm-up); return medians and the phase attribution."""
    p = llm.precision
    prefill_s, decode_steps, attributions = [], [], []
    for rep in range(reps + 1):
        on_progress(f"repetition {rep}/{reps}" if rep else "warm-up")
        run = run_batch(llm, [synthetic_prompt(llm, pp, rep)], tg)
        if not rep:
            continue
        prefill_s.append(sum(r.seconds for r in run.records if r.phase == "prefill"))
        decode_steps.append([r.seconds for r in run.records if r.phase == "decode"])
        attributions += [
            attribute_step(llm.config, p, r.shape, r.seconds, hw, r.around_seconds, calibration) for r in run.records
        ]
    tpot = statistics.median(statistics.median(d) for d in decode_steps) if tg > 1 else None
    decode_tps = [len(d) / sum(d) for d in decode_steps if d]
    summary = {
        "prompt_tokens": pp,
        "output_tokens": tg,
        "repetitions": reps,
        "prefill_tokens_per_s": statistics.median(pp / s for s in prefill_s),
        "prefill_tokens_per_s_stdev": statistics.stdev(pp / s for s in prefill_s) if reps > 1 else 0.0,
        "decode_tokens_per_s": statistics.median(decode_tps) if decode_tps else None,
        "decode_tokens_per_s_stdev": statistics.stdev(decode_tps) if len(decode_tps) > 1 else 0.0,
        "tpot_s": tpot,
    }
    return summary, attribute_phases(attributions, hw)
