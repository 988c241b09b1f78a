// GGUF's block formats run as the file stores them: Q5_0 and Q5_1 (blocks of 32 weights with a float16 scale) and
// the K-quants Q4_K, Q5_K and Q6_K (super-blocks of 256 weights whose sub-block scales are packed in 6 or 8 bits).
// A weight row is the file's row of blocks, unchanged; the kernels unpack each group of 32 weights into unsigned
// bytes u and dot them with the int8 activations (quantized.h).
//
// Every format reads as x = a*u - b, with a and b constant over each 16 weights: Q5_0 a = d, b = 16d; Q5_1 a = d, b = -m; Q4_K and Q5_K a = d*scale, b = dmin*min of the sub-block; Q6_K a = d*scale, b = 32*d*scale. So one
// loop serves them all: sum_i x_i * xq_i * xd = a * xd * dot(u, xq) - b * s16, where s16 = xd * sum(xq) over the
// 16 activations comes with the quantized activations. Groups go four at a time (128 weights, a "chunk") so that
// fma4 converts and scales four groups' sums in one go.

#include "quantized.h"

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#ifdef ROOFTOP_AVX2
  return _cvtsh_ss(bits);  // F16C: one instruction, where at::Half converts in software
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// Q4_K and Q5_K pack 8 six-bit scales and 8 six-bit mins in 12 bytes: sub-blocks 0-3 in the low 6 bits of bytes
// 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 in bytes 8-11's nibbles plus the top 2 bits of bytes 0-7.
inline void scale_min_k4(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63, min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q5_0: per 32 weights a float16 d, a 32-bit mask of fifth bits and 16 bytes whose low nibbles are weights 0-15
// and high nibbles 16-31; Q5_1 has a float16 minimum m after d. x = d * (u - 16) and d * u + m. (Q4_0 runs on
// tiles.cpp's loop, repacked in tiles of 16 rows, which batches better.)
template <bool Min>
struct Block32 {
  static constexpr int64_t QK = 32, HIGH = Min ? 4 : 2, QS = HIGH + 4, BYTES = QS + 16;
  static constexpr bool PER16 = false, SUPER = false;

  static float offset(const uint8_t* blk) { return Min ? -half_at(blk + 2) : half_at(blk) * 16.f; }

  static void decode(const uint8_t* row, int64_t g, uint8_t* u, float* a, float* b) {
    const uint8_t* blk = row + g * BYTES;
    const uint8_t* qs = blk + QS;
    uint32_t high;
    std::memcpy(&high, blk + HIGH, 4);
    for (int i = 0; i < 16; ++i) {
      u[i] = (qs[i] & 15) | (((high >> i) & 1) << 4);
      u[i + 16] = (qs[i] >> 4) | (((high >> (i + 16)) & 1) << 4);
    }
    decode_scales(row, g, a, b);
  }

  static void decode_scales(const uint8_t* row, int64_t g, float* a, float* b) {
    const uint8_t* blk = row + g * BYTES;
    a[0] = a[1] = half_at(blk);
    b[0] = b[1] = offset(blk);
  }

#ifdef ROOFTOP_AVX2
  // The four blocks' d (and m) gathered into one vector and converted at once (F16C); both halves of a block
  // share its scale, so fma4's order needs no shuffle, and its offset applies to its 32-sum s.
  static __m128 halves4(const uint8_t* blk, int at) {
    uint16_t h[4];
    for (int j = 0; j < 4; ++j) std::memcpy(&h[j], blk + j * BYTES + at, 2);
    return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h)));
  }

  static void chunk(const uint8_t* row, int64_t c, __m256& scales, __m128& offsets) {
    const uint8_t* blk = row + 4 * c * BYTES;
    const __m128 d = halves4(blk, 0);
    scales = _mm256_set_m128(d, d);
    offsets = Min ? _mm_sub_ps(_mm_setzero_ps(), halves4(blk, 2)) : _mm_mul_ps(d, _mm_set1_ps(16.f));
  }

  static __m256i block(const uint8_t* row, int64_t g) {
    const uint8_t* blk = row + g * BYTES;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + QS));
    const __m128i mask = _mm_set1_epi8(15);
    const __m256i low = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask));
    // bit i of the mask -> 16 in byte i: broadcast, pick byte i / 8 into lane i, test bit i % 8
    uint32_t high;
    std::memcpy(&high, blk + HIGH, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(high)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(16)));
  }

  template <int J>
  static __m256i group(const uint8_t* row, int64_t c) { return block(row, 4 * c + J); }
