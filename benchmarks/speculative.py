"""Speculative decoding (n-gram prompt lookup or a draft model) on the bundled model: decode speed with and without.

    .venv/bin/python benchmarks/speculative.py [--reps 3] [--max-tokens 128] [--k 4] [--limit N] [--json FILE]
        [--method ngram | --method draft --draft-layers 4,8,16 | --method draft --draft-model FILE]

`--method draft --draft-layers 4,8,16` runs one self-draft per N (the target's first N layers and its lm_head) and
prints a row per N and set: the N that pays is chosen by this measurement.

Two prompt sets (benchmarks/prompts/): input-grounded tasks (correct or rewrite a given paragraph, edit a given
code block, quote from a given text), where the answer copies the prompt and prompt lookup should pay, and
free-form chat, where it should cost next to nothing (a sequence whose drafts keep failing stops proposing for a
while). Each prompt runs alone, greedy, on an engine with and one without speculation, alternating, `reps` times;
decode tokens/s is a request's tokens after the first over its time after the first (proposing, verifying and
sampling included), summed over the set, and the table shows each set's median. Greedy outputs must be identical
token for token; the script fails if they are not. The last columns are the analyzer's speedup
(roofline/speculative.py) at the measured acceptance rate, on this machine's probed roofs, and the calibrated one:
the engine's expected time (`rooftop calibrate`'s curves, which time a decode step's linears by its rows) of the
steps the run took — its verify steps, at their mean draft length, and its plain decodes (a sequence backing off
proposes nothing) — against every token decoded plainly.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.calibrate import load_or_calibrate
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.metrics import SpecDecodeCounts
from rooftop.engine.probe import load_or_run_probe
from rooftop.enums import Phase
from rooftop.roofline.calibration import Calibration
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import SeqShape, StepShape
from rooftop.roofline.speculative import predict_speculative

PROMPTS = Path(__file__).parent / "prompts"
SETS = {"input-grounded": "input_grounded.jsonl", "chat": "chat.jsonl"}


def load_prompts(name: str, llm: LLM, limit: int | None) -> list[list[int]]:
    lines = (PROMPTS / SETS[name]).read_text().splitlines()[:limit]
    texts = [json.loads(line)["prompt"] for line in lines]
    return [llm.tokenizer.encode(llm.apply_chat_template([{"role": "user", "content": t}])) for t in texts]


def run_set(eng: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Each prompt alone to the end: its tokens, and the set's decode tokens/s and speculative counts."""
    tokens, decoded, seconds, counts = [], 0, 0.0, SpecDecodeCounts()
    for i, prompt in enumerate(prompts):
        eng.add_request(f"p{i}", prompt, params)
        output = None
        while output is None:
            output = next((d.output for d in eng.step().deltas if d.finished), None)
        m = output.metrics
        tokens.append(output.token_ids)
        decoded += m.output_tokens - 1
        seconds += m.e2e - m.ttft
        spec = m.spec_decode
        counts.drafts += spec.drafts
        counts.draft_tokens += spec.draft_tokens
        counts.accepted_tokens += spec.accepted_tokens
    return {"tokens": tokens, "tokens_per_s": decoded / seconds, "counts": counts, "decoded": decoded}


