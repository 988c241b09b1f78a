"""Number formats: bytes per weight (with the scale/zero overhead of each format) and which peak computes them, and
the one list of `--weights` choices every command takes (the engine's and the analyzer's)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rooftop.errors import InvalidRequestError


@dataclass(frozen=True)
class WeightFormat:
    """`bits` per weight plus `overhead_bits` per group of `group` weights (group 0: one group per output row)."""

    name: str
    bits: float  # a mix of formats (a Q4_K_M file) has a fractional mean
    compute: str  # the peak that does the math: weight-only kernels dequantize and multiply in bf16 (Hardware.peak)
    group: int = 0
    overhead_bits: int = 0

    def linear_bytes(self, k: int, n: int) -> float:
        """Bytes of a K -> N weight matrix (N rows of K weights), scales and zeros included."""
        groups_per_row = 1 if self.group == 0 else k / self.group
        return n * (k * self.bits + groups_per_row * self.overhead_bits) / 8

    def bits_per_weight(self, k: int = 4096) -> float:
        return self.linear_bytes(k, 1) * 8 / k


WEIGHT_FORMATS = {
    f.name: f
    for f in (
        WeightFormat("fp32", 32, "fp32"),
        WeightFormat("bf16", 16, "bf16"),
        WeightFormat("fp16", 16, "bf16"),
        WeightFormat("fp16-fp32", 16, "fp32"),  # float16 storage, float32 math (fbgemm): rooftop's quantized lm_head
        WeightFormat("fp8", 8, "fp8", group=0, overhead_bits=32),  # per-channel fp32 scale
        WeightFormat("int8", 8, "int8_weight_only", group=0, overhead_bits=16),  # per-row bf16 scale (Int8Linear)
        WeightFormat("int4", 4, "int4_weight_only", group=128, overhead_bits=32),  # bf16 scale + zero per 128
        WeightFormat("int4-g32", 4, "int4_weight_only", group=32, overhead_bits=32),  # per 32 (Int4Linear)
        WeightFormat("q8_0", 8, "int8_weight_only", group=32, overhead_bits=16),  # GGUF: fp16 d per 32 -> 8.5 bits
        WeightFormat("q4_0", 4, "int4_weight_only", group=32, overhead_bits=16),  # GGUF: fp16 d per 32 -> 4.5 bits
        WeightFormat("q4_1", 4, "int4_weight_only", group=32, overhead_bits=32),  # GGUF: fp16 d, m per 32 -> 5 bits
        WeightFormat("q5_0", 5, "int8_weight_only", group=32, overhead_bits=16),  # GGUF: fp16 d per 32 -> 5.5 bits
        WeightFormat("q5_1", 5, "int8_weight_only", group=32, overhead_bits=32),  # GGUF: fp16 d, m per 32 -> 6 bits
        # K-quants: per 256, fp16 d and dmin + 12 bytes of 6-bit scales/mins (Q4_K, Q5_K); 16 int8 scales + d (Q6_K)
        WeightFormat("q4_k", 4, "int4_weight_only", group=256, overhead_bits=128),  # 4.5 bits
        WeightFormat("q5_k", 5, "int8_weight_only", group=256, overhead_bits=128),  # 5.5 bits
        WeightFormat("q6_k", 6, "int8_weight_only", group=256, overhead_bits=144),  # 6.5625 bits
    )
}

KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}

# What rooftop's engine decides per device: float in the run's dtype; int8 / int4 as Q8_0 / Q4_1 groups on its CPU
# kernels, else per-row int8 / group-32 int4 (quant.linear.linear_kind). Every other choice names one format.
WEIGHT_POLICIES = ("float", "int8", "int4")
WEIGHT_CHOICES = ("auto", *WEIGHT_POLICIES, *(name for name in WEIGHT_FORMATS if name not in WEIGHT_POLICIES))
# On a device rooftop's probe has not measured (a datasheet): float as bf16, int8 per row, int4 per 128 (the engine
# does not run int4 off the CPU: the common layout stands in).
DATASHEET_FORMATS = {"float": "bf16", "int8": "int8", "int4": "int4"}
WEIGHTS_HELP = (
    "auto (the file's own format), float (the run's dtype), int8 or int4 (as rooftop's engine runs them: Q8_0 / Q4_1 "
    "groups of 32 on its CPU kernels, else int8 per row / int4 per 32; on a datasheet device int8 per row, int4 per "
    f"128), or an exact format: {', '.join(WEIGHT_CHOICES[4:])} (the engine refuses one it cannot run here)"
)


def mixed_format(bytes_by_format: dict[str, float], weights: int) -> WeightFormat:
    """One format standing for several (a Q4_K_M file's Q4_K, Q6_K, Q5_0, Q8_0): their mean bits per weight, the
    compute of the one holding the most bytes, named after all of them, most bytes first."""
    if len(bytes_by_format) == 1:
        return WEIGHT_FORMATS[next(iter(bytes_by_format))]
    names = sorted(bytes_by_format, key=bytes_by_format.get, reverse=True)
    total = sum(bytes_by_format.values())
    return WeightFormat("+".join(names), total * 8 / weights, WEIGHT_FORMATS[names[0]].compute)


def check_weight_choice(choice: str) -> str:
    """`choice` if it is one of WEIGHT_CHOICES, else an InvalidRequestError listing them."""
    if choice not in WEIGHT_CHOICES:
        raise InvalidRequestError(f"unknown weight format {choice!r} (known: {', '.join(WEIGHT_CHOICES)})")
    return choice


def weight_format(choice: str | None, file_format: str | None, engine_formats: dict[str, str]) -> str:
    """The exact format the analyzer models for a `--weights` choice: auto (or none) is the file's format, else
    bf16; float/int8/int4 are what the engine's linears are on this device (`engine_formats`, from the probe), else
    DATASHEET_FORMATS; an exact format is itself."""
    if choice is None or check_weight_choice(choice) == "auto":
        return file_format or "bf16"
    if choice in WEIGHT_POLICIES:
        return engine_formats.get(choice, DATASHEET_FORMATS[choice])
    return choice


@dataclass(frozen=True)
class Precision:
    """What a step reads and computes in: weights, KV cache, activations (the compute dtype's width)."""

    weights: WeightFormat
    kv_bytes: int
    activation_bytes: int
    state_bytes: int = 4  # linear-attention recurrent state, kept in fp32 by the reference kernels
    widen_rows: int | None = None  # prefill chunks of this many tokens or more widen quantized weights to floats
    widen_compute: str | None = None  # the peak those widened chunks run at (default: the activations' float peak)
    lm_head: WeightFormat | None = None  # when the lm_head is held in another format than the other linears

    @property
    def compute(self) -> str:
        return self.weights.compute

    def head(self) -> Precision:
        """The precision of the lm_head."""
        return self if self.lm_head is None else replace(self, weights=self.lm_head, lm_head=None)

    def at(self, tokens: int) -> Precision:
        """The precision a step of `tokens` tokens computes in: an engine that widens quantized weights for large
        steps (rooftop's prefill on CPU) does that math at its activations' float peak."""
        if self.widen_rows is None or tokens < self.widen_rows or self.compute in ("fp32", "bf16"):
            return self
        widened = self.widen_compute or ("fp32" if self.activation_bytes == 4 else "bf16")
        return replace(self, weights=replace(self.weights, compute=widened))

    @property
    def embedding_bytes_per_value(self) -> float:
        return self.weights.bits_per_weight() / 8


def precision(weights: str = "bf16", kv: str | None = None) -> Precision:
    """Precision from format names; the KV cache defaults to the activations' width (fp32 or bf16)."""
    if weights not in WEIGHT_FORMATS:
        raise InvalidRequestError(f"unknown weight format {weights!r} (known: {', '.join(WEIGHT_FORMATS)})")
    fmt = WEIGHT_FORMATS[weights]
    activation_bytes = 4 if fmt.compute == "fp32" else 2
    kv = kv or ("fp32" if activation_bytes == 4 else "bf16")
    if kv not in KV_BYTES:
        raise InvalidRequestError(f"unknown KV cache format {kv!r} (known: {', '.join(KV_BYTES)})")
    return Precision(weights=fmt, kv_bytes=KV_BYTES[kv], activation_bytes=activation_bytes)
