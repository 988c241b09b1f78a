"""Two builds of rooftop's CPU kernels on a decode's weights, alternating: the linears of a 1B's 16 layers (QKV, O,
gate-up, down of the llama-3.2-1b preset; distinct copies, so nothing stays cached) called in turn with a few
activation rows, and `stream_read` over as many bytes, round after round.

.venv/bin/python benchmarks/kernel_ab.py OLD_DIR NEW_DIR [--format q4_0] [--rows 1] [--rounds 15] [--threads 2]
    [--shapes 2048x2048 --layers 1 --repeat 200]  # other matrices (N x K): a small one stays in the caches, called
                                                  # --repeat times a round: its arithmetic, not the read, is timed

Each directory holds the kernel sources (src/rooftop/kernels/*.cpp, *.h: e.g. `git show REV:PATH` of each) and is
built as its own module. On a shared host a run of one build and then the other compares two minutes; taken in
turn, both builds see the same minutes (docs/PERFORMANCE.md). GGUF's block formats are tiled by each build's own
repack, so two layouts of the tiles compare; Q4_1 and Q8_0 by this checkout's quant/tiles.py, which both builds
must read. The weights and the read are in the pages the engine puts its weights in (kernels/pages.py).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from pathlib import Path

import torch
from kernel_speed import block_weight, linear

from rooftop.kernels import cpu, pages
from rooftop.quant.tiles import TILE_FORMATS, tile_blocks

LAYERS = 16
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]  # the 1B's QKV, O, gate-up, down: (N, K)


def build(directory: Path):
    sources = sorted(directory.glob("*.[ch]*"))
    tag = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:8]
    return cpu.build(f"rooftop_cpu_ab_{tag}", "-march=native", directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--format", default="q4_0", choices=TILE_FORMATS)
    parser.add_argument("--rows", type=int, default=1, help="activation rows per call: the decode's batch")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", default=None, help="NxK,...: each layer's matrices (default: the 1B's four)")
    parser.add_argument("--layers", type=int, default=LAYERS, help="distinct copies of the matrices, called in turn")
    parser.add_argument("--repeat", type=int, default=1, help="passes over the layers in each round")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    builds = {"old": build(args.old), "new": build(args.new)}
    torch.set_num_threads(args.threads)
    fmt = TILE_FORMATS.index(args.format)
    if args.format in ("q4_1", "q8_0"):
        base = [linear(args.format, n, k) for n, k in shapes]
        layers = [[(pages.copy(lin.q), pages.copy(lin.dm)) for lin in base] for _ in range(args.layers)]
        tiles = dict.fromkeys(builds, layers)
    else:
        blocks = [block_weight(args.format, n, k) for n, k in shapes]
        tiles = {
            name: [[tile_blocks(w, module) for w in blocks] for _ in range(args.layers)]
            for name, module in builds.items()
        }
    total = sum(q.nbytes + dm.nbytes for layer in tiles["new"] for q, dm in layer)
    blob = pages.empty(total // 64 * 64).fill_(1)
    xs = {k: torch.ones(args.rows, k) for _, k in shapes}
    seconds: dict[str, list[float]] = {"old": [], "new": [], "stream_read": []}
    for _ in range(args.rounds):
        for name, module in builds.items():
            start = time.perf_counter()
            for _ in range(args.repeat):
                for layer in tiles[name]:
                    for (q, dm), (n, k) in zip(layer, shapes, strict=True):
                        module.tiled_linear(xs[k], q, dm, fmt, n, None, None)
            seconds[name].append((time.perf_counter() - start) / args.repeat)
        start = time.perf_counter()
        builds["old"].stream_read(blob, 2)
        seconds["stream_read"].append(time.perf_counter() - start)
    weights = args.layers * sum(n * k for n, k in shapes) * args.rows
    print(f"{args.format}, {args.rows} row(s), {total / 1e6:.0f} MB, {args.rounds} rounds (GB/s; G weights x rows/s)")
    for name, taken in seconds.items():
        fast, median = min(taken), statistics.median(taken)
        rate = "" if name == "stream_read" else f"  ({weights / median / 1e9:.1f} G weights/s)"
        print(f"  {name:12s} median {total / median / 1e9:5.1f}  fastest {total / fast / 1e9:5.1f}{rate}")
    ratios = [n / o for o, n in zip(seconds["old"], seconds["new"], strict=True)]
    print(f"  new/old time per round: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
