"""This machine's roofs (matmul FLOP/s per dtype, memory bandwidth), measured with torch and cached as JSON.

Every roof is a peak: the fastest of its timed repetitions, so that a bound built from the roofs is never above a
time the engine measures. The int8/int4 weight-only peaks time the engine's own linears, which the analyzer never
builds, the read bandwidth is the faster of PyTorch's `sum` and the engine's own streaming read (its kernels ask
for memory ahead, and read faster than `sum` on some hosts), and the CPU's float32 peak the faster of `torch.mm` and
the engine's float32 linears: an `EngineTimer` given by the caller measures the engine's part (rooftop.engine.probe,
the probe `rooftop probe` and the engine's commands run).
Under tensor parallelism a `CollectiveTimer` times the group's all-reduce over message sizes: its latency and
bandwidth are the interconnect roof of the op model's collectives.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch

from rooftop.config import auto_dtype
from rooftop.errors import InvalidRequestError
from rooftop.roofline.hardware import GIGA, Hardware
from rooftop.roofline.precision import FLOAT_DTYPES, auto_formats
from rooftop.roofline.report import si

# The descriptions passed to `on_step`, in order, one per measurement; a progress bar's total is their count.
STEPS = (
    "fp32 matmul",
    "bf16 matmul",
    "int8 weight-only matmul",
    "int4 weight-only matmul",
    "copy bandwidth",
    "read bandwidth",
)
ALL_REDUCE_STEP = "all-reduce"  # one more, in a tensor-parallel group
# How the roofs are measured: 1, the median repetition and PyTorch's sum for the read; 2, the fastest repetition
# (peaks) and the faster of the sum and the engine's own read; 3, the CPU's weight-only kernels up to 512 rows; 4, the
# float32 roof the faster of `torch.mm` and the engine's float32 linears (oneDNN's matmul on AMD CPUs); 5, the engine's
# read the faster of one and two streams per thread (a decode's one-row linears read two).
PROCEDURE = 5
MIB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """Sizes and repetitions of one probe. Ladders climb while the next size's calls would take under `cap_s` each."""

    matmul_sizes: tuple[int, ...]
    weight_only_rows: tuple[int, ...]  # M, the activation rows, of M x K @ (N x K)^T
    weight_only_k: int
    weight_only_n: int
    copy_bytes: int
    read_bytes: int  # the DRAM read: far past any cache
    read_ladder: tuple[int, ...]  # smaller reads, for working sets that (partly) stay in a cache; from 16 MiB, as
    # below it a call's fixed cost, not the bytes, sets the rate (a 4 MiB sum read "28 GB/s" where 16 MiB read 169)
    reps: int
    cap_s: float
    min_rep_s: float  # short calls are looped within one timed repetition so the clock's resolution does not matter
    all_reduce_bytes: tuple[int, ...] = (1 << 10, 16 << 10, 256 << 10, 4 * MIB)  # a decode step's is a few KiB


_PLANS = {
    # weight-only kernels: the row counts rooftop runs them at on CPU, decode's and (where the host does not widen
    # prefill chunks to bfloat16) prefill's; the kernels' rate is not monotone in M: 32 rows can beat both 16 and 64
    "cpu": Plan(
        (256, 512, 1024, 2048, 4096),
        (16, 32, 64, 128, 256, 512),
        4096,
        4096,
        512 * MIB,
        1024 * MIB,
        (16 * MIB, 64 * MIB, 256 * MIB),
        5,
        1.0,
        0.02,
    ),
    # weight-only kernels: decode's row counts (a chunk of WIDEN_ROWS or more widens to cuBLAS), on a matrix
    # several times the H100/H200's 50-60 MB L2 so that repeated calls stream it from HBM
    "cuda": Plan(
        (1024, 2048, 4096, 8192),
        (1, 16, 64),
        8192,
        32768,
        1024 * MIB,
        2048 * MIB,
        (32 * MIB, 128 * MIB, 512 * MIB),
        7,
        1.0,
        0.02,
        (1 << 10, 16 << 10, 256 << 10, 4 * MIB, 64 * MIB),
    ),
}
# Quick sizes stay large enough that a fixed per-call cost (milliseconds on an oversubscribed VM) does not dominate.
_QUICK = Plan(
    (256, 512), (16, 32, 64), 1024, 1024, 32 * MIB, 64 * MIB, (16 * MIB,), 3, 0.15, 0.005, (1 << 10, 64 << 10)
)


