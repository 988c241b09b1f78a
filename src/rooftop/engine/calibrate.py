"""Calibration: the engine's own steps, timed op class by op class, at the model's own shapes, so the analyzer's
expected time of a step (roofline/calibration.py) is what this engine takes on this machine.

Real steps run on the loaded model: decodes at batches from 1 to the engine's limit over two context lengths, and
prompts of several lengths (long ones in their chunks). While they run, every linear, the token-mixing ops and the
elementwise ops are timed where they are called (`OpTimer`), so each class's time is measured inside the step,
with the caches as the step leaves them, not in a loop that keeps one matrix hot. What the forward pass took beyond
the timed ops is its host time (Python, metadata, dispatch); the rest of the step (scheduling, sampling,
detokenizing) is the step record's own. Cached per machine, model, weight format and engine settings.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median

import torch

from rooftop.engine.llm import LLM
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.runner import synchronize
from rooftop.engine.sampling_params import SamplingParams
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError, RooftopError
from rooftop.kernels import cpu, pages
from rooftop.models import delta_net
from rooftop.models.ops import KernelOps
from rooftop.quant import linear as linears
from rooftop.roofline import probe
from rooftop.roofline.calibration import (
    CLASSES,
    KERNEL_CLASSES,
    ROWS_KEYED,
    TOKENS_KEYED,
    Calibration,
    Curve,
    class_roofline,
)
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import COSTING
from rooftop.roofline.predict import time_step

# Every linear class the models build (the `Linear` union): a class left out has its calls counted as host time.
LINEAR_CLASSES = typing.get_args(linears.Linear)
# decode batches and contexts; prompt lengths (each up to the engine's chunk) and one long prompt of about `long`
# tokens in whole chunks (two at least), for its chunks' attention over what the earlier chunks cached, decoded after
# (attention over thousands of cached tokens streams them from memory: carried from the few hundred the caches hold,
# it was not what a long context takes, docs/BENCHMARKS.md); decode steps per run; and
# passes over the whole plan, each point's time the median of its passes: a prefill run is one step, and on a shared
# host one minute's run of a shape can differ from the next by a third (docs/BENCHMARKS.md), so a point is taken at
# three moments spread over the calibration, not three times in a row. A one-token prompt runs the decode kernels,
# reading the weights once where a 16-token one computes sixteen rows: without it, a short prompt was expected at
# the shortest measured prompt's time (docs/BENCHMARKS.md)
FULL = {"batches": (1, 2, 4, 8, 16, 32), "contexts": (32, 256), "prompts": (1, 16, 64, 256, 1024, 2048), "long": 2048, "steps": 6, "passes": 3}  # fmt: skip
QUICK = {"batches": (1, 4), "contexts": (32,), "prompts": (1, 16, 128), "long": 0, "steps": 3, "passes": 1}


class OpTimer:
    """Seconds per op class while installed: the linears' calls (the outermost, where one linear calls its parts),
    the model's attention and elementwise ops, the linear layers' conv and recurrence. On the CPU each timed call is
    clocked as the step is; on CUDA it is bracketed by two CUDA events, no sync between ops (a sync per op would
    add its latency to every op and stall the queue), resolved by `reset`. The timing is not free: about 1-2 us of
    Python per call, half a millisecond in a 4 ms decode step of 242 calls, so it counts the calls it timed
    (`calls`) and the calibration takes its cost back out of the steps' time (`timer_cost_per_call`). A decode step
    run in one call (models/decode_call.py) calls no op from Python: the kernels clock each op there, into the
    classes' seconds, at no cost to take back."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = dict.fromkeys(CLASSES, 0.0)
        self.calls = 0  # timed calls since the last reset
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []  # CUDA: read at reset
        self._depth = 0
        self._thread = threading.get_ident()  # the steps' thread: a tensor-parallel heartbeat is not a step's
        self._one_call = None  # the model's DecodeCall while installed, its clocks in KERNEL_CLASSES' order

    def reset(self) -> tuple[dict[str, float], int]:
        """The seconds per class and the calls timed since the last reset (on CUDA after the device finishes what
        was timed)."""
        if self._events:
            synchronize(self.device)
            for name, began, ended in self._events:
                self.seconds[name] += began.elapsed_time(ended) / 1e3
            self._events.clear()
        if self._one_call is not None and self._one_call.seconds is not None:
            for name, seconds in zip(KERNEL_CLASSES, self._one_call.seconds.tolist(), strict=True):
                self.seconds[name] += seconds
            self._one_call.seconds.zero_()
        taken, calls, self.seconds, self.calls = self.seconds, self.calls, dict.fromkeys(CLASSES, 0.0), 0
        return taken, calls

    def wrap(self, fn: Callable, name: str) -> Callable:
        clock, ident = time.perf_counter, threading.get_ident

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._depth or ident() != self._thread:
                return fn(*args, **kwargs)
            self._depth += 1
            self.calls += 1
            if self.device.type == "cuda":
                began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                began.record()
                try:
                    return fn(*args, **kwargs)
                finally:
                    ended.record()
                    self._events.append((name, began, ended))
                    self._depth -= 1
            start = clock()  # the CPU's ops are done when they return: no sync to wait on
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += clock() - start
                self._depth -= 1

        return timed

    @contextlib.contextmanager
    def installed(self, llm: LLM) -> Iterator[OpTimer]:
        """Patch the model's op entry points for the duration (the linear classes, the model's op backend, the
        hybrid layers' functions, a tensor-parallel group's collectives and plan), restoring them after."""
        ops = llm.model.ops
        patches = [(cls, "__call__", "linears") for cls in LINEAR_CLASSES]
        patches += [(ops, "attention", "attention"), (ops, "rms_norm", "elementwise"), (ops, "silu_mul", "elementwise")]
        attention = ("paged_attention", "gated_attention", "delta_net_decode")  # KernelOps has no paged_attention
        patches += [(ops, name, "attention") for name in attention if hasattr(ops, name)]
        if isinstance(ops, KernelOps):  # an MoE layer's experts in one call: linears but for their SiLU-muls and adds
            patches += [(ops, "experts_rows", "linears")]
        patches += [(delta_net, "gated_rms_norm", "elementwise")]
        patches += [(delta_net, name, "attention") for name in ("causal_conv", "chunked", "recurrent")]
        if (tp := llm.model.tp) is not None:
            patches += [(tp, "all_reduce", "communication"), (tp, "gather", "communication")]
            patches += [(tp.lead, "broadcast", "communication")]
        saved = [(owner, attr, owner.__dict__.get(attr)) for owner, attr, _ in patches]
        for owner, attr, name in patches:
            setattr(owner, attr, self.wrap(getattr(owner, attr), name))
        one_call = self._one_call = llm.model.decode_call
        outer = None if one_call is None else one_call.seconds  # an enclosing timer's clocks, given back after
        if one_call is not None:
            one_call.seconds = torch.zeros(len(KERNEL_CLASSES), dtype=torch.float64)
        try:
            yield self
        finally:
            if one_call is not None:
                one_call.seconds, self._one_call = outer, None
            for owner, attr, original in saved:
                if original is None:
                    delattr(owner, attr)  # an instance attribute shadowing its class's method
                else:
                    setattr(owner, attr, original)