#endif
};

// Q4_K (144 bytes per 256 weights): d, dmin (float16), the 12 bytes of packed scales and mins, then 128 bytes in
// which each 32 hold two sub-blocks: low nibbles sub-block 2p, high nibbles 2p + 1. Q5_K (176 bytes) puts 32
// bytes of fifth bits before them: bit j of byte l is the fifth bit of weight l of sub-block j.
template <bool FifthBit>
struct BlockK4 {
  static constexpr int64_t QK = 256, BYTES = FifthBit ? 176 : 144;
  static constexpr int64_t QS = FifthBit ? 48 : 16;
  static constexpr bool PER16 = false, SUPER = true;  // super(): a whole super-block at 512 bits

  static void sub_block(const uint8_t* sb, int j, float& a, float& b) {
    int scale, min;
    scale_min_k4(j, sb + 4, scale, min);
    a = half_at(sb) * scale, b = half_at(sb + 2) * min;
  }

  static void decode(const uint8_t* row, int64_t g, uint8_t* u, float* a, float* b) {
    const uint8_t* sb = row + (g / 8) * BYTES;
    const int j = g % 8;
    const uint8_t* qs = sb + QS + (j / 2) * 32;
    for (int l = 0; l < 32; ++l) {
      u[l] = (j % 2 ? qs[l] >> 4 : qs[l] & 15) | (FifthBit ? ((sb[16 + l] >> j) & 1) << 4 : 0);
    }
    decode_scales(row, g, a, b);
  }

  static void decode_scales(const uint8_t* row, int64_t g, float* a, float* b) {
    sub_block(row + (g / 8) * BYTES, g % 8, a[0], b[0]);
    a[1] = a[0], b[1] = b[0];
  }

#ifdef ROOFTOP_AVX2
  // The four sub-blocks' 6-bit scales and mins of a chunk (scale_min_k4 for four j at once, a byte per j in a
  // 32-bit word), times d and dmin.
  static void chunk(const uint8_t* row, int64_t c, __m256& scales, __m128& offsets) {
    const uint8_t* sb = row + (c / 2) * BYTES;
    uint32_t q[3];
    std::memcpy(q, sb + 4, 12);
    uint32_t scale, min;
    if (c % 2 == 0) {
      scale = q[0] & 0x3f3f3f3f, min = q[1] & 0x3f3f3f3f;
    } else {
      scale = (q[2] & 0x0f0f0f0f) | ((q[0] >> 2) & 0x30303030);
      min = ((q[2] >> 4) & 0x0f0f0f0f) | ((q[1] >> 2) & 0x30303030);
    }
    auto floats = [](uint32_t bytes) { return _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(bytes)))); };
    const __m128 a = _mm_mul_ps(floats(scale), _mm_set1_ps(half_at(sb)));
    scales = _mm256_set_m128(a, a);
    offsets = _mm_mul_ps(floats(min), _mm_set1_ps(half_at(sb + 2)));
  }

  template <int J>
  static __m256i group(const uint8_t* row, int64_t c) {
    const uint8_t* sb = row + (c / 2) * BYTES;
    const int j = 4 * (c % 2) + J;
    const __m256i q = load32(sb + QS + (j / 2) * 32);
    const __m256i mask = _mm256_set1_epi8(15);
    __m256i u = J % 2 ? _mm256_and_si256(_mm256_srli_epi16(q, 4), mask) : _mm256_and_si256(q, mask);
    if (FifthBit) {
      const __m256i bits = _mm256_srl_epi16(load32(sb + 16), _mm_cvtsi32_si128(j));
      u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(bits, _mm256_set1_epi8(1)), 4));
    }
    return u;
  }
#endif

