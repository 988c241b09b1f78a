"""Where a decode step's time goes: torch.profiler over 20 decode steps of a model (the bundled one) at batch 1.

.venv/bin/python benchmarks/profile_decode.py [--model FILE.gguf] [--weights auto|float|int8|int4] [--rows 15]
"""

from __future__ import annotations

import argparse
import statistics

from torch.profiler import ProfilerActivity, profile

from rooftop import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    llm = LLM(model=args.model, weights=args.weights)
    eng, params = llm.engine, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for rep in range(3):  # two warm-ups, then the timed run
        eng.add_request(f"warm{rep}", "Hello there, how are you", params)
        records = []
        while eng.has_unfinished():
            records.append(eng.step().record)
    steps = [r.seconds for r in records if r.phase == "decode"]
    print(f"median decode step {statistics.median(steps) * 1e3:.1f} ms ({args.weights} weights)")
    eng.add_request("profiled", "Hello there, how are you", params)
    eng.step()  # the prefill, not profiled
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            eng.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    while eng.has_unfinished():
        eng.step()


if __name__ == "__main__":
    main()
