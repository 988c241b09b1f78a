"""GGUF tensor decoding against gguf's own reference decoder, and llama.cpp's Q/K row permutation."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.gguf import unpermute_rope
from rooftop.quant.gguf_blocks import dequantize

SHAPE = (64, 256)


def random_data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE, dtype=np.float32)


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q4_1])
def test_dequantize_matches_gguf(qtype):
    # `quantize` returns what GGUFReader's `.data` holds: float32/float16 arrays, raw uint8 rows otherwise.
    raw = gguf_quantize(random_data(), qtype)
    expected = torch.from_numpy(gguf_dequantize(raw, qtype))
    out = dequantize(raw, qtype, SHAPE)
    assert out.dtype == torch.float32
    assert out.shape == SHAPE
    assert torch.equal(out, expected)


def test_dequantize_reads_raw_bytes_of_any_shape():
    raw = gguf_quantize(random_data(1), QType.Q4_0)
    expected = dequantize(raw, QType.Q4_0, SHAPE)
    assert torch.equal(dequantize(raw.reshape(-1), QType.Q4_0, SHAPE), expected)
    assert torch.equal(dequantize(raw.reshape(-1), QType.Q4_0, (4, 16, 256)), expected.reshape(4, 16, 256))


def test_unsupported_type_is_named():
    block, nbytes = GGML_QUANT_SIZES[QType.Q8_1]  # an activation type gguf's reader does not decode
    raw = np.random.default_rng(2).integers(0, 256, (SHAPE[0], SHAPE[1] // block * nbytes), dtype=np.uint8)
    with pytest.raises(UnsupportedModelError, match="blk.0.attn_q.weight: GGUF tensor type Q8_1 is not supported"):
        dequantize(raw, QType.Q8_1, SHAPE, "blk.0.attn_q.weight")


def test_truncated_q4_1_raises_load_error():
    raw = gguf_quantize(random_data(3), QType.Q4_1).reshape(-1)[:-7]
    with pytest.raises(ModelLoadError, match="Q4_1"):
        dequantize(raw, QType.Q4_1, SHAPE)


def test_wrong_element_count_raises_load_error():
    raw = gguf_quantize(random_data(4), QType.F16)
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight"):
        dequantize(raw, QType.F16, (SHAPE[0] + 1, SHAPE[1]), "blk.0.ffn_up.weight")


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotary halves of each head interleaved into pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_heads, head_dim, hidden", [(4, 16, 64), (2, 16, 64), (8, 32, 96), (3, 8, 24)])
def test_unpermute_rope_inverts_llama_cpp_permute(n_heads, head_dim, hidden):
    w = torch.randn(n_heads * head_dim, hidden, generator=torch.Generator().manual_seed(n_heads))
    permuted = llama_cpp_permute(w, n_heads)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rope(permuted, n_heads), w)
