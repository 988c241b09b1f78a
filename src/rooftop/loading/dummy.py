"""Dummy weights (vLLM's `--load-format dummy`): a model's config from a preset, a config.json, a Hugging Face
directory's config.json or a GGUF header, and seeded random weights made when the model asks for each tensor.

No weight file is read, so a model whose weights are not here can still be run (its speed, its memory, what the
engine does with its shapes) and one too big for this machine can still be built and analyzed: the LoadedModel
allocates nothing until `build_model` takes each tensor, and on the meta device not even then.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from rooftop.config import FULL_ATTENTION, ModelConfig, is_runnable
from rooftop.errors import InvalidRequestError, ModelLoadError
from rooftop.loading.bundled import bundled_model_path
from rooftop.loading.gguf import native_format
from rooftop.loading.gguf_config import config_from_gguf
from rooftop.loading.gguf_file import read_gguf
from rooftop.loading.hf_config import read_hf_config, read_json
from rooftop.loading.loaded import LazyWeights, LoadedModel
from rooftop.loading.shard import Shard, shard_weight
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.gguf_blocks import dequantize
from rooftop.quant.linear import weight_policy
from rooftop.quant.weights import GROUP, Int4Weight, Int8GroupWeight, Weight
from rooftop.roofline.ops import weight_bytes
from rooftop.roofline.precision import precision
from rooftop.roofline.presets import find_preset

DRAW_ROWS = 1024  # rows of a matrix drawn from one generator on the CPU (`drawn`)
# transformers' initializer_range: a random model's activations and logits stay in a sane range at any depth
STD = 0.02
# Group scales that give integer weights the same spread: (q - 8) with q uniform in 0..15 has a standard deviation
# of sqrt((16² - 1) / 12) ≈ 4.61 steps, q uniform in -127..127 one of sqrt((255² - 1) / 12) ≈ 73.6.
INT4_SCALE = STD / 4.61
INT8_SCALE = STD / 73.6
# The fewest bytes a policy's weights take (the analyzer's count): floats at 16 bits, int8 as Q8_0, int4 as Q4_1
SMALLEST_FORMAT = {"float": "bf16", "int8": "q8_0", "int4": "q4_1"}


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor `build_model` takes, under its Hugging Face name: lm_head only when the embeddings are not tied,
    q/k norms for qk_norm (Qwen3), q/k/v biases for attention_bias (Qwen2), the router and each expert's MLP for
    Qwen3-MoE, Qwen3.5's and Qwen3-Next's layer types. Nothing for a model the engine does not run: it would build
    none, and the analyzer needs only the config."""
    if not is_runnable(config):
        return {}
    d, qs, kvs = config.hidden_size, config.q_size, config.kv_size
    shapes = {"model.embed_tokens.weight": (config.vocab_size, d), "model.norm.weight": (d,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    for i in range(config.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        if config.architecture in ("qwen3_5", "qwen3_next"):
            shapes |= _hybrid_shapes(config, i)
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


def _hybrid_shapes(config: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i of Qwen3.5 or Qwen3-Next: Gated DeltaNet or gated attention (q_proj twice as wide: each head's gate),
    then the MLP (Qwen3-Next: router, experts, shared expert and its gate)."""
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
    if config.architecture == "qwen3_next":
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
    device only the shape exists. A `shard` is cut from the whole tensor, so every rank's part is the part of the
    weights a single device gets."""
    if shard is not None:
        return shard_weight(random_weight(name, shape, form, dtype, device, seed, values=values), shard, name)
    if form == "norm":
        return torch.ones(shape, dtype=dtype, device=device)
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    check_room(name, shape, form, values or dtype, device)
    key = f"{seed}:{name}"
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
    float_dtype: str | None = None  # the checkpoint's float dtype where the config does not say (a preset's)

    @property
    def values(self) -> torch.dtype | None:
        """The float dtype whose values dummy floats take: the checkpoint's (config.json's torch_dtype; a preset's
        checkpoints are bf16, as the analyzer costs them), so that a dummy model runs the path its real weights
        would (a bf16 checkpoint's linears as bf16-fp32 under auto on the CPU). None: float32 draws as they are."""
        dtype = self.config.torch_dtype or self.float_dtype
        return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)


def _gguf_source(path: Path) -> Source:
    """A GGUF's config, weight format and tokenizer, all from its header; `rope_freqs` (a config value GGUF stores
    as a tensor of a few hundred bytes) is the one tensor read."""
    gguf_file = read_gguf(path)
    config = config_from_gguf(gguf_file)
    for t in gguf_file.tensors:
        if t.name == "rope_freqs.weight":
            config.rope_freq_factors = dequantize(t.data, t.qtype, t.shape, t.name).tolist()
    tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    return Source(config, str(path), native_format(gguf_file.tensors), tokenizer)


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
        return Source(find_preset(str(model)), str(model), float_dtype="bfloat16")
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


def check_room(name: str, shape: tuple[int, ...], form: str, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse one tensor the device has no memory left for (a float tensor in `dtype`; an integer form's levels a
    byte each, with float32 scales per group): check_fits counts the weights as the model holds them, but while
    they are made a tensor exists in its drawn form too, and the kernel kills a process that runs out, silently."""
    available = available_bytes(device)
    count = math.prod(shape)
    need = count * dtype.itemsize if form == "float" else count + count // GROUP * 4 * (2 if form == "int4" else 1)
    if available is not None and need > available:
        raise ModelLoadError(
            f"{name}: making this dummy tensor needs {need / 1e9:.2f} GB on {device.type}, and "
            f"{available / 1e9:.2f} GB is left: the weights do not fit while they are made; fewer bits per weight "
            "(--weights int4) or a bigger device would hold them"
        )


def check_fits(loaded: LoadedModel, weights: str, device: torch.device, dtype: torch.dtype, ranks: int = 1) -> None:
    """Refuse dummy weights that cannot fit on `device` before a tensor is made: the fewest bytes the `weights`
    choice's tensors take there (SMALLEST_FORMAT, by the analyzer's count) against the memory available. A model too
    big for this machine would otherwise be built tensor by tensor until the kernel killed the process, with no
    message. Tensor-parallel ranks on the CPU share the host's memory; on GPUs each holds its share."""
    available = available_bytes(device)
    if available is None or not is_runnable(loaded.config):
        return
    policy = weight_policy(weights, loaded.native_format, device, dtype)
    fmt = SMALLEST_FORMAT[policy]
    need = weight_bytes(loaded.config, precision(fmt)) / (ranks if device.type == "cuda" else 1)
    if need > available:
        per = f" per GPU of {ranks}" if device.type == "cuda" and ranks > 1 else ""
        raise ModelLoadError(
            f"{loaded.source}: its {policy} weights take at least {need / 1e9:.1f} GB{per} (as {fmt}), but "
            f"{available / 1e9:.1f} GB of memory is available on {device.type}; fewer bits per weight (--weights "
            f"int4), tensor parallelism over GPUs or a bigger device would hold them, and `rooftop roofline -m "
            f"{loaded.source}` analyzes the model without any"
        )


def load_dummy(
    model: str | Path | None, weights: str, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> LoadedModel:
    """`model`'s config and tokenizer, and a reader per tensor that makes it at random when the model asks, in the
    form the `weights` choice runs on `device` (int4/int8 groups as integers with group scales, floats in `dtype`).
    Loading reads no weight file and allocates no tensor; a model the engine does not run loads its config (and no
    tensors), and `build_model` refuses it."""
    return dummy_weights(find_source(model), weights, device, dtype, seed)


def dummy_weights(source: Source, weights: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """load_dummy for a source already in hand (e.g. a preset's config changed in code, as benchmarks/moe.py does)."""
    policy = weight_policy(weights, source.native_format, device, dtype)
    values = source.values
    readers = {
        name: partial(
            random_weight, name, shape, tensor_form(name, shape, policy, device), dtype, device, seed, values=values
        )
        for name, shape in tensor_shapes(source.config).items()
    }
    tokenizer = source.tokenizer or bundled_tokenizer(source.config)
    return LoadedModel(source.config, LazyWeights(readers), tokenizer, source.name, source.native_format)
