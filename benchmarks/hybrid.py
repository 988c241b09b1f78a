"""A hybrid model's decode against the analyzer: dummy weights of a Qwen3.5 preset cut to a few layers (three Gated
DeltaNet layers to one gated attention layer, as the preset has them), one sequence at each context length: its
decode step time, its KV bytes (growing with the context) and its recurrent state bytes (constant), measured in the
engine's pool, beside the analyzer's numbers, and the analyzer alone at 32k.

.venv/bin/python benchmarks/hybrid.py [--preset qwen3.6-27b] [--layers 8] [--weights int4] [--contexts 1024,8192]

Results: docs/BENCHMARKS.md.
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
from rooftop.models.kv_cache import KVPool
from rooftop.models.loader import build_model
from rooftop.roofline.ops import StepShape, kv_bytes_per_token, state_bytes_per_sequence
from rooftop.roofline.predict import time_step
from rooftop.roofline.presets import find_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.6-27b")
    parser.add_argument("--layers", type=int, default=8, help="keep the preset's first N layers' shapes")
    parser.add_argument("--weights", default="int4")
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    config = find_preset(args.preset)
    config.num_layers, config.layer_types = args.layers, config.layer_types[: args.layers]
    loaded = dummy_weights(Source(config, args.preset), args.weights, torch.device("cpu"), torch.float32)
    model = build_model(loaded, torch.float32, "cpu", args.weights)
    p, hw = model.precision, load_or_run_probe().to_hardware()
    print(
        f"`benchmarks/hybrid.py --preset {args.preset} --layers {args.layers} --weights {args.weights} "
        f"--contexts {args.contexts}` — {date.today()}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads; {config.num_linear_attention_layers} Gated DeltaNet + "
        f"{config.num_full_attention_layers} gated attention layers; read roof {hw.memory_bandwidth / 1e9:.1f} GB/s\n"
    )
    print(
        "| context | decode step ms | analyzer step ms | KV bytes (engine / analyzer) | state bytes (engine / analyzer) |"
    )
    print("|---|---|---|---|---|")
    rng = random.Random(0)
    contexts = [int(c) for c in args.contexts.split(",")]
    block = 16
    for context in contexts:
        engine = LLMEngine(
            model,
            bundled_tokenizer(config),
            EngineConfig(max_num_seqs=1, num_kv_blocks=-(-(context + args.tokens) // block) + 1, block_size=block),
        )
        ids = [rng.randrange(config.vocab_size) for _ in range(context)]
        engine.add_request("r", ids, SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True))
        records, kv = [], 0
        while engine.has_unfinished():
            kv = max(kv, len(engine._requests["r"].block_table) if "r" in engine._requests else kv)
            record = engine.step().record
            if record and record.phase is Phase.DECODE:
                records.append(record)
        states = engine._pool.states
        step = statistics.median(r.seconds for r in records)
        predicted = time_step(config, p, StepShape.decode(1, context + args.tokens // 2), hw)
        kv_engine = kv * KVPool.bytes_per_block(config, block, model.dtype)
        kv_model = kv_bytes_per_token(config, p) * (context + args.tokens)
        print(
            f"| {context} | {step * 1e3:.1f} | {predicted.time_s * 1e3:.1f} | {kv_engine / 1e6:.1f} MB / "
            f"{kv_model / 1e6:.1f} MB | {states.nbytes / states.slots / 1e6:.2f} MB / "
            f"{state_bytes_per_sequence(config, p) / 1e6:.2f} MB |"
        )
    at = 32768
    print(
        f"| {at} (analyzer) | - | {time_step(config, p, StepShape.decode(1, at), hw).time_s * 1e3:.1f} | "
        f"- / {kv_bytes_per_token(config, p) * at / 1e6:.1f} MB | - / {state_bytes_per_sequence(config, p) / 1e6:.2f} MB |"
    )


if __name__ == "__main__":
    main()
