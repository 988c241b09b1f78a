"""rooftop on a GPU, measured beside the analyzer: the driver of benchmarks/gpu_check.sh, one section per call, each
writing its JSON (and PNG) into OUT as it goes, so that a section that fails or times out leaves the others' results.

    python benchmarks/gpu_check.py tokenizer .whl/tokenizer      # here, once: the bundled model's tokenizer as files
    python benchmarks/gpu_check.py probe --out OUT               # the GPU's roofs and the weight-only kernels by rows
    python benchmarks/gpu_check.py llama-3.1-8b-bf16 --out OUT   # a model section: TTFT and TPOT beside the analyzer
    python benchmarks/gpu_check.py summary --out OUT             # the targets, a markdown table, summary.png

Models are dummy weights of the analyzer's presets (vLLM's --load-format dummy) with SmolLM2's tokenizer read from
--tokenizer (the device has no bundled GGUF). Each scenario records the engine's measured step (device-synchronized
wall time of the forward pass; a decode step's also its graph replay timed by CUDA events), the request metrics, and
the analyzer's bound and expected time for the step's shape at the measured roofs (the probe's), the expected time
with the H200's published efficiencies (issue 12). --dry-run runs every section on the CPU with tiny models of the
same architectures, for the plumbing (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rooftop import SamplingParams
from rooftop.config import FULL_ATTENTION, EngineConfig, LinearAttention, ModelConfig
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.probe import ENGINE_KERNELS
from rooftop.enums import Phase
from rooftop.loading.dummy import Source, dummy_weights
from rooftop.loading.tokenizer import Tokenizer
from rooftop.models.loader import build_model
from rooftop.quant.linear import make_linear
from rooftop.quant.rows import RowPlan
from rooftop.roofline.catalog import find_hardware
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import weight_bytes
from rooftop.roofline.predict import expected_time, time_step
from rooftop.roofline.presets import find_preset
from rooftop.roofline.probe import Plan, ProbeResult, best_seconds, run_probe

GIB = 1 << 30


@dataclass(frozen=True)
class Section:
    """One model section: a preset in one weight format, the prompts whose TTFT it measures and the batches whose
    TPOT it measures (each sequence with `context` prompt tokens, then `steps` decode steps)."""

    preset: str
    weights: str
    prompts: tuple[int, ...]
    batches: tuple[int, ...]
    context: int
    steps: int
    kv_cache_bytes: int


SECTIONS = {
    "llama-3.1-8b-bf16": Section("llama-3.1-8b", "float", (2048,), (1, 8, 64), 512, 32, 8 * GIB),
    "llama-3.1-8b-int4": Section("llama-3.1-8b", "int4", (2048,), (1, 8, 64), 512, 32, 8 * GIB),
    "dense-27b-bf16": Section("dense-27b", "float", (2048, 4096), (1, 16), 4096, 16, 32 * GIB),
    "qwen3.6-27b-bf16": Section("qwen3.6-27b", "float", (2048, 4096), (1, 16), 4096, 16, 16 * GIB),
}
DRY = {"prompts": (48,), "batches": (1, 2), "context": 24, "steps": 3, "kv_cache_bytes": 1 << 24}
TPOT_TARGET = 0.15  # the 27B example: measured TPOT within 15% of the analyzer's expected time
DECODE_TARGET = 0.80  # the 8B in bf16 at batch 1: of the measured HBM read bandwidth
PREFILL_TARGET = 0.60  # a 2048-token prefill: of the measured bf16 matmul FLOP/s


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def write_tokenizer(directory: Path) -> None:
    """The bundled GGUF's tokenizer as tokenizer.json and tokenizer_config.json (specials, chat template), what
    Tokenizer.from_hf_dir reads: ~2 MB that travels to the device instead of the 94 MB model."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf_file import read_gguf

    tokenizer = Tokenizer.from_gguf_metadata(read_gguf(bundled_model_path()).metadata)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(directory / "tokenizer.json"), pretty=False)
    config = {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "add_bos_token": tokenizer.add_bos,
        "chat_template": tokenizer.chat_template,
    }
    write_json(directory / "tokenizer_config.json", config)


