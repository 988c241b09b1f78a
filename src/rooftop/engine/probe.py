"""The probe as the engine needs it: this machine's roofs (rooftop.roofline.probe) with the int8/int4 weight-only
peaks timed on the linears the engine builds (make_linear: rooftop's kernels where they exist, else PyTorch's), the
CPU's float32 peak also on its float32 linears, and the read bandwidth as rooftop's kernels stream their weights
where they are built."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rooftop.config import auto_dtype
from rooftop.kernels import cpu, pages
from rooftop.quant import cuda_linear
from rooftop.quant.linear import linear_format, make_linear, packs_float32
from rooftop.quant.weights import GROUP
from rooftop.roofline import probe
from rooftop.roofline.precision import WEIGHT_POLICIES
from rooftop.roofline.probe import CollectiveTimer, Plan, ProbeResult, best_on_ladder, best_seconds
from rooftop.roofline.report import si

if TYPE_CHECKING:
    from rooftop.engine.llm import LLM


class EngineKernels:
    """The int8/int4 linears (and on the CPU the float32 ones) exactly as the engine builds and calls them, on float32
    activations at the row counts the engine runs them at (the probe plan's ladder); and the read of rooftop's CPU
    kernels (one or two streams per thread, fetching ahead)."""

    def kernels(self, device: str) -> str:
        """Whose kernels, and for rooftop's which build of them: a probe taken before they changed is stale."""
        if device != "cpu":
            return f"pytorch tinygemm + rooftop triton {cuda_linear.sources_version()}"
        kernels = f"rooftop {cpu.sources_version()} in {pages.label()}" if cpu.ops() is not None else "pytorch"
        return kernels + (" + onednn float32" if packs_float32() else "")

    def flops(self, kind: str, device: str, plan: Plan) -> tuple[float | None, str]:
        k, n = plan.weight_only_k, plan.weight_only_n
        dtype = getattr(torch, auto_dtype(torch.device(device).type))  # the activations each device's model runs
        if kind == "float32" and device != "cpu":
            return None, "not timed on CUDA: its float32 linears are torch.mm's cuBLAS call"
        try:
            gen = torch.Generator(device=device).manual_seed(0)
            weight = torch.randn(n, k, generator=gen, device=device, dtype=dtype)
            linear = make_linear(weight, None, "float" if kind == "float32" else kind)
            del weight

            def measure(m: int) -> float:
                x = torch.randn(m, k, device=device, dtype=dtype)
                return best_seconds(lambda: linear(x), device, plan)

            flops, m = best_on_ladder(plan.weight_only_rows, lambda m: 2.0 * m * k * n, measure, plan.cap_s)
        except (AttributeError, RuntimeError, NotImplementedError) as error:
            # Builds differ: the op may be absent (AttributeError) or refuse this CPU or dtype (RuntimeError).
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return None, f"unavailable in torch {torch.__version__}: {reason}"
        how = {
            "Q4Linear": f"rooftop's kernel: int4 groups of {GROUP} x int8 activations, integer dots",
            "Q8Linear": f"rooftop's kernel: int8 groups of {GROUP} x int8 activations, integer dots",
            "Int4Linear": f"PyTorch's weight-only op, groups of {GROUP}: bf16 activations, computes in bf16",
            "CudaInt4Linear": f"PyTorch's tinygemm, groups of {GROUP}: bf16 activations and tensor cores",
            "CudaInt8Linear": f"rooftop's Triton kernel, Q8_0 groups of {GROUP}: bf16 activations and tensor cores",
            "FloatLinear": "oneDNN's matmul on weights packed once" if packs_float32() else "F.linear",
        }.get(type(linear).__name__, "PyTorch's weight-only op, one scale per row: bf16 activations, computes in bf16")
        one_row = ""
        if device != "cpu":  # decode's case: one row reads every weight once
            seconds = best_seconds(lambda: linear(torch.randn(1, k, device=device, dtype=dtype)), device, plan)
            one_row = f"; one row reads its {linear.nbytes / 1e6:.0f} MB at {linear.nbytes / seconds / 1e9:.0f} GB/s"
        return flops, f"{type(linear).__name__}, M={m} K={k} N={n} ({how}){one_row}"

    def formats(self, device: str) -> dict[str, str]:
        """The block linears of each policy at the activations the device's model runs (float32 on the CPU,
        bfloat16 on CUDA), as the probe times them."""
        dtype = getattr(torch, auto_dtype(torch.device(device).type))
        return {policy: linear_format(policy, torch.device(device), dtype) for policy in WEIGHT_POLICIES}

    def read_bandwidth(self, size: int, device: str, plan: Plan) -> float | None:
        """Bytes per second of `stream_read` over `size` bytes (kernels/tiles.cpp), the faster of its two patterns:
        one stream per thread, as a prefill's tiles read, and two, as a decode's one-row calls read (on some hosts
        two streams read faster, and a decode would run above a one-stream roof). None off the CPU or without the
        kernels. The buffer is in the pages the tiled weights are (kernels/pages.py); fill_ touches every page first,
        as the probe's sum does."""
        ops = cpu.ops() if device == "cpu" else None
        if ops is None:
            return None
        data = pages.empty(size).fill_(1)
        return max(size / best_seconds(lambda s=s: ops.stream_read(data, s), device, plan) for s in (1, 2))


ENGINE_KERNELS = EngineKernels()


def run_probe(
    device: str = "cpu",
    quick: bool = False,
    on_step: Callable[[str], None] | None = None,
    collectives: CollectiveTimer | None = None,
) -> ProbeResult:
    """Measure every roof of `device`, the engine's weight-only linears included (and, in a tensor-parallel group,
    its all-reduce: `collectives`, the group's Lead)."""
    return probe.run_probe(device, quick=quick, on_step=on_step, engine=ENGINE_KERNELS, collectives=collectives)


def load_or_run_probe(
    device: str = "cpu",
    force: bool = False,
    quick: bool = False,
    on_step: Callable[[str], None] | None = None,
    collectives: CollectiveTimer | None = None,
    reset: bool = False,
) -> ProbeResult:
    """The cached probe of `device` (measured by the engine's kernels as they run here, and the all-reduce of the
    tensor-parallel group `collectives` leads), else measure anew, keeping the cache's faster roofs unless `reset`."""
    return probe.load_or_run_probe(
        device, force=force, quick=quick, on_step=on_step, engine=ENGINE_KERNELS, collectives=collectives, reset=reset
    )


def probe_device(device: torch.device) -> str:
    """The probe's name for the device a model runs on: "cpu", or the GPU ("cuda:0")."""
    return "cpu" if device.type == "cpu" else str(device)


def keep_observed_read(
    device: str, working_set: float, bytes_per_s: float, what: str, collectives: CollectiveTimer | None = None
) -> ProbeResult | None:
    """Raise the cached probe's read of `working_set` bytes to `bytes_per_s` where a run of the engine moved its
    bytes faster than every probe read (`probe.with_observed_read`), for the runs after this one; the probe returned
    where it rose, else None (not faster, or no cached probe of this machine and these kernels to raise)."""
    path = probe.cache_path(device, collectives.group() if collectives is not None else "")
    cached = probe.read_cache(path)
    if cached is None or not probe.matches(cached, probe.identity(device, ENGINE_KERNELS, collectives)):
        return None
    raised = probe.with_observed_read(cached, working_set, bytes_per_s, what)
    return None if raised is cached else probe.write_cache(path, raised)


def keep_decode_read(llm: LLM, bytes_per_s: float) -> str | None:
    """After a run of `llm` whose decode moved `bytes_per_s` (the bytes its bound counts over its measured time, host
    time included: never more than the memory moved; a compute-bound step's is below the read, as its bound is above
    the bytes' time): where that is faster than every probe read a working set of the model's weights, it becomes
    this machine's read there (`keep_observed_read`), and the sentence saying so is returned; else None. This run's
    report keeps the roof it was bound by: raised by its own rate, its bound would be its measured time, which says
    nothing."""
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    what = f"a decode of {Path(llm.model_path).name} in {llm.precision.weights.name}, {when}"
    if keep_observed_read(probe_device(llm.device), llm.weight_bytes, bytes_per_s, what, llm.lead) is None:
        return None
    return (
        f"rooftop now keeps {si(bytes_per_s, 'B/s')} as this machine's read of {llm.weight_bytes / 1e6:.0f} MB, what "
        "this decode moved: later runs are bound by it (`rooftop probe --reset` measures anew)"
    )
