"""Dummy weights (vLLM's `--load-format dummy`): a model's config from a preset, a config.json, a Hugging Face
directory's config.json or a GGUF header, and seeded random weights made when the model asks for each tensor.
From a GGUF each matrix is made in the form a real load of the file gives it (its block format's random bytes, its
integer groups, its float dtype), so the weight policy, the kernels and the report run as they would on the file.

No weight file is read, so a model whose weights are not here can still be run (its speed, its memory, what the
engine does with its shapes) and one too big for this machine can still be built and analyzed: the LoadedModel
allocates nothing until `build_model` takes each tensor, and on the meta device not even then.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from rooftop.config import FULL_ATTENTION, ModelConfig, is_runnable
from rooftop.errors import InvalidRequestError, ModelLoadError
from rooftop.loading.bundled import bundled_model_path
from rooftop.loading.gguf import (
    GROUP_TYPES,
    converted,
    converted_types,
    hf_name,
    linear_value_order,
    native_format,
    split_experts,
)
from rooftop.loading.gguf_config import config_from_gguf
from rooftop.loading.gguf_file import TensorInfo, read_gguf
from rooftop.loading.hf_config import read_hf_config, read_json
from rooftop.loading.loaded import LazyWeights, LoadedModel
from rooftop.loading.shard import Shard, shard_weight
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.gguf_blocks import STORED_TYPES, dequantize
from rooftop.quant.linear import FLOAT_FORMATS, as_file_choice, weight_policy
from rooftop.quant.weights import BLOCK_FORMATS, GROUP, BlockWeight, Int4Weight, Int8GroupWeight, Weight
from rooftop.roofline.api import gguf_weights
from rooftop.roofline.ops import weight_bytes
from rooftop.roofline.precision import WEIGHT_FORMATS, precision
from rooftop.roofline.presets import find_preset

DRAW_ROWS = 1024  # rows of a matrix drawn from one generator on the CPU (`drawn`)
# transformers' initializer_range: a random model's activations and logits stay in a sane range at any depth
STD = 0.02
# Group scales that give integer weights the same spread: (q - 8) with q uniform in 0..15 has a standard deviation
# of sqrt((16² - 1) / 12) ≈ 4.61 steps, q uniform in -127..127 one of sqrt((255² - 1) / 12) ≈ 73.6.
INT4_SCALE = STD / 4.61
INT8_SCALE = STD / 73.6
CPU = torch.device("cpu")
# The fewest bytes a policy's weights take (the analyzer's count): floats at 16 bits, int8 as Q8_0, int4 as Q4_1
SMALLEST_FORMAT = {"float": "bf16", "int8": "q8_0", "int4": "q4_1"}
# A GGUF matrix's form (file_form) as the analyzer's format where its name is not one (the block formats are)
FILE_FORMATS = SMALLEST_FORMAT | {"bf16": "bf16"}


def _level_std(levels: int) -> float:
    """The standard deviation of a level drawn uniformly from `levels` values (what random bytes give)."""
    return math.sqrt((levels * levels - 1) / 12)


def _halves(*values: float) -> tuple[bytes, ...]:
    """Float16 fields' bytes, one per block of a cycle."""
    return tuple(torch.tensor([v], dtype=torch.float16).view(torch.uint8).numpy().tobytes() for v in values)


@dataclass(frozen=True)
class Fixed:
    """A field of a block format that random bytes would make wrong (a float16 scale: NaN, infinity, or a spread far
    from STD's): the bytes it holds instead at `offset`, block after block, repeating `cycle`."""

    offset: int
    cycle: tuple[bytes, ...]


