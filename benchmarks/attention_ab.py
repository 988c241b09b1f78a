"""Two builds of rooftop's decode attention, alternating: one decode row of a 1B (32 query heads, 8 KV heads, head_dim
64) attending over each of 16 layers' paged pools in turn, with `stream_read`'s rate in the same rounds.

.venv/bin/python benchmarks/attention_ab.py OLD_DIR NEW_DIR [--context 500,2000] [--dtypes float32,bfloat16,int8,float8_e4m3fn] [--layers 16]

Each directory holds the kernel sources (as for benchmarks/kernel_ab.py). 16 layers' pools of 16,384 slots are 1 GB
in float32, so each call reads its keys from DRAM, as a decode step does (the weights stream through the caches
between two layers' attention); --layers 1 reads one layer's pool again and again, from the cache. The sequence's
blocks are scattered over the pool, as after a server's churn. Both builds' outputs are compared first.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--context", default="500,2000", help="keys attended, comma-separated")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8,float8_e4m3fn")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if 16 % args.layers:
        parser.error("--layers must divide 16: the 16 calls cycle through the pools")
    torch.set_num_threads(args.threads)
    builds = {"old": build(args.old), "new": build(args.new)}
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
