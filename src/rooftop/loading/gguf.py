"""GGUF files: tensors -> weights under Hugging Face names and layout, vocabulary -> Tokenizer (config: gguf_config)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QType

from rooftop.config import ModelConfig
from rooftop.errors import ModelLoadError, RooftopError
from rooftop.loading.gguf_config import config_from_gguf
from rooftop.loading.gguf_file import TensorInfo, read_gguf, release_pages
from rooftop.loading.loaded import LazyWeights, LoadedModel
from rooftop.loading.shard import Shard, shard_tensor
from rooftop.loading.tokenizer import Tokenizer
from rooftop.quant.gguf_blocks import STORED_TYPES, bf16_values, dequantize, q4_1_parts, q8_0_parts, stored_blocks
from rooftop.quant.weights import Int4Weight, Int8GroupWeight, Weight
from rooftop.roofline.api import gguf_weights

GROUP_TYPES = (QType.Q4_1, QType.Q8_0)
FLOAT_TYPES = (QType.F32, QType.F16, QType.BF16)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
    # Qwen3.5 (qwen35): its MLP norm, and the Gated DeltaNet layers' tensors
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    # Qwen3-Next (qwen3next): b and a interleaved per key head, and the shared expert
    "ssm_ba": "linear_attn.in_proj_ba",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# tensors whose GGUF name has no HF counterpart part by part
_WHOLE_NAMES = {"ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias"}
# a mixture of experts' stacked (experts, rows, cols) matrices, split per expert as `ffn_gate_exps.{e}` (split_experts)
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for tensors we derive ourselves."""
    if gguf_name.startswith("blk.") and gguf_name.split(".", 2)[2] in _WHOLE_NAMES:
        _, layer, part = gguf_name.split(".", 2)
        return f"model.layers.{layer}.{_WHOLE_NAMES[part]}"
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}"
        stacked, _, expert = part.partition(".")
        if stacked in _EXPERT_NAMES and expert.isdigit():
            return f"model.layers.{layer}.mlp.experts.{expert}.{_EXPERT_NAMES[stacked]}.{suffix}"
    elif stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    return None


def split_experts(t: TensorInfo) -> list[TensorInfo]:
    """A stacked expert tensor (`blk.N.ffn_up_exps.weight`, experts x rows x cols) as one 2-D tensor per expert
    (`blk.N.ffn_up_exps.E.weight`), each a view of its slice of the file's bytes; any other tensor as it is."""
    stem, _, suffix = t.name.rpartition(".")
    if len(t.shape) != 3 or stem.rpartition(".")[2] not in _EXPERT_NAMES:
        return [t]
    experts, rows, cols = t.shape
    size = t.data.size // experts
    return [
        TensorInfo(f"{stem}.{e}.{suffix}", (rows, cols), t.qtype, t.data[e * size : (e + 1) * size])
        for e in range(experts)
    ]


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order (rotary pairs interleaved) back to Hugging Face's (halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def group_weight(t: TensorInfo) -> Int4Weight | Int8GroupWeight:
    """A Q4_1 / Q8_0 matrix as its integers with per-32 scales (and zeros), never widened to floats."""
    rows, cols = t.shape
    groups = cols // 32
    if t.qtype == QType.Q8_0:
        d, q = q8_0_parts(t.data, t.numel)
        return Int8GroupWeight(q.reshape(rows, cols), d.reshape(rows, groups))
    d, m, q = q4_1_parts(t.data, t.numel)
    zero = m + 8 * d  # d·q + m == (q - 8)·d + (m + 8d)
    return Int4Weight(q.reshape(rows, cols), d.reshape(rows, groups), zero.reshape(rows, groups))


def converted(t: TensorInfo) -> bool:
    """Whether a matrix is of a type the kernels do not run (the 2- and 3-bit K-quants, the IQ and ternary types,
    ...): read as its float32 values, one tensor at a time, and held as the weight policy's groups (models/tensors.py:
    under `auto` rooftop's own group-32 int4, CONVERTED_TO: Q4_1, which the analyzer costs it as)."""
    return len(t.shape) == 2 and t.qtype not in (*FLOAT_TYPES, *GROUP_TYPES, *STORED_TYPES) and t.shape[1] % 32 == 0


def read_matrix(t: TensorInfo) -> Weight:
    """A 2-D tensor as the file holds it: Q4_1/Q8_0 as integer groups, the stored block formats as their rows of
    blocks, BF16 as bfloat16 (the model's tensors widen it where they hold float32; a bf16-fp32 linear holds it as it
    is), the other types (float, and the rarer quantized ones) as their float32 values."""
    if t.qtype in GROUP_TYPES:
        return group_weight(t)
    if t.qtype in STORED_TYPES:
        return stored_blocks(t.data, t.qtype, t.shape, t.name)
    if t.qtype == QType.BF16:
        return bf16_values(t.data, t.shape, t.name)
    return dequantize(t.data, t.qtype, t.shape, t.name)