def calibrate(
    llm: LLM,
    hw: Hardware,
    quick: bool = False,
    on_progress: Callable[[str], None] = lambda _: None,
    engine: LLMEngine | None = None,
    at_prompt: int | None = None,
) -> Calibration:
    """Run and time the calibration steps on `engine` (default: `llm`'s own; it must be idle): its settings — the
    chunk size, the batch limit — decide which kernels its steps run, so the bench calibrates on the engine it
    measures with. `at_prompt`: a prompt of that many tokens is timed too (`rooftop bench
    --pp N`'s own shapes), where the plan's shapes stop short of it: a kernel's efficiency at 4,096 tokens is not
    its efficiency at 128 carried over (docs/BENCHMARKS.md)."""
    eng = engine or llm.engine
    if eng.has_unfinished():
        raise InvalidRequestError("calibration needs an idle engine: finish or abort its requests first")
    plan = QUICK if quick else FULL
    config, p = llm.config, llm.precision
    timer = OpTimer(llm.device)
    samples: dict[str, list[tuple[float, float]]] = {}
    runs = _runs(llm, eng, plan, at_prompt)
    gen = torch.Generator().manual_seed(0)
    vocab = min(config.vocab_size, llm.tokenizer.vocab_size)
    # warm up: kernels built, every weight page touched, the allocator's and the CPU's caches in their running
    # state (the first timed runs came out slower than the same shapes later without it)
    warm = min(256, eng.config.chunk_size, llm.max_model_len, eng.stats().kv_cache_tokens) - plan["steps"] - 4
    _run(eng, [torch.randint(vocab, (warm,), generator=gen).tolist()], plan["steps"] + 2)
    # what the timer adds per call, taken back out of every step on the CPU; on CUDA its host time mostly hides
    # behind the queue of a prompt's kernels, and each decode run runs again untimed (`_untimed_forward`)
    cost = timer_cost_per_call(timer) if llm.device.type == "cpu" else 0.0
    # a replayed graph calls no op from Python: the timed runs run eagerly
    graphs, eng.decode_graphs = eng.decode_graphs, None
    taken: dict[str, dict] = {}  # per run, its steps grouped by shape over every pass
    try:
        for done in range(plan["passes"]):
            for label, batch, prompt_len, output_len in runs:
                on_progress(label if plan["passes"] == 1 else f"{label} (pass {done + 1} of {plan['passes']})")
                # shared by the batch (prefilled once if cached); a new one each pass, so never a cache hit
                prompt = torch.randint(vocab, (prompt_len,), generator=gen).tolist()
                with timer.installed(llm):
                    groups = _timed_steps(eng, [prompt] * batch, output_len, timer, config, p, hw)
                if output_len > 1 and llm.device.type == "cuda":
                    _untimed_forward(eng, graphs, [prompt] * batch, output_len, groups)
                for key, steps in groups.items():
                    taken.setdefault(label, {}).setdefault(key, []).extend(steps)
    finally:
        eng.decode_graphs = graphs
    for groups in taken.values():
        _add_samples(samples, groups, cost)
    curves = {key: Curve.through(points) for key, points in samples.items()}
    longest = max(prompt_len + output_len for _, _, prompt_len, output_len in runs)
    return Calibration(curves, identity(llm, hw, eng, at_prompt), quick, longest)