#ifdef ROOFTOP_AVX512
  // A whole super-block (dot_super): its 8 groups as four pairs of 64 unsigned bytes, and a = d * scale and
  // b = dmin * min per 16 weights (each sub-block's twice). The packed scales are decoded once per 256 weights,
  // and two 64-byte loads give all the nibbles: bytes 32i..32i + 31 hold group 2i low and 2i + 1 high, so the low
  // nibbles of a load are groups (0, 2) and the high (1, 3), regrouped by 128-bit lanes.
  static void super(const uint8_t* sb, __m512i w[4], __m512& a, __m512& b) {
    uint32_t q[3];
    std::memcpy(q, sb + 4, 12);
    const uint64_t scales = (q[0] & 0x3f3f3f3f) | uint64_t((q[2] & 0x0f0f0f0f) | ((q[0] >> 2) & 0x30303030)) << 32;
    const uint64_t mins = (q[1] & 0x3f3f3f3f) | uint64_t(((q[2] >> 4) & 0x0f0f0f0f) | ((q[1] >> 2) & 0x30303030)) << 32;
    auto floats = [](uint64_t bytes) {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes))));
    };
    const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    a = _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_mul_ps(floats(scales), _mm256_set1_ps(half_at(sb)))));
    b = _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_mul_ps(floats(mins), _mm256_set1_ps(half_at(sb + 2)))));
    const __m512i mask = _mm512_set1_epi8(15);
    const __m512i fifth = FifthBit ? _mm512_broadcast_i64x4(load32(sb + 16)) : _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i bytes = _mm512_loadu_si512(sb + QS + 64 * h);
      const __m512i low = _mm512_and_si512(bytes, mask), high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), mask);
      w[2 * h] = _mm512_shuffle_i64x2(low, high, 0x44);  // 128-bit lanes 0, 1 of low, then of high
      w[2 * h + 1] = _mm512_shuffle_i64x2(low, high, 0xee);  // lanes 2, 3 of each
      if (FifthBit) {  // group j's fifth bits are bit j of the 32 bytes, moved to bit 4
        for (int p = 2 * h; p < 2 * h + 2; ++p) {
          const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(2 * p)), _mm256_set1_epi16(static_cast<short>(2 * p + 1)), 1);
          const __m512i bit = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(fifth, shift), 4), _mm512_set1_epi8(16));
          w[p] = _mm512_or_si512(w[p], bit);
        }
      }
    }
  }
#endif
};

// Q6_K (210 bytes per 256 weights): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one
// per 16 weights) and d (float16) last; x = d * scale * (u - 32). Each half of 128 weights reads 64 low-nibble
// bytes ql and 32 high-bit bytes qh: its group J takes the low (J < 2) or high nibbles of ql[32 (J % 2) + l] and
// bits 2J, 2J + 1 of qh[l].
struct BlockQ6K {
  static constexpr int64_t QK = 256, BYTES = 210;
  static constexpr bool PER16 = true, SUPER = true;

  static void decode(const uint8_t* row, int64_t g, uint8_t* u, float* a, float* b) {
    const uint8_t* sb = row + (g / 8) * BYTES;
    const int half = (g % 8) / 4, j = g % 4;
    const uint8_t *ql = sb + 64 * half + 32 * (j % 2), *qh = sb + 128 + 32 * half;
    for (int l = 0; l < 32; ++l) u[l] = (j < 2 ? ql[l] & 15 : ql[l] >> 4) | (((qh[l] >> (2 * j)) & 3) << 4);
    decode_scales(row, g, a, b);
  }

  static void decode_scales(const uint8_t* row, int64_t g, float* a, float* b) {
    const uint8_t* sb = row + (g / 8) * BYTES;
    const float d = half_at(sb + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(sb + 192) + 2 * (g % 8);
    for (int h = 0; h < 2; ++h) a[h] = d * scales[h], b[h] = 32.f * a[h];
  }

#ifdef ROOFTOP_AVX2
  // The chunk's 8 int8 scales (one per 16 weights) in fma4's order; the offsets of a scale per 16 cannot fold
  // into the 32-sums, so they come per 16 (chunk16).
  static void chunk16(const uint8_t* row, int64_t c, __m256& scales, __m256& offsets) {
    const uint8_t* sb = row + (c / 2) * BYTES;
    const __m256 d = _mm256_set1_ps(half_at(sb + 208));
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + 192 + 8 * (c % 2)));
    const __m256 natural = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    scales = _mm256_permutevar8x32_ps(natural, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    offsets = _mm256_mul_ps(natural, _mm256_set1_ps(32.f));
  }