class EngineTimer(Protocol):
    """Times the engine's own kernels (rooftop.engine.probe.ENGINE_KERNELS): its int8/int4 linears for the
    weight-only peaks, its float32 linears beside `torch.mm` for the float32 peak, and its streaming read for the
    read bandwidth."""

    def kernels(self, device: str) -> str:
        """Whose kernels run them on `device`: "rooftop <version of its sources>" (kernels/cpu.cpp) or "pytorch",
        with " + onednn float32" where its float32 linears run oneDNN's matmul."""
        ...

    def flops(self, kind: str, device: str, plan: Plan) -> tuple[float | None, str]:
        """The best FLOP/s of `kind` ("int8", "int4", "float32") over the plan's row counts, and a note saying how;
        None where it is not timed (float32 off the CPU, where `torch.mm` is what the float32 linears run)."""
        ...

    def formats(self, device: str) -> dict[str, str]:
        """The format each weight policy ("float", "int8", "int4") runs in on `device` (the analyzer's names)."""
        ...

    def read_bandwidth(self, size: int, device: str, plan: Plan) -> float | None:
        """Bytes per second of the engine's own read of `size` bytes, or None where it has none on `device`."""
        ...


class CollectiveTimer(Protocol):
    """Times the all-reduce of the tensor-parallel group the probe runs in (rooftop.engine.distributed)."""

    ranks: int

    def group(self) -> str:
        """The group, for the cache: its backend and ranks, e.g. "gloo x3"."""
        ...

    def all_reduce_seconds(self, sizes: tuple[int, ...], device: str, plan: Plan) -> dict[int, float]:
        """Median seconds of one all-reduce of each size in bytes, every rank taking part."""
        ...


