"""Write a random-weight GGUF of any model preset in any weight type, for llama.cpp and rooftop to run.

    .venv/bin/python benchmarks/make_gguf.py --preset llama-3.2-1b --type q4_k_m [--vocab N] [--layers N]
        [--seed S] [--out PATH]

The file is laid out as llama.cpp's convert_hf_to_gguf.py and llama-quantize would write the real model: the same
metadata keys, tensor names and shapes, llama's Q/K rows permuted, Llama 3's rope scaling as a `rope_freqs.weight`
tensor, and the per-tensor types of llama.cpp's mixes. That holds for the dense presets (llama, qwen3), the mixture
of experts (qwen3moe: each layer's experts stacked in one tensor per projection, the router kept in F32) and the
hybrid (qwen35: three Gated DeltaNet layers to each gated full-attention layer, the convolution kept in F32). Only
the numbers differ: matrices are drawn normal with std 0.02 (each tensor from its own seed, so --layers leaves the
other tensors as they were), norms are ones (Qwen3.5's are stored plus one: ones are its initial norms), a DeltaNet
layer's decay rates A run from 1 to 16 across its heads (the range Qwen's initializer draws them from). The
tokenizer is the bundled SmolLM2's (byte-level BPE, 49152 tokens) whatever the preset: a larger --vocab pads it
with unused `<id:N>` tokens, as llama.cpp's converter pads Llama 3's vocabulary; a smaller one keeps the first N
tokens and the merges among them. Tensors are drawn, quantized and written one at a time, so memory stays near one
tensor in float32 (the embedding's, for large vocabularies).
"""

from __future__ import annotations

import argparse
import functools
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rooftop.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from rooftop.console import check_output_file
from rooftop.errors import RooftopError
from rooftop.loading.bundled import bundled_model_path
from rooftop.loading.gguf_file import read_gguf
from rooftop.quant.gguf_quantize import quantize
from rooftop.roofline.presets import PRESETS, find_preset

T = gguf.GGMLQuantizationType
SINGLE = {
    name: T[name.upper()]
    for name in (
        "f32",
        "f16",
        "bf16",
        "q8_0",
        "q4_0",
        "q4_1",
        "q5_0",
        "q5_1",
        "q2_k",
        "q3_k",
        "q4_k",
        "q5_k",
        "q6_k",
        "iq4_nl",
        "iq4_xs",
    )
}
MIXES = {"q4_k_m": T.Q4_K, "q5_k_m": T.Q5_K}  # the mix's base type
FILE_TYPES = {  # general.file_type, as llama-quantize labels its output
    "f32": "ALL_F32",
    "f16": "MOSTLY_F16",
    "q2_k": "MOSTLY_Q2_K",
    "q3_k": "MOSTLY_Q3_K_S",
    "q4_k": "MOSTLY_Q4_K_S",
    "q5_k": "MOSTLY_Q5_K_S",
}
# llama.cpp's fallback when a row is not whole 256-value super-blocks (SmolLM2's 576, say)
NOT_WHOLE_SUPER_BLOCKS = {
    T.Q2_K: T.IQ4_NL,
    T.Q3_K: T.IQ4_NL,
    T.IQ4_XS: T.IQ4_NL,
    T.Q4_K: T.Q5_0,
    T.Q5_K: T.Q5_1,
    T.Q6_K: T.Q8_0,
}
# rooftop's architecture -> the name llama.cpp's converter writes (general.architecture, the metadata keys' prefix)
ARCHITECTURES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen3_5": "qwen35"}
# matrices llama-quantize leaves as the converter wrote them (F32): a router, a DeltaNet layer's convolution
KEPT_F32 = ("ffn_gate_inp.weight", "ssm_conv1d.weight")
SMOLLM2_ALPHABET = 252  # SmolLM2's single-byte tokens end at id 251: a smaller vocabulary could not spell every text
STD = 0.02