def expected_speedup(
    llm: LLM, calibration: Calibration, hw: Hardware, counts: SpecDecodeCounts, decoded: int, context: int
) -> float:
    """The calibrated time of every token decoded plainly over that of the steps the run took: `counts.drafts`
    verify steps of 1 + the mean draft length rows, and a plain decode for each token no verify step gave."""

    def step(new: int) -> float:
        shape = StepShape((SeqShape(new, context, phase=Phase.DECODE),))
        return calibration.expected(llm.config, llm.precision, shape, hw).total_s

    drafts = counts.drafts
    rows = 1 + round(counts.draft_tokens / drafts) if drafts else 1
    plain_steps = decoded - drafts - counts.accepted_tokens
    return decoded * step(1) / (drafts * step(rows) + plain_steps * step(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts of each set")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--method", choices=["ngram", "draft"], default="ngram")
    parser.add_argument("--draft-layers", default=None, help="method draft: self-drafts of these layer counts, 4,8,16")
    parser.add_argument("--draft-model", default=None, help="method draft: a draft model file (the target's vocab)")
    args = parser.parse_args()

    llm = LLM()
    if args.method == "ngram":
        spec_configs = {
            "ngram": {
                "method": "ngram",
                "num_speculative_tokens": args.k,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            }
        }
    elif args.draft_model is not None:
        spec_configs = {"draft": {"method": "draft", "num_speculative_tokens": args.k, "model": args.draft_model}}
    elif args.draft_layers:
        spec_configs = {
            f"self-draft {n}": {"method": "draft", "num_speculative_tokens": args.k, "draft_layers": n}
            for n in (int(v) for v in args.draft_layers.split(","))
        }
    else:
        raise SystemExit("--method draft needs --draft-layers N[,N...] or --draft-model FILE")
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    hw = load_or_run_probe().to_hardware(working_set=llm.weight_bytes)
    calibration = load_or_calibrate(llm, hw)
    rows = []
    for (label, spec_config), name in ((c, n) for c in spec_configs.items() for n in SETS):
        prompts = load_prompts(name, llm, args.limit)
        plain_rates, spec_rates, identical = [], [], True
        counts = SpecDecodeCounts()
        for rep in range(args.reps + 1):  # the first repetition warms up and is not counted
            engines = {
                "plain": LLMEngine(llm.model, llm.tokenizer, EngineConfig()),
                "spec": LLMEngine(llm.model, llm.tokenizer, EngineConfig(speculative_config=spec_config)),
            }
            order = ["plain", "spec"] if rep % 2 == 0 else ["spec", "plain"]  # alternate which runs first
            results = {mode: run_set(engines[mode], prompts, params) for mode in order}
            identical &= results["plain"]["tokens"] == results["spec"]["tokens"]
            if rep:
                plain_rates.append(results["plain"]["tokens_per_s"])
                spec_rates.append(results["spec"]["tokens_per_s"])
                counts = results["spec"]["counts"]  # the same every repetition: greedy drafts are deterministic
                decoded = results["spec"]["decoded"]
        plain, spec = statistics.median(plain_rates), statistics.median(spec_rates)
        acceptance = counts.acceptance_rate or 0.0
        lengths = [len(p) for p in prompts]
        context = int(statistics.mean(lengths)) + args.max_tokens // 2
        predicted = predict_speculative(llm.config, llm.precision, hw, args.k, acceptance, context)
        expected = expected_speedup(llm, calibration, hw, counts, decoded, context)
        rows.append(
            {
                "set": name,
                "config": label,
                "prompts": len(prompts),
                "plain_tokens_per_s": plain,
                "spec_tokens_per_s": spec,
                "speedup": spec / plain,
                "acceptance_rate": acceptance,
                "mean_accepted_length": counts.mean_accepted_length,
                "verify_steps": counts.drafts,
                "predicted_speedup": predicted.speedup,
                "expected_speedup": expected,
                "greedy_identical": identical,
            }
        )
        print(f"{label}, {name}: {plain:.1f} -> {spec:.1f} tok/s, acceptance {acceptance:.2f}", flush=True)

    print()
    print(f"k = {args.k}, {args.max_tokens} tokens max, greedy, one request at a time, median of {args.reps}")
    print()
    print(
        "| speculation | prompts | without | with | speedup | acceptance | mean accepted length | predicted (bound) "
        "| expected (calibrated) | identical |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        length = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(
            f"| {r['config']} | {r['set']} ({r['prompts']}) | {r['plain_tokens_per_s']:.1f} tok/s | {r['spec_tokens_per_s']:.1f} tok/s "
            f"| {r['speedup']:.2f}x | {r['acceptance_rate']:.0%} | {length} | {r['predicted_speedup']:.2f}x "
            f"| {r['expected_speedup']:.2f}x | {'yes' if r['greedy_identical'] else 'NO'} |"
        )
    if args.json:
        meta = {"when": datetime.now(timezone.utc).isoformat(), "machine": platform.processor() or platform.machine()}
        args.json.write_text(json.dumps({"meta": meta, "args": vars(args) | {"json": str(args.json)}, "rows": rows}))
    if not all(r["greedy_identical"] for r in rows):
        raise SystemExit("greedy outputs differ with speculation")


if __name__ == "__main__":
    main()
