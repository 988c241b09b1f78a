"""Two builds of rooftop's decode attention, alternating: one decode row of a 1B (32 query heads, 8 KV heads, head_dim
64) attending over each of 16 layers' paged pools in turn, with `stream_read`'s rate in the same rounds.

.venv/bin/python benchmarks/attention_ab.py OLD_DIR NEW_DIR [--context 500,2000] [--dtypes float32,bfloat16,int8,float8_e4m3fn] [--layers 16]

Each directory holds the kernel sources (as for benchmarks/kernel_ab.py). 16 layers' pools of 16,384 slots are 1 GB
in float32, so each call reads its keys from DRAM, as a decode step does (the weights stream through the caches
between two layers' attention); --layers 1 reads one layer's pool again and again, from the cache. The sequence's
blocks are scattered over the pool, as after a server's churn. Both builds' outputs are compared first.

--model FILE times them in the engine instead, where a kernel-alone gain may not hold: a decode after a prompt of each
--context length (random token ids), the builds taking turns by step over the engine's own pool (--dtypes as its
--kv-cache-dtype), the median microseconds of their calls.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from kernel_ab import build

from rooftop.kernels import cpu, pages
from rooftop.models.kv_cache import quantize_kv

HEADS, KV_HEADS, DIM, BLOCK, SLOTS = 32, 8, 64, 16, 16384


def pools(dtype: torch.dtype, layers: int, gen: torch.Generator) -> list[tuple]:
    """Per layer (K, V, K's scales, V's scales): random values stored as `dtype` (scales None for 16 and 32 bits)."""
    made = []
    for _ in range(layers):
        k, v = (torch.randn(SLOTS, KV_HEADS, DIM, generator=gen) for _ in range(2))
        if dtype in (torch.int8, torch.float8_e4m3fn):
            (kq, ks), (vq, vs) = quantize_kv(k, dtype), quantize_kv(v, dtype)
            made.append((kq, vq, ks, vs))
        else:
            made.append((k.to(dtype), v.to(dtype), None, None))
    return made


class Alternating:
    """The engine's kernels with decode_attention from one build or the other, as `turn` says, each call timed."""

    def __init__(self, kernels, builds: dict):
        self.kernels, self.builds, self.turn = kernels, builds, next(iter(builds))
        self.seconds: dict[str, list[float]] = {name: [] for name in builds}

    def __getattr__(self, name: str):
        if name != "decode_attention":
            return getattr(self.kernels, name)
        turn, call = self.turn, self.builds[self.turn].decode_attention

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = call(*args, **kwargs)
            self.seconds[turn].append(time.perf_counter() - start)
            return out

        return timed


def in_engine(builds: dict, model: str, dtype: str, context: int, steps: int = 60) -> None:
    """One decode of `steps` tokens after `context` random prompt tokens, the builds taking turns by step."""
    from rooftop import LLM, SamplingParams

    kv = {"float32": "auto", "float8_e4m3fn": "fp8_e4m3"}.get(dtype, dtype)
    llm = LLM(model=model, kv_cache_dtype=kv)
    ops = llm.model.ops
    alternating = Alternating(ops.kernels, builds)
    ops.kernels = alternating
    prompt = torch.randint(1000, 20000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.engine.add_request("ab", prompt, SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True))
    names = list(builds)
    step = 0
    while llm.engine.has_unfinished():
        llm.engine.step()
        step += 1
        alternating.turn = names[step % len(names)]
    medians = {name: statistics.median(s) * 1e6 for name, s in alternating.seconds.items()}
    cells = "  ".join(f"{name} {us:.0f} us a call" for name, us in medians.items())
    print(f"{dtype} in the engine, {context}-token prompt: {cells}  new/old {medians['new'] / medians['old']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--context", default="500,2000", help="keys attended, comma-separated")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8,float8_e4m3fn")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="a model file: time the builds' calls in the engine's decode instead")
    args = parser.parse_args()
    if 16 % args.layers:
        parser.error("--layers must divide 16: the 16 calls cycle through the pools")
    torch.set_num_threads(args.threads)
    builds = {"old": build(args.old), "new": build(args.new)}
    if args.model:
        for dtype in args.dtypes.split(","):
            for context in (int(c) for c in args.context.split(",")):
                in_engine(builds, args.model, dtype, context)
        return
    blob = pages.empty(256 << 20).fill_(1)
    gen = torch.Generator().manual_seed(0)
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        layers = pools(dtype, args.layers, gen)
        for context in (int(c) for c in args.context.split(",")):
            blocks = torch.randperm(SLOTS // BLOCK, generator=gen)[: context // BLOCK + 1]
            tables, lengths = blocks[None].contiguous(), torch.tensor([context + 1])
            slot = torch.tensor([int(blocks[context // BLOCK]) * BLOCK + context % BLOCK])
            qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * DIM, generator=gen)

            def run(ops, layers=layers, qkv=qkv, slot=slot, tables=tables, lengths=lengths) -> list[torch.Tensor]:
                args_ = (slot, tables, lengths, BLOCK, HEADS, KV_HEADS, DIM**-0.5)
                return [
                    ops.decode_attention(qkv, k, v, *args_, ks, vs) for k, v, ks, vs in layers * (16 // len(layers))
                ]

            outs = {name: run(ops) for name, ops in builds.items()}
            diff = max((a - b).abs().max().item() for a, b in zip(outs["old"], outs["new"], strict=True))
            seconds: dict[str, list[float]] = {name: [] for name in [*builds, "read"]}
            for _ in range(args.rounds):
                for name, ops in builds.items():
                    start = time.perf_counter()
                    run(ops)
                    seconds[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                cpu.ops().stream_read(blob, 2)
                seconds["read"].append(time.perf_counter() - start)
            nbytes = 16 * 2 * (context + 1) * KV_HEADS * DIM * layers[0][0].element_size()
            cells = [f"{name} {statistics.median(s) * 1e3:.2f} ms" for name, s in seconds.items() if name != "read"]
            read = blob.numel() / statistics.median(seconds["read"]) / 1e9
            print(
                f"{str(dtype).removeprefix('torch.')} {context} keys x 16 layers ({nbytes / 1e6:.1f} MB): "
                f"{'  '.join(cells)}  new/old {statistics.median(seconds['new']) / statistics.median(seconds['old']):.2f}"
                f"  read {read:.1f} GB/s  max |new - old| {diff:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
