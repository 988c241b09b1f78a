"""Mixture-of-experts decode against the analyzer: dummy weights of a Qwen3-MoE preset cut to a few layers (so it
fits this machine), decode step time, distinct experts touched and bytes per step at batch 1 and at batches that
touch most experts.

.venv/bin/python benchmarks/moe.py [--preset qwen3-30b-a3b] [--layers 8] [--weights int4] [--batches 1,8,64] [--tokens 16]

Each batch runs `--batch` requests of `--prompt` random token ids to `--tokens` new tokens; the decode steps that
hold all of them are timed (median). The analyzer's bytes use the experts each step measured; its expectation
E·(1 − (1 − k/E)^B) is printed beside the measured count. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
from datetime import date

import torch

from rooftop import SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.probe import load_or_run_probe
from rooftop.enums import Phase
from rooftop.loading.dummy import Source, bundled_tokenizer, dummy_weights
from rooftop.models.loader import build_model
from rooftop.roofline.ops import expected_experts_touched
from rooftop.roofline.predict import time_step
from rooftop.roofline.presets import find_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=8, help="keep the preset's first N layers' shapes")
    parser.add_argument("--weights", default="int4")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    config = find_preset(args.preset)
    config.num_layers = args.layers
    loaded = dummy_weights(Source(config, args.preset), args.weights, torch.device("cpu"), torch.float32)
    model = build_model(loaded, torch.float32, "cpu", args.weights)
    tokenizer = bundled_tokenizer(config)
    hw = load_or_run_probe().to_hardware()
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"`benchmarks/moe.py --preset {args.preset} --layers {args.layers} --weights {args.weights} "
        f"--batches {args.batches}` — {date.today()}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads; {config.num_experts} experts, top {config.num_experts_per_tok}; "
        f"read roof {hw.memory_bandwidth / 1e9:.1f} GB/s\n"
    )
    print(
        "| batch | decode step ms | tok/s | experts touched per layer (expected) | analyzer bytes/step | achieved GB/s | % of read roof | analyzer step ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rng = random.Random(0)
    for batch in batches:
        engine = LLMEngine(
            model,
            tokenizer,
            EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(1024, batch), num_kv_blocks=batch * 8),
        )
        params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
        for i in range(batch):
            ids = [rng.randrange(config.vocab_size) for _ in range(args.prompt)]
            engine.add_request(f"r{i}", ids, params)
        records = []
        while engine.has_unfinished():
            record = engine.step().record
            if record and record.phase is Phase.DECODE and record.shape.num_seqs == batch:
                records.append(record)
        step = statistics.median(r.seconds for r in records)
        touched = statistics.mean(r.shape.experts_touched for r in records)
        expected = expected_experts_touched(config.num_experts, config.num_experts_per_tok, batch)
        predicted = time_step(config, model.precision, records[len(records) // 2].shape, hw)
        print(
            f"| {batch} | {step * 1e3:.1f} | {batch / step:.1f} | {touched:.1f} ({expected:.1f}) | "
            f"{predicted.bytes / 1e9:.2f} GB | {predicted.bytes / step / 1e9:.1f} | "
            f"{100 * predicted.bytes / step / hw.memory_bandwidth:.0f}% | {predicted.time_s * 1e3:.1f} |"
        )


if __name__ == "__main__":
    main()
