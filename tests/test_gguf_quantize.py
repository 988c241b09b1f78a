"""rooftop's GGUF quantizers, checked through gguf's own dequantizers (the reference for the on-disk layout).

The error bound per type comes from uniform rounding: a sub-block of n values whose levels are a step s apart
rounds each value by at most s/2, an error spread evenly, so rms s/sqrt(12). An asymmetric type (min/max, L in
0..levels-1) has s = (max - min(min, 0))/(levels - 1); a symmetric one (largest magnitude at the extra negative
level) s = max|x|/(levels/2); IQ4's non-uniform levels are at most 24/127 of max|x| apart. A quantizer that fits
its scales does no worse than that min/max step, and the slack covers the scales' own rounding to 4, 6 or 8 bits
and fp16.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from rooftop.quant.gguf_quantize import IQ4_VALUES, quantize

T = gguf.GGMLQuantizationType

# type: (values per sub-block, levels, symmetric, slack)
UNIFORM = {
    T.Q2_K: (16, 4, False, 1.0),
    T.Q3_K: (16, 8, True, 1.1),
    T.Q4_K: (32, 16, False, 1.0),
    T.Q5_K: (32, 32, False, 1.05),
    T.Q6_K: (16, 64, True, 1.05),
    T.Q4_0: (32, 16, True, 1.05),
    T.Q4_1: (32, 16, False, 1.05),
    T.Q5_0: (32, 32, True, 1.05),
    T.Q5_1: (32, 32, False, 1.05),
    T.Q8_0: (32, 256, True, 1.05),
}
IQ4 = (T.IQ4_NL, T.IQ4_XS)
FLOAT = {T.F32: 0.0, T.F16: 2.0**-11, T.BF16: 2.0**-8}  # relative rounding of one value (and fp16's half
# subnormal step, 2**-25, below its normal range)


def roundtrip(x: np.ndarray, qtype: T) -> np.ndarray:
    q = quantize(x, qtype)
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    assert q.dtype == np.uint8 and q.shape == (x.shape[0], x.shape[1] // block * nbytes)
    return gguf.quants.dequantize(q, qtype).reshape(x.shape)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def random_rows(seed: int, rows: int = 24, k: int = 768) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.02, size=(rows, k)).astype(np.float32)
    x[::5] += rng.normal(0.0, 0.2, size=(1, k)).astype(np.float32)  # a few rows with an offset and more spread
    x[1, 7] = 0.5  # an outlier
    return x


@pytest.mark.parametrize("qtype", list(UNIFORM), ids=lambda t: t.name)
def test_error_within_the_uniform_rounding_bound(qtype):
    n, levels, symmetric, slack = UNIFORM[qtype]
    x = random_rows(1)
    sub = x.reshape(-1, n)
    if symmetric:
        step = np.abs(sub).max(axis=1) / (levels / 2)
    else:
        step = (sub.max(axis=1) - np.minimum(sub.min(axis=1), 0)) / (levels - 1)
    bound = slack * rms(step) / np.sqrt(12)
    assert rms(roundtrip(x, qtype) - x) <= bound


@pytest.mark.parametrize("qtype", IQ4, ids=lambda t: t.name)
def test_iq4_error_within_its_widest_gap(qtype):
    x = random_rows(2)
    gap = np.diff(IQ4_VALUES).max() / -IQ4_VALUES[0]
    bound = 1.05 * rms(gap * np.abs(x.reshape(-1, 32)).max(axis=1)) / np.sqrt(12)
    assert rms(roundtrip(x, qtype) - x) <= bound


@pytest.mark.parametrize("qtype", list(FLOAT), ids=lambda t: t.name)
def test_float_types_round_each_value(qtype):
    x = random_rows(3)
    assert np.all(np.abs(roundtrip(x, qtype) - x) <= FLOAT[qtype] * np.abs(x) + 2.0**-25)


def test_k_quants_beat_the_legacy_types_of_their_width():
    """A fitted per-32 scale and min (Q4_K, Q5_K) is more accurate than Q4_1's and Q5_1's plain min/max."""
    x = random_rows(4)
    err = {t: rms(roundtrip(x, t) - x) for t in (T.Q4_K, T.Q4_1, T.Q5_K, T.Q5_1, T.Q2_K, T.Q3_K, T.Q6_K)}
    assert err[T.Q4_K] < err[T.Q4_1] and err[T.Q5_K] < err[T.Q5_1]
    assert err[T.Q2_K] > err[T.Q3_K] > err[T.Q4_K] > err[T.Q5_K] > err[T.Q6_K]


@pytest.mark.parametrize("qtype", list(UNIFORM) + list(IQ4), ids=lambda t: t.name)
def test_zeros_stay_zeros(qtype):
    x = np.zeros((2, 512), np.float32)
    x[1, 256:] = 0.25  # a zero super-block beside a constant one
    y = roundtrip(x, qtype)
    assert np.all(y[0] == 0) and np.all(y[1, :256] == 0)
    np.testing.assert_allclose(y[1, 256:], 0.25, rtol=0.01)


def test_q4_k_represents_its_own_values_exactly():
    """Values d*scale*L - dmin*min with 6-bit scales and mins, levels 0..15 and power-of-two d, dmin: every level
    0 and 15 appears in each sub-block and some sub-block has scale 63 and min 63, so the min/max fit lands on
    the very scales that made the row."""
    rng = np.random.default_rng(5)
    rows, d, dmin = 4, 2.0**-10, 2.0**-9
    sc = rng.integers(1, 64, size=(rows, 8)).astype(np.float32)
    m = rng.integers(0, 64, size=(rows, 8)).astype(np.float32)
    sc[:, 0], m[:, 1] = 63, 63
    levels = rng.integers(0, 16, size=(rows, 8, 32)).astype(np.float32)
    levels[..., 0], levels[..., 1] = 0, 15
    x = ((np.float32(d) * sc)[..., None] * levels - (np.float32(dmin) * m)[..., None]).reshape(rows, 256)
    np.testing.assert_array_equal(roundtrip(x.astype(np.float32), T.Q4_K), x)


def test_q6_k_represents_its_own_values_exactly():
    """Values d*scale*L with int8 scales and levels -32..31: each sub-block's largest magnitude is at level -32 and
    one sub-block has scale -128, where the symmetric fits put them."""
    rng = np.random.default_rng(6)
    rows, d = 4, 2.0**-12
    sc = rng.integers(1, 128, size=(rows, 16)).astype(np.float32)
    sc[:, 3] = -128
    levels = rng.integers(-31, 32, size=(rows, 16, 16)).astype(np.float32)
    levels[..., 5] = -32
    x = ((np.float32(d) * sc)[..., None] * levels).reshape(rows, 256)
    np.testing.assert_array_equal(roundtrip(x.astype(np.float32), T.Q6_K), x)


def test_iq4_nl_represents_its_own_values_exactly():
    rng = np.random.default_rng(7)
    d = np.float32(2.0**-8)
    idx = rng.integers(0, 16, size=(6, 32))
    idx[:, 3] = 0  # the level -127, where the fit puts each block's largest magnitude
    x = (d * IQ4_VALUES[idx]).reshape(2, 96)
    np.testing.assert_array_equal(roundtrip(x, T.IQ4_NL), x)


def test_rows_must_hold_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(np.zeros((2, 128), np.float32), T.Q4_K)
    with pytest.raises(ValueError, match="rows, K"):
        quantize(np.zeros(256, np.float32), T.Q4_K)


def test_many_rows_go_through_in_chunks():
    """A tensor larger than one chunk comes out the same as its rows quantized one at a time."""
    x = random_rows(8, rows=300, k=512)
    whole = quantize(x, T.Q5_K)
    np.testing.assert_array_equal(whole[299], quantize(x[299:], T.Q5_K)[0])
    np.testing.assert_array_equal(whole[:3], quantize(x[:3], T.Q5_K))


def test_tiny_gguf_takes_a_k_quant_or_a_per_tensor_mix(tmp_path):
    """The test factory writes real K-quant blocks, one type for all matrices or one per tensor name."""
    from gguf_factory import write_tiny_gguf

    def mix(name: str) -> T:
        return T.Q6_K if name.endswith("ffn_down.weight") else T.Q4_K

    for qtype, want in ((T.Q3_K, {"blk.0.attn_q.weight": T.Q3_K, "token_embd.weight": T.F32}), (mix, None)):
        path = tmp_path / "tiny.gguf"
        weights = write_tiny_gguf(path, qtype=qtype)
        r = gguf.GGUFReader(path)
        types = {t.name: T(t.tensor_type) for t in r.tensors}
        if want is None:
            want = {"blk.1.ffn_down.weight": T.Q6_K, "blk.1.ffn_up.weight": T.Q4_K, "token_embd.weight": T.Q4_K}
        assert {name: types[name] for name in want} == want and types["output_norm.weight"] == T.F32
        t = next(t for t in r.tensors if t.name == "blk.1.ffn_up.weight")
        got = gguf.quants.dequantize(t.data, T(t.tensor_type)).reshape(256, 256)
        x = weights["model.layers.1.mlp.up_proj.weight"]
        assert rms(got - x) < 0.2 * rms(x)
    write_tiny_gguf(path, qtype={"blk.0.ffn_up.weight": T.IQ4_XS})
    types = {t.name: T(t.tensor_type) for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up.weight"] == T.IQ4_XS and types["blk.0.ffn_gate.weight"] == T.F32
