"""Tensor-parallel tests' ranks: a small gloo group of spawned processes, each running one function of this module
and saving what it computed for the test process to compare (torch.multiprocessing spawn: each rank is a fresh
interpreter, as rooftop's own workers are)."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gguf
import httpx
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gguf import GGMLQuantizationType as QType

from rooftop.loading.shard import Shard, shard_weight
from rooftop.models.parallel import RowParallel, TPGroup, VocabParallelEmbedding, VocabParallelHead, split, vocab_rows
from rooftop.quant.gguf_blocks import stored_blocks
from rooftop.quant.gguf_quantize import quantize
from rooftop.quant.linear import Int4Linear, Int8Linear, RowPlan, make_linear
from rooftop.quant.weights import quantize_int4, quantize_int8, quantize_int8_groups

N, K, ROWS = 64, 512, 5  # K: two Q4_K super-blocks per rank; N: 32 per rank (PyTorch's int4 packs 16 rows at a time)
WIDE = 100  # a prefill chunk's rows: the kernels' widened path


def weights(seed: int = 0) -> dict[str, object]:
    """One (N, K) matrix per format, made from the same seeded floats: float32, the formats rooftop's kernels run as
    stored (Q4_1 and Q8_0 groups, the GGUF block formats), PyTorch's weight-only fallbacks and a fused projection
    of mixed formats."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05
    blocks = {
        name: stored_blocks(quantize(w.numpy(), QType[name.upper()]), QType[name.upper()], (N, K), name)
        for name in ("q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
    }
    return {"fp32": w, "q4_1": quantize_int4(w), "q8_0": quantize_int8_groups(w), **blocks}


def inputs() -> tuple[torch.Tensor, ...]:
    """Seeded rows: decode rows x, a prefill chunk's rows, a residual, and a vocabulary's table (259 rows: odd, so
    the last rank holds fewer and pads its logits for the gather)."""
    gen = torch.Generator().manual_seed(1)
    x, wide = torch.randn(ROWS, K, generator=gen), torch.randn(WIDE, K, generator=gen)
    return x, wide, torch.randn(ROWS, N, generator=gen), torch.randn(259, K, generator=gen)


def linear_of(name: str, weight):
    """The engine's linear for `name`'s weight, as `auto` builds it (stored formats as stored)."""
    if name == "int8-rows":
        return Int8Linear(*quantize_int8(weight))
    if name == "int4-g32":
        return Int4Linear.from_weight(weight, None)
    policy = "float" if name == "fp32" else "int4"
    return make_linear(weight, None, policy, stored=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, size: int, out: Path, *args) -> None:
    """Run `fn(rank, size, port, out, *args)` on `size` ranks of a fresh gloo group; raises if any rank fails."""
    mp.start_processes(fn, args=(size, free_port(), out, *args), nprocs=size, join=True, start_method="spawn")


def _join(rank: int, size: int, port: int) -> TPGroup:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=60),
    )
    return TPGroup(rank, size)


def sharded_linears(rank: int, size: int, port: int, out: Path) -> None:
    """Each format's column-parallel and row-parallel linears on this rank's part, on decode rows and on a prefill
    chunk's widened rows; the vocab-parallel embedding and lm_head. Saves every result to out/rank{rank}.pt."""
    tp = _join(rank, size, port)
    x, wide, residual, table = inputs()
    every = weights()
    every["int8-rows"] = every["fp32"]
    every["int4-g32"] = every["q4_1"]
    every["q4_k+q8_0"] = [every["q4_k"], every["q8_0"]]  # a fused projection stored in two formats
    rows, cols = split(N, rank, size), split(K, rank, size)
    results = {}
    for name, w in every.items():
        parts = w if isinstance(w, list) else [w]
        if name != "q4_k+q8_0":
            column = linear_of(name, shard_weight(w, Shard(0, *rows, N), name))
            results[f"{name}.column"] = column(x)
            if name not in ("int8-rows", "int4-g32"):
                results[f"{name}.column.wide"] = column(wide, plan=RowPlan((WIDE,)))
        else:
            fused = [shard_weight(p, Shard(0, *rows, N), name) for p in parts]
            results[f"{name}.column"] = make_linear(fused, None, "int4", stored=True)(x)
            continue
        local = linear_of(name, shard_weight(w, Shard(1, *cols, K), name))
        results[f"{name}.partial"] = local(x[:, slice(*cols)])
        results[f"{name}.row"] = RowParallel(local, tp)(x[:, slice(*cols)].contiguous(), residual.clone())
    vocab = table.shape[0]
    start, stop = vocab_rows(vocab, rank, size)
    part = table[start:stop].contiguous()
    ids = torch.tensor([0, 5, 129, 130, 258, 7])
    results["embedding"] = VocabParallelEmbedding(part, start, stop, tp)(ids, torch.float32)
    head = VocabParallelHead(make_linear(part, None, "float"), -(-vocab // size), vocab, tp)(x)
    if head is not None:
        results["head"] = head
    torch.save(results, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def ordered_reduce(rank: int, size: int, port: int, out: Path) -> None:
    """The ordered all-reduce of rows of three ranks' partial sums, as one message of every row and as messages of
    one row each: the same bits, whatever the message's length (batch invariance at three ranks and more)."""
    tp = _join(rank, size, port)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own partial sums, spread over magnitudes
    parts = torch.randn(40, 576, generator=gen) * torch.logspace(-3, 3, 576)
    whole = tp.all_reduce(parts.clone())
    alone = torch.cat([tp.all_reduce(parts[i : i + 1].clone()) for i in range(parts.shape[0])])
    plain = parts.clone()
    dist.all_reduce(plain)
    torch.save({"parts": parts, "whole": whole, "alone": alone, "ring": plain}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def gguf_tensor(qtype: QType, shape: tuple[int, int], seed: int = 0):
    """A TensorInfo of seeded values in `qtype`, with its float32 values as gguf decodes them."""
    from rooftop.loading.gguf_file import TensorInfo

    values = np.random.default_rng(seed).normal(0, 0.1, size=shape).astype(np.float32)
    raw = values if qtype == QType.F32 else quantize(values, qtype)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    decoded = values if qtype == QType.F32 else gguf.quants.dequantize(raw, qtype).reshape(shape)
    return TensorInfo("blk.0.ffn_down.weight", shape, qtype, data), torch.from_numpy(np.asarray(decoded))


@contextlib.contextmanager
def serving(model: Path, *options: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m rooftop serve --model MODEL -tp 2 OPTIONS` on a free port, healthy; yields its URL and process
    (stopped on the way out if it still runs)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "rooftop", "serve", "-m", str(model), "-tp", "2", "--port", str(port), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(process.communicate())
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


def children(pid: int) -> list[int]:
    """The processes `pid` started (a server's tensor-parallel workers)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
