"""Float32 rows to GGUF's on-disk blocks, for the types gguf's Python package can read but not write.

gguf.quants dequantizes every type but quantizes only the simple ones (Q4_0..Q8_0, F16, BF16); writing a K-quant or
IQ4 file (so llama.cpp and rooftop run the same file, so tests can build tiny K-quant files) needs the rest. Each
quantizer here fits the block's scales, rounds them to the bits the block stores, and packs the bytes in the order
gguf's dequantizers (and ggml's) read them. The scale fits follow ggml's reference quantizers in spirit (a few
candidate scales, each refined by weighted least squares, the best kept) with fewer candidates, so a 1B model
quantizes in minutes in numpy; they are not bit-exact with ggml. Every step is vectorized over blocks, and a
tensor goes through in row chunks so the temporaries stay small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
QK_K = 256  # the K-quants' (and IQ4_XS's) super-block
CHUNK = 1 << 16  # values per chunk: a handful of float32 temporaries this size stay in cache
IQ4_VALUES = np.array(gguf.quants.IQ4_NL.kvalues, np.float32)  # IQ4_NL's and IQ4_XS's 16 non-uniform levels


def quantize(values: np.ndarray, qtype: T) -> np.ndarray:
    """(rows, K) float32 -> (rows, bytes per row) uint8, the tensor's data as a GGUF file holds it."""
    values = np.ascontiguousarray(values, np.float32)
    if values.ndim != 2:
        raise ValueError(f"expected (rows, K) values, got shape {values.shape}")
    rows, k = values.shape
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    if k % block:
        raise ValueError(f"{qtype.name} needs rows that are a multiple of {block} values, got {k}")
    fit = QUANTIZERS.get(qtype)
    if fit is None:
        return np.ascontiguousarray(gguf.quants.quantize(values, qtype)).view(np.uint8).reshape(rows, -1)
    out = np.empty((rows, k // block * nbytes), np.uint8)
    step = max(1, CHUNK // k)
    for start in range(0, rows, step):
        chunk = values[start : start + step]
        out[start : start + step] = fit(chunk.reshape(-1, block)).reshape(len(chunk), -1)
    return out


# ---- shared pieces


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fp16 a block stores, as its two little-endian bytes (n, 2), and the float32 value a reader sees."""
    h = x.astype(np.float16)
    return h.reshape(-1, 1).view(np.uint8), h.astype(np.float32)


def _inverse(x: np.ndarray) -> np.ndarray:
    """1/x, and 0 where x is 0 (an all-zero block quantizes to zeros)."""
    safe = np.where(x == 0, 1, x)
    return np.where(x == 0, 0, 1 / safe).astype(np.float32)


def _or_shifted(parts: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Packs small values along `axis` into one byte (or uint16): part i lands at bit bits*i."""
    n = parts.shape[axis]
    shape = [1] * parts.ndim
    shape[axis] = n
    dtype = np.uint16 if bits * n > 8 else np.uint8
    shifts = (np.arange(n, dtype=dtype) * bits).reshape(shape)
    return (parts.astype(dtype) << shifts).sum(axis=axis, dtype=dtype)


def _fit_scale_min(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """x (..., n) ~ scale*L - minimum with L in 0..nmax: the asymmetric sub-blocks of Q2_K, Q4_K, Q5_K.

    Like ggml's make_qkx2_quants: candidate inverse scales (nmax + rmin + rdelta*i)/(max - min) each round x to
    levels, weighted least squares then gives the best scale and offset for those levels, and the candidate of the
    smallest weighted squared error wins. Weights rms(x) + |x| favour the large values. The offset is kept <= 0
    (the minimum stored is >= 0), as the formats store an unsigned minimum. Errors come from sums, not per-value
    residuals: sum w*(s*L + m - x)^2 expands into the sums the fit already has.
    """
    w = np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + np.abs(x)
    lo = np.minimum(x.min(axis=-1), 0)
    span = x.max(axis=-1) - lo
    safe_span = np.where(span > 0, span, 1)[..., None]
    shifted = x - lo[..., None]
    wx = w * x
    sw, swx, swx2 = w.sum(-1), wx.sum(-1), (wx * x).sum(-1)
    best_scale, best_offset = span / nmax, lo
    best_err = np.full(span.shape, np.inf, np.float32)
    for i in range(-1, nstep + 1):  # -1: the plain min/max scale, unrefined
        iscale = (nmax + (rmin + rdelta * i if i >= 0 else 0)) / safe_span
        levels = np.clip(np.rint(iscale * shifted), 0, nmax)
        wl = w * levels
        sl, sl2, sxl = wl.sum(-1), (wl * levels).sum(-1), (wx * levels).sum(-1)
        if i < 0:
            scale, offset, valid = span / nmax, lo, True
        else:
            det = sw * sl2 - sl * sl
            valid = det > 0
            safe_det = np.where(det > 0, det, 1)
            scale = (sw * sxl - swx * sl) / safe_det
            offset = (sl2 * swx - sl * sxl) / safe_det
            positive = offset > 0  # an offset above zero cannot be stored: refit the scale through zero
            scale = np.where(positive, sxl / np.where(sl2 > 0, sl2, 1), scale)
            offset = np.where(positive, 0, offset)
        err = scale * scale * sl2 + 2 * scale * offset * sl - 2 * scale * sxl + offset * offset * sw
        err += swx2 - 2 * offset * swx
        better = (err < best_err) & valid & (scale >= 0)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_offset = np.where(better, offset, best_offset)
    best_scale = np.where(span > 0, best_scale, 0)
    return best_scale.astype(np.float32), (-best_offset).astype(np.float32)


def _least_squares_scale(x: np.ndarray, candidates: Iterable[np.ndarray]) -> np.ndarray:
    """Of candidate level assignments L of x (..., n), the least-squares scale sum(w*x*L)/sum(w*L^2) of the one
    that removes the most squared error, sum(w*x*L)^2/sum(w*L^2) (weights w = x^2): the search ggml's symmetric and
    IQ4 quantizers share."""
    w = x * x
    wx = w * x
    best_score = np.full(x.shape[:-1], -1.0, np.float32)
    best_scale = np.zeros(x.shape[:-1], np.float32)
    for levels in candidates:
        sxl, sl2 = (wx * levels).sum(-1), (w * levels * levels).sum(-1)
        safe = np.where(sl2 > 0, sl2, 1)
        score = sxl * sxl / safe
        better = (sl2 > 0) & (score > best_score)
        best_score = np.where(better, score, best_score)
        best_scale = np.where(better, sxl / safe, best_scale)
    return best_scale


def _inverse_peak(x: np.ndarray) -> np.ndarray:
    """1 / the value of largest magnitude of each sub-block of x (..., n), as (..., 1)."""
    return _inverse(np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1))


def _fit_symmetric(x: np.ndarray, nmax: int, nstep: int) -> np.ndarray:
    """x (..., n) ~ scale*L with L in -nmax..nmax-1: the symmetric sub-blocks of Q3_K and Q6_K.

    Like ggml's make_qx_quants: the value of largest magnitude maps to about -nmax (the side with the extra
    level), candidates spread the inverse scale by +-0.2*nstep levels (_least_squares_scale picks one).
    """
    inv_peak = _inverse_peak(x)
    return _least_squares_scale(
        x, (np.clip(np.rint(-(nmax + 0.2 * i) * inv_peak * x), -nmax, nmax - 1) for i in range(-nstep, nstep + 1))
    )


def _nearest_iq4(v: np.ndarray) -> np.ndarray:
    """The index of the IQ4 level nearest each value. The levels are integers, so every midpoint between two is a
    multiple of 0.5 and a table over half-unit bins answers exactly, without a search."""
    return _IQ4_TABLE[np.clip(np.floor(2 * v).astype(np.int32) + 256, 0, 511)]


_IQ4_TABLE = np.abs((np.arange(512) - 256) / 2 + 0.25 - IQ4_VALUES[:, None]).argmin(axis=0).astype(np.uint8)


def _fit_iq4(x: np.ndarray, ntry: int) -> np.ndarray:
    """x (..., 32) ~ scale*IQ4_VALUES[i]: IQ4's sub-block scale, as in ggml's quantize_row_iq4_nl_impl.

    The value of largest magnitude maps to the extreme level -127, shifted by up to ntry levels either way
    (_least_squares_scale picks one).
    """
    inv_peak = _inverse_peak(x)
    return _least_squares_scale(
        x, (IQ4_VALUES[_nearest_iq4((IQ4_VALUES[0] + t) * inv_peak * x)] for t in range(-ntry, ntry + 1))
    )


def _super_scale(scales: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nonnegative sub-block scales (n, m) -> the super-block's fp16 bytes and value, and integer scales 0..top."""
    raw, d = _f16(scales.max(axis=-1) / top)
    q = np.clip(np.rint(scales * _inverse(d)[:, None]), 0, top).astype(np.uint8)
    return raw, d, q


def _signed_super_scale(scales: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signed sub-block scales (n, m) -> the super-block's fp16 bytes and value, and integer scales in
    -levels..levels-1: the scale of largest magnitude maps to -levels, the side with the extra level."""
    peak = np.take_along_axis(scales, np.abs(scales).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    raw, d = _f16(-peak / levels)
    q = np.clip(np.rint(scales * _inverse(d)[:, None]), -levels, levels - 1).astype(np.int32)
    return raw, d, q


def _asymmetric_levels(x, d, dmin, sc, m, nmax):
    """The levels 0..nmax for sub-blocks (n, s, len) under the stored (rounded) scales and minimums."""
    step = d[:, None] * sc
    offset = dmin[:, None] * m
    return np.clip(np.rint((x + offset[..., None]) * _inverse(step)[..., None]), 0, nmax).astype(np.uint8)


def _pack_scales_mins_6bit(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K's and Q5_K's 12 scale bytes from 8 six-bit scales and mins: bytes 0-3 hold scales 0-3, 4-7 mins 0-3,
    each with two high bits of scales/mins 4-7 on top; bytes 8-11 the low nibbles of scales 4-7 and mins 4-7."""
    low = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6)], axis=1)
    return np.concatenate([low, (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)], axis=1)


def _pack_nibbles_64(q: np.ndarray) -> np.ndarray:
    """Q4_K's and Q5_K's 128 bytes of low nibbles from (n, 256) levels: each 64 values fill 32 bytes, the first 32
    values in the low nibbles and the next 32 in the high ones."""
    q = (q & 0xF).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def _pack_crumbs_128(q: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's 64 bytes of 2-bit fields from (n, 256) levels: each 128 values fill 32 bytes, value
    32*s + l of that half at bits 2s of byte l."""
    return _or_shifted((q & 3).reshape(-1, 2, 4, 32), 2, axis=2).reshape(-1, 64)


# ---- the types


def _q2_k(x: np.ndarray) -> np.ndarray:
    """block_q2_K (84 bytes per 256): scales[16] (4-bit scale low, 4-bit min high, per 16 values), qs[64] (2-bit
    levels), d and dmin (fp16). A value is d*scale*L - dmin*min."""
    sub = x.reshape(-1, 16, 16)
    scale, minimum = _fit_scale_min(sub, 3, -0.5, 0.1, 8)
    d_raw, d, sc = _super_scale(scale, 15)
    m_raw, dmin, m = _super_scale(minimum, 15)
    q = _asymmetric_levels(sub, d, dmin, sc, m, 3).reshape(-1, 256)
    return np.concatenate([sc | (m << 4), _pack_crumbs_128(q), d_raw, m_raw], axis=1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    """block_q3_K (110 bytes per 256): hmask[32] (bit 2 of each level+4: value 32*j + l at bit j of byte l), qs[64]
    (its low two bits), scales[12] (16 six-bit scales+32: low nibbles in bytes 0-7, scale i and i+8 sharing byte
    i; high two bits in bytes 8-11, scale i at bits 2*(i//4) of byte 8 + i%4), d (fp16). A value is d*scale*L,
    L in -4..3."""
    sub = x.reshape(-1, 16, 16)
    d_raw, d, sc = _signed_super_scale(_fit_symmetric(sub, 4, 4), 32)
    step = _inverse(d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(sub * step), -4, 3) + 4).astype(np.uint8).reshape(-1, 256)
    hmask = _or_shifted((q >> 2).reshape(-1, 8, 32), 1, axis=1)
    s = (sc + 32).astype(np.uint8)
    low = (s[:, :8] & 0xF) | ((s[:, 8:] & 0xF) << 4)
    high = _or_shifted((s >> 4).reshape(-1, 4, 4), 2, axis=1)
    return np.concatenate([hmask, _pack_crumbs_128(q), low, high, d_raw], axis=1)


def _k_asymmetric(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, ...]:
    """Q4_K's and Q5_K's shared half: 8 sub-blocks of 32, six-bit scales and mins under fp16 d and dmin."""
    sub = x.reshape(-1, 8, 32)
    scale, minimum = _fit_scale_min(sub, nmax, rmin, 0.2, nstep)
    d_raw, d, sc = _super_scale(scale, 63)
    m_raw, dmin, m = _super_scale(minimum, 63)
    q = _asymmetric_levels(sub, d, dmin, sc, m, nmax).reshape(-1, 256)
    return d_raw, m_raw, _pack_scales_mins_6bit(sc, m), q


def _q4_k(x: np.ndarray) -> np.ndarray:
    """block_q4_K (144 bytes per 256): d, dmin (fp16), scales[12] (6-bit scales and mins per 32 values), qs[128]
    (4-bit levels). A value is d*scale*L - dmin*min."""
    d_raw, m_raw, scales, q = _k_asymmetric(x, 15, -1.0, 10)
    return np.concatenate([d_raw, m_raw, scales, _pack_nibbles_64(q)], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    """block_q5_K (176 bytes per 256): Q4_K's layout with qh[32] between scales and qs: bit 4 of value 32*j + l at
    bit j of byte l."""
    d_raw, m_raw, scales, q = _k_asymmetric(x, 31, -0.5, 8)
    qh = _or_shifted((q >> 4).reshape(-1, 8, 32), 1, axis=1)
    return np.concatenate([d_raw, m_raw, scales, qh, _pack_nibbles_64(q)], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """block_q6_K (210 bytes per 256): ql[128] (low nibbles of level+32: per half of 128, value l and 64+l share
    byte l), qh[64] (its top two bits: value 32*s + l of a half at bits 2s of byte l), scales[16] (int8 per 16
    values), d (fp16). A value is d*scale*L, L in -32..31."""
    sub = x.reshape(-1, 16, 16)
    d_raw, d, sc = _signed_super_scale(_fit_symmetric(sub, 32, 4), 128)
    step = _inverse(d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(sub * step), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 2, 64)
    ql = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
    qh = _or_shifted((q >> 4).reshape(-1, 2, 4, 32), 2, axis=2).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d_raw], axis=1)


def _iq4_nl(x: np.ndarray) -> np.ndarray:
    """block_iq4_nl (18 bytes per 32): d (fp16), qs[16] (4-bit indices into IQ4_VALUES: value l in the low nibble
    of byte l, value 16 + l in its high nibble). A value is d*IQ4_VALUES[i]."""
    d_raw, d = _f16(_fit_iq4(x, 7))
    idx = _nearest_iq4(x * _inverse(d)[:, None]).reshape(-1, 2, 16)
    return np.concatenate([d_raw, idx[:, 0] | (idx[:, 1] << 4)], axis=1)


def _iq4_xs(x: np.ndarray) -> np.ndarray:
    """block_iq4_xs (136 bytes per 256): d (fp16), scales_h (uint16: two high bits of sub-block j's scale+32 at bits
    2j), scales_l[4] (its low nibbles, sub-block 2b and 2b+1 in byte b), qs[128] (IQ4_NL's nibble order per 32)."""
    sub = x.reshape(-1, 8, 32)
    d_raw, d, ls = _signed_super_scale(_fit_iq4(sub, 7), 32)
    idx = _nearest_iq4(sub * _inverse(d[:, None] * ls)[..., None]).reshape(-1, 8, 2, 16)
    s = (ls + 32).astype(np.uint8)
    high = _or_shifted(s >> 4, 2, axis=1).reshape(-1, 1).view(np.uint8)
    low = (s[:, 0::2] & 0xF) | ((s[:, 1::2] & 0xF) << 4)
    qs = (idx[:, :, 0] | (idx[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([d_raw, high, low, qs], axis=1)


QUANTIZERS: dict[T, Callable[[np.ndarray], np.ndarray]] = {
    T.Q2_K: _q2_k,
    T.Q3_K: _q3_k,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
    T.IQ4_NL: _iq4_nl,
    T.IQ4_XS: _iq4_xs,
}
