"""Expected against measured (issue 16's target): `rooftop bench`'s sweep — prompts at batch 1, decode batches at
two contexts — for each model and weight format given, with each row's calibrated expected time, bound and
measured time, then the median and worst |expected − measured| / measured per phase and whether any bound
exceeded its measured time.

.venv/bin/python benchmarks/prediction.py [--model bundled:int4,bundled:int8,bundled:float,llama-3.2-1b:int4] \
    [--prompt-lens 16,64,256,1024,2048] [--batch-sizes 1,2,4,8,16,32] [--contexts 16,256] [--reps 2]

A model is the bundled one (`bundled`), a file, or an analyzer preset, which runs with dummy weights
(`--load-format dummy`), in the weight format after the colon and the dtype after a second one
(`bundled:float:bfloat16`: float weights in bfloat16). Each row's repetitions are passes over the whole sweep
(`rooftop bench`'s). Calibrations are cached as `rooftop bench` caches them. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from datetime import datetime, timezone

import torch

from rooftop.bench.measure import fresh_engine
from rooftop.bench.sweep import sweep
from rooftop.engine.calibrate import load_or_calibrate
from rooftop.engine.llm import LLM
from rooftop.engine.probe import load_or_run_probe
from rooftop.errors import RooftopError
from rooftop.roofline.presets import PRESETS


def load(spec: str) -> tuple[str, LLM]:
    name, _, rest = spec.partition(":")
    weights, _, dtype = rest.partition(":")
    weights, dtype = weights or "auto", dtype or "auto"
    label = f"{weights}{'' if dtype == 'auto' else ' ' + dtype}"
    if name == "bundled":
        return f"bundled {label}", LLM(weights=weights, dtype=dtype)
    dummy = name in PRESETS
    return f"{name} {label}{' (dummy)' if dummy else ''}", LLM(
        model=name, weights=weights, dtype=dtype, load_format="dummy" if dummy else "auto"
    )


def error(expected: float, measured: float) -> float:
    return abs(expected - measured) / measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:int4,bundled:int8,bundled:float,llama-3.2-1b:int4")
    parser.add_argument("--prompt-lens", default="16,64,256,1024,2048")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--contexts", default="16,256", help="decode contexts: each batch size at each")
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    lens = [int(v) for v in args.prompt_lens.split(",")]
    batches = [int(v) for v in args.batch_sizes.split(",")]
    contexts = [int(v) for v in args.contexts.split(",")]
    specs = args.model.split(",")
    for spec in specs:  # a model the engine refuses stops the run now, not after the ones before it have swept
        try:
            load(spec)
        except RooftopError as exc:
            raise SystemExit(f"--model {spec}: {exc}") from None
    print(
        f"`benchmarks/prediction.py --model {args.model} --prompt-lens {args.prompt_lens} --batch-sizes "
        f"{args.batch_sizes} --contexts {args.contexts} --reps {args.reps}`, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads\n"
    )
    print("| model | step | measured | expected | bound | error |\n|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"prefill": [], "decode": []}
    above = []
    for spec in specs:
        label, llm = load(spec)
        hw = load_or_run_probe().to_hardware(working_set=llm.weight_bytes)
        engine = fresh_engine(llm, max(lens), max(batches))
        calibration = load_or_calibrate(llm, hw, on_progress=lambda s: None, engine=engine)
        del engine
        for i, context in enumerate(contexts):
            result = sweep(
                llm,
                hw,
                calibration,
                lens if i == 0 else [context],
                batches,
                args.output_len,
                args.reps,
                decode_context=context,
            )
            rows = (
                []
                if i
                else [
                    (
                        "prefill",
                        f"pp{r['prompt_tokens']}",
                        r["measured_prefill_step_s"],
                        r["expected_prefill_step_s"],
                        r["bound_prefill_step_s"],
                    )
                    for r in result.ttft
                ]
            )
            rows += [
                ("decode", f"b{r['batch']} @{context}", r["measured_tpot_s"], r["expected_tpot_s"], r["bound_tpot_s"])
                for r in result.decode
            ]
            for phase, step, measured, expected, bound in rows:
                errors[phase].append(error(expected, measured))
                if bound > measured:
                    above.append(f"{label} {step}")
                print(
                    f"| {label} | {step} | {measured * 1e3:.2f} ms | {expected * 1e3:.2f} ms | "
                    f"{bound * 1e3:.2f} ms | {100 * error(expected, measured):.1f}% |"
                )
    print()
    for phase, values in errors.items():
        if values:
            print(
                f"- {phase}: median |expected − measured| / measured {100 * statistics.median(values):.1f}%, "
                f"worst {100 * max(values):.1f}% over {len(values)} rows"
            )
    print(f"- bound above measured: {', '.join(above) if above else 'never'}")


if __name__ == "__main__":
    main()