@dataclass
class Tensor:
    """One tensor of the file: its GGUF name, numpy shape ((experts,) rows, row length) and how it is drawn."""

    name: str
    shape: tuple[int, ...]
    layer: int | None = None
    permute_heads: int = 0  # llama's Q/K: rows reordered as the converter does, for this many heads
    values: np.ndarray | None = None  # fixed contents (rope_freqs); None: random (matrices) or ones (norms)


def file_type(choice: str) -> int:
    return gguf.LlamaFileType[FILE_TYPES.get(choice, f"MOSTLY_{choice.upper()}")]


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down a _M mix widens: the first and last eighth, and
    every third layer between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(tensor: Tensor, choice: str, layers: int, tied: bool) -> T:
    """The type a tensor is stored in: llama.cpp's rules, simplified.

    1-D tensors (norms, rope_freqs, a DeltaNet layer's A and dt bias) and the matrices of KEPT_F32 stay F32. A
    single type (--type q4_k) applies to every other matrix, as `llama-quantize --pure` does. The mixes follow
    llama_tensor_get_type for Q4_K_M and Q5_K_M: output.weight (or token_embd.weight where the embeddings are tied,
    as llama.cpp treats it as the output) is Q6_K; attn_v and ffn_down (an MoE layer's stacked ffn_down_exps too,
    and a DeltaNet layer's attn_qkv, which llama.cpp classes with attn_v) are Q6_K in the layers use_more_bits
    picks; every other matrix is the base type (Q4_K or Q5_K). llama.cpp's further rules (for GQA ratios, 8-expert
    models, the falcon architecture) are left out. A K-quant that needs whole 256-value super-blocks falls back as
    llama.cpp does where the rows are not, and to F16 where rows are not even whole 32-value blocks.
    """
    if len(tensor.shape) == 1 or tensor.name.endswith(KEPT_F32):
        return T.F32
    if choice in SINGLE:
        qtype = SINGLE[choice]
    else:
        qtype = MIXES[choice]
        is_output = tensor.name == "output.weight" or (tied and tensor.name == "token_embd.weight")
        widened = tensor.name.endswith(("attn_v.weight", "attn_qkv.weight", "ffn_down.weight", "ffn_down_exps.weight"))
        if is_output or (widened and use_more_bits(tensor.layer, layers)):
            qtype = T.Q6_K
    k = tensor.shape[-1]
    if k % gguf.GGML_QUANT_SIZES[qtype][0]:
        qtype = NOT_WHOLE_SUPER_BLOCKS.get(qtype, qtype)
    if k % gguf.GGML_QUANT_SIZES[qtype][0]:
        qtype = T.F16
    return qtype


def rope_factors(config: ModelConfig) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp reads it: one divisor per frequency pair (the converter's rope_freqs).

    Wavelengths shorter than the original context over high_freq_factor keep their frequency, longer than it over
    low_freq_factor are divided by factor, and the band between blends the two.
    """
    s = config.rope_scaling
    freqs = 1.0 / config.rope_theta ** (np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = 1 / ((1 - smooth) / s.factor + smooth)
    low, high = (
        s.original_max_position_embeddings / s.low_freq_factor,
        s.original_max_position_embeddings / s.high_freq_factor,
    )
    return np.where(wavelen < high, 1.0, np.where(wavelen > low, s.factor, blended)).astype(np.float32)


def tensors(config: ModelConfig) -> list[Tensor]:
    """The model's tensors in the converter's order: rope_freqs, embeddings, the blocks, the final norm, output."""
    out = []
    if config.rope_scaling is not None and config.rope_scaling.rope_type == "llama3":
        out.append(Tensor("rope_freqs.weight", (config.head_dim // 2,), values=rope_factors(config)))
    out.append(Tensor("token_embd.weight", (config.vocab_size, config.hidden_size)))
    for i in range(config.num_layers):
        linear = config.layer_types is not None and config.layer_types[i] == LINEAR_ATTENTION
        block = [Tensor(f"blk.{i}.attn_norm.weight", (config.hidden_size,))]
        block += delta_net_tensors(config, f"blk.{i}.") if linear else attention_tensors(config, f"blk.{i}.")
        block += mlp_tensors(config, f"blk.{i}.")
        for t in block:
            t.layer = i
        out += block
    out.append(Tensor("output_norm.weight", (config.hidden_size,)))
    if not config.tie_word_embeddings:
        out.append(Tensor("output.weight", (config.vocab_size, config.hidden_size)))
    return out


def attention_tensors(config: ModelConfig, p: str) -> list[Tensor]:
    """A full-attention layer's projections (a gated one's Q rows carry the gate too) and Qwen's q/k norms."""
    d, llama = config.hidden_size, config.architecture == "llama"
    q_rows = config.q_size * (2 if config.attn_output_gate else 1)
    out = [
        Tensor(p + "attn_q.weight", (q_rows, d), permute_heads=config.num_heads if llama else 0),
        Tensor(p + "attn_k.weight", (config.kv_size, d), permute_heads=config.num_kv_heads if llama else 0),
        Tensor(p + "attn_v.weight", (config.kv_size, d)),
        Tensor(p + "attn_output.weight", (d, config.q_size)),
    ]
    if config.qk_norm:
        out += [
            Tensor(p + "attn_q_norm.weight", (config.head_dim,)),
            Tensor(p + "attn_k_norm.weight", (config.head_dim,)),
        ]
    return out


