"""`rooftop roofline`, `rooftop probe` and `rooftop explain`: the analyzer and the probe on the command line. The CLI
face sits above the analyzer: "this" machine is the full probe, which times the engine's kernels (engine.probe)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.progress import Progress

from rooftop.config import RunConfig
from rooftop.console import err, user_errors
from rooftop.engine.distributed import launch_of, rank_device, rank_threads
from rooftop.engine.lead import Lead, lead_group
from rooftop.engine.probe import load_or_run_probe
from rooftop.engine.tp_worker import serve_rank
from rooftop.errors import InvalidRequestError
from rooftop.roofline.api import resolve, resolve_hardware
from rooftop.roofline.explain import explain as explain_text
from rooftop.roofline.precision import DEFAULT_STATE_DTYPE, STATE_DTYPES, WEIGHTS_HELP
from rooftop.roofline.predict import DEFAULT_GPU_MEMORY_UTILIZATION, analyze
from rooftop.roofline.probe import OBSERVED, ProbeResult, available_cores, cache_path, read_cache
from rooftop.roofline.speculative import predict_speculative

ModelArg = Annotated[
    str | None,
    typer.Option("--model", "-m", help="preset name, GGUF file, HF directory or config.json (default: bundled)"),
]
HardwareArg = Annotated[
    str | None,
    typer.Option(
        "--hardware", "-H", help="catalog name (h200, a100, ...) or 'this' (the default: this machine's probed roofs)"
    ),
]
PromptArg = Annotated[int, typer.Option("--prompt", "-p", help="prompt tokens per sequence")]
KvArg = Annotated[
    str | None,
    typer.Option(
        "--kv-cache-dtype",
        "--kv",
        help="KV cache (vLLM's and the engine's option; --kv for short): auto|float32|bfloat16|float16|int8|fp8_e4m3 "
        "(fp8: fp8_e4m3) or bf16|fp16|fp32; int8 and fp8_e4m3 count a 4-byte scale per token and KV head, as "
        "rooftop's engine stores them",
    ),
]
StateDtypeArg = Annotated[
    str,
    typer.Option(help=f"recurrent state of linear-attention (Gated DeltaNet) layers: {'|'.join(STATE_DTYPES)}"),
]
TpArg = Annotated[int, typer.Option("--tp", help="tensor-parallel degree: the devices the model is split over")]
PeakArg = Annotated[float | None, typer.Option(help="custom hardware: dense peak TFLOP/s")]
BandwidthArg = Annotated[float | None, typer.Option(help="custom hardware: memory TB/s")]
MemoryArg = Annotated[float | None, typer.Option(help="custom hardware: memory GB")]
InterconnectArg = Annotated[
    float | None, typer.Option(help="custom hardware: interconnect GB/s per device (times --tp's all-reduces)")
]
ComputeEfficiencyArg = Annotated[float, typer.Option(help="fraction of peak FLOP/s reachable")]
MemoryEfficiencyArg = Annotated[float, typer.Option(help="fraction of peak bandwidth reachable")]
UtilizationArg = Annotated[
    float,
    typer.Option(help="fraction of the device's memory an engine uses (vLLM's option): the max batch's capacity"),
]


def _resolve(
    model,
    hardware,
    weights,
    kv,
    state_dtype,
    custom: tuple[float | None, float | None, float | None, float | None],
    compute_efficiency: float = 1.0,
    memory_efficiency: float = 1.0,
    tp: int = 1,
):
    """The model, device and precision of a command; `custom`: --peak-tflops, --bandwidth-tbs, --memory-gb and
    --interconnect-gbs, the custom hardware's numbers (all None for a named device)."""
    peak_tflops, bandwidth_tbs, memory_gb, interconnect_gbs = custom
    if any(v is not None for v in (peak_tflops, bandwidth_tbs, memory_gb)):
        hardware = resolve_hardware(hardware, peak_tflops, bandwidth_tbs, memory_gb, interconnect_gbs)
    elif interconnect_gbs is not None:
        raise InvalidRequestError(
            "--interconnect-gbs describes custom hardware: give it with --peak-tflops, --bandwidth-tbs and "
            "--memory-gb (a catalog device has its own)"
        )
    probe = load_or_run_probe if tp == 1 else lambda: group_probe(tp)
    config, hw, p = resolve(model, hardware, weights, kv, tp, state_dtype, probe)
    return config, hw.scaled(compute_efficiency, memory_efficiency), p