  template <int J>
  static __m256i group(const uint8_t* row, int64_t c) {
    const uint8_t* sb = row + (c / 2) * BYTES;
    const int half = c % 2;
    const __m256i ql = load32(sb + 64 * half + 32 * (J % 2)), qh = load32(sb + 128 + 32 * half);
    const __m256i mask = _mm256_set1_epi8(15);
    const __m256i low = J < 2 ? _mm256_and_si256(ql, mask) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), mask);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * J), _mm256_set1_epi8(3));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  }
#endif

#ifdef ROOFTOP_AVX512
  // A whole super-block (dot_super): each half's 64 low-nibble bytes are groups 0-1 (low nibbles) and 2-3 (high)
  // in the activations' order already; qh, the same 32 bytes for all four, gives each half of a pair its 2 bits.
  // a = d * scale and b = 32 a per 16 weights.
  static void super(const uint8_t* sb, __m512i w[4], __m512& a, __m512& b) {
    a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 192)))),
                      _mm512_set1_ps(half_at(sb + 208)));
    b = _mm512_mul_ps(a, _mm512_set1_ps(32.f));
    const __m512i mask = _mm512_set1_epi8(15);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(sb + 64 * h), qh = _mm512_broadcast_i64x4(load32(sb + 128 + 32 * h));
      const __m512i nibbles[2] = {_mm512_and_si512(ql, mask), _mm512_and_si512(_mm512_srli_epi16(ql, 4), mask)};
      for (int p = 0; p < 2; ++p) {  // groups 2p, 2p + 1 of the half: bits 4p, 4p + 1 and 4p + 2, 4p + 3 of qh
        const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * p)), _mm256_set1_epi16(static_cast<short>(4 * p + 2)), 1);
        const __m512i high = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(qh, shift), 4), _mm512_set1_epi8(48));
        w[2 * h + p] = _mm512_or_si512(nibbles[p], high);
      }
    }
  }
#endif
};

// One output row of format F dotted with R activation rows: chunks of four groups through fma4 with each half
// group's scale a, the offsets b dotted with the activations' 32-sums (16-sums for Q6_K, whose scales change every
// 16 weights) once per chunk; a tail of 1-3 groups (block-32 formats whose K is not a multiple of 128, such as the
// bundled model's 576) singly. The portable loops decode each group into bytes first.
template <typename F>
struct BlockWeights {
  const uint8_t* data;  // (N, K / QK * BYTES): the file's rows of blocks
  const QuantizedRows* a;
  int64_t groups;

  template <int R>
  void dot(int64_t n, int64_t r0, float* acc) const {
    const uint8_t* row = data + n * (groups * GROUP / F::QK) * F::BYTES;
    const int8_t* xq = a->q.data() + r0 * groups * GROUP;
    const float *xd = a->d.data() + r0 * groups, *xs = a->s16.data() + r0 * groups * 2, *xs32 = a->s.data() + r0 * groups;
    const int64_t chunks = groups / 4;
#ifdef ROOFTOP_AVX512
    if constexpr (F::SUPER) {
      dot_super<R>(row, xq, xd, xs, acc);
      return;
    }
#endif
#ifdef ROOFTOP_AVX2
    __m256 sum[R], off[R];
    for (int r = 0; r < R; ++r) sum[r] = off[r] = _mm256_setzero_ps();
#ifdef ROOFTOP_AVX512
    __m512 wide[R][2];
    for (int r = 0; r < R; ++r) wide[r][0] = wide[r][1] = _mm512_setzero_ps();
#endif
    for (int64_t c = 0; c < chunks; ++c) {
      const __m256i w0 = F::template group<0>(row, c), w1 = F::template group<1>(row, c);
      const __m256i w2 = F::template group<2>(row, c), w3 = F::template group<3>(row, c);
#ifdef ROOFTOP_AVX512
      const __m512i w01 = join(w0, w1), w23 = join(w2, w3);
#endif
      __m256 scales;
      if constexpr (F::PER16) {  // offsets per 16 weights, against the activations' 16-sums
        __m256 offsets;
        F::chunk16(row, c, scales, offsets);
        for (int r = 0; r < R; ++r) off[r] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(xs + 2 * (r * groups + 4 * c)), off[r]);
      } else {  // one offset per 32 weights, against the 32-sums
        __m128 offsets;
        F::chunk(row, c, scales, offsets);
        for (int r = 0; r < R; ++r) {
          const __m128 o = _mm_mul_ps(offsets, _mm_loadu_ps(xs32 + r * groups + 4 * c));
          off[r] = _mm256_add_ps(off[r], _mm256_zextps128_ps256(o));  // the upper half zero, not undefined
        }
      }
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + 4 * c;
        const int8_t* x = xq + ag * GROUP;
        const __m128 d4 = _mm_loadu_ps(xd + ag);
#ifdef ROOFTOP_AVX512
        fma4_wide(w01, w23, x, _mm256_mul_ps(scales, _mm256_set_m128(d4, d4)), wide[r]);
#else
        sum[r] = fma4(dot_i32(w0, load32(x)), dot_i32(w1, load32(x + 32)), dot_i32(w2, load32(x + 64)),
                      dot_i32(w3, load32(x + 96)), _mm256_mul_ps(scales, _mm256_set_m128(d4, d4)), sum[r]);
#endif
      }
    }