def _timed_steps(eng: LLMEngine, prompts: list[list[int]], output_len: int, timer: OpTimer, config, p, hw) -> dict:
    """The run's steps grouped by shape: each step's classes' roofline and measured seconds, its forward pass's,
    the time around it and the calls the timer timed in it."""
    groups: dict[tuple, list] = {}
    for record, (classes, calls) in _run(eng, prompts, output_len, timer):
        shape = record.shape
        if record.phase is Phase.MIXED:
            continue  # its prefill and decode parts are measured on their own
        cached = sum(s.cached * s.count for s in shape.seqs) if record.phase is Phase.PREFILL else 0
        roof = class_roofline(time_step(config, p.at(shape.tokens), shape, hw), hw)
        key = (record.phase, shape.num_seqs, shape.tokens, cached)
        groups.setdefault(key, []).append([roof, classes, record.seconds, record.around_seconds, calls])
    return groups


def _untimed_forward(eng: LLMEngine, graphs, prompts: list[list[int]], output_len: int, groups: dict) -> None:
    """On CUDA, the run again without the timer, each decode step's forward pass taking the place of the timed one
    (the classes stay the timed run's): from the engine's graphs where it has them, whose forward pass has no host
    time between ops; else eagerly, without the timer's own cost."""
    eng.decode_graphs = graphs
    try:
        untimed: dict[tuple, list[float]] = {}
        for record, _ in _run(eng, prompts, output_len, None):
            if record.phase is Phase.DECODE:
                untimed.setdefault((record.phase, record.shape.num_seqs, record.shape.tokens, 0), []).append(
                    record.seconds
                )
    finally:
        eng.decode_graphs = None
    for key, taken in groups.items():
        if key in untimed:
            forward = median(untimed[key])
            for step in taken:
                step[2] = forward


def timer_cost_per_call(timer: OpTimer, rounds: int = 9) -> float:
    """What `timer` adds to a call beyond the op it clocks, on the CPU: calls of a small op (an add over 64 KiB,
    under PyTorch's grain for a parallel region, whose wake-ups would jitter by more than the cost) through its
    wrapper against the same calls bare, in rounds that alternate which goes first, the median of the rounds'
    differences. It was the difference of each decode run's forward pass timed
    and run again untimed, per call: two medians of a handful of steps taken seconds apart, whose noise on a large
    model's step swamped the timer's cost and swung the host time it left from one quick calibration to the next.
    A call of the small op costs the timer somewhat less than one inside a step does (docs/BENCHMARKS.md)."""
    x = torch.zeros(16 * 1024)
    bare, clock = x.add_, time.perf_counter
    timed = timer.wrap(bare, "elementwise")
    start = clock()
    for _ in range(8):
        timed(1.0)
    n = max(8, min(2000, int(0.004 / max(clock() - start, 1e-9) * 8)))  # rounds of ~4 ms each way

    def seconds(fn: Callable) -> float:
        began = clock()
        for _ in range(n):
            fn(1.0)
        return clock() - began

    differences = []
    for i in range(rounds):
        first, second = (bare, timed) if i % 2 else (timed, bare)
        took = {first: seconds(first), second: seconds(second)}
        differences.append((took[timed] - took[bare]) / n)
    timer.reset()
    return max(0.0, median(differences))