@dataclass
class ProbeResult:
    """Measured roofs (each the fastest of repeated runs after warm-up, and of every probe since `first_date`) and
    what they were measured on."""

    device: str
    device_name: str  # the CPU model, or the GPU's name on CUDA
    cpu_model: str
    cpu_signature: str  # family/model and the SIMD level torch dispatches to: hosts share names like "AMD EPYC"
    cpu_count: int
    torch_threads: int
    torch_version: str
    cuda_device: str | None
    weight_only_kernels: (
        str  # whose kernels were timed (int8/int4 linears, read; "+ onednn float32" where float32 linears run it):
        # "rooftop <version>" (kernels/), "pytorch" or "none"
    )
    memory_bytes: int
    fp32_flops: float
    bf16_flops: float
    int8_weight_only_flops: float | None
    int4_weight_only_flops: float | None
    copy_bandwidth: float  # bytes read + bytes written, per second
    read_bandwidth: float  # bytes read per second
    date: str
    duration_s: float
    quick: bool
    notes: dict[str, str] = field(default_factory=dict)
    engine_formats: dict[str, str] = field(default_factory=dict)  # policy -> format, as the timed linears report
    # bytes read -> bytes/s, the DRAM read's size included: what a working set of that size streams at
    read_by_size: dict[int, float] = field(default_factory=dict)
    # the tensor-parallel group measured ("gloo x3"; "" for a probe run alone) and its all-reduce: bytes -> seconds,
    # the latency of a small one and the bandwidth of the bytes a ring moves per rank, 2(n-1)/n of the message
    tensor_parallel: str = ""
    all_reduce_seconds: dict[int, float] = field(default_factory=dict)
    all_reduce_latency_s: float | None = None
    all_reduce_bandwidth: float | None = None
    procedure: int = 1  # how the roofs were measured (PROCEDURE); a cache from an older procedure is measured again
    probes: int = 1  # how many probes of this machine each roof is the fastest of (`keep_peaks`)
    first_date: str = ""  # the first of them ("": this one alone)

    def read_bandwidth_at(self, working_set: float) -> float:
        """The read bandwidth of a working set of `working_set` bytes: interpolated (in log size) between the sizes
        read, the smallest's below them, the DRAM read's past them. A model whose weights stay partly in a cache
        (the bundled 97 MB in a server CPU's 260 MiB L3) reads faster than DRAM, and its roof must say so."""
        if not self.read_by_size:
            return self.read_bandwidth
        points = sorted(self.read_by_size.items())
        if working_set <= points[0][0]:
            return points[0][1]
        for (s0, b0), (s1, b1) in zip(points, points[1:], strict=False):
            if working_set <= s1:
                t = math.log(working_set / s0) / math.log(s1 / s0)
                return b0 + t * (b1 - b0)
        return self.read_bandwidth

    def to_hardware(self, working_set: float | None = None) -> Hardware:
        """A `Hardware` with the measured roofs; decode streams weights, so the memory roof is the read bandwidth,
        of the `working_set` (bytes a step reads: the model's weights) where given, else of DRAM."""
        threads = f", {self.torch_threads} threads" if self.device == "cpu" else ""
        notes = dict(self.notes)
        # The weight-only kernels dequantize and multiply in bf16: their measured rates are the compute roofs of
        # the int8/int4 weight formats ("*_weight_only"), never an "int8" (integer tensor core) peak.
        peaks = {"fp32": self.fp32_flops, "bf16": self.bf16_flops}
        for key, value in (
            ("int8_weight_only", self.int8_weight_only_flops),
            ("int4_weight_only", self.int4_weight_only_flops),
        ):
            if value is not None:
                peaks[key] = value
        if self.copy_bandwidth is not None:
            notes["copy_bandwidth"] = f"{self.copy_bandwidth / GIGA:.1f} GB/s"
        bandwidth = self.read_bandwidth if working_set is None else self.read_bandwidth_at(working_set)
        if working_set is not None:
            notes["read_bandwidth"] = (
                f"{bandwidth / GIGA:.1f} GB/s reading a {working_set / 1e6:.0f} MB working set "
                f"(DRAM: {self.read_bandwidth / GIGA:.1f} GB/s)"
            )
        group = f", one of {self.tensor_parallel} ranks" if self.tensor_parallel else ""
        return Hardware(
            name=f"this machine ({self.device_name}{threads}{group})",
            peak_flops=peaks,
            memory_bandwidth=bandwidth,
            memory_bytes=self.memory_bytes,
            interconnect_bandwidth=self.all_reduce_bandwidth,
            collective_latency_s=self.all_reduce_latency_s,
            source=f"rooftop probe {self.date}",
            notes=notes,
            engine_formats=dict(self.engine_formats),
            engine_auto=auto_formats(self.engine_formats.get("float"), self.runs_cpu_kernels),
            engine_dtype=FLOAT_DTYPES[auto_dtype(torch.device(self.device).type)],
            engine_device=torch.device(self.device).type,
            working_set=working_set,
        )

    @property
    def runs_cpu_kernels(self) -> bool:
        """Whether the engine's linears were timed on rooftop's CPU kernels: the engine's probe names them where it
        builds them (rooftop.engine.probe's `kernels`: on the CPU where they loaded), which is where the engine holds
        a bf16 checkpoint's linears as bf16-fp32 (quant.linear.runs_bf16)."""
        return self.device == "cpu" and self.weight_only_kernels.startswith("rooftop ")

    def to_dict(self) -> dict:
        data = asdict(self)
        for name, key in _SI_KEYS.items():
            data[key] = data.pop(name)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ProbeResult:
        """The inverse of `to_dict`; raises KeyError, TypeError or ValueError on a malformed dict."""
        # a cache written before rooftop read several sizes: DRAM for every size; one without a group: measured alone
        optional = {"read_by_size", "tensor_parallel", "all_reduce_seconds", "all_reduce_latency_s"}
        optional |= {"all_reduce_bandwidth", "procedure", "probes", "first_date"}
        values = {name: data[_SI_KEYS.get(name, name)] for name in cls.__dataclass_fields__ if name not in optional}
        values["read_by_size"] = {int(size): float(bw) for size, bw in (data.get("read_by_size") or {}).items()}
        values["tensor_parallel"] = str(data.get("tensor_parallel") or "")
        values["procedure"] = int(data.get("procedure") or 1)
        values["probes"] = int(data.get("probes") or 1)
        values["first_date"] = str(data.get("first_date") or "")
        values["all_reduce_seconds"] = {int(n): float(t) for n, t in (data.get("all_reduce_seconds") or {}).items()}
        for name in ("all_reduce_latency_s", "all_reduce_bandwidth"):
            key = _SI_KEYS.get(name, name)
            values[name] = None if data.get(key) is None else float(data[key])
        for name in ("fp32_flops", "bf16_flops", "copy_bandwidth", "read_bandwidth", "duration_s"):
            values[name] = float(values[name])
        for name in ("int8_weight_only_flops", "int4_weight_only_flops"):
            values[name] = None if values[name] is None else float(values[name])
        for name in ("cpu_count", "torch_threads", "memory_bytes"):
            values[name] = int(values[name])
        for name in ("notes", "engine_formats"):
            if not isinstance(values[name], dict):
                raise TypeError(f"{name} must be a dict, got {type(values[name]).__name__}")
        return cls(**values)


