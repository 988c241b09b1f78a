"""Number formats: bytes per weight (with the scale/zero overhead of each format) and which peak computes them, and
the one list of `--weights` choices every command takes (the engine's and the analyzer's)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rooftop.config import KV_CACHE_DTYPE_ALIASES, ModelConfig
from rooftop.errors import InvalidRequestError, UnsupportedModelError


@dataclass(frozen=True)
class WeightFormat:
    """`bits` per weight plus `overhead_bits` per group of `group` weights (group 0: one group per output row)."""

    name: str
    bits: float  # a mix of formats (a Q4_K_M file) has a fractional mean
    compute: str  # the peak that does the math: weight-only kernels dequantize and multiply in bf16 (Hardware.peak)
    group: int = 0
    overhead_bits: int = 0
    # a mix (mixed_format): each format it holds with its share of the mix's weights, most bytes first
    parts: tuple[tuple[WeightFormat, float], ...] = ()

    def linear_bytes(self, k: int, n: int) -> float:
        """Bytes of a K -> N weight matrix (N rows of K weights), scales and zeros included."""
        groups_per_row = 1 if self.group == 0 else k / self.group
        return n * (k * self.bits + groups_per_row * self.overhead_bits) / 8

    def bits_per_weight(self, k: int = 4096) -> float:
        return self.linear_bytes(k, 1) * 8 / k

    @property
    def compute_shares(self) -> tuple[tuple[str, float], ...]:
        """A mix's peaks, each with the share of the weights (and so of the math) its parts do there; () for one
        format, whose math is all at `compute`."""
        shares: dict[str, float] = {}
        for fmt, share in self.parts:
            shares[fmt.compute] = shares.get(fmt.compute, 0.0) + share
        return tuple(shares.items())

    def computed_at(self, compute: str) -> WeightFormat:
        """The same bytes with all the math at `compute` (a prefill chunk that widens the weights to floats)."""
        parts = tuple((replace(fmt, compute=compute), share) for fmt, share in self.parts)
        return replace(self, compute=compute, parts=parts)


WEIGHT_FORMATS = {
    f.name: f
    for f in (
        WeightFormat("fp32", 32, "fp32"),
        WeightFormat("bf16", 16, "bf16"),
        WeightFormat("fp16", 16, "bf16"),
        WeightFormat("fp16-fp32", 16, "fp32"),  # float16 storage, float32 math (fbgemm): rooftop's quantized lm_head
        WeightFormat("bf16-fp32", 16, "fp32"),  # bfloat16 storage, float32 math (rooftop's CPU kernel): bf16 files
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

KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
# the engine's --kv-cache-dtype names (vLLM's) for the same widths; auto: the activations' width; vLLM's alias fp8
# is fp8_e4m3, as the engine takes it (config.KV_CACHE_DTYPE_ALIASES)
KV_BYTES |= {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1}
# a float32 scale per token and KV head (head_dim values), as rooftop's pool stores int8 and fp8_e4m3 (KVPool)
KV_SCALE_BYTES = {"int8": 4, "fp8_e4m3": 4}
# the recurrent state of linear-attention layers (Gated DeltaNet): fp32 in the reference kernels, the default
STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_STATE_DTYPE = "float32"

# What rooftop's engine decides per device: float in the run's dtype; int8 / int4 as Q8_0 / Q4_1 groups on its CPU
# kernels, else per-row int8 / group-32 int4 (quant.linear.linear_kind). Every other choice names one format.
WEIGHT_POLICIES = ("float", "int8", "int4")
WEIGHT_CHOICES = ("auto", *WEIGHT_POLICIES, *(name for name in WEIGHT_FORMATS if name not in WEIGHT_POLICIES))
# On a device rooftop's probe has not measured (a datasheet): float as bf16, int8 per row, int4 per 128 (the engine
# does not run int4 off the CPU: the common layout stands in).
DATASHEET_FORMATS = {"float": "bf16", "int8": "int8", "int4": "int4"}
WEIGHTS_HELP = (
    "auto (the file's own format as rooftop's engine runs it: a bf16 checkpoint as bf16-fp32 on its CPU kernels, "
    "other floats in the run's dtype; on a datasheet device as stored), float (the run's dtype), int8 or int4 (as "
    "rooftop's engine runs them: Q8_0 / Q4_1 groups of 32 on its CPU kernels, else int8 per row / int4 per 32; on a "
    "datasheet device int8 per row, int4 per 128), or an exact format: "
    f"{', '.join(WEIGHT_CHOICES[4:])} (the engine refuses one it does not make here; a file's own block formats "
    "run as stored under auto)"
)


def mixed_format(bytes_by_format: Mapping[str, float] | Mapping[WeightFormat, float], weights: float) -> WeightFormat:
    """One format standing for several (a Q4_K_M file's Q4_K, Q6_K, Q5_0, Q8_0), given by format or by name (the
    engine's linears report names): their mean bits per weight over `weights`, named after all of them, most bytes
    first, with the compute of the one holding the most bytes, and each format as a part with its share of the
    weights (its bytes over its own bits per weight), which does that share of every linear's math at its own peak
    (`compute_shares`). The op model spreads the mix over every block linear alike (a Q4_K_M's Q6_K tensors are
    its V and down projections): a step's bytes and FLOPs at each peak are the file's, one op's are its mean."""
    held = {WEIGHT_FORMATS[f] if isinstance(f, str) else f: b for f, b in bytes_by_format.items()}
    if len(held) == 1:
        return next(iter(held))
    formats = sorted(held, key=held.get, reverse=True)
    counts = {f: held[f] * 8 / f.bits_per_weight() for f in formats}
    parts = tuple((f, counts[f] / sum(counts.values())) for f in formats)
    name = "+".join(f.name for f in formats)
    return WeightFormat(name, sum(held.values()) * 8 / weights, formats[0].compute, parts=parts)


# What rooftop's loader converts a GGUF type outside WEIGHT_FORMATS to (Q2_K, Q3_K, the IQ and ternary types;
# loading.gguf takes it from here): where its engine runs the file (a probed device) the analyzer costs that, elsewhere the
# type as stored, which an engine that runs it as stored (llama.cpp) reads.
CONVERTED_TO = "q4_1"


def converted_types(fmt: WeightFormat) -> tuple[str, ...]:
    """The types of `fmt` (a mix's parts) that rooftop's loader converts to CONVERTED_TO."""
    return tuple(part.name for part, _ in fmt.parts or ((fmt, 1.0),) if part.name not in WEIGHT_FORMATS)


def as_converted(fmt: WeightFormat) -> WeightFormat:
    """`fmt` as rooftop's loader holds it: a type outside WEIGHT_FORMATS as CONVERTED_TO, a mix's parts each so
    (the mix then of the bytes they become)."""
    if not converted_types(fmt):
        return fmt
    held: dict[WeightFormat, float] = {}
    for part, share in fmt.parts or ((fmt, 1.0),):
        part = part if part.name in WEIGHT_FORMATS else WEIGHT_FORMATS[CONVERTED_TO]
        held[part] = held.get(part, 0.0) + share * part.bits_per_weight() / 8
    return mixed_format(held, 1)


def check_weight_choice(choice: str) -> str:
    """`choice` if it is one of WEIGHT_CHOICES, else an InvalidRequestError listing them."""
    if choice not in WEIGHT_CHOICES:
        raise InvalidRequestError(f"unknown weight format {choice!r} (known: {', '.join(WEIGHT_CHOICES)})")
    return choice


def weight_format(
    choice: str | None,
    file_format: WeightFormat | None,
    engine_formats: dict[str, str],
    engine_auto: dict[str, str] | None = None,
) -> str | WeightFormat:
    """The exact format the analyzer models for a `--weights` choice: auto (or none) is the file's format, else
    bf16, as the engine runs it on this device (`engine_auto`, `as_run`); float/int8/int4 are what the engine's
    linears are on this device (`engine_formats`, from the probe), else DATASHEET_FORMATS; an exact format is itself."""
    if choice is None or check_weight_choice(choice) == "auto":
        return as_run(file_format or "bf16", engine_auto or {})
    if choice in WEIGHT_POLICIES:
        return engine_formats.get(choice, DATASHEET_FORMATS[choice])
    return choice


def auto_formats(float_format: str | None, cpu_kernels: bool) -> dict[str, str]:
    """What rooftop's engine runs a float checkpoint's linears as under `--weights auto` on a device it was probed
    on, by the file's format: the float policy's format there (`float_format`: the weights converted to the run's
    dtype), except a bf16 checkpoint's on rooftop's CPU kernels (`cpu_kernels`), which stay bfloat16 with float32
    math (quant.linear.runs_bf16 -> Bf16Linear, bf16-fp32; the engine widens the rare matrix whose inputs are no
    multiple of 32, which this leaves out). Without the engine's float format (a datasheet device, or the
    analyzer's own probe, which builds no linears) a file's floats stay as they are: {}. A bf16 file costed as
    bf16 on a CPU would run at its bf16 matmul peak, which most CPUs emulate, not at the float32 one the engine's
    math runs at."""
    if float_format is None:
        return {}
    run = dict.fromkeys(FLOAT_DTYPES.values(), float_format)
    if cpu_kernels:
        run["bf16"] = "bf16-fp32"
    return run


def as_run(fmt: str | WeightFormat, engine_auto: dict[str, str]) -> str | WeightFormat:
    """`fmt` (a file's format, or its name) as the engine runs it under auto (`auto_formats`): a float format
    it converts is the one it runs; any other (quantized, mixed) runs as stored."""
    name = fmt if isinstance(fmt, str) else fmt.name
    return engine_auto.get(name, fmt)


@dataclass(frozen=True)
class Precision:
    """What a step reads and computes in: weights, KV cache, activations (the compute dtype's width)."""

    weights: WeightFormat
    kv_bytes: int
    activation_bytes: int
    kv_scale_bytes: int = 0  # per head_dim values of one KV head (a quantized cache's scale), beside kv_bytes each
    state_bytes: int = STATE_DTYPES[DEFAULT_STATE_DTYPE]  # linear-attention recurrent state (with_state)
    widen_rows: int | None = None  # prefill chunks of this many tokens or more widen quantized weights to floats
    widen_compute: str | None = None  # the peak those widened chunks run at (default: the activations' float peak)
    lm_head: WeightFormat | None = None  # when the lm_head is held in another format than the other linears
    embedding: WeightFormat | None = None  # when the input embedding table is (a quantized checkpoint's: floats)
    converted: tuple[str, ...] = ()  # a GGUF's types the weights hold as CONVERTED_TO, as rooftop's loader does

    def kv_head_bytes(self, head_dim: int) -> int:
        """Stored bytes of one token's K (or V) in one KV head: its values and their scale."""
        return head_dim * self.kv_bytes + self.kv_scale_bytes

    @property
    def compute(self) -> str:
        return self.weights.compute

    @property
    def activation_compute(self) -> str:
        """The peak that math between activations runs at (attention's scores and weighted sums, a linear-attention
        layer's recurrence): their float width's, whatever the weights are stored in (an fp8 or int4 model's
        attention is not fp8 or int4 math)."""
        return "fp32" if self.activation_bytes == 4 else "bf16"

    def head(self) -> Precision:
        """The precision of the lm_head."""
        return self if self.lm_head is None else replace(self, weights=self.lm_head, lm_head=None)

    def at(self, tokens: int) -> Precision:
        """The precision a step of `tokens` tokens computes in: an engine that widens quantized weights for large
        steps (rooftop's prefill on CPU) does that math at its activations' float peak."""
        if self.widen_rows is None or tokens < self.widen_rows or self.compute in ("fp32", "bf16"):
            return self
        return replace(self, weights=self.weights.computed_at(self.widen_compute or self.activation_compute))

    def with_state(self, dtype: str) -> Precision:
        """The same precision with the recurrent state held in `dtype` (one of STATE_DTYPES)."""
        if dtype not in STATE_DTYPES:
            raise InvalidRequestError(
                f"unknown recurrent state dtype {dtype!r} (known: {', '.join(STATE_DTYPES)})", "state_dtype"
            )
        return replace(self, state_bytes=STATE_DTYPES[dtype])

    @property
    def embedding_format(self) -> WeightFormat:
        return self.embedding or self.weights

    @property
    def embedding_bytes_per_value(self) -> float:
        return self.embedding_format.bits_per_weight() / 8


def as_format(weights: str | WeightFormat) -> WeightFormat:
    """A format, or its name in WEIGHT_FORMATS."""
    if isinstance(weights, WeightFormat):
        return weights
    if weights not in WEIGHT_FORMATS:
        raise InvalidRequestError(f"unknown weight format {weights!r} (known: {', '.join(WEIGHT_FORMATS)})")
    return WEIGHT_FORMATS[weights]


def precision(weights: str | WeightFormat = "bf16", kv: str | None = None, activations: str | None = None) -> Precision:
    """Precision from a format (or its name); the activations are `activations` (fp32 or bf16: what an engine
    computes in on its device) where given, else of the weights' compute width (fp32 or bf16); the KV cache
    defaults to the activations' width, and vLLM's fp8 is fp8_e4m3, as the engine takes it."""
    fmt = as_format(weights)
    activation_bytes = 4 if (activations or fmt.compute) == "fp32" else 2
    kv = kv if kv and kv != "auto" else ("fp32" if activation_bytes == 4 else "bf16")
    kv = KV_CACHE_DTYPE_ALIASES.get(kv, kv)
    if kv not in KV_BYTES:
        known = ", ".join([*KV_BYTES, *KV_CACHE_DTYPE_ALIASES])
        raise InvalidRequestError(f"unknown KV cache format {kv!r} (known: auto, {known})")
    return Precision(
        weights=fmt, kv_bytes=KV_BYTES[kv], activation_bytes=activation_bytes, kv_scale_bytes=KV_SCALE_BYTES.get(kv, 0)
    )


# A config.json's own description of its weights (ModelConfig.torch_dtype, .quantization_config): what the analyzer
# costs when no --weights is given.
FLOAT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
QUANT_METHODS = ("awq", "gptq", "fp8", "compressed-tensors")


@dataclass(frozen=True)
class CheckpointWeights:
    """The formats a checkpoint holds its weights in: the block linears', the input embedding table's, the
    lm_head's (a quantized checkpoint leaves the tables in floats)."""

    linears: WeightFormat
    embedding: WeightFormat
    lm_head: WeightFormat

    def as_run(self, engine_auto: dict[str, str]) -> CheckpointWeights:
        """The formats the engine holds them in under auto (`auto_formats`): a float checkpoint's linears and
        tables converted alike (a bf16 one's lookup table stays bfloat16 beside its bf16-fp32 linears); a
        quantized checkpoint's as the config says (the float rule is only the float policy's)."""
        if self.linears.name not in engine_auto:
            return self
        held = (self.linears, self.embedding, self.lm_head)
        return CheckpointWeights(*(WEIGHT_FORMATS[engine_auto.get(f.name, f.name)] for f in held))

    def precision(self, kv: str | None = None, activations: str | None = None) -> Precision:
        p = precision(self.linears, kv, activations)
        return replace(
            p,
            embedding=None if self.embedding == self.linears else self.embedding,
            lm_head=None if self.lm_head == self.linears else self.lm_head,
        )


def checkpoint_weights(config: ModelConfig) -> CheckpointWeights | None:
    """What a config.json says its weights are: a `quantization_config` (AWQ, GPTQ, FP8, compressed-tensors)
    quantizes the block linears and leaves the embedding table, and unless it says otherwise the lm_head, in the
    float dtype (torch_dtype, else fp16 for AWQ and GPTQ, bf16 for the others); without one, torch_dtype is every weight's format. None when the config
    says neither (a GGUF's header; a bare config.json). An unknown quant_method is refused rather than costed as floats: a
    quantized checkpoint costed at 16 bits would be wrong by 2-4x, silently."""
    dtype = config.torch_dtype
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise UnsupportedModelError(
            f"config.json's dtype {dtype!r} is not a weight format the analyzer knows "
            f"({', '.join(FLOAT_DTYPES)}); pass --weights to choose one"
        )
    q = config.quantization_config
    if q is None:
        return None if dtype is None else CheckpointWeights(*[WEIGHT_FORMATS[FLOAT_DTYPES[dtype]]] * 3)
    method = q.get("quant_method")
    # without a dtype: AWQ's and GPTQ's kernels run in float16, the others in bfloat16
    floats = WEIGHT_FORMATS[FLOAT_DTYPES.get(dtype, "fp16" if method in ("awq", "gptq") else "bf16")]
    if method not in QUANT_METHODS:
        raise UnsupportedModelError(
            f"config.json's quantization_config has quant_method {method!r}, which the analyzer does not cost "
            f"(it costs {', '.join(QUANT_METHODS)}); pass --weights to cost the model in a format of your choice"
        )
    try:
        if method == "fp8":
            linears, head_quantized = _fp8(q), False
        elif method == "compressed-tensors":
            linears, head_quantized = _compressed_tensors(q)
        else:
            linears, head_quantized = _awq_gptq(q, method)
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a field of the wrong shape
        raise UnsupportedModelError(
            f"config.json's {method} quantization_config is malformed ({type(e).__name__}: {e}); "
            "pass --weights to choose a format"
        ) from None
    # tied embeddings: the lm_head is the (float) embedding table
    head = linears if head_quantized and not config.tie_word_embeddings else floats
    return CheckpointWeights(linears, floats, head)


def _one_of(value, allowed: tuple, what: str):
    """`value` if it is one of `allowed`, else an error naming it and the way out."""
    if value not in allowed:
        raise UnsupportedModelError(
            f"config.json's quantization_config: {what} {value!r} is not one the analyzer costs "
            f"({', '.join(map(str, allowed))}); pass --weights to choose a format"
        )
    return value


def _weight_only(bits: int) -> str:
    """The peak of integer weights dequantized into 16-bit math: the int8 kernels' at 8 bits, the int4's below."""
    return "int8_weight_only" if bits == 8 else "int4_weight_only"


def _awq_gptq(q: dict, method: str) -> tuple[WeightFormat, bool]:
    """AWQ and GPTQ: `bits`-bit integers (AutoAWQ's own key: w_bit) with an fp16 scale per `group_size` input
    weights (AutoAWQ: q_group_size; -1: one per output row), plus a packed `bits`-bit zero point per group unless
    symmetric (GPTQ `sym`, AWQ `zero_point` false). GPTQ's g_idx (one int32 per input row, under 1/N of the
    matrix) is left out. The lm_head stays in floats unless GPTQ says `lm_head: true`."""
    bits = _one_of(q.get("bits", q.get("w_bit")), (2, 3, 4, 8), f"{method} bits")
    group = q.get("group_size", q.get("q_group_size", 128))
    if group != -1 and not (isinstance(group, int) and group > 0):
        raise UnsupportedModelError(
            f"config.json's quantization_config: {method} group_size {group!r} is not -1 or >= 1"
        )
    group = 0 if group == -1 else group
    zeros = not q.get("sym", True) if method == "gptq" else q.get("zero_point", True)
    name = f"{method}-int{bits}-" + (f"g{group}" if group else "per-row")
    fmt = WeightFormat(name, bits, _weight_only(bits), group=group, overhead_bits=16 + (bits if zeros else 0))
    return fmt, method == "gptq" and bool(q.get("lm_head"))


def _fp8(q: dict) -> WeightFormat:
    """quant_method "fp8" (transformers' FP8 configs, vLLM's Fp8Config): e4m3 weights and activations, so the
    matmuls run at the fp8 peak, with an fp32 scale per `weight_block_size` block (a 128x128 block's scale is one
    per 16384 weights along a row) or, without blocks, per output row. Its lm_head is never converted."""
    block = q.get("weight_block_size")
    if not block:
        return WEIGHT_FORMATS["fp8"]
    rows, cols = _block(block)
    return WeightFormat(f"fp8-block{rows}x{cols}", 8, "fp8", group=rows * cols, overhead_bits=32)


def _compressed_tensors(q: dict) -> tuple[WeightFormat, bool]:
    """compressed-tensors (llm-compressor): the `weights` scheme of its config_groups (all groups must agree):
    `num_bits` of `type` int or float with one 16-bit scale per tensor, output channel, `group_size` weights or
    `block_structure` block, plus a `num_bits`-bit zero point per scale unless symmetric. Input activations
    quantized to 8 bits put the matmuls on the int8 or fp8 peak (W8A8), else the weights are dequantized into
    16-bit math. The lm_head is quantized unless the `ignore` list names it (by name or a "re:" pattern)."""
    groups = {name: group for name, group in (q.get("config_groups") or {}).items() if group.get("weights")}
    schemes = [group["weights"] for group in groups.values()]
    if not schemes or any(w != schemes[0] for w in schemes):
        found = ", ".join(
            f"{name}: {g['weights'].get('type')}{g['weights'].get('num_bits')}" for name, g in groups.items()
        )
        raise UnsupportedModelError(
            "config.json's compressed-tensors quantization_config needs one weights scheme across its config_groups "
            f"(found {found or 'none'}); pass --weights to choose a format"
        )
    w, acts = schemes[0], next(iter(groups.values())).get("input_activations") or {}
    kind = _one_of(w.get("type", "int"), ("int", "float"), "compressed-tensors weights type")
    bits = _one_of(w.get("num_bits"), (4, 8), "compressed-tensors weights num_bits")
    group, label = _ct_scales(w)
    overhead = 0 if label == "tensor" else 16 + (0 if w.get("symmetric", True) else bits)  # per tensor: nothing per row
    act_bits = acts.get("num_bits") or 16
    if act_bits == 8:
        compute = "fp8" if acts.get("type", "int") == "float" else "int8"
    else:
        compute = "fp8_weight_only" if kind == "float" else _weight_only(bits)
    prefix = "fp" if kind == "float" else "int"
    fmt = WeightFormat(f"ct-w{bits}a{act_bits}-{prefix}{bits}-{label}", bits, compute, group, overhead)
    return fmt, not any(_names(entry, "lm_head") for entry in q.get("ignore") or [])


def _ct_scales(w: dict) -> tuple[int, str]:
    """The weights a compressed-tensors scale covers along a row (0: a whole row, WeightFormat.group), and a label."""
    strategy = w.get("strategy", "tensor")
    if strategy in ("tensor", "channel"):
        return 0, strategy
    if strategy == "group":
        group = w.get("group_size")
        if not (isinstance(group, int) and group > 0):
            raise UnsupportedModelError(f"config.json's compressed-tensors group_size {group!r} is not >= 1")
        return group, f"g{group}"
    if strategy == "block":
        rows, cols = _block(w.get("block_structure"))
        return rows * cols, f"block{rows}x{cols}"
    raise UnsupportedModelError(
        f"config.json's compressed-tensors weights strategy {strategy!r} is not one the analyzer costs "
        "(tensor, channel, group, block); pass --weights to choose a format"
    )


def _block(block) -> tuple[int, int]:
    """A [rows, cols] block of weights sharing one scale."""
    if not (isinstance(block, list | tuple) and len(block) == 2 and all(isinstance(n, int) and n > 0 for n in block)):
        raise ValueError(f"a scale block must be [rows, cols] of positive integers, got {block!r}")
    return block[0], block[1]


def _names(entry: str, module: str) -> bool:
    """A compressed-tensors ignore entry naming `module`: its name (or a dotted path ending in it), or "re:" and a
    regular expression matching it (re.match, as compressed-tensors does)."""
    if entry.startswith("re:"):
        return re.match(entry[3:], module) is not None
    return entry == module or entry.endswith("." + module)
