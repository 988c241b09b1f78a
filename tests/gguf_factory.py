"""Writes tiny Llama-shaped GGUF files (random weights, a 256-byte BPE vocabulary) for loader and CLI tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy as np

from rooftop.quant.gguf_quantize import QUANTIZERS, quantize

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
T = gguf.GGMLQuantizationType
# what rooftop.quant.gguf_quantize writes: its own K-quants and IQ4s, and the types it hands to gguf.quants
QUANTIZABLE = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, *QUANTIZERS)
TensorTypes = T | Mapping[str, T] | Callable[[str], T]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    visible = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = [], 0
    for b in range(256):
        if b in visible:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def llama_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert script's Q/K row order."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_types(qtype: TensorTypes) -> Callable[[str], T]:
    """GGUF tensor name -> its type. One type covers every matrix but the embedding (kept F32, as the first
    callers expect); a mapping names the matrices it quantizes (the rest F32); a callable decides each."""
    if isinstance(qtype, T):
        return lambda name: T.F32 if name == "token_embd.weight" else qtype
    if isinstance(qtype, Mapping):
        return lambda name: qtype.get(name, T.F32)
    return qtype


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    qtype: TensorTypes = T.F32,
    context_length: int = 64,
    seed: int = 0,
    tokenizer_model: str = "gpt2",
) -> dict[str, np.ndarray]:
    """Write the file; return the float32 weights (HF layout, HF names) it was made from, before quantization.

    `qtype`: the matrices' type, or a per-tensor choice by GGUF name (see tensor_types); norms are always F32.
    """
    type_of = tensor_types(qtype)
    rng = np.random.default_rng(seed)
    d, ff, layers, heads, kv_heads = 256, 256, 2, 4, 2  # 256: a whole K-quant super-block per row
    hd = d // heads
    tokens = SPECIALS + byte_tokens()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_block_count(layers)
    w.add_context_length(context_length)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * 256)
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    weights: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, shape: tuple[int, ...], permute_heads: int = 0):
        x = rng.normal(0.0, 0.3, size=shape).astype(np.float32)
        if len(shape) == 1:
            x = 1.0 + 0.1 * x  # norm weights near one
        weights[hf_name] = x
        stored = llama_permute(x, permute_heads) if permute_heads and arch == "llama" else x
        kind = T.F32 if len(shape) == 1 else type_of(gguf_name)
        if kind == T.F32:
            w.add_tensor(gguf_name, stored)
        elif kind == T.F16:
            w.add_tensor(gguf_name, stored.astype(np.float16))
        elif kind not in QUANTIZABLE:  # a type rooftop must refuse: zero bytes of the right size will do
            block, nbytes = gguf.GGML_QUANT_SIZES[kind]
            w.add_tensor(gguf_name, np.zeros((shape[0], shape[1] // block * nbytes), np.uint8), raw_dtype=kind)
        else:
            w.add_tensor(gguf_name, quantize(stored, kind), raw_dtype=kind)

    add("token_embd.weight", "model.embed_tokens.weight", (vocab, d))
    add("output_norm.weight", "model.norm.weight", (d,))
    for i in range(layers):
        p, hf = f"blk.{i}.", f"model.layers.{i}."
        add(p + "attn_norm.weight", hf + "input_layernorm.weight", (d,))
        add(p + "attn_q.weight", hf + "self_attn.q_proj.weight", (heads * hd, d), permute_heads=heads)
        add(p + "attn_k.weight", hf + "self_attn.k_proj.weight", (kv_heads * hd, d), permute_heads=kv_heads)
        add(p + "attn_v.weight", hf + "self_attn.v_proj.weight", (kv_heads * hd, d))
        add(p + "attn_output.weight", hf + "self_attn.o_proj.weight", (d, heads * hd))
        add(p + "ffn_norm.weight", hf + "post_attention_layernorm.weight", (d,))
        add(p + "ffn_gate.weight", hf + "mlp.gate_proj.weight", (ff, d))
        add(p + "ffn_up.weight", hf + "mlp.up_proj.weight", (ff, d))
        add(p + "ffn_down.weight", hf + "mlp.down_proj.weight", (d, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def with_nan_output_norm(source: Path, path: Path) -> Path:
    """`source` (a float32 file) copied to `path` with its final norm's weights NaN: every logit is NaN, which the
    engine refuses to sample (the request ends with an error)."""
    data = bytearray(source.read_bytes())
    norm = next(t for t in gguf.GGUFReader(source).tensors if t.name == "output_norm.weight")
    data[norm.data_offset : norm.data_offset + norm.n_bytes] = b"\xff" * norm.n_bytes  # float32 NaNs
    path.write_bytes(data)
    return path
