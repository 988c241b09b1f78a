"""One quantized linear of rooftop's CPU kernels, timed alone: a decode row (or a few) against random weights of each
format, at a matrix size that stays in L2 and one that streams from DRAM, with the read rate it reached.

.venv/bin/python benchmarks/kernel_speed.py [--formats q4_0,q4_1,q8_0,q4_k,q5_k,q6_k,q5_0,q5_1] [--threads 1] [--rows 1,5] [--shapes 512x2048,16384x2048]

What a decode step's linears can do at best on this host, without the model around them (docs/PERFORMANCE.md):
compare the DRAM rate with `rooftop probe`'s read bandwidth, measured in the same minutes on a shared host.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gguf import GGMLQuantizationType as QType

from rooftop.kernels import cpu
from rooftop.quant.gguf_blocks import stored_blocks
from rooftop.quant.gguf_quantize import quantize
from rooftop.quant.linear import BlockLinear, Q4Linear, Q8Linear
from rooftop.quant.weights import BlockWeight, quantize_int4


def random_values(n: int, k: int) -> torch.Tensor:
    """Seeded float weights of a trained model's spread, the same for a shape in every script that times it."""
    return torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.02


def block_weight(fmt: str, n: int, k: int) -> BlockWeight:
    """A random (n, k) matrix in GGUF's block format `fmt`, by rooftop's quantizer, as a file holds it."""
    qtype = QType[fmt.upper()]
    return stored_blocks(quantize(random_values(n, k).numpy(), qtype), qtype, (n, k))


def linear(fmt: str, n: int, k: int):
    """A random (n, k) matrix quantized to `fmt` (GGUF's blocks by rooftop's quantizer; Q4_1 and Q8_0 by the
    engine's own int4 and int8 quantization), as the engine keeps it."""
    if fmt == "q4_1":
        return Q4Linear.from_weight(quantize_int4(random_values(n, k)), None)
    if fmt == "q8_0":
        return Q8Linear.from_weight(random_values(n, k), None)
    return BlockLinear.from_weight(block_weight(fmt, n, k), None)


def median_seconds(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="q4_0,q4_k,q5_k,q6_k,q5_0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1", help="activation rows per call, comma-separated: 1,2,5,8")
    parser.add_argument("--shapes", default="512x2048,16384x2048", help="NxK: output rows x input width")
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if cpu.ops() is None:
        raise SystemExit("rooftop's CPU kernels did not build on this machine")
    print(f"{torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s)")
    print("| format | N x K | rows | us | x 1 row | GB/s | G weights/s |\n|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            lin = linear(fmt, n, k)
            one = None
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
                seconds = median_seconds(lambda lin=lin, x=x: lin(x), args.reps)
                one = one or (seconds if rows == 1 else None)
                ratio = f"{seconds / one:.2f}" if one else "-"
                print(
                    f"| {fmt} | {n}x{k} | {rows} | {seconds * 1e6:.0f} | {ratio} | {lin.nbytes / seconds / 1e9:.1f} "
                    f"| {n * k * rows / seconds / 1e9:.1f} |"
                )


if __name__ == "__main__":
    main()