_SI_KEYS = {
    "fp32_flops": "fp32_matmul_flops_per_s",
    "bf16_flops": "bf16_matmul_flops_per_s",
    "int8_weight_only_flops": "int8_weight_only_matmul_flops_per_s",
    "int4_weight_only_flops": "int4_weight_only_matmul_flops_per_s",
    "copy_bandwidth": "copy_bandwidth_bytes_per_s",
    "read_bandwidth": "read_bandwidth_bytes_per_s",
    "all_reduce_bandwidth": "all_reduce_bandwidth_bytes_per_s",
}


def run_probe(
    device: str = "cpu",
    quick: bool = False,
    on_step: Callable[[str], None] | None = None,
    engine: EngineTimer | None = None,
    collectives: CollectiveTimer | None = None,
) -> ProbeResult:
    """Measure every roof of `device` ("cpu" or "cuda[:i]"); `quick` uses tiny sizes (about a second, for tests).
    The weight-only peaks are measured only by `engine` (the engine's linears), else left out, as is its read; the
    all-reduce only by `collectives` (a tensor-parallel group's)."""
    device = _probe_device(device)
    plan = _QUICK if quick else _PLANS[torch.device(device).type]
    step = on_step or (lambda description: None)
    start = time.perf_counter()
    notes: dict[str, str] = {}
    machine = identity(device, engine, collectives)
    if engine is None:
        engine = _NotTimed()

    step(STEPS[0])
    fp32, notes["fp32_matmul"] = _matmul_flops(torch.float32, device, plan)
    linears, how = engine.flops("float32", device, plan)
    if linears is not None and linears > fp32:  # a roof below what the engine's linears reach makes no bound
        fp32, notes["fp32_matmul"] = linears, f"{how}; torch.mm's best {fp32 / GIGA:.0f} GFLOP/s"
    if device != "cpu" and torch.backends.cuda.matmul.allow_tf32:
        notes["fp32_matmul"] += "; TF32 was allowed, so this is a TF32 rate"
    step(STEPS[1])
    bf16, notes["bf16_matmul"] = _matmul_flops(torch.bfloat16, device, plan)
    step(STEPS[2])
    int8, notes["int8_weight_only"] = engine.flops("int8", device, plan)
    step(STEPS[3])
    int4, notes["int4_weight_only"] = engine.flops("int4", device, plan)
    step(STEPS[4])
    copy = _copy_bandwidth(device, plan)
    notes["copy_bandwidth"] = f"copy of {plan.copy_bytes // MIB} MiB, read + write bytes counted"
    step(STEPS[5])
    sizes = (*plan.read_ladder, plan.read_bytes)
    by_sum = {size: _read_bandwidth(device, size, plan) for size in sizes}
    by_engine = {size: engine.read_bandwidth(size, device, plan) for size in sizes}
    read_by_size = {size: max(by_sum[size], by_engine[size] or 0.0) for size in sizes}
    read = read_by_size[plan.read_bytes]
    notes["read_bandwidth"] = (
        f"{plan.read_bytes // MIB} MiB, the faster of PyTorch's sum of float32 and the engine's streaming read; "
        + ", ".join(_read_note(size, by_sum[size], by_engine[size]) for size in sizes)
    )

    communication = {}
    if collectives is not None:
        step(ALL_REDUCE_STEP)
        communication = _all_reduce(collectives, device, plan)
        notes["all_reduce"] = (
            f"{collectives.group()}: "
            + ", ".join(f"{n >> 10} KiB {t * 1e6:.0f} us" for n, t in communication["all_reduce_seconds"].items())
            + "; latency the smallest's time, bandwidth 2(n-1)/n of the message per rank over the time beyond it"
        )

    memory = _total_ram_bytes() if device == "cpu" else torch.cuda.get_device_properties(device).total_memory
    return ProbeResult(
        **{"weight_only_kernels": "none", **machine},
        memory_bytes=memory,
        fp32_flops=fp32,
        bf16_flops=bf16,
        int8_weight_only_flops=int8,
        int4_weight_only_flops=int4,
        copy_bandwidth=copy,
        read_bandwidth=read,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        duration_s=time.perf_counter() - start,
        quick=quick,
        notes=notes,
        engine_formats=engine.formats(device),
        read_by_size=read_by_size,
        **communication,
    )