def _add_samples(samples: dict[str, list[tuple[float, float]]], groups: dict, cost: float) -> None:
    """Each group's point on its phase's curves: every class's seconds against its roofline seconds (a decode's
    linears against its rows), the host's inside and around the forward pass against the step's sequences (a
    prefill's inside: against its tokens). Each step's forward pass gives back what the timer cost it, `cost` per
    call (0 on CUDA, where a decode's forward pass is already its untimed run's)."""
    for (phase, seqs, tokens, _), taken in groups.items():
        for name in CLASSES:
            roof = median(r[name] for r, _, _, _, _ in taken)
            if roof > 0:
                key = f"{phase}.{name}"
                samples.setdefault(key, []).append(
                    (tokens if key in ROWS_KEYED else roof, median(c[name] for _, c, _, _, _ in taken))
                )
        host = median(forward - calls * cost - sum(c.values()) for _, c, forward, _, calls in taken)
        key = f"{phase}.host"
        samples.setdefault(key, []).append((tokens if key in TOKENS_KEYED else seqs, max(0.0, host)))
        samples.setdefault(f"{phase}.around", []).append((seqs, median(a for _, _, _, a, _ in taken)))


def _runs(llm: LLM, eng: LLMEngine, plan: dict, at_prompt: int | None = None) -> list[tuple[str, int, int, int]]:
    """(label, batch, prompt tokens, output tokens) of each calibration run, within the engine's limits; with
    `at_prompt`, a prompt of that length (`rooftop bench -p N`'s, whose tg tests decode from a 1-token context)."""
    limits, kv_tokens = eng.config, eng.stats().kv_cache_tokens
    room = min(llm.max_model_len, kv_tokens) - plan["steps"] - 2
    runs = [
        (f"decode at batch {b}, {c} tokens of context", b, c, plan["steps"] + 1)
        for c in plan["contexts"]
        if c <= room
        for b in plan["batches"]
        if b <= limits.max_num_seqs and b * (c + plan["steps"] + 1) <= kv_tokens
    ]
    runs += [
        (f"a prompt of {n} token{'s' if n > 1 else ''}", 1, n, 1)
        for n in plan["prompts"]
        if n <= min(room, limits.chunk_size, kv_tokens - 2)
    ]
    long = plan["long"] // limits.chunk_size * limits.chunk_size
    if long >= 2 * limits.chunk_size and long <= min(room, kv_tokens):
        label = f"a prompt of {long} tokens, in chunks of {limits.chunk_size}, and a decode after it"
        runs.append((label, 1, long, plan["steps"] + 1))
    if at_prompt and at_prompt > room:
        raise InvalidRequestError(
            f"calibrating at a {at_prompt}-token prompt needs {at_prompt + plan['steps'] + 2} tokens of context and KV "
            f"cache; the engine holds {room + plan['steps'] + 2}"
        )
    if at_prompt and at_prompt not in plan["prompts"]:
        runs.append((f"a prompt of {at_prompt} tokens", 1, at_prompt, 1))
    return runs