def group_probe(tp: int) -> ProbeResult:
    """This machine as one rank of a group of `tp` on its CPU: the probe `rooftop probe -tp N` cached, with the
    group's all-reduce (the analyzer does not start a group itself)."""
    cached = read_cache(cache_path("cpu", f"gloo x{tp}"))
    if cached is None:
        raise InvalidRequestError(
            f"this machine's all-reduce among {tp} ranks is not measured yet: run `rooftop probe "
            f"--tensor-parallel-size {tp}` first",
            "tp",
        )
    return cached


def roofline(
    model: ModelArg = None,
    hardware: HardwareArg = None,
    prompt: PromptArg = 1024,
    output: Annotated[int, typer.Option("--output", "-n", help="output tokens per sequence")] = 256,
    batch: Annotated[int, typer.Option("--batch", "-b", help="sequences decoded together")] = 1,
    weights: Annotated[str | None, typer.Option(help=WEIGHTS_HELP)] = None,
    kv: KvArg = None,
    tp: TpArg = 1,
    peak_tflops: PeakArg = None,
    bandwidth_tbs: BandwidthArg = None,
    memory_gb: MemoryArg = None,
    interconnect_gbs: InterconnectArg = None,
    compute_efficiency: ComputeEfficiencyArg = 1.0,
    memory_efficiency: MemoryEfficiencyArg = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON with SI units in the keys")] = False,
    plot: Annotated[str | None, typer.Option(help="write the roofline chart to this PNG")] = None,
    gpu_memory_utilization: UtilizationArg = DEFAULT_GPU_MEMORY_UTILIZATION,
    state_dtype: StateDtypeArg = DEFAULT_STATE_DTYPE,
    num_speculative_tokens: Annotated[
        int | None, typer.Option(help="speculative decoding: draft tokens per verify step (with --acceptance)")
    ] = None,
    acceptance: Annotated[
        float | None, typer.Option(help="speculative decoding: the probability each draft token is accepted")
    ] = None,
) -> None:
    """Predict FLOPs, bytes, bound and time of prefill and decode for a model on a device; with
    --num-speculative-tokens and --acceptance, also TPOT with speculative decoding."""
    with user_errors():
        custom = (peak_tflops, bandwidth_tbs, memory_gb, interconnect_gbs)
        config, hw, p = _resolve(
            model, hardware, weights, kv, state_dtype, custom, compute_efficiency, memory_efficiency, tp
        )
        if (num_speculative_tokens is None) != (acceptance is None):
            raise InvalidRequestError("--num-speculative-tokens and --acceptance go together: give both or neither")
        if num_speculative_tokens is not None and output == 1:
            raise InvalidRequestError(
                "--num-speculative-tokens needs --output 2 or more: speculative decoding speeds up decode steps, and "
                "one output token has none (it is the prefill's)",
                "num_speculative_tokens",
            )
        pred = analyze(config, hw, p, prompt, output, batch, tp, gpu_memory_utilization=gpu_memory_utilization)
        spec = None
        if num_speculative_tokens is not None:  # at the output's middle context, as a mean TPOT
            context = prompt + output // 2
            spec = predict_speculative(config, p, hw, num_speculative_tokens, acceptance, context, batch, tp)
        if as_json:
            typer.echo(json.dumps(pred.to_dict() | ({"speculative": spec.to_dict()} if spec else {}), indent=2))
        else:
            from rooftop.roofline.report import print_prediction, speculative_sentence

            print_prediction(pred, Console(highlight=False))
            if spec:
                typer.echo(speculative_sentence(spec))
                if not config.can_speculate:
                    typer.echo(
                        "rooftop's engine does not run speculative decoding on this hybrid model (its linear-attention "
                        "layers' recurrent state cannot be rolled back past rejected drafts): the prediction is an "
                        "engine's that can"
                    )
        if plot:
            from rooftop.roofline.plot import plot_roofline

            err.print(f"roofline chart written to {plot_roofline(pred, plot)}")