def _all_reduce(collectives: CollectiveTimer, device: str, plan: Plan) -> dict:
    """The group's all-reduce times by size, and the latency and bandwidth of the line through them: the smallest
    message's time is the latency; the bytes a ring moves per rank, 2(n-1)/n of each message, over the time the
    largest took beyond the smallest's, the bandwidth."""
    times = collectives.all_reduce_seconds(plan.all_reduce_bytes, device, plan)
    ring = 2 * (collectives.ranks - 1) / collectives.ranks
    (small, latency), (large, longest) = min(times.items()), max(times.items())
    beyond = longest - latency
    bandwidth = ring * (large - small) / beyond if beyond > 0 else ring * large / longest
    return {
        "all_reduce_seconds": times,
        "all_reduce_latency_s": latency,
        "all_reduce_bandwidth": bandwidth,
    }


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or `taskset`'s limit, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cache_path(device: str = "cpu", tensor_parallel: str = "") -> Path:
    """`$ROOFTOP_CACHE_DIR/probe-<device>.json` (a tensor-parallel group's, whatever its threads:
    `probe-<device>-<group>.json`; a CPU probe on fewer or more threads than the process's cores, as `rooftop bench -t
    1,2` runs: `probe-cpu-t<threads>.json`, so that each thread count keeps its roofs), else under
    `$XDG_CACHE_HOME/rooftop`, else `~/.cache/rooftop`."""
    if os.environ.get("ROOFTOP_CACHE_DIR"):
        directory = Path(os.environ["ROOFTOP_CACHE_DIR"])
    elif os.environ.get("XDG_CACHE_HOME"):
        directory = Path(os.environ["XDG_CACHE_HOME"]) / "rooftop"
    else:
        directory = Path.home() / ".cache" / "rooftop"
    threads = torch.get_num_threads()
    if tensor_parallel:
        suffix = f"-{tensor_parallel.replace(' ', '-')}"
    else:
        suffix = "" if device != "cpu" or threads == available_cores() else f"-t{threads}"
    return directory / f"probe-{device.replace(':', '-')}{suffix}.json"


def load_or_run_probe(
    device: str = "cpu",
    force: bool = False,
    quick: bool = False,
    on_step: Callable[[str], None] | None = None,
    engine: EngineTimer | None = None,
    collectives: CollectiveTimer | None = None,
    reset: bool = False,
) -> ProbeResult:
    """The cached probe of `device` (and of the tensor-parallel group `collectives` times) if measured here, with
    this torch, at least as thoroughly; else measure anew. Without `engine` (the analyzer) a cached probe is
    taken whichever kernels it timed. A new measurement keeps the cached probe's faster roofs (`keep_peaks`) where
    both are of this machine and equally thorough, unless `reset`."""
    device = _probe_device(device)
    path = cache_path(device, collectives.group() if collectives is not None else "")
    if not force and not reset:
        cached = read_cache(path)
        machine = identity(device, engine, collectives)
        if cached is not None and matches(cached, machine) and (quick or not cached.quick):
            return cached
    result = run_probe(device, quick=quick, on_step=on_step, engine=engine, collectives=collectives)
    cached = None if reset else read_cache(path)
    # the same machine, measured as thoroughly by the same kernels (the analyzer's probe times none: it keeps none
    # of the engine's)
    same = {**identity(device, engine, collectives), "weight_only_kernels": result.weight_only_kernels}
    if cached is not None and matches(cached, same) and cached.quick == quick:
        result = keep_peaks(cached, result)
    return write_cache(path, result)


