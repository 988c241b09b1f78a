"""rooftop against llama.cpp and transformers on the same GGUF: prefill tok/s (pp), decode TPOT (tg), peak memory.

    .venv/bin/python benchmarks/peers.py [--model FILE.gguf] [--reps 3] [--pp 512] [--tg 128] [--depth 0]
        [--threads 2] [--engines rooftop-auto,llama.cpp] [--markdown FILE]

--model: any GGUF (default the bundled model), e.g. one benchmarks/make_gguf.py wrote at a preset's size;
rooftop-auto runs each tensor in the format the file holds it in, rooftop-int4/int8/float32 convert them.

Each measurement runs in its own process (so peak RSS is that engine's alone), engines alternate within every
repetition, and the table shows medians. Like llama-bench, pp times a prefill of `pp` random tokens into an
empty cache and tg the decode of `tg` tokens after a one-token prompt (after a `--depth`-token prompt with one:
llama-bench's `tg128 @ d4096`, the context's prefill not timed), greedy, each after a warm-up of the same size (a first large call pays one-time allocations: rooftop's first 512-token prefill ran 10% slower). llama.cpp comes from the optional
`bench` extra (`pip install -e .[bench]`: llama-cpp-python, compiled from source for this CPU).

Right after its decode each worker reads memory as decode does (`host_read`), and the table puts each engine's
decode beside that rate: on a shared host the rate moves by up to 1.8x from one minute to the next, and a decode
that streams its weights moves with it, so a TPOT means little without the read of its minute.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ENGINES = ("rooftop-float32", "rooftop-int8", "rooftop-int4", "llama.cpp", "transformers")
MODEL: str | None = None  # --model: the GGUF every engine runs (None: the bundled model)


def model_path() -> Path:
    from rooftop.loading.bundled import bundled_model_path

    return Path(MODEL) if MODEL else bundled_model_path()


def analyzed_weight_bytes(weights: str | None) -> float:
    """The weight bytes a decode step of the file reads, by the analyzer's count: in the file's own formats (None:
    llama.cpp runs them as stored) or in `weights` (transformers widens them to fp32)."""
    from rooftop.roofline.api import resolve_model
    from rooftop.roofline.ops import weight_bytes
    from rooftop.roofline.precision import precision

    config, held = resolve_model(model_path())
    return weight_bytes(config, precision(weights or held or "bf16"), per_token=True)


def host_read() -> float | None:
    """The host's memory read rate now: bytes per second of rooftop's two-stream read (decode's pattern,
    kernels/tiles.cpp) over 512 MiB in the pages the weights are in, best of 3; None without rooftop's kernels.
    A worker calls it right after its decode, once its peak memory is taken."""
    from rooftop.kernels import cpu, pages

    ops = cpu.ops()
    if ops is None:
        return None
    data = pages.empty(512 << 20).fill_(1)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        ops.stream_read(data, 2)
        best = min(best, time.perf_counter() - t0)
    return data.numel() / best


def prompt_ids(n: int, vocab: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(0).integers(100, vocab - 100, size=n).tolist()


def run_rooftop(fmt: str, pp: int, tg: int, depth: int) -> tuple[float, float, float]:
    from rooftop import LLM, SamplingParams
    from rooftop.roofline.ops import weight_bytes

    llm = LLM(
        model=str(model_path()),
        weights=fmt,
        max_num_batched_tokens=max(pp, 1024),
        num_kv_blocks=(max(pp, depth) + tg) // 16 + 8,
        enable_prefix_caching=False,
    )
    ids = prompt_ids(max(pp, depth), llm.config.vocab_size)

    def greedy(tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)

    llm.generate([ids[:pp]], greedy(8), use_tqdm=False)  # warm-up at full size
    prefill = llm.generate([ids[:pp]], greedy(1), use_tqdm=False)[0].metrics.prefill_time
    decode = llm.generate([ids[: max(depth, 1)]], greedy(tg), use_tqdm=False)[0].metrics
    return pp / prefill, decode.tpot, weight_bytes(llm.config, llm.precision, per_token=True)


def run_llama_cpp(pp: int, tg: int, depth: int, threads: int) -> tuple[float, float]:
    from llama_cpp import Llama

    context = max(pp, depth) + tg + 16
    llm = Llama(
        str(model_path()),
        n_ctx=context,
        n_batch=context,  # llama-cpp-python keeps the last logits at row n_tokens - 1 of an n_batch-row array
        n_ubatch=pp,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    ids = prompt_ids(max(pp, depth), llm.n_vocab())
    llm.eval(ids[:pp])  # warm-up at full size
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids[:pp])
    prefill = time.perf_counter() - t0
    llm.reset()
    llm.eval(ids[: max(depth, 1)])
    token = int(llm.scores[llm.n_tokens - 1].argmax())
    t0 = time.perf_counter()
    for _ in range(tg - 1):
        llm.eval([token])
        token = int(llm.scores[llm.n_tokens - 1].argmax())
    return pp / prefill, (time.perf_counter() - t0) / (tg - 1)


def run_transformers(pp: int, tg: int, depth: int) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM

    path = model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids(max(pp, depth), model.config.vocab_size)])
    with torch.inference_mode():
        model(ids[:, :pp])  # warm-up at full size
        t0 = time.perf_counter()
        model(ids[:, :pp])
        prefill = time.perf_counter() - t0
        out = model(ids[:, : max(depth, 1)], use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(tg - 1):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        return pp / prefill, (time.perf_counter() - t0) / (tg - 1)


def worker(engine: str, pp: int, tg: int, depth: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    if engine.startswith("rooftop-"):
        fmt = engine.removeprefix("rooftop-")
        pp_rate, tpot, step_bytes = run_rooftop("float" if fmt == "float32" else fmt, pp, tg, depth)
    elif engine == "llama.cpp":
        pp_rate, tpot = run_llama_cpp(pp, tg, depth, threads)
        step_bytes = analyzed_weight_bytes(None)
    else:
        pp_rate, tpot = run_transformers(pp, tg, depth)
        step_bytes = analyzed_weight_bytes("fp32")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    read = host_read()
    return {
        "engine": engine,
        "pp_tok_s": pp_rate,
        "tpot_ms": tpot * 1e3,
        "peak_rss_mib": peak,
        "decode_gb_s": step_bytes / tpot / 1e9,
        "host_read_gb_s": read and read / 1e9,
    }


def versions() -> dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name, module in (("transformers", "transformers"), ("llama-cpp-python", "llama_cpp")):
        try:
            out[name] = __import__(module).__version__
        except ImportError:
            out[name] = "not installed"
    return out


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def markdown(rows: dict[str, list[dict]], args: argparse.Namespace) -> str:
    """The medians per engine. decode GB/s is the weight bytes its decode step reads (the analyzer's count, in the
    formats that engine runs; at a --depth the KV cache it reads comes on top) over the TPOT; host read the rate
    measured right after each run; % is their ratio per run (the median of the runs' ratios, so each is of its own
    minute)."""
    v = versions()
    lines = [
        f"`{' '.join(sys.argv)}` — {date.today()}, {cpu_name()}, {args.threads} threads, "
        + ", ".join(f"{k} {val}" for k, val in v.items()),
        "",
        f"| engine | prefill pp{args.pp} (tok/s) | decode tg{args.tg}{f' @ d{args.depth}' if args.depth else ''} "
        "TPOT (ms) | decode GB/s | host read GB/s | "
        "% of host read | peak RSS (MiB) | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("pp_tok_s", "tpot_ms", "decode_gb_s", "peak_rss_mib")}
        reads = [r["host_read_gb_s"] for r in runs if r["host_read_gb_s"] is not None]
        shares = [r["decode_gb_s"] / r["host_read_gb_s"] for r in runs if r["host_read_gb_s"]]
        read = f"{statistics.median(reads):.1f}" if reads else "-"
        share = f"{100 * statistics.median(shares):.0f}%" if shares else "-"
        lines.append(
            f"| {engine} | {med['pp_tok_s']:.1f} | {med['tpot_ms']:.2f} | {med['decode_gb_s']:.1f} | {read} | {share} "
            f"| {med['peak_rss_mib']:.0f} | {len(runs)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file (default: the bundled model)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--tg", type=int, default=128)
    parser.add_argument("--depth", type=int, default=0, help="tokens of context before the decode (llama-bench's -d)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="every run's numbers")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global MODEL
    MODEL = args.model
    if args.worker:
        print(json.dumps(worker(args.worker, args.pp, args.tg, args.depth, args.threads)))
        return
    engines = args.engines.split(",")
    rows: dict[str, list[dict]] = {e: [] for e in engines}
    for rep in range(args.reps):
        for engine in engines[rep % len(engines) :] + engines[: rep % len(engines)]:  # rotate who goes first
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                engine,
                "--pp",
                str(args.pp),
                "--tg",
                str(args.tg),
                "--depth",
                str(args.depth),
                "--threads",
                str(args.threads),
                *(["--model", args.model] if args.model else []),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{engine}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rows[engine].append(result)
            print(
                f"rep {rep + 1} {engine}: pp {result['pp_tok_s']:.1f} tok/s, TPOT {result['tpot_ms']:.2f} ms, "
                f"peak {result['peak_rss_mib']:.0f} MiB, host read after {result['host_read_gb_s'] or float('nan'):.1f} GB/s",
                flush=True,
            )
    table = markdown({e: r for e, r in rows.items() if r}, args)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