# Step sizes that give each format's levels (uniform random bits) a standard deviation of STD
_Q4, _Q5, _Q6 = STD / _level_std(16), STD / _level_std(32), STD / _level_std(64)
# Q4_K's and Q5_K's 12 bytes of 6-bit sub-block scales and mins, all 1 (packed as gguf_quantize's
# _pack_scales_mins_6bit packs them: 0-3 scales, 4-7 mins, 8-11 the low nibbles of scales and mins 4-7)
_K_SCALES = bytes([1] * 8 + [0x11] * 4)
# Each stored format's fixed fields, set so its values centre on 0: the symmetric formats' levels (d·(q - 8),
# d·(q - 16), Q6_K's d·sc·(q - 32)) average -d/2, cancelled by a scale that alternates in sign block by block (or
# sub-block by sub-block: Q6_K's int8 scales) as llama.cpp's own signed scales do; the asymmetric ones' minimum
# is minus the levels' mean (Q5_1: m = -15.5·d; Q4_K, Q5_K: dmin·m = 7.5·d·sc, 15.5·d·sc).
BLOCK_FIELDS = {
    "q4_0": (Fixed(0, _halves(_Q4, -_Q4)),),
    "q5_0": (Fixed(0, _halves(_Q5, -_Q5)),),
    "q5_1": (Fixed(0, _halves(_Q5)), Fixed(2, _halves(-15.5 * _Q5))),
    "q4_k": (Fixed(0, _halves(_Q4)), Fixed(2, _halves(7.5 * _Q4)), Fixed(4, (_K_SCALES,))),
    "q5_k": (Fixed(0, _halves(_Q5)), Fixed(2, _halves(15.5 * _Q5)), Fixed(4, (_K_SCALES,))),
    "q6_k": (Fixed(192, (bytes([1, 255] * 8),)), Fixed(208, _halves(_Q6))),
}


