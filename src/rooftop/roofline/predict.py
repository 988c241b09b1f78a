"""Predictions: TTFT, TPOT, end-to-end latency, memory fit and crossovers of a model on a device, from `step_ops`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rooftop.config import ModelConfig
from rooftop.errors import InvalidRequestError, PromptTooLongError
from rooftop.roofline.hardware import Efficiency, Hardware
from rooftop.roofline.ops import (
    Op,
    ParameterCount,
    StepShape,
    activation_bytes,
    check_tp,
    kv_bytes_per_token,
    parameter_count,
    state_bytes_per_sequence,
    step_ops,
    weight_bytes,
)
from rooftop.roofline.precision import Precision, WeightFormat

MAX_SEARCH = 1 << 22  # crossover searches give up past ~4M tokens or sequences
EXACT_DECODE_STEPS = 1024  # longer outputs integrate TPOT over evenly spaced contexts
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization: the share of the device an engine takes


class DoesNotFitError(InvalidRequestError):
    """The weights, the KV caches and states, and the prefill's activations exceed what an engine has."""


@dataclass(frozen=True)
class StepTime:
    """One step's totals and two times. `time_s`, the roofline of its ops as they run, one after another, each
    at its own roof (the elementwise ops move their activations through memory). `bound_s`, a true lower bound:
    the step's FLOPs at the peaks, or the bytes no fusion avoids (weights, KV cache, state) at the bandwidth, or
    its interconnect traffic, whichever is slowest; no engine on this hardware can run the step faster."""

    ops: list[Op]
    time_s: float
    flops: float
    bytes: float
    compute_time_s: float
    memory_time_s: float
    comm_time_s: float
    bound_s: float

    @property
    def bound(self) -> str:
        times = {"compute": self.compute_time_s, "memory": self.memory_time_s, "interconnect": self.comm_time_s}
        return max(times, key=times.get)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def essential_bytes(self) -> float:
        """The bytes no fusion avoids: weights, KV cache, state."""
        return sum(op.essential_bytes for op in self.ops)

    @property
    def kv_share(self) -> float:
        """The KV cache's share of the essential bytes."""
        kv = sum(op.essential_bytes for op in self.ops if op.name == "attention")
        return kv / self.essential_bytes if self.essential_bytes else 0.0


def time_step(config: ModelConfig, p: Precision, shape: StepShape, hw: Hardware) -> StepTime:
    ops = step_ops(config, p, shape)
    return StepTime(
        ops=ops,
        time_s=sum(op.time(hw) for op in ops),
        flops=sum(op.flops for op in ops),
        bytes=sum(op.bytes for op in ops),
        compute_time_s=sum(op.compute_time(hw) for op in ops),
        memory_time_s=sum(op.memory_time(hw) for op in ops),
        comm_time_s=sum(op.comm_time(hw) for op in ops),
        bound_s=step_bound(ops, hw),
    )


def expected_time(step: StepTime, hw: Hardware, config: ModelConfig, p: Precision) -> float | None:
    """What an engine is expected to take for the step on `hw`, from its published efficiencies (Efficiency): each
    op at the reachable share of its roofs, a fixed time per layer, and a latency per collective — the device's
    measured one where the op model's communication already counts it (`Hardware.collective_latency_s`), else
    the published all-reduce latency; None where the catalog has no efficiencies for the device."""
    eff = hw.efficiency
    if eff is None:
        return None
    memory = memory_efficiency(p.weights, eff)
    ops = sum(max(op.compute_time(hw) / eff.compute, op.memory_time(hw) / memory, op.comm_time(hw)) for op in step.ops)
    latency = 0.0 if hw.collective_latency_s is not None else eff.all_reduce_s
    collectives = sum(op.collectives for op in step.ops)
    return ops + config.num_layers * eff.per_layer_s + collectives * latency


def memory_efficiency(fmt: WeightFormat, eff: Efficiency) -> float:
    """The share of the bandwidth weights of `fmt` stream at: 4-bit formats' kernels' (`memory_4bit`) up to 4.5
    bits per weight, else `memory`; a mix's parts each at their own, by their bytes."""
    parts = fmt.parts or ((fmt, 1.0),)
    held = [
        (part.bits_per_weight() * share, eff.memory_4bit if part.bits <= 4.5 else eff.memory) for part, share in parts
    ]
    return sum(b for b, _ in held) / sum(b / e for b, e in held)