def delta_net_tensors(config: ModelConfig, p: str) -> list[Tensor]:
    """A Gated DeltaNet layer as the converter writes Qwen3.5's: q, k and v in one projection (and the convolution
    over their channels), the output gate z, beta and alpha per value head, A (as -A) and dt's bias, the gated norm
    and the output projection."""
    la, d = config.linear_attention, config.hidden_size
    heads, values = la.num_value_heads, la.num_value_heads * la.value_head_dim
    channels = 2 * la.num_key_heads * la.key_head_dim + values
    return [
        Tensor(p + "attn_qkv.weight", (channels, d)),
        Tensor(p + "attn_gate.weight", (values, d)),
        Tensor(p + "ssm_beta.weight", (heads, d)),
        Tensor(p + "ssm_alpha.weight", (heads, d)),
        Tensor(p + "ssm_a", (heads,), values=-np.linspace(1, 16, heads, dtype=np.float32)),
        Tensor(p + "ssm_dt.bias", (heads,)),
        Tensor(p + "ssm_conv1d.weight", (channels, la.conv_kernel_dim)),
        Tensor(p + "ssm_norm.weight", (la.value_head_dim,)),
        Tensor(p + "ssm_out.weight", (d, values)),
    ]


def mlp_tensors(config: ModelConfig, p: str) -> list[Tensor]:
    """The MLP and its norm (Qwen3.5 names it post_attention_norm): dense, or an MoE layer's router and its
    experts' projections, stacked (experts, rows, row length)."""
    d, norm = config.hidden_size, "post_attention_norm" if config.architecture == "qwen3_5" else "ffn_norm"
    if not config.is_moe:
        ff = config.intermediate_size
        stacks = [("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))]
        return [Tensor(f"{p}{norm}.weight", (d,)), *(Tensor(f"{p}{name}.weight", shape) for name, shape in stacks)]
    e, ff = config.num_experts, config.moe_intermediate_size
    return [
        Tensor(f"{p}{norm}.weight", (d,)),
        Tensor(p + "ffn_gate_inp.weight", (e, d)),
        Tensor(p + "ffn_gate_exps.weight", (e, ff, d)),
        Tensor(p + "ffn_up_exps.weight", (e, ff, d)),
        Tensor(p + "ffn_down_exps.weight", (e, d, ff)),
    ]


def values(tensor: Tensor, seed: int) -> np.ndarray:
    """The tensor's float32 contents: fixed, ones (norms) or normal(0, STD) from a seed of its own."""
    if tensor.values is not None:
        return tensor.values
    if len(tensor.shape) == 1:
        return np.ones(tensor.shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(tensor.name.encode())])
    x = rng.standard_normal(tensor.shape, dtype=np.float32)
    x *= STD
    if tensor.permute_heads:  # the row order llama.cpp's converter gives HF's q_proj/k_proj
        h = tensor.permute_heads
        x = x.reshape(h, 2, x.shape[0] // h // 2, x.shape[1]).swapaxes(1, 2).reshape(x.shape)
    return x


def encode(x: np.ndarray, qtype: T) -> np.ndarray:
    """The tensor's bytes in `qtype`: a stack of experts' matrices quantized row by row, as one matrix is."""
    if x.ndim == 1 or qtype == T.F32:
        return x.astype(np.float32)
    return quantize(x.reshape(-1, x.shape[-1]), qtype).reshape(*x.shape[:-1], -1)


@dataclass
class Vocabulary:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]


@functools.cache
def smollm2_metadata() -> dict:
    """The bundled SmolLM2 GGUF's metadata (its tokenizer is every file's), read once."""
    return read_gguf(bundled_model_path()).metadata


def smollm2_vocabulary(size: int) -> Vocabulary:
    """SmolLM2's tokens cut or padded to `size`.

    Padding tokens are named `<id:N>` and typed UNUSED (llama.cpp's converter pads Llama 3 the same way): never
    produced by the tokenizer and never matched in text. Cutting keeps the first `size` tokens and only the merges
    whose two halves and result survive (SmolLM2's merges are in the order of their result's id, so a prefix).
    """
    meta = smollm2_metadata()
    tokens, types, merges = (list(meta[f"tokenizer.ggml.{k}"]) for k in ("tokens", "token_type", "merges"))
    if size < SMOLLM2_ALPHABET:
        raise SystemExit(f"--vocab {size}: the SmolLM2 tokenizer needs at least {SMOLLM2_ALPHABET} tokens")
    if size <= len(tokens):
        kept = set(tokens[:size])
        merges = [m for m in merges if all(p in kept for p in (*m.split(" ", 1), m.replace(" ", "", 1)))]
        return Vocabulary(tokens[:size], types[:size], merges)
    pad = range(len(tokens), size)
    return Vocabulary(tokens + [f"<id:{i}>" for i in pad], types + [gguf.TokenType.UNUSED] * len(pad), merges)


def add_metadata(w: gguf.GGUFWriter, config: ModelConfig, choice: str, vocab: Vocabulary):
    """The keys llama.cpp's converter writes for the model (an MoE's experts, a hybrid's DeltaNet shapes and layer
    pattern too), and SmolLM2's tokenizer keys."""
    w.add_type("model")
    w.add_name(f"{config.name} (random weights)")
    w.add_vocab_size(len(vocab.tokens))
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_rope_dimension_count(config.rotary_dim)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    if config.head_dim != config.hidden_size // config.num_heads:
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if config.is_moe:
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    if config.linear_attention is not None:
        add_hybrid_metadata(w, config)
    w.add_file_type(file_type(choice))
    if choice not in ("f32", "f16", "bf16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    smollm2 = smollm2_metadata()
    w.add_tokenizer_model(smollm2["tokenizer.ggml.model"])
    w.add_tokenizer_pre(smollm2["tokenizer.ggml.pre"])
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        w.add_uint32(f"tokenizer.ggml.{key}", smollm2[f"tokenizer.ggml.{key}"])
    w.add_add_bos_token(smollm2["tokenizer.ggml.add_bos_token"])
    w.add_add_space_prefix(smollm2["tokenizer.ggml.add_space_prefix"])
    w.add_chat_template(smollm2["tokenizer.chat_template"])


def add_hybrid_metadata(w: gguf.GGUFWriter, config: ModelConfig) -> None:
    """Qwen3.5's keys: the DeltaNet shapes as ssm.*, every how many layers one is full attention, and the M-RoPE
    sections of its rotary pairs (text gives every section the same position, so only their sum matters)."""
    la = config.linear_attention
    w.add_ssm_conv_kernel(la.conv_kernel_dim)
    w.add_ssm_state_size(la.key_head_dim)
    w.add_ssm_group_count(la.num_key_heads)
    w.add_ssm_time_step_rank(la.num_value_heads)
    w.add_ssm_inner_size(la.num_value_heads * la.value_head_dim)
    w.add_full_attention_interval(attention_interval(config))
    pairs = config.rotary_dim // 2
    third = -(-pairs // 3)
    w.add_rope_dimension_sections([third, third, pairs - 2 * third, 0])


def attention_interval(config: ModelConfig) -> int:
    """Every how many layers a hybrid's full attention comes (the file stores that, not the list): the first full
    layer's position, or one past the last layer where --layers cut before it."""
    types = config.layer_types
    every = next((i + 1 for i, t in enumerate(types) if t == FULL_ATTENTION), len(types) + 1)
    if any((t == FULL_ATTENTION) != ((i + 1) % every == 0) for i, t in enumerate(types)):
        raise SystemExit(f"{config.name}: full attention at no fixed interval, which a GGUF cannot say")
    return every


def model_config(preset: str, vocab: int | None, layers: int | None) -> ModelConfig:
    config = find_preset(preset)
    if config.architecture not in ARCHITECTURES:
        raise SystemExit(
            f"--preset {preset}: make_gguf writes {', '.join(ARCHITECTURES)} models, not {config.architecture}"
        )
    if vocab is not None:
        config.vocab_size = vocab
    if layers is not None:
        if layers < 1:
            raise SystemExit(f"--layers {layers}: needs at least one layer")
        if config.layer_types is not None:  # the first layers of the pattern
            config.layer_types = [config.layer_types[i % len(config.layer_types)] for i in range(layers)]
        config.num_layers = layers
    return config


def write_gguf(config: ModelConfig, choice: str, path: Path, seed: int = 0, console: Console | None = None) -> Counter:
    """Write the file; return how many tensors each type holds."""
    vocab = smollm2_vocabulary(config.vocab_size)
    plan = tensors(config)
    types = [tensor_type(t, choice, config.num_layers, config.tie_word_embeddings) for t in plan]
    w = gguf.GGUFWriter(str(path), ARCHITECTURES[config.architecture])
    add_metadata(w, config, choice, vocab)
    for t, qtype in zip(plan, types, strict=True):
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        size = math.prod(t.shape) // block * nbytes
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), size, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("tensors", total=len(plan))
        for t, qtype in zip(plan, types, strict=True):
            progress.update(task, description=f"{t.name} ({qtype.name})")
            w.write_tensor_data(encode(values(t, seed), qtype))
            progress.advance(task)
    w.close()
    return Counter(qtype.name for qtype in types)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True, help=f"a preset: {', '.join(PRESETS)}")
    parser.add_argument("--type", required=True, choices=[*SINGLE, *MIXES], help="one type for all matrices, or a mix")
    parser.add_argument("--vocab", type=int, help="vocabulary size (default: the preset's)")
    parser.add_argument("--layers", type=int, help="number of blocks (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output file (default: PRESET-TYPE.gguf here)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed {args.seed}: must be >= 0")
    path = args.out or Path(f"{args.preset}-{args.type}.gguf")
    try:
        config = model_config(args.preset, args.vocab, args.layers)
        check_output_file(path, "--out")
    except RooftopError as e:
        parser.error(str(e))
    console = Console()
    counts = write_gguf(config, args.type, path, args.seed, console)
    console.print(
        f"wrote {path} ({path.stat().st_size / 1e6:,.1f} MB): {config.name}, layers {config.num_layers}, vocabulary {config.vocab_size}"
    )
    console.print("tensors per type: " + ", ".join(f"{n} {name}" for name, n in counts.most_common()))
    asked = [SINGLE[args.type]] if args.type in SINGLE else [MIXES[args.type], T.Q6_K]
    fallen = [f"{n} {name}" for name, n in counts.most_common() if name not in (*(t.name for t in asked), "F32")]
    if fallen:
        block = gguf.GGML_QUANT_SIZES[asked[0]][0]
        console.print(
            f"note: {', '.join(fallen)} instead of {' or '.join(t.name for t in asked)}: their rows are not whole "
            f"{block}-value blocks, and llama.cpp's quantizer falls back the same way"
        )
    return path


if __name__ == "__main__":
    main()