def tensor_shapes(config: ModelConfig, from_gguf: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor `build_model` takes, under its Hugging Face name: lm_head only when the embeddings are not tied,
    q/k norms for qk_norm (Qwen3), q/k/v biases for attention_bias (Qwen2), the router and each expert's MLP for
    Qwen3-MoE, Qwen3.5's and Qwen3-Next's layer types (`from_gguf`: Qwen3-Next's as its GGUFs hold them). Nothing
    for a model the engine does not run: it would build none, and the analyzer needs only the config."""
    if not is_runnable(config):
        return {}
    d, qs, kvs = config.hidden_size, config.q_size, config.kv_size
    shapes = {"model.embed_tokens.weight": (config.vocab_size, d), "model.norm.weight": (d,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    for i in range(config.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        if config.architecture in ("qwen3_5", "qwen3_next"):
            shapes |= _hybrid_shapes(config, i, from_gguf)
            continue
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            a + "q_proj.weight": (qs, d),
            a + "k_proj.weight": (kvs, d),
            a + "v_proj.weight": (kvs, d),
            a + "o_proj.weight": (d, qs),
        }
        if config.is_moe:
            shapes[p + "mlp.gate.weight"] = (config.num_experts, d)
            for e in range(config.num_experts):
                shapes |= _mlp_shapes(f"{p}mlp.experts.{e}.", d, config.moe_intermediate_size)
        else:
            shapes |= _mlp_shapes(p + "mlp.", d, config.intermediate_size)
        if config.qk_norm:
            shapes |= {a + "q_norm.weight": (config.head_dim,), a + "k_norm.weight": (config.head_dim,)}
        if config.attention_bias:
            shapes |= {a + "q_proj.bias": (qs,), a + "k_proj.bias": (kvs,), a + "v_proj.bias": (kvs,)}
    return shapes


def _hybrid_shapes(config: ModelConfig, i: int, from_gguf: bool) -> dict[str, tuple[int, ...]]:
    """Layer i of Qwen3.5 or Qwen3-Next: Gated DeltaNet or gated attention (q_proj twice as wide: each head's gate),
    then the MLP (Qwen3-Next: router, experts, shared expert and its gate). Qwen3-Next's in_proj_qkvz is split in
    its GGUFs (`from_gguf`) into in_proj_qkv and in_proj_z, as llama.cpp's converter writes it."""
    d, p, la = config.hidden_size, f"model.layers.{i}.", config.linear_attention
    shapes = {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)}
    if config.is_moe:
        shapes[p + "mlp.gate.weight"] = (config.num_experts, d)
        for e in range(config.num_experts):
            shapes |= _mlp_shapes(f"{p}mlp.experts.{e}.", d, config.moe_intermediate_size)
        shapes |= _mlp_shapes(p + "mlp.shared_expert.", d, config.shared_expert_intermediate_size)
        shapes[p + "mlp.shared_expert_gate.weight"] = (1, d)
    else:
        shapes |= _mlp_shapes(p + "mlp.", d, config.intermediate_size)
    if config.layer_types[i] == FULL_ATTENTION:
        a, hd, kvs = p + "self_attn.", config.head_dim, config.kv_size
        return shapes | {
            a + "q_proj.weight": (2 * config.q_size, d),
            a + "k_proj.weight": (kvs, d),
            a + "v_proj.weight": (kvs, d),
            a + "o_proj.weight": (d, config.q_size),
            a + "q_norm.weight": (hd,),
            a + "k_norm.weight": (hd,),
        }
    a, heads, value_dim = p + "linear_attn.", la.num_value_heads, la.num_value_heads * la.value_head_dim
    if config.architecture == "qwen3_next" and from_gguf:
        projections = {
            a + "in_proj_qkv.weight": (la.conv_channels, d),
            a + "in_proj_z.weight": (value_dim, d),
            a + "in_proj_ba.weight": (2 * heads, d),
        }
    elif config.architecture == "qwen3_next":
        projections = {
            a + "in_proj_qkvz.weight": (la.conv_channels + value_dim, d),
            a + "in_proj_ba.weight": (2 * heads, d),
        }
    else:
        projections = {
            a + "in_proj_qkv.weight": (la.conv_channels, d),
            a + "in_proj_z.weight": (value_dim, d),
            a + "in_proj_b.weight": (heads, d),
            a + "in_proj_a.weight": (heads, d),
        }
    return (
        shapes
        | projections
        | {
            a + "conv1d.weight": (la.conv_channels, 1, la.conv_kernel_dim),
            a + "A_log": (heads,),
            a + "dt_bias": (heads,),
            a + "norm.weight": (la.value_head_dim,),
            a + "out_proj.weight": (d, value_dim),
        }
    )


def _mlp_shapes(p: str, d: int, ff: int) -> dict[str, tuple[int, ...]]:
    return {p + "gate_proj.weight": (ff, d), p + "up_proj.weight": (ff, d), p + "down_proj.weight": (d, ff)}


def tensor_form(name: str, shape: tuple[int, ...], policy: str, device: torch.device) -> str:
    """What a tensor is made as: "int4" / "int8" groups where `build_model` keeps a file's groups (a quantized
    policy on the CPU), so that no float32 copy is ever made and quantized; "norm" (ones, as transformers
    initializes them) or "float" otherwise. The embedding (and so a tied lm_head) is int8 groups under either
    quantized policy, as a GGUF's token_embd usually is: it becomes the Q8_0 lm_head as it is. A mixture of experts'
    router (mlp.gate) is always float: its logits pick the experts."""
    if len(shape) == 1:
        return "norm" if name.endswith("norm.weight") else "float"
    if (
        policy == "float"
        or device.type != "cpu"
        or shape[1] % GROUP
        or name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
    ):
        return "float"
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return "int8"
    return policy


def file_form(t: TensorInfo) -> str:
    """What a GGUF's matrix is made as, following read_matrix: its block format (q4_k, ...), "int8" for Q8_0, "int4"
    for Q4_1 and for the types the kernels do not run (as `auto` holds them: CONVERTED_TO), "bf16" for BF16 (drawn
    and held as bfloat16), "float" for the other float types."""
    if t.qtype in STORED_TYPES:
        return STORED_TYPES[t.qtype]
    if t.qtype in GROUP_TYPES:
        return "int8" if t.qtype == QType.Q8_0 else "int4"
    if t.qtype == QType.BF16:
        return "bf16"
    return "int4" if converted(t) else "float"


def random_weight(
    name: str,
    shape: tuple[int, ...],
    form: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    shard: Shard | None = None,
    values: torch.dtype | None = None,
) -> Weight:
    """One tensor, from a generator seeded by `seed` and the tensor's name: the same whatever order the model
    asks in. Floats are made on `device` (random values differ between a CPU and a CUDA generator) in `values`, the
    checkpoint's own float dtype, where given, as a checkpoint's tensor of that dtype is read (a bf16 checkpoint's:
    the model keeps it bfloat16 where it runs bf16-fp32, and widens it elsewhere), else in `dtype`; on the meta
    device only the shape exists. Integer groups and a block format's rows (`form` one of BLOCK_FORMATS) are made
    on the CPU, where a file's are read. A `shard` is cut from the whole tensor, so every rank's part is the part of
    the weights a single device gets."""
    if shard is not None:
        return shard_weight(random_weight(name, shape, form, dtype, device, seed, values=values), shard, name)
    if form == "norm":
        return torch.ones(shape, dtype=dtype, device=device)
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    check_room(name, shape, form, values or dtype, device if form == "float" else CPU)
    key = f"{seed}:{name}"
    if form in BLOCK_FORMATS:
        return random_blocks(shape, form, key)
    if form == "float":
        # drawn in the checkpoint's dtype and held in it, as a file's tensor is read: the model widens it where needed
        out = torch.empty(shape, dtype=values or dtype, device=device)
        return drawn(out, key, lambda gen, rows: torch.normal(0.0, STD, rows.shape, generator=gen, out=rows))
    rows, cols = shape
    if form == "int4":
        q = drawn(
            torch.empty(shape, dtype=torch.uint8),
            key,
            lambda gen, r: torch.randint(0, 16, r.shape, generator=gen, out=r),
        )
        scale = torch.full((rows, cols // GROUP), INT4_SCALE)
        return Int4Weight(q, scale, scale / 2)  # (q - 8)·s + s/2: centred on 0
    q = drawn(
        torch.empty(shape, dtype=torch.int8),
        key,
        lambda gen, r: torch.randint(-127, 128, r.shape, generator=gen, out=r),
    )
    return Int8GroupWeight(q, torch.full((rows, cols // GROUP), INT8_SCALE))


def random_blocks(shape: tuple[int, ...], fmt: str, key: str) -> BlockWeight:
    """A matrix in block format `fmt` as a file's rows of blocks: random bytes (uniform levels and high bits), then
    the format's scale fields (BLOCK_FIELDS) written over them, so the values are finite, centred on 0 with a
    spread of about STD, and the bytes are made at the generator's speed, never as floats."""
    rows, cols = shape
    block, block_bytes = GGML_QUANT_SIZES[QType[fmt.upper()]]
    blocks = cols // block
    fixed = [(f.offset, _cycled(f.cycle, blocks)) for f in BLOCK_FIELDS[fmt]]

    def fill(gen: torch.Generator, part: torch.Tensor) -> None:
        _random_bytes(gen, part)
        laid = part.view(part.shape[0], blocks, block_bytes)
        for offset, values in fixed:
            laid[:, :, offset : offset + values.shape[1]] = values

    out = drawn(torch.empty((rows, blocks * block_bytes), dtype=torch.uint8), key, fill)
    return BlockWeight((out,), fmt, cols)


def _cycled(cycle: tuple[bytes, ...], blocks: int) -> torch.Tensor:
    """A field's bytes for each of `blocks` blocks (blocks, field bytes), `cycle` repeated."""
    one = torch.frombuffer(bytearray(b"".join(cycle)), dtype=torch.uint8).reshape(len(cycle), -1)
    return one.repeat(-(-blocks // len(cycle)), 1)[:blocks]


def _random_bytes(gen: torch.Generator, out: torch.Tensor) -> None:
    """`out` (contiguous uint8) filled with uniform random bytes, drawn 8 at a time (a 64-bit draw costs what a
    byte's does): in place where its bytes are whole aligned words, else into words copied over; the same bytes
    either way."""
    flat = out.view(-1)
    whole = flat.numel() % 8 == 0 and flat.storage_offset() % 8 == 0
    words = flat.view(torch.int64) if whole else torch.empty(-(-flat.numel() // 8), dtype=torch.int64)
    words.random_(-(2**63), None, generator=gen)
    if not whole:
        flat.copy_(words.view(torch.uint8)[: flat.numel()])


def drawn(out: torch.Tensor, key: str, fill: Callable[[torch.Generator, torch.Tensor], object]) -> torch.Tensor:
    """`out` filled by `fill(generator, rows)`: on the CPU DRAW_ROWS rows at a time, each block from a generator of
    its own seeded by `key` and its first row, the blocks shared among as many threads as PyTorch's ops use (a CPU
    generator draws on one core: an 8B's weights took most of a minute); elsewhere in one call. The values depend on
    `key` and the shape alone, never on the threads."""
    if out.device.type != "cpu":
        fill(_generator(key, out.device), out)
        return out
    starts = range(0, max(1, out.shape[0]), DRAW_ROWS)
    with ThreadPoolExecutor(torch.get_num_threads()) as pool:
        list(pool.map(lambda r: fill(_generator(f"{key}:{r}", out.device), out[r : r + DRAW_ROWS]), starts))
    return out


def _generator(key: str, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    return gen.manual_seed(zlib.crc32(key.encode()))  # CPU generators keep a seed's low 32 bits only


@dataclass
class Source:
    """What a dummy model takes from where `--model` points: everything but weights."""

    config: ModelConfig
    name: str  # the path or the preset name, as LoadedModel.source
    native_format: str = "float"  # a GGUF's closest weight format (what --weights auto then makes)
    tokenizer: Tokenizer | None = None  # the file's own, where it has one
    from_gguf: bool = False  # a GGUF's header: its tensors are laid out as llama.cpp's converter writes them
    forms: dict[str, str] = field(default_factory=dict)  # a GGUF's: HF name -> each matrix's form (file_form)
    converted_types: dict[str, str] = field(default_factory=dict)  # a GGUF's matrices the kernels do not run
    file_format: str | None = None  # a GGUF's blocks' format(s) (LoadedModel.file_format)

    @property
    def values(self) -> torch.dtype | None:
        """The float dtype whose values dummy floats take: the checkpoint's (config.json's torch_dtype; a preset's
        is bf16, as the analyzer costs it), so that a dummy model runs the path its real weights
        would (a bf16 checkpoint's linears as bf16-fp32 under auto on the CPU). None: float32 draws as they are."""
        return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.config.torch_dtype)


def _gguf_source(path: Path) -> Source:
    """A GGUF's config, weight format, tokenizer and each matrix's type, all from its header, under the names
    load_gguf gives them (an expert stack split per expert); `rope_freqs` (a config value GGUF stores as a tensor of
    a few hundred bytes) is the one tensor read."""
    gguf_file = read_gguf(path)
    config = config_from_gguf(gguf_file)
    tensors = [part for t in gguf_file.tensors for part in split_experts(t)]
    forms = {}
    for t in tensors:
        if t.name == "rope_freqs.weight":
            config.rope_freq_factors = dequantize(t.data, t.qtype, t.shape, t.name).tolist()
        elif len(t.shape) == 2 and (name := hf_name(t.name)) is not None:
            forms[name] = file_form(t)
    tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    return Source(
        config,
        str(path),
        native_format(tensors),
        tokenizer,
        from_gguf=True,
        forms=forms,
        converted_types=converted_types(tensors),
        file_format=held.name if (held := gguf_weights(tensors)) else None,
    )


def _hf_source(path: Path) -> Source:
    """A Hugging Face directory's config.json (and generation_config.json) and, where it has one, tokenizer.json."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: no config.json (is this a Hugging Face model directory?)")
    generation = read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    config = read_hf_config(path / "config.json", generation)
    if not (path / "tokenizer.json").is_file():
        return Source(config, str(path))
    tokenizer = Tokenizer.from_hf_dir(path, config.eos_token_ids)
    config.eos_token_ids = config.eos_token_ids or tokenizer.eos_token_ids
    return Source(config, str(path), tokenizer=tokenizer)


def find_source(model: str | Path | None) -> Source:
    """The bundled model (None), a GGUF file, an HF directory, a config.json, or a preset name of the analyzer."""
    path = bundled_model_path() if model is None else Path(model)
    if path.is_dir():
        return _hf_source(path)
    if path.is_file():
        return Source(read_hf_config(path), str(path)) if path.suffix == ".json" else _gguf_source(path)
    try:
        return Source(find_preset(str(model)), str(model))
    except InvalidRequestError as e:
        raise ModelLoadError(f"{model}: no such file or directory, and {e}") from None


def bundled_tokenizer(config: ModelConfig) -> Tokenizer:
    """SmolLM2's tokenizer for a source without one, ending generation at the config's EOS ids (not SmolLM2's):
    text prompts work on any vocabulary, and ids past SmolLM2's detokenize as `<id:N>`."""
    tokenizer = Tokenizer.from_gguf_metadata(read_gguf(bundled_model_path()).metadata)
    return replace(tokenizer, eos_token_ids=list(config.eos_token_ids))


def available_bytes(device: torch.device) -> int | None:
    """The memory a model built now may take on `device`: a GPU's free memory, the host's MemAvailable (free pages
    and the caches the kernel can drop) for the CPU; None where it is not known (the meta device)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def made_bytes(shape: tuple[int, ...], form: str, dtype: torch.dtype) -> int:
    """The bytes a tensor takes as it is made: a float tensor in `dtype`; an integer form's levels a byte each, with
    float32 scales per group; a block format's rows of blocks as the file holds them."""
    count = math.prod(shape)
    if form == "float":
        return count * dtype.itemsize
    if form in BLOCK_FORMATS:
        block, block_bytes = GGML_QUANT_SIZES[QType[form.upper()]]
        return count // block * block_bytes
    return count + count // GROUP * 4 * (2 if form == "int4" else 1)


def check_room(name: str, shape: tuple[int, ...], form: str, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse one tensor the device has no memory left for (made_bytes): check_fits counts the weights as the model
    holds them, but while they are made a tensor exists in its drawn form too, and the kernel kills a process that
    runs out, silently."""
    available = available_bytes(device)
    need = made_bytes(shape, form, dtype)
    if available is not None and need > available:
        raise ModelLoadError(
            f"{name}: making this dummy tensor needs {need / 1e9:.2f} GB on {device.type}, and "
            f"{available / 1e9:.2f} GB is left: the weights do not fit while they are made; fewer bits per weight "
            "(--weights int4) or a bigger device would hold them"
        )


class DummyWeights(LazyWeights):
    """A dummy's readers, and the shape and form (file_form) of each of a GGUF's matrices, known before any is made:
    what check_fits counts them as."""

    def __init__(
        self, readers: dict[str, Callable[[Shard | None], Weight]], matrices: dict[str, tuple[tuple[int, ...], str]]
    ):
        super().__init__(readers)
        self.matrices = matrices


def held_formats(matrices: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, float]:
    """The bytes of a GGUF's matrices by the analyzer's format, each as `--weights auto` holds it: its block format,
    Q8_0 and Q4_1 groups as themselves, a float at 16 bits (the fewest any float takes)."""
    held: dict[str, float] = {}
    for (rows, cols), form in matrices.values():
        fmt = FILE_FORMATS.get(form, form)
        held[fmt] = held.get(fmt, 0.0) + WEIGHT_FORMATS[fmt].linear_bytes(cols, rows)
    return held


def check_fits(loaded: LoadedModel, weights: str, device: torch.device, dtype: torch.dtype, ranks: int = 1) -> None:
    """Refuse dummy weights that cannot fit on `device` before a tensor is made: the fewest bytes the `weights`
    choice's tensors take there against the memory available — a GGUF's matrices under auto each in the format the
    file holds it in (held_formats), else every matrix in the policy's smallest format (SMALLEST_FORMAT, by the
    analyzer's count). A model too big for this machine would otherwise be built tensor by tensor until the kernel
    killed the process, with no message. Tensor-parallel ranks on the CPU share the host's memory; on GPUs each
    holds its share."""
    available = available_bytes(device)
    if available is None or not is_runnable(loaded.config):
        return
    weights = as_file_choice(weights, loaded.file_format, device)
    policy = weight_policy(weights, loaded.native_format, device, dtype)
    auto = weights == "auto" and isinstance(loaded.weights, DummyWeights)
    matrices = loaded.weights.matrices if auto else {}
    if matrices:
        held = held_formats(matrices)
        need, fmt = sum(held.values()), "+".join(sorted(held, key=held.get, reverse=True))
    else:  # floats a choice names are widened to the model's dtype; auto keeps a bf16 checkpoint's
        fmt = FLOAT_FORMATS[dtype] if policy == "float" and weights != "auto" else SMALLEST_FORMAT[policy]
        need = weight_bytes(loaded.config, precision(fmt))
    need /= ranks if device.type == "cuda" else 1
    if need > available:
        per = f" per GPU of {ranks}" if device.type == "cuda" and ranks > 1 else ""
        ways = ["fewer bits per weight (--weights int4)"] if policy != "int4" else []
        ways += ["tensor parallelism over GPUs"] if loaded.config.can_split else []
        ways = ", ".join(ways) + (" or " if ways else "") + "a bigger device"
        raise ModelLoadError(
            f"{loaded.source}: its {policy} weights take at least {need / 1e9:.1f} GB{per} (as {fmt}), but "
            f"{available / 1e9:.1f} GB of memory is available on {device.type}; {ways} would hold them, and "
            f"`rooftop roofline -m {loaded.source}` analyzes the model without any"
        )


def load_dummy(
    model: str | Path | None, weights: str, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> LoadedModel:
    """`model`'s config and tokenizer, and a reader per tensor that makes it at random when the model asks, in the
    form the `weights` choice runs on `device` (int4/int8 groups as integers with group scales, floats in `dtype`),
    and a GGUF's matrices in the form a load of the file gives them (file_form), whatever the choice: the choice
    then acts on them as on the file's. Loading reads no weight file and allocates no tensor; a model the engine
    does not run loads its config (and no tensors), and `build_model` refuses it."""
    return dummy_weights(find_source(model), weights, device, dtype, seed)


def made_as(
    source: Source, name: str, shape: tuple[int, ...], policy: str, device: torch.device
) -> tuple[str, torch.dtype | None]:
    """A tensor's form and float values (random_weight's): a GGUF's matrix as its file holds it (a BF16 one drawn
    in bfloat16, other float types in the model's dtype, which the file's float32 is converted to), anything else
    as the policy runs it (tensor_form) in the checkpoint's values."""
    form = source.forms.get(name) if len(shape) == 2 else None
    if form is None:
        return tensor_form(name, shape, policy, device), source.values
    return ("float", torch.bfloat16) if form == "bf16" else (form, None)


def dummy_weights(source: Source, weights: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """load_dummy for a source already in hand (e.g. a preset's config changed in code, as benchmarks/moe.py does)."""
    file_format = source.file_format or ("bf16" if source.values == torch.bfloat16 else None)
    policy = weight_policy(as_file_choice(weights, file_format, device), source.native_format, device, dtype)
    readers, matrices = {}, {}
    for name, shape in tensor_shapes(source.config, source.from_gguf).items():
        form, values = made_as(source, name, shape, policy, device)
        readers[name] = partial(random_weight, name, shape, form, dtype, device, seed, values=values)
        if name in source.forms and len(shape) == 2:
            matrices[name] = (shape, source.forms[name])
    tokenizer = source.tokenizer or bundled_tokenizer(source.config)
    order = linear_value_order(source.config) if source.from_gguf else "grouped"
    return LoadedModel(
        source.config,
        DummyWeights(readers, matrices),
        tokenizer,
        source.name,
        source.native_format,
        source.converted_types,
        linear_value_order=order,
        file_format=file_format,
    )