def tiny(config: ModelConfig) -> ModelConfig:
    """A few-layer, narrow model of `config`'s architecture (its layer pattern kept), for --dry-run on a CPU."""
    small = replace(
        config,
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    if config.layer_types is None:
        return replace(small, num_layers=2)
    pattern = config.layer_types[: config.layer_types.index(FULL_ATTENTION) + 1]
    shapes = LinearAttention(2, 4, 16, 16, config.linear_attention.conv_kernel_dim)
    return replace(small, num_layers=len(pattern), layer_types=pattern, linear_attention=shapes)


def probe_section(out: Path, device: str, dry_run: bool) -> None:
    """The device's roofs (probe.json), then each weight-only linear against bfloat16 at decode and prefill row
    counts, on the kernel and widened (kernels.json): the numbers that choose where a chunk widens."""
    result = run_probe(device, quick=dry_run, engine=ENGINE_KERNELS)
    write_json(out / "probe.json", result.to_dict())
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    plan = Plan((), (), 0, 0, 0, 0, (), reps=3 if dry_run else 7, cap_s=1.0, min_rep_s=0.002 if dry_run else 0.02)
    k, n = (256, 512) if dry_run else (4096, 28672)  # the 8B's gate/up: 14336 x 2 rows of 4096 inputs
    gen = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(n, k, generator=gen, device=device, dtype=dtype) * 0.02
    linears = {"bf16": make_linear(weight, None, "float")}
    if device != "cpu":
        linears |= {policy: make_linear(weight, None, policy) for policy in ("int8", "int4")}
    rows_tried = (1, 16, 64) if dry_run else (1, 8, 16, 32, 64, 96, 128, 256, 2048)
    table = []
    for rows in rows_tried:
        x = torch.randn(rows, k, generator=gen, device=device, dtype=dtype)
        for name, linear in linears.items():
            paths = {"kernel": RowPlan()} if name == "bf16" else {"kernel": RowPlan(), "widened": RowPlan((rows,))}
            for path, row_plan in paths.items():
                seconds = best_seconds(
                    lambda linear=linear, row_plan=row_plan, x=x: linear(x, plan=row_plan), device, plan
                )
                table.append(
                    {
                        "format": linear.format,
                        "path": path,
                        "rows": rows,
                        "seconds": seconds,
                        "weight_gb_per_s": linear.nbytes / seconds / 1e9,
                        "tflops": 2 * rows * k * n / seconds / 1e12,
                    }
                )
                write_json(out / "kernels.json", {"k": k, "n": n, "device": result.device_name, "runs": table})


def engine_for(section: Section, name: str, device: str, dry_run: bool, tokenizer: Tokenizer) -> LLMEngine:
    config = find_preset(section.preset)
    if dry_run:
        config = tiny(config)
        section = replace(section, **DRY)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    loaded = dummy_weights(Source(config, name, tokenizer=tokenizer), section.weights, torch.device(device), dtype)
    model = build_model(loaded, dtype, device, section.weights)
    longest = max(*section.prompts, section.context) + section.steps + 1
    engine = EngineConfig(
        max_num_seqs=max(section.batches),
        max_num_batched_tokens=max(section.prompts),
        kv_cache_bytes=section.kv_cache_bytes,
        max_model_len=longest,
        enable_prefix_caching=False,
        batch_invariant=False,  # as the CUDA engine runs: one chunk per prompt of up to max_num_batched_tokens
        cuda_graph_sizes=sorted({1, *section.batches}),  # the batches measured (1: the warm-up's decodes)
    )
    return LLMEngine(model, tokenizer, engine)


def run_batch(engine: LLMEngine, rng: random.Random, prompt_len: int, batch: int, steps: int) -> list:
    """`batch` requests of `prompt_len` random tokens, run to the end so that all of them decode together for
    `steps` steps: the first sequence prefilled decodes while the others' chunks run, so each asks for as many more
    tokens as the prompts take steps to prefill. The step records, and the request outputs."""
    vocab = engine.model.config.vocab_size
    prefill_steps = -(-batch * prompt_len // engine.config.max_num_batched_tokens)
    params = SamplingParams(max_tokens=max(1, steps + prefill_steps), temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", [rng.randrange(vocab) for _ in range(prompt_len)], params)
    records, outputs = [], []
    while engine.has_unfinished():
        step = engine.step()
        records.append(step.record)
        outputs += [d.output for d in step.deltas if d.output is not None]
    return [r for r in records if r is not None], outputs


def analyzed(engine: LLMEngine, shape, hw: Hardware, measured_s: float) -> dict:
    """The analyzer's bound and expected time for `shape` at `hw`'s roofs, with the share of them `measured_s`
    reached."""
    config, p = engine.model.config, engine.model.precision
    step = time_step(config, p, shape, hw)
    expected = expected_time(step, hw, config, p)
    return {
        "bound_s": step.bound_s,
        "expected_s": expected,
        "unfused_s": step.time_s,
        "flops": step.flops,
        "essential_bytes": step.essential_bytes,
        "bandwidth_share": step.essential_bytes / measured_s / hw.memory_bandwidth,
        "flops_share": step.flops / measured_s / hw.peak("bf16"),
        "measured_over_expected": None if expected is None else measured_s / expected,
    }


def replay_seconds(engine: LLMEngine, batch: int, device: str) -> float | None:
    """The device time of one replay of the decode graph of `batch` rows, by CUDA events over 20 replays (the step
    without the host's part: scheduling, the input copy, sampling)."""
    graphs = engine.decode_graphs
    if graphs is None or batch not in graphs.graphs:
        return None
    graph = graphs.graphs[batch][0]
    graph.replay()
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    for _ in range(20):
        graph.replay()
    ended.record()
    ended.synchronize()
    return began.elapsed_time(ended) / 1e3 / 20


def model_section(key: str, out: Path, device: str, dry_run: bool, tokenizer: Tokenizer) -> None:
    """TTFT at each prompt length and TPOT at each batch, each beside the analyzer, into OUT/<key>.json and .png."""
    section = SECTIONS[key]
    started = time.perf_counter()
    engine = engine_for(section, section.preset, device, dry_run, tokenizer)
    if dry_run:
        section = replace(section, **DRY)
    probe = ProbeResult.from_dict(json.loads((out / "probe.json").read_text()))
    weights = engine.model.precision
    hw = probe.to_hardware(working_set=weight_bytes(engine.model.config, weights))
    hw = replace(hw, efficiency=find_hardware("h200").efficiency)  # issue 12's expected time, at measured roofs
    result = {
        "section": key,
        "preset": section.preset,
        "weights": weights.weights.name,
        "device": probe.device_name,
        "load_and_capture_s": time.perf_counter() - started,
        "roofs": {"read_bytes_per_s": hw.memory_bandwidth, "bf16_flops_per_s": hw.peak("bf16")},
        "ttft": [],
        "tpot": [],
    }
    rng = random.Random(0)
    run_batch(engine, rng, 16, 1, 2)  # warm: the allocator, cuBLAS and the kernels at the prefill's shapes
    for prompt_len in section.prompts:
        runs = []
        for _ in range(3):
            records, outputs = run_batch(engine, rng, prompt_len, 1, 0)
            prefill = [r for r in records if r.phase is Phase.PREFILL]
            runs.append((sum(r.seconds for r in prefill), outputs[0].metrics.ttft, prefill[0].shape))
        measured = statistics.median(r[0] for r in runs)
        point = {"prompt": prompt_len, "step_s": measured, "ttft_s": statistics.median(r[1] for r in runs)}
        result["ttft"].append(point | analyzed(engine, runs[0][2], hw, measured))
        write_json(out / f"{key}.json", result)
    for batch in section.batches:
        records, outputs = run_batch(engine, rng, section.context, batch, section.steps)
        decodes = [r for r in records if r.phase is Phase.DECODE and r.shape.num_seqs == batch]
        if not decodes:
            raise RuntimeError(f"no decode step ran all {batch} sequences together")
        measured = statistics.median(r.seconds for r in decodes)
        middle = decodes[len(decodes) // 2].shape
        point = {
            "batch": batch,
            "context": section.context,
            "step_s": measured,
            "step_wall_s": statistics.median(r.wall_seconds for r in decodes),
            "tpot_s": statistics.median(o.metrics.tpot for o in outputs),
            "graph_replay_s": replay_seconds(engine, batch, device),
            "decode_steps": len(decodes),
        }
        result["tpot"].append(point | analyzed(engine, middle, hw, measured))
        write_json(out / f"{key}.json", result)
    plot_section(result, out / f"{key}.png")


def plot_section(result: dict, path: Path) -> None:
    """Bound, expected and measured per scenario, one group of bars each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(f"TTFT {p['prompt']}", p) for p in result["ttft"]] + [(f"TPOT b{p['batch']}", p) for p in result["tpot"]]
    fig, ax = plt.subplots(figsize=(1.8 * len(points) + 2, 4))
    for j, (name, key) in enumerate((("bound", "bound_s"), ("expected", "expected_s"), ("measured", "step_s"))):
        values = [(p[key] or 0) * 1e3 for _, p in points]
        ax.bar([i + 0.27 * (j - 1) for i in range(len(points))], values, width=0.27, label=name)
    ax.set_xticks(range(len(points)), [name for name, _ in points])
    ax.set_ylabel("ms per step")
    ax.set_title(f"{result['preset']} ({result['weights']}) on {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_section(out: Path) -> dict:
    """The issue's targets from whatever sections wrote their JSON, a markdown table (summary.md) and summary.json."""
    results = {key: json.loads((out / f"{key}.json").read_text()) for key in SECTIONS if (out / f"{key}.json").exists()}
    targets = []  # (what, value, goal, kind): "at least" the goal, or measured / expected "within" 1 ± goal
    llama = results.get("llama-3.1-8b-bf16", {})
    for p in llama.get("tpot", []):
        if p["batch"] == 1:
            targets.append(
                (
                    "8B bf16 decode at batch 1: share of the read bandwidth",
                    p["bandwidth_share"],
                    DECODE_TARGET,
                    "at least",
                )
            )
    for p in llama.get("ttft", []):
        if p["prompt"] == 2048:
            targets.append(
                ("8B bf16 prefill of 2048: share of the bf16 FLOP/s", p["flops_share"], PREFILL_TARGET, "at least")
            )
    for key in ("dense-27b-bf16", "qwen3.6-27b-bf16"):
        for p in results.get(key, {}).get("tpot", []):
            targets.append(
                (f"{key} TPOT b{p['batch']}: measured / expected", p["measured_over_expected"], TPOT_TARGET, "within")
            )
    rows = ["| model | scenario | measured ms | expected ms | bound ms | share of roof |", "|---|---|---|---|---|---|"]
    for key, r in results.items():
        for p in r["ttft"]:
            rows.append(_row(key, f"TTFT {p['prompt']}", p, p["flops_share"], "FLOP/s"))
        for p in r["tpot"]:
            rows.append(_row(key, f"TPOT batch {p['batch']} at {p['context']}", p, p["bandwidth_share"], "GB/s"))
    met = [
        {
            "target": name,
            "value": value,
            "goal": goal if kind == "at least" else f"1 ± {goal}",
            "met": None if value is None else (value >= goal if kind == "at least" else abs(value - 1) <= goal),
        }
        for name, value, goal, kind in targets
    ]
    summary = {"sections": sorted(results), "targets": met, "table": rows}
    write_json(out / "summary.json", summary)
    (out / "summary.md").write_text("\n".join(rows) + "\n")
    return summary


def _row(key: str, scenario: str, p: dict, share: float, roof: str) -> str:
    expected = "—" if p["expected_s"] is None else f"{p['expected_s'] * 1e3:.2f}"
    return (
        f"| {key} | {scenario} | {p['step_s'] * 1e3:.2f} | {expected} | {p['bound_s'] * 1e3:.2f} | "
        f"{share:.0%} of {roof} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=["tokenizer", "probe", *SECTIONS, "summary"])
    parser.add_argument("directory", nargs="?", help="tokenizer: where to write it")
    parser.add_argument("--out", type=Path, help="the results folder (every section but tokenizer)")
    parser.add_argument("--tokenizer", type=Path, default=Path(".whl/tokenizer"), help="tokenizer.json's folder")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, with tiny models: the plumbing only")
    args = parser.parse_args(argv)
    if args.section == "tokenizer":
        if not args.directory:
            parser.error("tokenizer needs the folder to write into")
        write_tokenizer(Path(args.directory))
        return 0
    if args.out is None:
        parser.error(f"{args.section} needs --out")
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else "cuda"
    if args.section != "summary" and device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA device (--dry-run runs on the CPU)", file=sys.stderr)
        return 2
    if args.section == "probe":
        probe_section(args.out, device, args.dry_run)
    elif args.section == "summary":
        summary = summary_section(args.out)
        print("\n".join(summary["table"]))
        for t in summary["targets"]:
            value = "missing" if t["value"] is None else f"{t['value']:.3f}"
            print(f"{'MET ' if t['met'] else 'MISS'} {t['target']}: {value} (goal {t['goal']})")
    else:
        tokenizer = Tokenizer.from_hf_dir(args.tokenizer, [])
        model_section(args.section, args.out, device, args.dry_run, tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