def _run(eng, prompts: list[list[int]], output_len: int, timer: OpTimer | None = None):
    """Run the prompts to the end, greedy: each step's record with its op classes' seconds and timed calls (with a
    timer; else none)."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    ids = [f"calibration-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    try:
        for request_id, prompt in zip(ids, prompts, strict=True):
            eng.add_request(request_id, prompt, params)
    except RooftopError:  # one did not fit: the engine is left as idle as it was found
        for request_id in ids:
            eng.abort(request_id)
        raise
    results = []
    while eng.has_unfinished():
        if timer is not None:
            timer.reset()
        out = eng.step()
        if out.record is not None:
            results.append((out.record, timer.reset() if timer is not None else ({}, 0)))
    return results


def identity(llm: LLM, hw: Hardware, eng: LLMEngine, at_prompt: int | None = None) -> dict[str, str]:
    """What a calibration depends on: the machine (as the probe names it) and the roofs its curves are drawn
    against, the model file, the formats it runs in, the engine settings that change a step's kernels, the
    kernels' build, and a prompt length timed beyond the plan (`calibrate`'s `at_prompt`)."""
    engine = eng.config
    machine = probe.identity(str(llm.device) if llm.device.type == "cuda" else "cpu", None)
    source = Path(llm.model_path)
    stat = source.stat() if source.is_file() else None
    run = llm.run_config
    return (
        {
            **{k: str(v) for k, v in machine.items()},
            "roofs": f"{hw.memory_bandwidth:.6g} B/s; "
            + ", ".join(f"{k} {v:.6g}" for k, v in sorted(hw.peak_flops.items()))
            + (f"; interconnect {hw.interconnect_bandwidth:.6g} B/s" if hw.interconnect_bandwidth else ""),
            "tensor_parallel_size": str(llm.tensor_parallel_size),
            "model": str(source),
            "model_file": f"{stat.st_size} bytes, modified {stat.st_mtime:.0f}" if stat else "",
            "load_format": f"{run.load_format} seed {run.dummy_seed}"
            if run.load_format == "dummy"
            else run.load_format,
            "weights": llm.precision.weights.name,
            "dtype": str(llm.dtype),
            "device": str(llm.device),
            "batch_invariant": str(engine.batch_invariant),
            "block_size": str(engine.block_size),
            "chunk_size": str(engine.chunk_size),
            "kernels": cpu.sources_version() if cpu.ops() is not None else "pytorch",
            "costing": str(COSTING),  # the roofline seconds the curves are drawn against
            "weight_pages": pages.label(),
            # the kernels' prefill chunks: one widened matmul, or every row narrow
            "prefill_widens_to": str(linears.widen_dtype()),
            "float32_linears": "onednn" if llm.device.type == "cpu" and linears.packs_float32() else "F.linear",
            # the rows a float decode's calls are padded to, timed per process (quant/linear.py): only where the
            # model has float linears, or a quantized model's calibration went unused whenever it came out otherwise
            "float_narrow_rows": str(linears.float_narrow_rows(llm.dtype))
            if llm.device.type == "cpu" and _float_linears(llm)
            else "",
            "procedure": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8],  # this file: what was measured
        }
        | ({"at_prompt": str(at_prompt)} if at_prompt else {})
    )


def _float_linears(llm: LLM) -> bool:
    """Whether any of the model's linears multiplies in a float format (FloatLinear: padded to the narrow rows)."""
    formats = {*llm.model.bytes_by_format(), llm.model.lm_head.format}
    return bool(formats & set(linears.FLOAT_FORMATS.values()))


def cache_path(llm: LLM, hw: Hardware, engine: LLMEngine | None = None, at_prompt: int | None = None) -> Path:
    """Beside the probe's cache: calibration-<hash of the identity>.json."""
    ident = identity(llm, hw, engine or llm.engine, at_prompt)
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return probe.cache_path().with_name(f"calibration-{key}.json")


def cached_calibration(
    llm: LLM, hw: Hardware, engine: LLMEngine | None = None, at_prompt: int | None = None
) -> Calibration | None:
    """The cached calibration of this model and engine here (quick or full), or None: for a server, which starts
    without running one (its engine may already be serving, or held, by the time a calibration would run)."""
    eng = engine or llm.engine
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        cached = Calibration.from_dict(json.loads(cache_path(llm, hw, eng, at_prompt).read_text()))
        if cached.identity == identity(llm, hw, eng, at_prompt):
            return cached
    return None


def serves(cached: Calibration | None, quick: bool) -> bool:
    """Whether a cached calibration serves a request: a full one serves a quick request too."""
    return cached is not None and (quick or not cached.quick)


def load_or_calibrate(
    llm: LLM,
    hw: Hardware,
    force: bool = False,
    quick: bool = False,
    on_progress: Callable[[str], None] = lambda _: None,
    engine: LLMEngine | None = None,
    at_prompt: int | None = None,
) -> Calibration:
    """The cached calibration of this model here (a full one serves a quick request too), else calibrate and cache
    (`at_prompt`: as `calibrate`'s, cached apart: a calibration without it, full or quick, does not serve it)."""
    eng = engine or llm.engine
    path = cache_path(llm, hw, eng, at_prompt)
    cached = None if force else cached_calibration(llm, hw, eng, at_prompt)
    if serves(cached, quick):
        return cached
    result = calibrate(llm, hw, quick, on_progress, eng, at_prompt)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
        tmp.replace(path)
    return result