def write_cache(path: Path, result: ProbeResult) -> ProbeResult:
    """Write `result` to `path` (whole or not at all); where it cannot be written, its notes say so."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        tmp.replace(path)
    except OSError as error:
        result.notes["cache"] = f"not written to {path}: {error}"
    return result


OBSERVED = "observed_reads"  # the notes' key naming every read `with_observed_read` raised


def with_observed_read(result: ProbeResult, size: float, bytes_per_s: float, what: str) -> ProbeResult:
    """`result` with its read of a `size`-byte working set raised to `bytes_per_s`, a rate the engine was measured
    moving (`what`: whose steps, when). A roof is the most the hardware has shown, and a decode that streamed its
    weights faster than every probe read showed more: a probe run in a shared host's slow minute (36 GB/s, where the
    next minute's decode read 66) would otherwise keep the bound above the steps of every fast minute until probed
    again. A working set at least the DRAM read's size raises the DRAM read; a smaller one gets a point of its own
    on the ladder. The rate only rises: a slower one returns `result` unchanged."""
    if bytes_per_s <= result.read_bandwidth_at(size):
        return result
    dram = max(result.read_by_size, default=None)  # a cache from before the ladder has none: DRAM's read alone
    if dram is None or size >= dram:
        read, read_by_size = bytes_per_s, {**result.read_by_size, **({} if dram is None else {dram: bytes_per_s})}
    else:
        read, read_by_size = result.read_bandwidth, {**result.read_by_size, int(size): bytes_per_s}
    notes = dict(result.notes)
    probed = si(result.read_bandwidth_at(size), "B/s")
    seen = f"read of {size / 1e6:.0f} MB {si(bytes_per_s, 'B/s')} moved by {what} (the probes: {probed})"
    notes[OBSERVED] = "; ".join(filter(None, (notes.get(OBSERVED), seen)))
    return replace(result, read_by_size=read_by_size, read_bandwidth=read, notes=notes)


def keep_peaks(before: ProbeResult, now: ProbeResult) -> ProbeResult:
    """`now` with each roof the faster of its own and `before`'s (two probes of one machine): a roof is the most the
    hardware has shown. A shared host's memory read 42 GB/s in one minute and 74 GB/s twelve minutes later
    (docs/PERFORMANCE.md); a roof measured in the slow minute put the bound above steps that ran in a fast one.
    The read at each size and the all-reduce's times keep their fastest too. The notes name every figure an
    earlier probe set, with this probe's own; the other notes describe this probe's measurement."""
    peaks = {name: _faster(getattr(before, name), getattr(now, name)) for name in PEAK_ROOFS}
    read_by_size = {
        size: max(before.read_by_size.get(size, 0.0), now.read_by_size.get(size, 0.0))
        for size in {*before.read_by_size, *now.read_by_size}
    }
    all_reduce_seconds = {
        n: min(before.all_reduce_seconds.get(n, math.inf), now.all_reduce_seconds.get(n, math.inf))
        for n in {*before.all_reduce_seconds, *now.all_reduce_seconds}
    }
    latency = [t for t in (before.all_reduce_latency_s, now.all_reduce_latency_s) if t is not None]
    kept = [
        f"{name} {_roof_text(name, peaks[name])} (this probe {_roof_text(name, getattr(now, name))})"
        for name in PEAK_ROOFS
        if peaks[name] is not None and peaks[name] != getattr(now, name)
    ]
    dram = max(read_by_size, default=None)  # its read is read_bandwidth's, named above
    kept += [
        f"read of {size >> 20} MiB {si(bw, 'B/s')} (this probe {si(now.read_by_size.get(size), 'B/s')})"
        for size, bw in sorted(read_by_size.items())
        if size != dram and bw != now.read_by_size.get(size)
    ]
    kept += [
        f"all-reduce of {n >> 10} KiB {t * 1e6:.0f} us (this probe {now.all_reduce_seconds[n] * 1e6:.0f} us)"
        if n in now.all_reduce_seconds
        else f"all-reduce of {n >> 10} KiB {t * 1e6:.0f} us (this probe did not time it)"
        for n, t in sorted(all_reduce_seconds.items())
        if t != now.all_reduce_seconds.get(n)
    ]
    if latency and min(latency) != now.all_reduce_latency_s:
        own = "none" if now.all_reduce_latency_s is None else f"{now.all_reduce_latency_s * 1e6:.0f} us"
        kept.append(f"all-reduce latency {min(latency) * 1e6:.0f} us (this probe {own})")
    probes = before.probes + now.probes
    first = before.first_date or before.date
    notes = dict(now.notes)
    if OBSERVED in before.notes:  # reads the engine was measured moving, which `read_by_size` keeps
        notes[OBSERVED] = before.notes[OBSERVED]
    notes["peaks"] = f"each roof the fastest of {probes} probes since {first}" + (
        "; from earlier probes: " + ", ".join(kept) if kept else "; this probe set every one"
    )
    return replace(
        now,
        **peaks,
        read_by_size=read_by_size,
        all_reduce_seconds=all_reduce_seconds,
        all_reduce_latency_s=min(latency) if latency else None,
        notes=notes,
        probes=probes,
        first_date=first,
    )


# The roofs `keep_peaks` takes the larger of: rates, where faster is more.
PEAK_ROOFS = (
    "fp32_flops",
    "bf16_flops",
    "int8_weight_only_flops",
    "int4_weight_only_flops",
    "copy_bandwidth",
    "read_bandwidth",
    "all_reduce_bandwidth",
)


def _faster(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _roof_text(name: str, value: float) -> str:
    return si(value, "B/s" if "bandwidth" in name else "FLOP/s")


def read_cache(path: Path) -> ProbeResult | None:
    """A cached probe, or None where there is none or it does not parse."""
    try:
        return ProbeResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def matches(cached: ProbeResult, identity: dict) -> bool:
    """Whether `cached` was measured on the machine, torch and kernels `identity` (`identity()`'s dict) names."""
    return all(getattr(cached, name) == value for name, value in identity.items())


def checked_device(device: str) -> torch.device:
    """`device` parsed, if rooftop can run on it here: the CPU, or a GPU this PyTorch build sees. The engine and the
    probe both refuse anything else with one line."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise InvalidRequestError(f"device must be cpu, cuda or cuda:N; got {device!r}", "device")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        why = "was built without CUDA" if torch.version.cuda is None else "sees no GPU"
        raise InvalidRequestError(f"device {device}: this PyTorch ({torch.__version__}) {why}", "device")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise InvalidRequestError(
            f"device {device}: this host has {count} GPU(s) visible (cuda:0 .. cuda:{count - 1})", "device"
        )
    return parsed


def _probe_device(device: str) -> str:
    """The probe's name for a checked device: "cpu", or "cuda:<i>" as given."""
    parsed = checked_device(device)
    return "cpu" if parsed.type == "cpu" else str(parsed)


def identity(device: str, engine: EngineTimer | None, collectives: CollectiveTimer | None = None) -> dict:
    """What the roofs depend on besides the hardware's mood: a cached probe is reused only if all of it is unchanged
    (whose weight-only kernels it timed is left out when no timer is given), the tensor-parallel group included."""
    cpu_model, cpu_signature = _cpu_description()
    cuda_device = torch.cuda.get_device_name(device if device != "cpu" else None) if torch.cuda.is_available() else None
    return {
        "device": device,
        "device_name": cpu_model if device == "cpu" else cuda_device,
        "cpu_model": cpu_model,
        "cpu_signature": cpu_signature,
        "cpu_count": os.cpu_count() or 1,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_device": cuda_device,
        "tensor_parallel": "" if collectives is None else collectives.group(),
        "procedure": PROCEDURE,
        **({} if engine is None else {"weight_only_kernels": engine.kernels(device)}),
    }


def _cpu_description() -> tuple[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = info.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    parts = [f"family {info['cpu family']} model {info['model']}"] if "cpu family" in info and "model" in info else []
    parts.append(torch.backends.cpu.get_cpu_capability())
    return model, ", ".join(parts)


def _total_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def best_seconds(call: Callable[[], object], device: str, plan: Plan) -> float:
    """Seconds per call of the fastest of `plan.reps` timed repetitions, after two untimed warm-up calls: a roof is
    what the hardware can do, and on a shared host the slower repetitions measure the neighbours. On CUDA each
    repetition is timed by CUDA events around its calls (the device's own clock, no host gap at either end)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device != "cpu" else (lambda: None)
    call()
    sync()
    start = time.perf_counter()
    call()
    sync()
    number = max(1, round(plan.min_rep_s / max(time.perf_counter() - start, 1e-9)))
    times = []
    for _ in range(plan.reps):
        sync()
        if device != "cpu":
            began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream(device)
            began.record(stream)
            for _ in range(number):
                call()
            ended.record(stream)
            ended.synchronize()
            times.append(began.elapsed_time(ended) / 1e3 / number)
            continue
        start = time.perf_counter()
        for _ in range(number):
            call()
        sync()
        times.append((time.perf_counter() - start) / number)
    return min(times)


def best_on_ladder(
    sizes: tuple[int, ...], work: Callable[[int], float], measure: Callable[[int], float], cap_s: float
) -> tuple[float, int]:
    """The best rate (work per second) over `sizes`, ascending; stops before a size whose calls would exceed `cap_s`."""
    best, best_size = 0.0, sizes[0]
    points: list[tuple[float, float]] = []  # (work, seconds) of each size measured
    for size in sizes:
        if points and _predict_seconds(points, work(size)) > cap_s:
            break
        seconds = measure(size)
        points.append((work(size), seconds))
        if work(size) / seconds > best:
            best, best_size = work(size) / seconds, size
    return best, best_size


def _predict_seconds(points: list[tuple[float, float]], work: float) -> float:
    """Seconds a call of `work` would take: by the marginal cost between the last two sizes, so a fixed per-call cost
    (a thread wake-up, a kernel launch) does not stop the climb early; by proportion from one size."""
    w1, t1 = points[-1]
    if len(points) > 1:
        w0, t0 = points[-2]
        if t1 > t0:
            return t1 + (t1 - t0) / (w1 - w0) * (work - w1)
    return t1 * work / w1


def _matmul_flops(dtype: torch.dtype, device: str, plan: Plan) -> tuple[float, str]:
    def measure(n: int) -> float:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        return best_seconds(lambda: torch.mm(a, b), device, plan)

    flops, n = best_on_ladder(plan.matmul_sizes, lambda n: 2.0 * n**3, measure, plan.cap_s)
    return flops, f"{n}x{n} @ {n}x{n}, the best of the sizes tried"


class _NotTimed:
    """The analyzer's own probe: it builds none of the engine's kernels, so it leaves their peaks and read out."""

    def flops(self, kind: str, device: str, plan: Plan) -> tuple[float | None, str]:
        return None, "not measured: the engine's probe (`rooftop probe`) times its own linears"

    def formats(self, device: str) -> dict[str, str]:
        return {}

    def read_bandwidth(self, size: int, device: str, plan: Plan) -> float | None:
        return None


def _copy_bandwidth(device: str, plan: Plan) -> float:
    source = torch.empty(plan.copy_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), device, plan)
    return 2 * source.nbytes / seconds


def _read_note(size: int, by_sum: float, by_engine: float | None) -> str:
    engine = "" if by_engine is None else f", engine {by_engine / GIGA:.1f}"
    return f"{size // MIB} MiB: sum {by_sum / GIGA:.1f}{engine} GB/s"


def _read_bandwidth(device: str, size: int, plan: Plan) -> float:
    # fill_ touches every page: an untouched allocation reads back the kernel's shared zero page, from cache.
    data = torch.empty(size // 4, dtype=torch.float32, device=device).fill_(1.0)
    seconds = best_seconds(lambda: data.sum(), device, plan)
    return data.nbytes / seconds
