"""Decode TPOT against context for each KV cache dtype on the bundled model, beside the analyzer's prediction.

    PYTHONPATH=src python benchmarks/kv_cache.py [--contexts 1000,4000,8000] [--kv float32,bfloat16,float16,int8,fp8_e4m3]
        [--steps 32] [--reps 3]

For each KV dtype one engine (the bundled model in its own Q4_1 format, float32 activations, this process's
threads) with a pool that holds the longest context. The prompt at each context is the first tokens of
benchmarks/text/python_reference.txt (repeated to reach 8k), contexts in increasing order, so that each prompt
finds the previous one in the prefix cache and only the longest is prefilled in full: one long prefill per dtype
(an 8,000-token prefill takes about a minute on 2 cores). At each context a request decodes --steps tokens
(greedy, ignore_eos) --reps times, and the table shows the median TPOT, its ratio to float32's at the same
context, and the analyzer's decode step at that context (roofline/api.py `predict`, what `rooftop roofline --kv`
prints: the ops one after another at this machine's probed roofs, and the fused lower bound), the memory roof taken
at the step's working set (the weights and the cache at that context).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.probe import load_or_run_probe
from rooftop.models.kv_cache import KVPool, kv_storage_dtype
from rooftop.roofline.api import predict

TEXT = Path(__file__).with_name("text") / "python_reference.txt"


def tpot(eng: LLMEngine, prompt: list[int], steps: int) -> float:
    """One greedy request of `steps` + 1 tokens, alone: its TPOT (vLLM's definition) in seconds."""
    eng.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    while True:
        for delta in eng.step().deltas:
            if delta.finished:
                return delta.output.metrics.tpot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="1000,4000,8000")
    parser.add_argument("--kv", default="float32,bfloat16,float16,int8,fp8_e4m3")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per request")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    contexts = sorted(int(c) for c in args.contexts.split(","))
    kvs = sorted(args.kv.split(","), key=lambda kv: kv != "float32")  # float32 first: the others are shown against it
    llm = LLM(dtype="float32")
    text = llm.tokenizer.encode(TEXT.read_text())
    ids = (text * -(-contexts[-1] // len(text)))[: contexts[-1]]
    if contexts[-1] + args.steps + 1 > llm.max_model_len:
        raise SystemExit(f"context {contexts[-1]} + {args.steps + 1} tokens exceed the model's {llm.max_model_len}")
    probe = load_or_run_probe()
    print(
        f"`benchmarks/kv_cache.py --contexts {args.contexts} --kv {args.kv} --steps {args.steps} --reps {args.reps}`, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, the bundled model ({llm.model.weight_policy} weights)\n"
    )
    print(
        "| KV cache | context | TPOT measured | / float32 | analyzer TPOT | analyzer bound |\n|---|---|---|---|---|---|"
    )
    measured: dict[tuple[str, int], float] = {}
    blocks = -(-(contexts[-1] + args.steps + 1) // 16) + 1
    for kv in kvs:
        eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(kv_cache_dtype=kv, num_kv_blocks=blocks))
        per_token = KVPool.bytes_per_block(llm.config, 1, kv_storage_dtype(kv, llm.dtype))
        for context in contexts:
            tpot(eng, ids[:context], 1)  # the prefill, and a first decode
            seconds = statistics.median(tpot(eng, ids[:context], args.steps) for _ in range(args.reps))
            measured[kv, context] = seconds
            hw = probe.to_hardware(working_set=llm.weight_bytes + context * per_token)
            p = predict(llm.model_path, hw, prompt_len=context, output_len=args.steps + 1, kv=kv)
            ratio = f"{seconds / measured['float32', context]:.2f}" if ("float32", context) in measured else "-"
            print(
                f"| {kv} | {context} | {seconds * 1e3:.2f} ms | {ratio} | {p.decode_total_s / args.steps * 1e3:.2f} ms "
                f"| {p.decode_bound_total_s / args.steps * 1e3:.2f} ms |",
                flush=True,
            )
        del eng
    if ("float32", contexts[-1]) in measured and ("int8", contexts[-1]) in measured:
        ratio = measured["int8", contexts[-1]] / measured["float32", contexts[-1]]
        print(f"\nint8 / float32 TPOT at {contexts[-1]} tokens: {ratio:.2f} (issue 19's target: <= 0.75)")


if __name__ == "__main__":
    main()
