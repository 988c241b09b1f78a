"""Continuous batching on the bundled model: decode throughput against batch size, and prefix-cache TTFT.

    .venv/bin/python benchmarks/batching.py [--batches 1,2,4,8,16,32] [--reps 3] [--json FILE]

Decode is memory-bound, so a step costs about the same for 1 or 32 sequences and total tok/s should grow
almost linearly with the batch. Numbers are medians over repetitions of the decode steps' measured times.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone

import torch

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine

QUESTION = "Explain in one paragraph why the sky is blue."


def run(eng: LLMEngine, prompts: list, params: SamplingParams) -> tuple[list, list]:
    """Every prompt to the end: the final outputs and the step records."""
    for i, p in enumerate(prompts):
        eng.add_request(f"r{time.perf_counter_ns()}-{i}", p, params)
    outputs, records = [], []
    while eng.has_unfinished():
        step = eng.step()
        records.append(step.record)
        outputs += [d.output for d in step.deltas if d.finished]
    return outputs, records


def decode_sweep(llm: LLM, batches: list[int], reps: int, prompt_len: int, output_len: int) -> list[dict]:
    base = llm.tokenizer.encode("The history of the printing press begins ")
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    rows = []
    for batch in batches:
        step_times = []
        for rep in range(reps + 1):  # the first repetition warms up and is not counted
            eng = LLMEngine(
                llm.model, llm.tokenizer, EngineConfig(max_num_seqs=max(batches), enable_prefix_caching=False)
            )
            prompts = [(base * prompt_len)[: prompt_len - 1] + [100 + i] for i in range(batch)]
            _, records = run(eng, prompts, params)
            decode = [r.seconds for r in records if r.phase == "decode" and r.shape.num_seqs == batch]
            if rep:
                step_times.append(statistics.median(decode))
        step = statistics.median(step_times)
        rows.append({"batch": batch, "decode_step_s": step, "decode_tokens_per_s_total": batch / step})
        print(f"batch {batch:3d}: decode step {step * 1e3:7.1f} ms   total {batch / step:7.1f} tok/s", flush=True)
    return rows


def prefix_cache_ttft(llm: LLM, reps: int, system_tokens: int) -> dict:
    system = llm.tokenizer.decode(
        llm.tokenizer.encode("You are a meticulous assistant who answers briefly. " * 40)[:system_tokens]
    )
    params = SamplingParams(max_tokens=1, temperature=0)
    result = {}
    for caching in (False, True):
        eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(enable_prefix_caching=caching))
        run(
            eng,
            [
                llm.tokenizer.apply_chat_template(
                    [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
                )
            ],
            params,
        )
        ttfts = []
        for rep in range(reps):
            prompt = llm.tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": f"{QUESTION} ({rep})"}]
            )
            ttfts.append(run(eng, [prompt], params)[0][0].metrics.ttft)
        key = "with_prefix_cache" if caching else "without_prefix_cache"
        result[key] = {"ttft_s": statistics.median(ttfts), "prefix_hit_tokens": eng.stats().prefix_hits}
        print(
            f"TTFT {key.replace('_', ' '):22s}: {statistics.median(ttfts) * 1e3:7.1f} ms (hit tokens {eng.stats().prefix_hits})",
            flush=True,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args()
    llm = LLM()
    print(
        f"rooftop batching benchmark, bundled SmolLM2-135M, {llm.dtype}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
        flush=True,
    )
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(llm.dtype),
        "decode": decode_sweep(
            llm, [int(b) for b in args.batches.split(",")], args.reps, args.prompt_len, args.output_len
        ),
        "prefix_cache": prefix_cache_ttft(llm, args.reps + 2, args.system_tokens),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
