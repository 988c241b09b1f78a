"""Hardware: peak FLOP/s per compute dtype, memory bandwidth and size, interconnect; the datasheet catalog."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace

from rooftop.errors import InvalidRequestError

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class Efficiency:
    """What engines reach on a device, fit on published measurements (each entry's sources in roofline/catalog.py):
    the share of the datasheet bandwidth a weight-streaming op reaches (`memory_4bit` for 4-bit weights, whose
    kernels dequantize more per byte), the share of the dense peak a long prefill's matmuls reach, a time per layer
    per step that no roofline counts (kernel launches and tails, norms, attention's fixed costs), and the latency of
    one all-reduce of a step's small hidden states under tensor parallelism."""

    memory: float
    memory_4bit: float
    compute: float
    per_layer_s: float
    all_reduce_s: float


@dataclass(frozen=True)
class Hardware:
    """One device. `peak_flops` maps a compute dtype ("fp32", "bf16", "fp8", "int8") to dense FLOP/s."""

    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float  # bytes/s
    memory_bytes: float
    interconnect_bandwidth: float | None = None  # bytes/s per device, one direction, for all-reduces
    # seconds one collective takes before its bytes (a small all-reduce): measured by the probe of a tensor-parallel
    # group; datasheet devices leave it to Efficiency.all_reduce_s, what engines reach there
    collective_latency_s: float | None = None
    source: str = ""
    notes: dict[str, str] = field(default_factory=dict)
    engine_formats: dict[str, str] = field(default_factory=dict)  # float/int8/int4 -> the engine's format here (probe)
    # a float file's format -> what the engine runs it as under --weights auto here (probe: precision.auto_formats);
    # empty on a datasheet device, where a file's weights are costed as stored
    engine_auto: dict[str, str] = field(default_factory=dict)
    engine_dtype: str | None = None  # what rooftop's engine computes in here (probe: fp32 on a CPU, else bf16)
    engine_device: str | None = None  # the device type rooftop's engine runs on here (probe: "cpu", "cuda")
    efficiency: Efficiency | None = None  # published engines' efficiencies here: the analyzer's expected times
    # bytes: memory_bandwidth is the probe's read of a working set of this size (a model's weights), not DRAM's
    working_set: float | None = None
    # the share of the device's memory roof memory_bandwidth is (--memory-efficiency, `scaled`): 1 for the roof itself
    memory_efficiency: float = 1.0
    compute_efficiency: float = 1.0  # the share of the datasheet's peaks peak_flops are (--compute-efficiency)

    @property
    def probed(self) -> bool:
        """Whether rooftop's probe measured this device (this machine): there its engine runs a model, so a file's
        weights are costed as its loader holds them; on a datasheet or custom device, as the file stores them."""
        return self.engine_dtype is not None

    @property
    def widens_tables(self) -> bool:
        """Whether rooftop's engine holds a GGUF's embedding table in its float dtype here: on a probed device other
        than the CPU, where only CPU tensors look rows up from a file's groups (models.loader)."""
        return self.engine_device not in (None, "cpu")

    def peak(self, compute: str) -> float:
        """Peak of `compute`. Weight-only int8/int4 kernels multiply in bf16: the bf16 peak unless this device's
        kernels were measured (the probe); a device without fp8 units runs fp8 weights at its bf16 rate."""
        if compute in self.peak_flops:
            return self.peak_flops[compute]
        if (compute == "fp8" or compute.endswith("_weight_only")) and "bf16" in self.peak_flops:
            return self.peak_flops["bf16"]
        raise InvalidRequestError(f"{self.name} has no {compute} peak (it has {', '.join(self.peak_flops)})")

    def ridge_point(self, compute: str) -> float:
        """FLOPs per byte where the compute roof meets the memory roof."""
        return self.peak(compute) / self.memory_bandwidth

    def scaled(self, compute_efficiency: float = 1.0, memory_efficiency: float = 1.0) -> Hardware:
        """The same device with peaks scaled by achievable fractions (roofline bounds when both are 1). Given
        fractions replace the catalog's published efficiencies: the ops at the scaled roofs are then the expectation."""
        for name, value in (("compute_efficiency", compute_efficiency), ("memory_efficiency", memory_efficiency)):
            if not 0 < value <= 1:
                raise InvalidRequestError(f"{name} must be in (0, 1], got {value}")
        return replace(
            self,
            peak_flops={k: v * compute_efficiency for k, v in self.peak_flops.items()},
            memory_bandwidth=self.memory_bandwidth * memory_efficiency,
            efficiency=self.efficiency if compute_efficiency == memory_efficiency == 1.0 else None,
            memory_efficiency=self.memory_efficiency * memory_efficiency,
            compute_efficiency=self.compute_efficiency * compute_efficiency,
        )


def custom_hardware(
    peak_tflops: float, bandwidth_tbs: float, memory_gb: float, interconnect_gbs: float | None = None
) -> Hardware:
    """`--peak-tflops X --bandwidth-tbs Y --memory-gb Z`: one peak for every dtype."""
    for name, value in (("peak_tflops", peak_tflops), ("bandwidth_tbs", bandwidth_tbs), ("memory_gb", memory_gb)):
        if value is None or value <= 0:
            raise InvalidRequestError(f"{name} must be positive, got {value}")
    peaks = {dtype: peak_tflops * TERA for dtype in ("fp32", "bf16", "fp8", "int8")}
    return Hardware(
        name=f"custom ({peak_tflops:g} TFLOP/s, {bandwidth_tbs:g} TB/s, {memory_gb:g} GB)",
        peak_flops=peaks,
        memory_bandwidth=bandwidth_tbs * TERA,
        memory_bytes=memory_gb * GIGA,
        interconnect_bandwidth=None if interconnect_gbs is None else interconnect_gbs * GIGA,
        source="given on the command line",
    )


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=3, cutoff=0.4)
    originals = [k for k in known if k.lower() in close]
    return f"; did you mean {', '.join(originals)}?" if originals else f"; known: {', '.join(known)}"