#ifdef ROOFTOP_AVX512
    for (int r = 0; r < R; ++r) sum[r] = fold(wide[r]);
#endif
    if constexpr (F::QK == GROUP) {  // the last 1-3 blocks of a row whose K is not a multiple of 128
      for (int64_t g = 4 * chunks; g < groups; ++g) {
        const __m256i w = F::block(row, g);
        float a[2], b[2];
        F::decode_scales(row, g, a, b);
        for (int r = 0; r < R; ++r) {
          const int64_t ag = r * groups + g;
          const __m256 p = _mm256_cvtepi32_ps(dot_i32(w, load32(xq + ag * GROUP)));
          sum[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(a[0] * xd[ag]), sum[r]);
          off[r] = _mm256_add_ps(off[r], _mm256_zextps128_ps256(_mm_set_ss(b[0] * xs32[ag])));
        }
      }
    }
    for (int r = 0; r < R; ++r) acc[r] = hsum(sum[r]) - hsum(off[r]);
#else
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    uint8_t u[32];
    float av[2], bv[2];
    for (int64_t g = 0; g < groups; ++g) {
      F::decode(row, g, u, av, bv);
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        for (int h = 0; h < 2; ++h) {
          int isum = 0;
          for (int i = 0; i < 16; ++i) isum += u[16 * h + i] * xq[ag * GROUP + 16 * h + i];
          acc[r] += av[h] * xd[ag] * isum - bv[h] * xs[2 * ag + h];
        }
      }
    }
#endif
  }

#ifdef ROOFTOP_AVX512
  // The K-quants at 512 bits, a super-block at a time (F::super: four pairs of groups, and a and b per 16
  // weights): per row, four dpbusd whose lanes take their 16 weights' a times the activations' d, and one FMA of
  // the offsets b with the activations' 16-sums.
  template <int R>
  void dot_super(const uint8_t* row, const int8_t* xq, const float* xd, const float* xs, float* acc) const {
    __m512 wide[R][2], off[R];
    for (int r = 0; r < R; ++r) wide[r][0] = wide[r][1] = off[r] = _mm512_setzero_ps();
    const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512i pick[4];  // pair p's lanes 4i..4i+3 are the products of weights 16i..16i+15 of groups 2p, 2p + 1
    for (int p = 0; p < 4; ++p) {
      pick[p] = _mm512_set_epi32(4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 2,
                                 4 * p + 1, 4 * p + 1, 4 * p + 1, 4 * p + 1, 4 * p, 4 * p, 4 * p, 4 * p);
    }
    for (int64_t g = 0; g < groups; g += 8) {
      __m512i w[4];
      __m512 scale, offset;
      F::super(row + (g / 8) * F::BYTES, w, scale, offset);
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        const int8_t* x = xq + ag * GROUP;
        const __m512 s = _mm512_mul_ps(scale, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(xd + ag))));
        for (int p = 0; p < 4; ++p) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[p], _mm512_loadu_si512(x + 64 * p));
          wide[r][p % 2] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(pick[p], s), wide[r][p % 2]);
        }
        off[r] = _mm512_fmadd_ps(offset, _mm512_loadu_ps(xs + 2 * ag), off[r]);
      }
    }
    for (int r = 0; r < R; ++r) acc[r] = _mm512_reduce_add_ps(_mm512_sub_ps(_mm512_add_ps(wide[r][0], wide[r][1]), off[r]));
  }
