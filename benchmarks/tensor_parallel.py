"""Tensor parallelism on this machine: TPOT and decode throughput at each group size, and the measured
communication of a decode step beside the analyzer's prediction for it.

    .venv/bin/python benchmarks/tensor_parallel.py [--model M] [--load-format auto|dummy] [--tp 1,2] \
        [--batch 1,8] [--prompt-len 128] [--output-len 64] [--reps 3] [--json FILE]

Each size runs on a fresh group (rooftop starts its ranks on this host): the group's all-reduce is probed first
(`rooftop probe -tp N`'s measurement, cached), then every batch decodes `--output-len` tokens greedily after a
`--prompt-len` prompt, `--reps` times after a warm-up. The decode steps' collectives (the plan, the all-reduces,
the logits gather) are timed where the engine calls them, inside the steps (the calibration's timer), so
"measured" is the time a decode step spent waiting on the other ranks; "predicted" is the op model's
communication for the same step shape at the probe's latency and bandwidth. The default model is a dummy
Qwen3-0.6B (16 query heads, 8 KV heads: it splits 2, 4 or 8 ways); the bundled model splits by 3 (`--model
bundled --load-format auto --tp 1,3`).
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
from rooftop.engine.calibrate import OpTimer
from rooftop.engine.probe import load_or_run_probe, probe_device
from rooftop.enums import Phase
from rooftop.roofline.calibration import op_class
from rooftop.roofline.ops import StepShape
from rooftop.roofline.predict import time_step


def decode_run(llm: LLM, batch: int, prompt_len: int, output_len: int) -> dict:
    """One greedy run of `batch` prompts: its requests' TPOT, the decode throughput, and each decode step's time
    and the part of it spent in collectives."""
    base = llm.tokenizer.encode("The history of the printing press begins ")
    prompts = [(base * prompt_len)[: prompt_len - 1] + [100 + i] for i in range(batch)]
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    timer, steps = OpTimer(llm.device), []
    eng = llm.engine
    for i, prompt in enumerate(prompts):
        eng.add_request(f"tp-{time.perf_counter_ns()}-{i}", prompt, params)
    outputs, start = [], time.perf_counter()
    with timer.installed(llm):
        while eng.has_unfinished():
            timer.reset()
            step = eng.step()
            classes = timer.reset()
            outputs += [d.output for d in step.deltas if d.finished]
            if step.record is not None and step.record.phase == Phase.DECODE:
                steps.append((step.record, classes["communication"]))
    wall = time.perf_counter() - start
    decode_s = sum(r.wall_seconds for r, _ in steps)
    return {
        "tpot_s": statistics.median(o.metrics.tpot for o in outputs),
        "decode_tokens_per_s": sum(r.shape.tokens for r, _ in steps) / decode_s,
        "output_tokens_per_s": sum(len(o.token_ids) for o in outputs) / wall,
        "decode_step_s": statistics.median(r.seconds for r, _ in steps),
        "communication_s": statistics.median(c for _, c in steps),
        "context": steps[len(steps) // 2][0].shape.seqs[0].cached,
    }


def measure(args, tp: int) -> list[dict]:
    llm = LLM(
        model=None if args.model == "bundled" else args.model,
        load_format=args.load_format,
        tensor_parallel_size=tp,
        max_num_seqs=max(args.batch),
        kv_cache_bytes=args.kv_cache_bytes,
    )
    try:
        hw = None
        if tp > 1:
            probe = load_or_run_probe(probe_device(llm.device), collectives=llm.lead)
            hw = probe.to_hardware(working_set=llm.weight_bytes)
            print(
                f"tp {tp}: all-reduce latency {probe.all_reduce_latency_s * 1e6:.0f} us, bandwidth "
                f"{probe.all_reduce_bandwidth / 1e9:.2f} GB/s ({probe.tensor_parallel})",
                flush=True,
            )
        decode_run(llm, 1, min(args.prompt_len, 16), 4)  # warm-up: kernels, pages, the group's connections
        rows = []
        for batch in args.batch:
            runs = [decode_run(llm, batch, args.prompt_len, args.output_len) for _ in range(args.reps)]
            row = {"tp": tp, "batch": batch, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
            if hw is not None:
                shape = StepShape.decode(batch, int(row["context"]), tp)
                predicted = time_step(llm.config, llm.precision.at(batch), shape, hw)
                comm = [op for op in predicted.ops if op_class(op.name) == "communication"]
                row["predicted_communication_s"] = sum(op.comm_time(hw) for op in comm)
                row["collectives_per_step"] = sum(op.collectives for op in comm)
            rows.append(row)
            print(table_row(row), flush=True)
        return rows
    finally:
        llm.close()


def table_row(r: dict) -> str:
    predicted = r.get("predicted_communication_s")
    share = r["communication_s"] / r["decode_step_s"]
    return (
        f"| {r['tp']} | {r['batch']} | {r['tpot_s'] * 1e3:.1f} | {r['decode_tokens_per_s']:.1f} | "
        f"{r['output_tokens_per_s']:.1f} | {r['decode_step_s'] * 1e3:.1f} | {r['communication_s'] * 1e3:.2f} "
        f"({share:.0%}) | {'-' if predicted is None else f'{predicted * 1e3:.2f}'} | "
        f"{r.get('collectives_per_step', '-')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-0.6b", help="a preset (with dummy weights), a file, or bundled")
    parser.add_argument("--load-format", default="dummy", choices=("auto", "dummy"))
    parser.add_argument("--tp", default="1,2", help="group sizes, comma-separated")
    parser.add_argument("--batch", default="1,8", help="decode batches, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kv-cache-bytes", type=int, default=256 << 20)
    parser.add_argument("--json", help="write the rows and the machine here")
    args = parser.parse_args()
    args.batch = [int(b) for b in args.batch.split(",")]
    print(
        "| tp | batch | TPOT ms | decode tok/s | output tok/s | decode step ms | communication ms (share) "
        "| predicted ms | collectives |\n|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    rows = [row for tp in (int(t) for t in args.tp.split(",")) for row in measure(args, tp)]
    if args.json:
        machine = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump({"date": datetime.now(timezone.utc).isoformat(), "machine": machine, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