def step_bound(ops: list[Op], hw: Hardware) -> float:
    """The fused lower bound of a step of `ops` (StepTime.bound_s)."""
    compute = sum(op.compute_time(hw) for op in ops)
    memory = sum(op.essential_bytes for op in ops) / hw.memory_bandwidth
    return max(compute, memory, sum(op.comm_time(hw) for op in ops))


@dataclass(frozen=True)
class Prediction:
    model: str
    hw: Hardware
    weights_format: str
    kv_bytes_per_value: int
    tp: int
    batch: int
    prompt_len: int
    output_len: int
    parameters: ParameterCount
    weight_bytes: float  # the whole model; each of tp devices holds 1/tp
    kv_bytes_per_token: float
    state_bytes_per_sequence: float
    prefill: StepTime
    decode_first: StepTime
    decode_last: StepTime
    decode_total_s: float
    decode_bound_total_s: float  # the decode steps' fused lower bound, summed
    memory_needed_bytes: float  # per device
    memory_available_bytes: float
    max_batch: int
    prefill_compute_bound_from_tokens: int | None
    decode_compute_bound_from_batch: int | None
    ridge_point_flops_per_byte: float
    embedding_format: str = ""  # the input embedding table's format (a quantized checkpoint's stays in floats)
    lm_head_format: str = ""
    converted_formats: tuple[str, ...] = ()  # a GGUF's types costed as the format rooftop's loader converts them to
    device_memory_bytes: float = 0.0  # memory_available_bytes is gpu_memory_utilization of it
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    activation_bytes: float = 0.0  # per device: the prefill step's working set, reserved beside weights and KV
    state_bytes_per_value: int = 4  # the recurrent state's dtype width (--state-dtype)
    expected_ttft_s: float | None = None  # from the device's published efficiencies, where the catalog has them
    expected_decode_total_s: float | None = None

    @property
    def ttft_s(self) -> float:
        return self.prefill.time_s

    @property
    def ttft_bound_s(self) -> float:
        return self.prefill.bound_s

    @property
    def tpot_bound_s(self) -> float | None:
        """No engine on this hardware decodes faster than this per token (the fused roofline); None for one output
        token, which no decode step follows (TPOT needs two)."""
        steps = self.output_len - 1
        return self.decode_bound_total_s / steps if steps > 0 else None

    @property
    def expected_tpot_s(self) -> float | None:
        if self.expected_decode_total_s is None:
            return None
        steps = self.output_len - 1
        return self.expected_decode_total_s / steps if steps > 0 else None

    @property
    def e2e_s(self) -> float:
        return self.prefill.time_s + self.decode_total_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (the README's TPOT: (E2E - TTFT) / (n - 1)); None for one
        output token."""
        return self.decode_total_s / (self.output_len - 1) if self.output_len > 1 else None

    @property
    def decode_tokens_per_s_per_seq(self) -> float | None:
        """The decode rate, 1 / TPOT (the prefill's time not in it)."""
        return None if self.tpot_s is None else 1 / self.tpot_s

    @property
    def decode_tokens_per_s_total(self) -> float | None:
        return None if self.tpot_s is None else self.batch / self.tpot_s

    @property
    def output_tokens_per_s(self) -> float:
        """Every sequence's output tokens over the end-to-end time, prefill included (vLLM's output throughput)."""
        return self.batch * self.output_len / self.e2e_s

    def to_dict(self) -> dict:
        """Self-describing keys with SI units in their names."""

        def step(s: StepTime) -> dict:
            return {
                "time_s": s.time_s,
                "flops": s.flops,
                "bytes": s.bytes,
                "arithmetic_intensity_flops_per_byte": s.intensity,
                "compute_time_s": s.compute_time_s,
                "memory_time_s": s.memory_time_s,
                "interconnect_time_s": s.comm_time_s,
                "bound_time_s": s.bound_s,
                "bound": s.bound,
            }

        def op_rows(s: StepTime) -> list[dict]:
            return [
                {
                    "name": op.name,
                    "flops": op.flops,
                    "bytes_read": op.bytes_read,
                    "bytes_written": op.bytes_written,
                    "interconnect_bytes": op.comm_bytes,
                    "arithmetic_intensity_flops_per_byte": op.intensity,
                    "time_s": op.time(self.hw),
                    "bound": op.bound(self.hw),
                }
                for op in s.ops
            ]

        return {
            "model": self.model,
            "hardware": self.hw.name,
            "memory_bandwidth_bytes_per_s": self.hw.memory_bandwidth,
            "memory_roof": memory_roof(self.hw),
            "weights_format": self.weights_format,
            "embedding_format": self.embedding_format,
            "lm_head_format": self.lm_head_format,
            "converted_formats": list(self.converted_formats),
            "kv_bytes_per_value": self.kv_bytes_per_value,
            "tp": self.tp,
            "batch": self.batch,
            "prompt_tokens": self.prompt_len,
            "output_tokens": self.output_len,
            "parameters": self.parameters.total,
            "parameters_active": self.parameters.active,
            "parameters_embedding": self.parameters.embedding,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "state_bytes_per_sequence": self.state_bytes_per_sequence,
            "state_bytes_per_value": self.state_bytes_per_value,
            "ttft_s": self.ttft_s,
            "ttft_bound_s": self.ttft_bound_s,
            "tpot_s": self.tpot_s,
            "tpot_bound_s": self.tpot_bound_s,
            "expected_ttft_s": self.expected_ttft_s,
            "expected_tpot_s": self.expected_tpot_s,
            "tpot_first_s": None if self.tpot_s is None else self.decode_first.time_s,
            "tpot_last_s": None if self.tpot_s is None else self.decode_last.time_s,
            "e2e_s": self.e2e_s,
            "decode_tokens_per_s_per_seq": self.decode_tokens_per_s_per_seq,
            "decode_tokens_per_s_total": self.decode_tokens_per_s_total,
            "output_tokens_per_s": self.output_tokens_per_s,
            "prefill": {**step(self.prefill), "ops": op_rows(self.prefill)},
            "decode": {**step(self.decode_first), "ops": op_rows(self.decode_first)},
            "decode_last": step(self.decode_last),
            "memory_needed_bytes": self.memory_needed_bytes,
            "memory_available_bytes": self.memory_available_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "activation_bytes": self.activation_bytes,
            "max_batch": self.max_batch,
            "prefill_compute_bound_from_tokens": self.prefill_compute_bound_from_tokens,
            "decode_compute_bound_from_batch": self.decode_compute_bound_from_batch,
            "ridge_point_flops_per_byte": self.ridge_point_flops_per_byte,
        }


def memory_roof(hw: Hardware) -> str:
    """The memory roof and where it comes from: the probe's read of a working set (ProbeResult.to_hardware, whose
    note says the rate, the size and DRAM's rate), or the device's source (a datasheet, the probe's DRAM read); a
    rate scaled by --memory-efficiency (Hardware.scaled) says so and what it is a share of."""
    if hw.working_set is None:
        roof = f"{_rate(hw.memory_bandwidth / hw.memory_efficiency)}: {hw.source}"
    else:
        roof = (
            f"{hw.notes['read_bandwidth']}: the model's weights per device, the roof `rooftop bench` bounds it by "
            "(weights that stay partly in a cache read faster than DRAM)"
        )
    if hw.memory_efficiency == 1.0:
        return roof
    return f"{_rate(hw.memory_bandwidth)}, --memory-efficiency {hw.memory_efficiency:g} of {roof}"


def _rate(bytes_per_s: float) -> str:
    tera = bytes_per_s >= 1e12
    return f"{bytes_per_s / (1e12 if tera else 1e9):.3g} {'TB/s' if tera else 'GB/s'}"


def device_kv_share(config: ModelConfig, tp: int) -> float:
    """The share of the KV cache one of `tp` devices holds: its KV heads split tp ways, or one replicated on each
    device when there are fewer KV heads than devices."""
    return max(1, config.num_kv_heads // tp) / config.num_kv_heads


def _per_seq_bytes(config: ModelConfig, p: Precision, tokens_per_seq: int, tp: int) -> float:
    """One sequence's KV cache and recurrent state on one device."""
    kv = tokens_per_seq * kv_bytes_per_token(config, p) * device_kv_share(config, tp)
    return kv + state_bytes_per_sequence(config, p) / tp


@dataclass(frozen=True)
class MemoryFit:
    """One device's memory for a batch: what an engine may use (a fraction of the device, vLLM's
    --gpu-memory-utilization) against the weights, each sequence's KV cache and recurrent state at its full context,
    and each sequence's share of the prefill step's activations. The batch's prompts are prefilled in one step, the
    largest the analysis runs: its working set is what an engine reserves for activations (vLLM profiles it)."""

    device_bytes: float
    utilization: float
    weights: float  # weights / tp
    per_sequence: float  # one sequence's KV cache and recurrent state
    activations_per_sequence: float  # one sequence's share of the prefill step's activations

    @property
    def usable(self) -> float:
        return self.device_bytes * self.utilization

    def needed(self, batch: int) -> float:
        return self.weights + batch * (self.per_sequence + self.activations_per_sequence)

    @property
    def max_batch(self) -> int:
        """The largest batch whose weights, KV caches, states and prefill activations fit in the usable memory."""
        each = self.per_sequence + self.activations_per_sequence
        return max(0, int((self.usable - self.weights) // each)) if each > 0 else 0


def memory_fit(
    config: ModelConfig,
    p: Precision,
    hw: Hardware,
    prompt_len: int,
    tokens_per_seq: int,
    tp: int = 1,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> MemoryFit:
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidRequestError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    return MemoryFit(
        device_bytes=hw.memory_bytes,
        utilization=gpu_memory_utilization,
        weights=weight_bytes(config, p) / tp,
        per_sequence=_per_seq_bytes(config, p, tokens_per_seq, tp),
        activations_per_sequence=activation_bytes(config, p, prompt_len, 1, tp),
    )


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def check_fits(memory: MemoryFit, config: ModelConfig, hw: Hardware, batch: int, context: int) -> None:
    """Refuse a batch that does not fit, saying what does not and by how much: the weights alone, one sequence (its
    KV cache and recurrent state at the full context, and its prefill's activations), or this many of them."""
    usable = f"{_size(memory.usable)} usable ({memory.utilization:g} of {_size(memory.device_bytes)})"
    if memory.weights > memory.usable:
        raise DoesNotFitError(
            f"the weights alone need {_size(memory.weights)} per device but {hw.name} has {usable}: "
            f"{_size(memory.weights - memory.usable)} short; use more tensor parallelism or fewer bits per weight"
        )
    left = f"{_size(memory.usable - memory.weights)} of the {usable} is left after the weights"
    cache, need = (
        ("KV cache and recurrent state", "need") if config.num_linear_attention_layers else ("KV cache", "needs")
    )
    if memory.needed(1) > memory.usable:
        raise DoesNotFitError(
            f"one sequence does not fit: its {cache} at {context} tokens {need} {_size(memory.per_sequence)} and "
            f"its prefill's activations {_size(memory.activations_per_sequence)}, but {left}: "
            f"{_size(memory.needed(1) - memory.usable)} short; use a shorter prompt or output, fewer KV bits "
            "(--kv-cache-dtype fp8) or more tensor parallelism"
        )
    if memory.needed(batch) > memory.usable:
        raise DoesNotFitError(
            f"batch {batch} does not fit: its {cache} at {context} tokens per sequence {need} "
            f"{_size(batch * memory.per_sequence)} and its prefill's activations "
            f"{_size(batch * memory.activations_per_sequence)}, but {left}: "
            f"{_size(memory.needed(batch) - memory.usable)} short; batch <= {memory.max_batch} fits"
        )


def _first_true(predicate, limit: int = MAX_SEARCH) -> int | None:
    """Smallest n in [1, limit] with predicate(n), for a predicate that stays true once true."""
    hi = 1
    while not predicate(hi):
        hi *= 2
        if hi > limit:
            return None
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def compute_bound(step: StepTime) -> bool:
    """Whether the step's math takes longer than its memory traffic and its collectives (under tensor parallelism
    a step can be interconnect-bound at any length)."""
    return step.bound == "compute"


def prefill_crossover(config: ModelConfig, p: Precision, hw: Hardware, tp: int = 1) -> int | None:
    """The shortest prompt whose single-sequence prefill step is compute-bound."""
    return _first_true(lambda s: compute_bound(time_step(config, p, StepShape.prefill(1, s, tp), hw)))


def decode_crossover(config: ModelConfig, p: Precision, hw: Hardware, context: int, tp: int = 1) -> int | None:
    """The smallest batch whose decode step (each sequence `context` tokens deep) is compute-bound."""
    return _first_true(lambda b: compute_bound(time_step(config, p, StepShape.decode(b, context, tp), hw)))


def decode_time(
    config: ModelConfig,
    p: Precision,
    hw: Hardware,
    batch: int,
    prompt_len: int,
    output_len: int,
    tp: int = 1,
    of: Callable[[StepTime], float] = lambda step: step.time_s,
) -> float:
    """Total time of the output_len − 1 decode steps, each step's time taken by `of` (its roofline by default, or
    its bound, or its expected time); step j attends to prompt_len + j − 1 cached tokens."""
    steps = output_len - 1
    if steps <= 0:
        return 0.0

    def at(j: float) -> float:
        return of(time_step(config, p, StepShape.decode(batch, prompt_len + int(round(j)) - 1, tp), hw))

    if steps <= EXACT_DECODE_STEPS:
        return sum(at(j) for j in range(1, steps + 1))
    # each op's time is a max of lines in the context: the trapezoid over many points is near exact
    points = [1 + (steps - 1) * i / EXACT_DECODE_STEPS for i in range(EXACT_DECODE_STEPS + 1)]
    values = [at(j) for j in points]
    width = (steps - 1) / EXACT_DECODE_STEPS
    return width * (sum(values) - (values[0] + values[-1]) / 2) + (values[0] + values[-1]) / 2


def analyze(
    config: ModelConfig,
    hw: Hardware,
    p: Precision,
    prompt_len: int = 1024,
    output_len: int = 256,
    batch: int = 1,
    tp: int = 1,
    check_memory: bool = True,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> Prediction:
    """Roofline bounds of one batch of `batch` prompts of `prompt_len` tokens, each generating `output_len`."""
    for name, value in (("batch", batch), ("prompt", prompt_len), ("output", output_len)):
        if not isinstance(value, int) or value < 1:
            raise InvalidRequestError(f"{name} must be an integer >= 1, got {value!r}")
    check_tp(config, tp)
    total_tokens = prompt_len + output_len
    if total_tokens > config.max_position_embeddings:  # no engine serves a sequence past the model's positions
        raise PromptTooLongError(
            f"prompt {prompt_len} + output {output_len} = {total_tokens} tokens exceed the model's "
            f"{config.max_position_embeddings} positions (max_position_embeddings); shorten the prompt or the output"
        )
    memory = memory_fit(config, p, hw, prompt_len, total_tokens, tp, gpu_memory_utilization)
    if check_memory:
        check_fits(memory, config, hw, batch, total_tokens)
    prefill = time_step(config, p, StepShape.prefill(batch, prompt_len, tp), hw)
    return Prediction(
        model=config.name or config.architecture,
        hw=hw,
        weights_format=p.weights.name,
        kv_bytes_per_value=p.kv_bytes,
        tp=tp,
        batch=batch,
        prompt_len=prompt_len,
        output_len=output_len,
        parameters=parameter_count(config),
        weight_bytes=weight_bytes(config, p),
        kv_bytes_per_token=kv_bytes_per_token(config, p),
        state_bytes_per_sequence=state_bytes_per_sequence(config, p),
        prefill=prefill,
        decode_first=time_step(config, p, StepShape.decode(batch, prompt_len, tp), hw),
        decode_last=time_step(config, p, StepShape.decode(batch, prompt_len + max(0, output_len - 2), tp), hw),
        decode_total_s=decode_time(config, p, hw, batch, prompt_len, output_len, tp),
        decode_bound_total_s=decode_time(config, p, hw, batch, prompt_len, output_len, tp, lambda s: s.bound_s),
        expected_ttft_s=expected_time(prefill, hw, config, p),
        expected_decode_total_s=None
        if hw.efficiency is None
        else decode_time(config, p, hw, batch, prompt_len, output_len, tp, lambda s: expected_time(s, hw, config, p)),
        memory_needed_bytes=memory.needed(batch),
        memory_available_bytes=memory.usable,
        max_batch=memory.max_batch,
        prefill_compute_bound_from_tokens=prefill_crossover(config, p, hw, tp),
        decode_compute_bound_from_batch=decode_crossover(config, p, hw, prompt_len, tp),
        ridge_point_flops_per_byte=hw.ridge_point(p.compute),
        embedding_format=p.embedding_format.name,
        converted_formats=p.converted,
        lm_head_format=p.head().weights.name,
        device_memory_bytes=hw.memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        activation_bytes=batch * memory.activations_per_sequence,
        state_bytes_per_value=p.state_bytes,
    )