def explain(
    model: ModelArg = None,
    hardware: HardwareArg = None,
    prompt: PromptArg = 1024,
    output: Annotated[int, typer.Option("--output", "-n", help="output tokens")] = 256,
    weights: Annotated[str | None, typer.Option(help=WEIGHTS_HELP)] = None,
    kv: KvArg = None,
    tp: TpArg = 1,
    peak_tflops: PeakArg = None,
    bandwidth_tbs: BandwidthArg = None,
    memory_gb: MemoryArg = None,
    interconnect_gbs: InterconnectArg = None,
    gpu_memory_utilization: UtilizationArg = DEFAULT_GPU_MEMORY_UTILIZATION,
    state_dtype: StateDtypeArg = DEFAULT_STATE_DTYPE,
) -> None:
    """The two phases in plain words, with this model's numbers (one sequence, which must fit, as in roofline)."""
    with user_errors():
        custom = (peak_tflops, bandwidth_tbs, memory_gb, interconnect_gbs)
        config, hw, p = _resolve(model, hardware, weights, kv, state_dtype, custom, tp=tp)
        pred = analyze(config, hw, p, prompt, output, 1, tp, gpu_memory_utilization=gpu_memory_utilization)
        typer.echo(explain_text(pred, config, p))


def probe(
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="measure again even if cached; each roof stays the fastest this machine has shown"
        ),
    ] = False,
    reset: Annotated[
        bool,
        typer.Option("--reset", help="measure again and forget the roofs earlier probes set (after a hardware change)"),
    ] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json")] = False,
    tensor_parallel_size: Annotated[
        int,
        typer.Option(
            "--tensor-parallel-size",
            "-tp",
            help="measure as one rank of a tensor-parallel group of this many (rooftop starts it, or torchrun did): "
            "the roofs with this rank's share of the threads, and the group's all-reduce over message sizes",
        ),
    ] = 1,
    distributed_timeout: Annotated[
        float, typer.Option("--distributed-timeout", help="seconds a rank waits on the others")
    ] = 60.0,
) -> None:
    """Measure this machine's roofs (matmul FLOP/s, memory bandwidth) and cache them; in a tensor-parallel group
    also the latency and bandwidth of its all-reduce. Measured again, each roof is the fastest of every probe."""
    from rooftop.roofline.probe import ALL_REDUCE_STEP, STEPS
    from rooftop.roofline.report import seconds, si

    with user_errors():
        run = RunConfig(
            device=device, tensor_parallel_size=tensor_parallel_size, distributed_timeout_s=distributed_timeout
        )
        with group_for_probe(run) as lead, Progress(console=err, transient=True) as progress:
            steps = [*STEPS, ALL_REDUCE_STEP] if lead is not None else list(STEPS)
            task = progress.add_task("probing", total=len(steps))

            measured = []  # a step reported: measured now, not read from the cache

            def on_step(what: str) -> None:
                measured.append(what)
                progress.update(task, description=what, completed=steps.index(what) if what in steps else None)

            result = load_or_run_probe(device=device, force=force, on_step=on_step, collectives=lead, reset=reset)
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
            return
        for key, value in result.to_dict().items():
            if isinstance(value, float) and key.endswith("_per_s"):
                unit = "B/s" if "bytes" in key else "FLOP/s"
                typer.echo(f"{key:40s} {si(value, unit)}")
            elif key == "all_reduce_latency_s" and value is not None:
                typer.echo(f"{key:40s} {seconds(value)}")
            elif key == "all_reduce_seconds" and value:
                by_size = ", ".join(f"{int(n) >> 10} KiB {seconds(t)}" for n, t in value.items())
                typer.echo(f"{key:40s} {by_size}")
            elif not isinstance(value, dict) and value not in (None, ""):
                typer.echo(f"{key:40s} {value}")
        for note in ("peaks", OBSERVED):
            if note in result.notes:
                typer.echo(f"{note:40s} {result.notes[note]}")
        path = cache_path(device, result.tensor_parallel)
        if force or reset or measured:
            err.print(f"[dim]measured now, cached in {path}[/]")
        else:
            err.print(f"[dim]read from the cache ({result.date}; `rooftop probe --force` measures again): {path}[/]")


@contextlib.contextmanager
def group_for_probe(run: RunConfig) -> Iterator[Lead | None]:
    """The tensor-parallel group the probe runs in (None: alone): rank 0 leads it for the measurement; under
    torchrun a process of another rank serves rank 0's all-reduces, then exits."""
    if run.tensor_parallel_size == 1:
        yield None
        return
    launch = launch_of(run)
    if launch.rank != 0:
        raise typer.Exit(serve_rank(run, launch, with_model=False))
    torch.set_num_threads(rank_threads(run, launch, available_cores()))
    lead, _ = lead_group(run, launch, rank_device(run.device, launch), None)
    try:
        yield lead
    finally:
        lead.close()