def read_tensor(t: TensorInfo, config: ModelConfig, name: str, shard: Shard | None = None) -> Weight:
    """One tensor under its HF layout: quantized matrices in a form the kernels run, everything else as float32.
    With `shard`, only those rows or columns of the file are read (Q and K rows by whole heads: llama.cpp's row
    order is undone within each head). The file's pages of the tensor are let go after (`release_pages`)."""
    try:
        return _read_tensor(shard_tensor(t, shard), config, name)
    finally:
        release_pages(t)


def _read_tensor(t: TensorInfo, config: ModelConfig, name: str) -> Weight:
    if config.architecture in ("qwen3_5", "qwen3_next") and (hf := hybrid_tensor(t, name)) is not None:
        return hf
    w = read_matrix(t) if len(t.shape) == 2 else dequantize(t.data, t.qtype, t.shape, t.name)
    if config.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = w.shape[0] // config.head_dim
        if isinstance(w, torch.Tensor):
            w = unpermute_rope(w, heads)
        else:  # the same row order, applied to integers, scales and zeros alike
            w = w.rows(unpermute_rope(torch.arange(w.shape[0])[:, None], heads)[:, 0])
    return w


def hybrid_tensor(t: TensorInfo, name: str) -> torch.Tensor | None:
    """What llama.cpp's converter changed in a Qwen3.5 or Qwen3-Next tensor, undone: the zero-centred norms were stored plus one,
    A_log as -exp(A_log), the convolution squeezed. None for the rest, read as any tensor. (Qwen3.5's value heads stay
    in the file's tiled order, which the model is told: LoadedModel.linear_value_order.)"""
    if name.endswith(("layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")):
        return dequantize(t.data, t.qtype, t.shape, t.name) - 1
    if name.endswith("A_log"):
        return torch.log(-dequantize(t.data, t.qtype, t.shape, t.name))
    if name.endswith("conv1d.weight"):
        return dequantize(t.data, t.qtype, t.shape, t.name)[:, None, :]
    return None


def native_format(tensors: list[TensorInfo]) -> str:
    """The engine's weight policy closest to what the file's transformer blocks hold (most of their elements):
    int8 for Q8_0, float for float types, int4 for the 4-, 5- and 6-bit block formats (which run as stored)."""
    held: dict[QType, int] = {}
    for t in tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:  # matrices, and stacks of experts' matrices
            held[t.qtype] = held.get(t.qtype, 0) + t.numel
    most = max(held, key=held.get, default=QType.F32)
    return "float" if most in FLOAT_TYPES else "int8" if most == QType.Q8_0 else "int4"


def converted_types(tensors: list[TensorInfo]) -> dict[str, str]:
    """HF name -> the GGUF type ("Q3_K") of each matrix the kernels do not run (`converted`)."""
    return {hf_name(t.name): t.qtype.name for t in tensors if converted(t) and hf_name(t.name)}


def linear_value_order(config: ModelConfig) -> str:
    """How a GGUF holds a linear-attention layer's value heads: Qwen3.5's converted files keep them tiled."""
    return "tiled" if config.architecture == "qwen3_5" else "grouped"


def load_gguf(path: Path) -> LoadedModel:
    """Read a GGUF file's config and tokenizer now, and its tensors (under HF names and layout) when the model
    asks for each: quantized matrices in a form the kernels run (read_matrix), the rest as float32."""
    gguf_file = read_gguf(path)
    meta = gguf_file.metadata
    config = config_from_gguf(gguf_file)
    tensors = [part for t in gguf_file.tensors for part in split_experts(t)]
    readers, file_names = {}, {}
    for t in tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name == "rope_freqs.weight":  # Llama-3 rope scaling, stored as per-pair frequency divisors
                config.rope_freq_factors = dequantize(t.data, t.qtype, t.shape, t.name).tolist()
            continue
        readers[name] = partial(read_tensor, t, config, name)
        file_names[name] = t.name
    try:
        tokenizer = Tokenizer.from_gguf_metadata(meta)
    except RooftopError:
        raise
    except Exception as e:  # the tokenizers library raises its own exception types on a bad vocabulary or merges
        raise ModelLoadError(f"{path}: the GGUF tokenizer data is invalid ({type(e).__name__}: {e})") from None
    return LoadedModel(
        config,
        LazyWeights(readers, gguf_file.release_pages, file_names),
        tokenizer,
        str(path),
        native_format(tensors),
        converted_types(tensors),
        linear_value_order=linear_value_order(config),
        file_format=held.name if (held := gguf_weights(tensors)) else None,
    )