#endif
};

template <typename F, typename T>
void dequantize_rows(const uint8_t* data, int64_t n, int64_t k, T* out) {
  const int64_t groups = k / GROUP, row_bytes = k / F::QK * F::BYTES;
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    uint8_t u[32];
    float a[2], b[2];
    for (int64_t row = n0; row < n1; ++row) {
      const uint8_t* rp = data + row * row_bytes;
      int64_t g = 0;
#ifdef ROOFTOP_AVX2
      for (; g + 4 <= groups; g += 4) {
        const __m256i w[4] = {F::template group<0>(rp, g / 4), F::template group<1>(rp, g / 4),
                              F::template group<2>(rp, g / 4), F::template group<3>(rp, g / 4)};
        for (int j = 0; j < 4; ++j) {
          F::decode_scales(rp, g + j, a, b);
          widen32(w[j], a[0], b[0], a[1], b[1], out + row * k + (g + j) * GROUP);
        }
      }
#endif
      for (; g < groups; ++g) {
        F::decode(rp, g, u, a, b);
        T* y = out + row * k + g * GROUP;
        for (int i = 0; i < GROUP; ++i) put(y + i, a[i / 16] * u[i] - b[i / 16]);
      }
    }
  });
}

enum class Format : int64_t { Q5_0 = 0, Q5_1 = 1, Q4_K = 2, Q5_K = 3, Q6_K = 4 };

template <typename Fn>
auto by_format(int64_t format, Fn&& fn) {
  switch (static_cast<Format>(format)) {
    case Format::Q5_0: return fn(Block32<false>{});
    case Format::Q5_1: return fn(Block32<true>{});
    case Format::Q4_K: return fn(BlockK4<false>{});
    case Format::Q5_K: return fn(BlockK4<true>{});
    case Format::Q6_K: return fn(BlockQ6K{});
  }
  TORCH_CHECK(false, "unknown block format ", format);
}

template <typename F>
void check_blocks(const at::Tensor& data, int64_t k) {
  TORCH_CHECK(k % F::QK == 0, "K = ", k, " is not a multiple of the format's ", F::QK, "-weight blocks");
  TORCH_CHECK(data.dim() == 2 && data.scalar_type() == at::kByte && data.is_contiguous() && data.size(1) == k / F::QK * F::BYTES,
              "blocks must be contiguous uint8 (N, K / ", F::QK, " * ", F::BYTES, ")");
}

}  // namespace

// x (rows, K) float32 @ the block rows `data` (N, bytes per row) of `format` (0 Q5_0, 1 Q5_1, 2 Q4_K, 3 Q5_K,
// 4 Q6_K: quant/linear.py's KERNEL_FORMATS), transposed (+bias) (+residual).
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& data, int64_t format,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual) {
  const int64_t k = x.size(1), n = data.size(0);
  check_linear_inputs(x, bias, residual, n);
  return by_format(format, [&](auto f) {
    using F = decltype(f);
    check_blocks<F>(data, k);
    return run_linear(BlockWeights<F>{data.data_ptr<uint8_t>(), nullptr, k / GROUP}, x, n, bias, residual);
  });
}

// Float32 or bfloat16 (N, K) from block rows: the weights a prefill chunk widens to run as one sgemm.
at::Tensor block_dequantize(const at::Tensor& data, int64_t format, int64_t k, bool bf16) {
  return by_format(format, [&](auto f) {
    using F = decltype(f);
    check_blocks<F>(data, k);
    return widened(data.size(0), k, bf16, data.options(),
                   [&](auto* out) { dequantize_rows<F>(data.data_ptr<uint8_t>(), data.size(0), k, out); });
  });
}
