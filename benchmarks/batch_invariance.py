"""What batch invariance costs: the same workloads with and without it, on the same loaded weights.

    .venv/bin/python benchmarks/batch_invariance.py [--model M] [--reps 3] [--json FILE]

Four workloads, each run on a fresh engine (no prefix cache) in both modes, medians over --reps after one warm-up:
- TTFT of one 1024-token prompt: 256-token chunks (invariant) against one 1024-token step;
- decode TPOT of one sequence, and of 32 (int4 here: the narrow path is the same kernel; float32: padded matmuls);
- a mixed load: 16 requests of 300 prompt tokens and 64 output tokens at once (chunks that wait for a step they fit
  in, against chunks cut wherever the budget ends), total seconds;
- the same decodes in bfloat16 on PyTorch's attention, which attends each decode alone under invariance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine

TEXT = "The history of the printing press begins in the workshops of fifteenth-century Mainz, where "


def prompts(llm: LLM, n: int, length: int) -> list[list[int]]:
    base = llm.tokenizer.encode(TEXT)
    ids = (base * (length // len(base) + 1))[:length]
    return [[llm.tokenizer.encode(str(i))[0], *ids[1:]] for i in range(n)]


def run(llm: LLM, invariant: bool, batch: list[list[int]], max_tokens: int) -> dict:
    """All of `batch` at once on a fresh engine: total seconds, the first token's time, and the decode steps'."""
    config = EngineConfig(enable_prefix_caching=False, batch_invariant=invariant, max_num_seqs=64)
    eng = LLMEngine(llm.model, llm.tokenizer, config)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(batch):
        eng.add_request(str(i), p, params)
    start, first, decode = time.perf_counter(), None, []
    while eng.has_unfinished():
        step = eng.step()
        if first is None and step.deltas:
            first = time.perf_counter() - start
        if step.record and all(s.phase == "decode" for s in step.record.shape.seqs):
            decode.append(step.record.seconds)
    return {"total_s": time.perf_counter() - start, "ttft_s": first, "tpot_s": statistics.median(decode or [0.0])}


def measure(llm: LLM, name: str, batch: list[list[int]], max_tokens: int, key: str, reps: int) -> dict:
    row = {"workload": name}
    for invariant in (True, False):
        run(llm, invariant, batch, max_tokens)  # warm-up
        row["invariant" if invariant else "not"] = statistics.median(
            run(llm, invariant, batch, max_tokens)[key] for _ in range(reps)
        )
    row["ratio"] = row["invariant"] / row["not"]
    row["metric"] = key
    return row


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for dtype, weights in (("float32", "auto"), ("float32", "float"), ("bfloat16", "float")):
        llm = LLM(model=args.model, dtype=dtype, weights=weights)
        fmt = llm.model.layers[0].qkv.format
        work = [
            ("TTFT, one 1024-token prompt", prompts(llm, 1, 1024), 1, "ttft_s"),
            ("TPOT, 1 sequence", prompts(llm, 1, 32), 65, "tpot_s"),
            ("TPOT, 32 sequences", prompts(llm, 32, 32), 33, "tpot_s"),
            ("16 x (300 in, 64 out) at once", prompts(llm, 16, 300), 64, "total_s"),
        ]
        if dtype == "bfloat16":
            work = work[1:3]  # what PyTorch's attention changes: decodes
        for name, batch, max_tokens, key in work:
            row = {"format": fmt, **measure(llm, name, batch, max_tokens, key, args.reps)}
            rows.append(row)
            print(
                f"{fmt:16} {name:32} {key}: invariant {row['invariant'] * 1e3:9.2f} ms, "
                f"not {row['not'] * 1e3:9.2f} ms, x{row['ratio']:.3f}",
                flush=True,
            )
    if args.json:
        info = {
            "date": datetime.now(timezone.utc).isoformat(),
            "machine": cpu_model(),
            "cpus": len(os.sched_getaffinity(0)),
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)


if __name__ == "__main__":
    main()
