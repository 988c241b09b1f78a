// Decode attention straight from the paged KV pool, as the pool stores K and V: float32, bfloat16 or float16
// (--kv-cache-dtype's casts), or int8 or fp8 e4m3 values with a float32 scale per (slot, KV head). Each decode's new k
// and v are written to their slots first (rotated and quantized on the way in, as kv_cache.quantize_kv does), then
// each query head attends over its sequence's first `lengths[b]` positions where they lie in the pool. A quantized
// pool holds every head rotated by the normalized Walsh-Hadamard transform (rotate_heads): the queries are rotated
// the same way before they meet the keys (q . k is unchanged), and the weighted sums of the rotated values are
// rotated back (the transform is its own inverse).
//
// One task per sequence and PART keys (Task), all heads: a task first copies its slots, read whole and in order, into
// one block of rows per KV head, then attends from that copy in the cache (a task whose blocks an earlier sequence of
// the step reads too attends from the pool, where they are cached by then); the query heads that share a KV head are
// scored together against each key row (one load for the group, their dots summed 16 at a time), and each V row is
// widened once for four heads' weighted sums (AVX2: three).
// - float32: q . k and sum_s p v in float FMAs, on the rows as stored.
// - int8: q is quantized per head to int16 (max|q| / 32767: its rounding negligible beside K's) and dotted with the
//   int8 keys in integers (sign-extended to 16 bits, AVX2's madd or VNNI's dpwssd: exact sums, the same in the
//   plain loops), then scaled by both scales; V rows are widened to floats in registers, each softmax weight
//   carrying its row's scale.
// - fp8 e4m3: a tile of keys is widened to floats, times their scales, once for the group, then dotted in float32;
//   V rows are widened in registers. The vector loops widen e4m3 through float16: its bits shifted into place are
//   exactly 2^-8 of the value, which F16C converts (the 2^8 rides on the scale); the plain loops use a table.

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <array>
#include <memory>
#include <numeric>
#include <unordered_set>
#include <utility>
#include <type_traits>

#include "exp.h"
#include "kernels.h"

namespace {

using Fp8 = c10::Float8_e4m3fn;
using Bf16 = c10::BFloat16;
using Fp16 = c10::Half;

constexpr int64_t KEY_TILE = 64;  // keys whose rows stay in L1 while the group's query heads read them
constexpr int64_t PART = 64;  // the most keys one task attends (see Task); 32 and 128 measured no better
#ifdef ROOFTOP_AVX512
constexpr int64_t HEADS_AT_ONCE = 4;  // query heads sharing each widened V row (their sums: 16 of 32 registers)
#else
constexpr int64_t HEADS_AT_ONCE = 3;  // (12 of 16 registers)
#endif
constexpr float FP8_UNIT = 256.f;  // what a widened e4m3 value is short of (float16 bits: 2^-8 of the value)

// What a quantized pool stores: values in [-largest, largest] times a scale per (slot, KV head).
template <typename T>
struct Stored;
template <>
struct Stored<float> {  // the float pools (and bfloat16, float16 below): values as they are, no scales
  static constexpr bool scaled = false;
};
template <>
struct Stored<Bf16> : Stored<float> {};
template <>
struct Stored<Fp16> : Stored<float> {};
template <>
struct Stored<int8_t> {
  static constexpr bool scaled = true;
  static constexpr float largest = 127.f;
  static constexpr float unit = 1.f;
  static int8_t from(float v) { return static_cast<int8_t>(std::nearbyint(v)); }
};
template <>
struct Stored<int16_t> {  // the queries that meet int8 keys: 16-bit, so that their rounding is negligible beside K's
  static constexpr float largest = 32767.f;
  static constexpr float unit = 1.f;
  static int16_t from(float v) { return static_cast<int16_t>(std::nearbyint(v)); }
};
template <>
struct Stored<Fp8> {
  static constexpr bool scaled = true;
  static constexpr float largest = 448.f;  // e4m3's largest finite value
  static constexpr float unit = FP8_UNIT;
  static Fp8 from(float v) { return Fp8(v); }  // round to nearest even, as torch's .to(torch.float8_e4m3fn)
};

// x (heads * dim) -> values and a scale per head: scale = max|x| / largest, value = x / scale clamped to
// [-largest, largest] and rounded to the format (a zero head: scale 0, values 0).
template <typename T>
void quantize_heads(const float* x, int64_t heads, int64_t dim, T* q, float* scale) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* xh = x + h * dim;
    float top = 0.f;
    for (int64_t j = 0; j < dim; ++j) top = std::max(top, std::fabs(xh[j]));
    const float sc = top / Stored<T>::largest, div = sc == 0.f ? 1.f : sc;
    for (int64_t j = 0; j < dim; ++j) {
      q[h * dim + j] = Stored<T>::from(std::max(-Stored<T>::largest, std::min(Stored<T>::largest, xh[j] / div)));
    }
    scale[h] = sc;
  }
}

// x (heads * dim) <- each head times the normalized Walsh-Hadamard matrix, blockwise over dim's largest power-of-two
// divisor: kv_cache.rotate_heads's butterflies in the same order, so both give the same bits.
void rotate_heads(float* x, int64_t heads, int64_t dim) {
  const int64_t n = dim & -dim;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < heads * dim; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  for (int64_t j = 0; j < heads * dim; ++j) x[j] *= norm;
}

// e4m3 bits -> the value / FP8_UNIT, as the vector loops widen it.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(Fp8(static_cast<uint8_t>(i), Fp8::from_bits())) / FP8_UNIT;
    return t;
  }();
  return table;
}

inline float widened(float v) { return v; }
inline float widened(int8_t v) { return static_cast<float>(v); }
inline float widened(Fp8 v) { return fp8_table()[v.x]; }
inline float widened(Bf16 v) { return static_cast<float>(v); }
inline float widened(Fp16 v) { return static_cast<float>(v); }

#ifdef ROOFTOP_AVX2
// Eight consecutive values of a row as floats (e4m3: / FP8_UNIT).
inline __m256 widen8(const float* v) { return _mm256_loadu_ps(v); }
inline __m256 widen8(const int8_t* v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v))));
}
// The byte sign-extended to 16 bits and shifted left by 7 holds e4m3's exponent and mantissa where float16 keeps
// them and its sign at bit 15, with a stray copy of the sign at bit 14, cleared.
inline __m256 widen8(const Fp8* v) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v));
  const __m128i half = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7), _mm_set1_epi16(static_cast<int16_t>(0xBFFF)));
  return _mm256_cvtph_ps(half);
}
inline __m256 widen8(const Fp16* v) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))); }
// bfloat16 is float32's upper half
inline __m256 widen8(const Bf16* v) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

#ifdef ROOFTOP_AVX512
// widen8 at 512 bits: sixteen values.
inline __m512 widen16(const float* v) { return _mm512_loadu_ps(v); }
inline __m512 widen16(const int8_t* v) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))));
}
inline __m512 widen16(const Fp8* v) {
  const __m256i bytes = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(bytes, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBFFF))));
}
inline __m512 widen16(const Fp16* v) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v))); }
inline __m512 widen16(const Bf16* v) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

// Eight int32 vectors' lane sums as one vector: lane i holds the sum of a[i]'s eight lanes.
inline __m256i sum_lanes8(const __m256i a[8]) {
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}
#endif

#ifdef ROOFTOP_AVX2
// A dot's 16 partial sums (lo: inputs 16c + 0..7, hi: 16c + 8..15 over the chunks c) added as lane_sums16 adds them:
// lane l and l + 8, then l and l + 4, then the pairs (0, 1) and (2, 3), then those two. So a key's score has the same
// bits on either vector width, and in either of the 512-bit path's loops.
inline float sum16(__m256 lo, __m256 hi) {
  const __m256 v = _mm256_add_ps(lo, hi);
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_hadd_ps(x, x);
  return _mm_cvtss_f32(_mm_hadd_ps(pairs, pairs));
}
#endif

// p[s] = scale * (q . the key at rows[s]) for s < n, float32 keys at base + rows[s] * stride. Four keys at a time,
// so that their FMA chains run side by side instead of each dot waiting on its own.
void scores(const float* q, const float* base, const int64_t* rows, int64_t stride, int64_t n, int64_t dim, float scale,
            float* p) {
  int64_t s = 0;
#ifdef ROOFTOP_AVX2
  if (dim % 16 == 0) {
    for (; s + 4 <= n; s += 4) {
      const float* k[4];
      for (int i = 0; i < 4; ++i) k[i] = base + rows[s + i] * stride;
      __m256 lo[4], hi[4];
      for (int i = 0; i < 4; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
      for (int64_t j = 0; j < dim; j += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + j), q1 = _mm256_loadu_ps(q + j + 8);
        for (int i = 0; i < 4; ++i) {
          lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(k[i] + j), q0, lo[i]);
          hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(k[i] + j + 8), q1, hi[i]);
        }
      }
      for (int i = 0; i < 4; ++i) p[s + i] = sum16(lo[i], hi[i]) * scale;
    }
    for (; s < n; ++s) {
      const float* k = base + rows[s] * stride;
      __m256 lo = _mm256_setzero_ps(), hi = lo;
      for (int64_t j = 0; j < dim; j += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(k + j), _mm256_loadu_ps(q + j), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(k + j + 8), _mm256_loadu_ps(q + j + 8), hi);
      }
      p[s] = sum16(lo, hi) * scale;
    }
  } else if (dim % 8 == 0) {
    for (; s + 4 <= n; s += 4) {
      const float *k0 = base + rows[s] * stride, *k1 = base + rows[s + 1] * stride;
      const float *k2 = base + rows[s + 2] * stride, *k3 = base + rows[s + 3] * stride;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < dim; j += 8) {
        const __m256 qv = _mm256_loadu_ps(q + j);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + j), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + j), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + j), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + j), a3);
      }
      p[s] = hsum(a0) * scale, p[s + 1] = hsum(a1) * scale, p[s + 2] = hsum(a2) * scale, p[s + 3] = hsum(a3) * scale;
    }
  }
#endif
  for (; s < n; ++s) {
    const float* k = base + rows[s] * stride;
    float sum = 0.f;
    for (int64_t j = 0; j < dim; ++j) sum += q[j] * k[j];
    p[s] = sum * scale;
  }
}

#ifdef ROOFTOP_AVX512
// Sixteen vectors' lane sums as one vector: lane i holds the sum of v[i]'s lanes. Each level adds the halves of pairs
// of vectors, so that 30 shuffles and 15 adds finish 16 dots where a horizontal sum per dot took 8 instructions.
// The levels leave lane 4m + r holding the input at m + 4r, so the inputs are taken in that order.
inline __m512 lane_sums16(const __m512 v[16]) {
  const auto at = [&](int i) { return v[(i % 4) * 4 + i / 4]; };
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // 256-bit halves: vector 2i's partial sums in the low half, 2i + 1's in the high
    const __m512 x = at(2 * i), y = at(2 * i + 1);
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit quarters: quarter m, vector 4i + m's
    const __m512 x = a[2 * i], y = a[2 * i + 1];
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) {  // pairs of lanes within each quarter
    const __m512 x = b[2 * i], y = b[2 * i + 1];
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The scores of HB query heads (consecutive, dim apart in q) against blocks of 16 / HB keys: each key row is loaded
// once for the HB heads and the HB x KB dots stay one lane each until lane_sums16 sums them all together.
// p[j * pstride + s] = scale * (q_j . key s); returns how many keys it scored (whole blocks). dim % 16 == 0.
template <int HB>
int64_t scores512(const float* q, int64_t dim, float scale, const float* base, const int64_t* rows, int64_t stride,
                  int64_t n, float* p, int64_t pstride) {
  constexpr int KB = 16 / HB;  // keys per block (HB 3: 15 lanes used)
  int64_t s = 0;
  for (; s + KB <= n; s += KB) {
    const float* k[KB];
    for (int i = 0; i < KB; ++i) k[i] = base + rows[s + i] * stride;
    __m512 acc[16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
      __m512 qv[HB];
      for (int j = 0; j < HB; ++j) qv[j] = _mm512_loadu_ps(q + j * dim + c);
      for (int i = 0; i < KB; ++i) {
        const __m512 kv = _mm512_loadu_ps(k[i] + c);
        for (int j = 0; j < HB; ++j) acc[j * KB + i] = _mm512_fmadd_ps(kv, qv[j], acc[j * KB + i]);
      }
    }
    alignas(64) float dots[16];
    _mm512_store_ps(dots, _mm512_mul_ps(lane_sums16(acc), _mm512_set1_ps(scale)));
    for (int j = 0; j < HB; ++j) std::copy_n(dots + j * KB, KB, p + j * pstride + s);
  }
  return s;
}
#endif

// The scores of `group` query heads (consecutive in q) against n keys at base + rows[s] * stride:
// p[h * pstride + s] = scale * (q_h . key s).
void key_scores(const float* q, int64_t group, int64_t dim, float scale, const float* base, const int64_t* rows,
                int64_t stride, int64_t n, float* p, int64_t pstride) {
  for (int64_t h = 0; h < group;) {
    const int64_t heads = std::min<int64_t>(4, group - h);
    int64_t done = 0;
#ifdef ROOFTOP_AVX512
    if (dim % 16 == 0) {
      const float* qh = q + h * dim;
      float* ph = p + h * pstride;
      switch (heads) {
        case 4: done = scores512<4>(qh, dim, scale, base, rows, stride, n, ph, pstride); break;
        case 3: done = scores512<3>(qh, dim, scale, base, rows, stride, n, ph, pstride); break;
        case 2: done = scores512<2>(qh, dim, scale, base, rows, stride, n, ph, pstride); break;
        default: done = scores512<1>(qh, dim, scale, base, rows, stride, n, ph, pstride);
      }
    }
#endif
    for (int64_t j = h; j < h + heads; ++j) {  // the keys after the last whole block, one head at a time
      scores(q + j * dim, base, rows + done, stride, n - done, dim, scale, p + j * pstride + done);
    }
    h += heads;
  }
}

#ifdef ROOFTOP_AVX2
// Eight keys' scores from their dots' int32 lanes: p[i] = (sum of dots[i]'s lanes) * qscale * key_scales[i].
inline void store_scores(const __m256i dots[8], float qscale, const float* key_scales, float* p) {
  const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(sum_lanes8(dots)), _mm256_set1_ps(qscale));
  _mm256_storeu_ps(p, _mm256_mul_ps(scaled, _mm256_loadu_ps(key_scales)));
}
#endif

#ifdef ROOFTOP_AVX512
// scores_int8's 512-bit loop for head_dim 32 * CHUNKS (32 key bytes widened per instruction): the keys of whole
// groups of eight; returns how many it scored.
template <int CHUNKS>
int64_t scores_int8_512(const int16_t* q, float qscale, const int8_t* base, const int64_t* rows, int64_t stride,
                        const float* key_scales, int64_t n, float* p) {
  __m512i qs[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) qs[c] = _mm512_loadu_si512(q + 32 * c);
  int64_t s = 0;
  for (; s + 8 <= n; s += 8) {
    __m256i dots[8];
    for (int i = 0; i < 8; ++i) {
      const int8_t* k = base + rows[s + i] * stride;
      __m512i acc = _mm512_setzero_si512();
      for (int c = 0; c < CHUNKS; ++c) {
        const __m512i kc = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 32 * c)));
        acc = _mm512_dpwssd_epi32(acc, qs[c], kc);
      }
      dots[i] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    }
    store_scores(dots, qscale, key_scales + s, p + s);
  }
  return s;
}
#endif

// scores of an int16 q over int8 keys: p[s] = (q . the key at rows[s]) * qscale * key_scales[s], the dot an exact
// integer (|q| <= 32767, |key| <= 127: at most 2^30 over 256 dims). The keys are sign-extended to 16 bits and
// multiplied in pairs of int16 (AVX2's madd, VNNI's dpwssd: the same sums), eight keys at a time, each key's dot a
// vector of int32 lanes until the eight are summed together.
void scores_int8(const int16_t* q, float qscale, const int8_t* base, const int64_t* rows, int64_t stride,
                 const float* key_scales, int64_t n, int64_t dim, float* p) {
  int64_t s = 0;
#ifdef ROOFTOP_AVX512
  switch (dim) {  // the chunk loop unrolled for the common head sizes
    case 64: s = scores_int8_512<2>(q, qscale, base, rows, stride, key_scales, n, p); break;
    case 128: s = scores_int8_512<4>(q, qscale, base, rows, stride, key_scales, n, p); break;
    case 256: s = scores_int8_512<8>(q, qscale, base, rows, stride, key_scales, n, p); break;
    default: break;
  }
#endif
#ifdef ROOFTOP_AVX2
  if (dim % 16 == 0 && dim <= 256) {
    const int64_t chunks = dim / 16;
    __m256i qs[16];
    for (int64_t c = 0; c < chunks; ++c) qs[c] = load32(q + 16 * c);
    for (; s + 8 <= n; s += 8) {
      __m256i dots[8];
      for (int i = 0; i < 8; ++i) {
        const int8_t* k = base + rows[s + i] * stride;
        __m256i acc = _mm256_setzero_si256();
        for (int64_t c = 0; c < chunks; ++c) {
          const __m256i kc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 16 * c)));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(qs[c], kc));
        }
        dots[i] = acc;
      }
      store_scores(dots, qscale, key_scales + s, p + s);
    }
  }
#endif
  for (; s < n; ++s) {
    const int8_t* k = base + rows[s] * stride;
    int32_t dot = 0;
    for (int64_t j = 0; j < dim; ++j) dot += static_cast<int32_t>(q[j]) * static_cast<int32_t>(k[j]);
    p[s] = static_cast<float>(dot) * qscale * key_scales[s];
  }
}

// y_h = sum_s w[h * n + s] * (the value at rows[s]) for the HC heads h: each row is widened once for all of them,
// and each head's 32 output floats stay in registers over all n rows.
template <int HC, typename T>
void weighted_sum_heads(const float* w, const T* base, const int64_t* rows, int64_t stride, int64_t n, int64_t dim,
                        float* y) {
  int64_t d0 = 0;
#ifdef ROOFTOP_AVX512
  for (; d0 + 64 <= dim; d0 += 64) {  // the same FMAs per output float as below, sixteen at a time
    __m512 acc[HC][4];
    for (int h = 0; h < HC; ++h) {
      for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_setzero_ps();
    }
    for (int64_t s = 0; s < n; ++s) {
      const T* v = base + rows[s] * stride + d0;
      const __m512 x[4] = {widen16(v), widen16(v + 16), widen16(v + 32), widen16(v + 48)};
      for (int h = 0; h < HC; ++h) {
        const __m512 wh = _mm512_set1_ps(w[h * n + s]);
        for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_fmadd_ps(wh, x[i], acc[h][i]);
      }
    }
    for (int h = 0; h < HC; ++h) {
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(y + h * dim + d0 + 16 * i, acc[h][i]);
    }
  }
#endif
#ifdef ROOFTOP_AVX2
  for (; d0 + 32 <= dim; d0 += 32) {
    __m256 acc[HC][4];
    for (int h = 0; h < HC; ++h) {
      for (int i = 0; i < 4; ++i) acc[h][i] = _mm256_setzero_ps();
    }
    for (int64_t s = 0; s < n; ++s) {
      const T* v = base + rows[s] * stride + d0;
      const __m256 x[4] = {widen8(v), widen8(v + 8), widen8(v + 16), widen8(v + 24)};
      for (int h = 0; h < HC; ++h) {
        const __m256 wh = _mm256_set1_ps(w[h * n + s]);
        for (int i = 0; i < 4; ++i) acc[h][i] = _mm256_fmadd_ps(wh, x[i], acc[h][i]);
      }
    }
    for (int h = 0; h < HC; ++h) {
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y + h * dim + d0 + 8 * i, acc[h][i]);
    }
  }
#endif
  for (int h = 0; h < HC; ++h) {
    for (int64_t d = d0; d < dim; ++d) y[h * dim + d] = 0.f;
    for (int64_t s = 0; s < n; ++s) {
      const T* v = base + rows[s] * stride;
      const float wh = w[h * n + s];
      for (int64_t d = d0; d < dim; ++d) y[h * dim + d] += wh * widened(v[d]);
    }
  }
}

// weighted_sum_heads for any number of heads, up to HEADS_AT_ONCE at a time.
template <typename T>
void weighted_sum(const float* w, int64_t heads, const T* base, const int64_t* rows, int64_t stride, int64_t n,
                  int64_t dim, float* y) {
  static_assert(HEADS_AT_ONCE <= 4, "the switch below covers 1 to 4 heads");
  for (int64_t h = 0; h < heads; h += HEADS_AT_ONCE) {
    const float* wh = w + h * n;
    float* yh = y + h * dim;
    switch (std::min(HEADS_AT_ONCE, heads - h)) {
      case 4: weighted_sum_heads<4>(wh, base, rows, stride, n, dim, yh); break;
      case 3: weighted_sum_heads<3>(wh, base, rows, stride, n, dim, yh); break;
      case 2: weighted_sum_heads<2>(wh, base, rows, stride, n, dim, yh); break;
      default: weighted_sum_heads<1>(wh, base, rows, stride, n, dim, yh);
    }
  }
}

// p[0..n) -> e^(p - top) in place, top = max p; returns top and the sum of the e. A weight below e^NEGLIGIBLE of
// the largest is 0: it is below float32's resolution of the sum anyway, and left in it would become a denormal once
// divided by the sum (with thousands of keys), which the weighted sum would then multiply ~100x slower (Intel's
// microcode assists).
std::pair<float, float> exponentiate_(float* p, int64_t n) {
  constexpr float NEGLIGIBLE = -60.f;
  float top = -INFINITY;
  int64_t i = 0;
#ifdef ROOFTOP_AVX2
  __m256 tops = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) tops = _mm256_max_ps(tops, _mm256_loadu_ps(p + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, tops);
  for (float lane : lanes) top = std::max(top, lane);
#endif
  for (; i < n; ++i) top = std::max(top, p[i]);
  float total = 0.f;
  i = 0;
#ifdef ROOFTOP_AVX2
  __m256 sums = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(p + i), _mm256_set1_ps(top));
    const __m256 e = _mm256_and_ps(exp_ps(x), _mm256_cmp_ps(x, _mm256_set1_ps(NEGLIGIBLE), _CMP_GE_OQ));
    _mm256_storeu_ps(p + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  total = hsum(sums);
#endif
  for (; i < n; ++i) {
    const float x = p[i] - top;
    total += (p[i] = x >= NEGLIGIBLE ? std::exp(x) : 0.f);
  }
  return {top, total};
}

// p[s] *= inv (times factor[s] where given: a V row's scale).
void normalize_(float* p, int64_t n, float inv, const float* factor) {
  if (factor) {
    for (int64_t s = 0; s < n; ++s) p[s] = p[s] * inv * factor[s];
  } else {
    for (int64_t s = 0; s < n; ++s) p[s] *= inv;
  }
}

// One KV head of the pool: values at base + slot * stride (stride = kv_heads * dim), and for a quantized pool
// their scales at scale[slot * kv_heads].
template <typename T>
struct HeadRows {
  const T* k;
  const T* v;
  const float* k_scale;
  const float* v_scale;
  int64_t stride, kv_heads;
};

// Keys first .. first + count - 1 of sequence b, for every head: one task. The pool holds a slot's KV heads side by
// side: a task per KV head read a few hundred bytes of every kv_heads * dim values, scattered over pages, and decode
// attention waited on DRAM for most of its time; read whole and in order, a task's slots come in faster
// (docs/PERFORMANCE.md). A sequence of more than PART keys is split into parts of PART, each attended on its own
// (softmax weights relative to the part's largest score, sums not divided) and merged afterwards, which also keeps
// every thread busy on one sequence. The split depends on the sequence's length alone: a sequence's result does not
// depend on what shares its step, nor on the threads.
struct Task {
  int64_t b, first, count;
};

// What one task reuses from one task to the next.
struct Scratch {
  std::vector<float> p;       // (group, count): scores, then softmax weights
  std::vector<int64_t> rows;  // (count,): the keys' slots
  std::vector<float> k_scales, v_scales;  // (count,): their scales (quantized pools; V's times the widening's unit)
  std::vector<float> tile;  // (KEY_TILE, dim): a tile of keys widened to float32 (fp8 pools)
  std::vector<int64_t> in_order;  // 0, 1, 2, ...: the places of rows that lie one after another (a tile, a copy)
  std::vector<float> sums;  // (group, dim): a part's weighted sums of values
  const int16_t* q16 = nullptr;  // (group, dim): the group's queries as int16, and their scales (int8 pools)
  const float* q_scale = nullptr;
};

// The group's scores: p[h * n + s] = scale * (q_h . key s), key s at pool.k + rows[s] * pool.stride.
void group_scores(const float* q, int64_t group, int64_t dim, float scale, const HeadRows<float>& pool,
                  const int64_t* rows, int64_t n, Scratch& sc) {
  for (int64_t s0 = 0; s0 < n; s0 += KEY_TILE) {
    const int64_t count = std::min(KEY_TILE, n - s0);
    key_scores(q, group, dim, scale, pool.k, rows + s0, pool.stride, count, sc.p.data() + s0, n);
  }
}

// int8 keys: the queries as sc.q16 holds them (quantized once per step), not q.
void group_scores(const float*, int64_t group, int64_t dim, float scale, const HeadRows<int8_t>& pool,
                  const int64_t* rows, int64_t n, Scratch& sc) {
  for (int64_t s0 = 0; s0 < n; s0 += KEY_TILE) {
    const int64_t count = std::min(KEY_TILE, n - s0);
    for (int64_t h = 0; h < group; ++h) {
      scores_int8(sc.q16 + h * dim, sc.q_scale[h] * scale, pool.k, rows + s0, pool.stride,
                  sc.k_scales.data() + s0, count, dim, sc.p.data() + h * n + s0);
    }
  }
}

// fp8, bfloat16 and float16 keys: a tile widened to float32 once for the group's heads, then dotted as float32 keys.
template <typename T>
void group_scores(const float* q, int64_t group, int64_t dim, float scale, const HeadRows<T>& pool,
                  const int64_t* rows, int64_t n, Scratch& sc) {
  float* tile = sc.tile.data();
  for (int64_t s0 = 0; s0 < n; s0 += KEY_TILE) {
    const int64_t count = std::min(KEY_TILE, n - s0);
    for (int64_t s = 0; s < count; ++s) {  // e4m3: key * its scale, FP8_UNIT times the widened value, exactly
      const T* k = pool.k + rows[s0 + s] * pool.stride;
      const float ks = Stored<T>::scaled ? sc.k_scales[s0 + s] * FP8_UNIT : 1.f;
      int64_t j = 0;
#ifdef ROOFTOP_AVX2
      for (; j + 8 <= dim; j += 8) _mm256_storeu_ps(tile + s * dim + j, _mm256_mul_ps(widen8(k + j), _mm256_set1_ps(ks)));
#endif
      for (; j < dim; ++j) tile[s * dim + j] = widened(k[j]) * ks;
    }
    key_scores(q, group, dim, scale, tile, sc.in_order.data(), dim, count, sc.p.data() + s0, n);
  }
}

// The scales of a quantized pool's rows, in key order; V's times FP8_UNIT for e4m3's widening, since they go into the
// softmax weights that multiply the widened rows.
template <typename T>
void gather_scales(const HeadRows<T>& pool, int64_t n, Scratch& sc) {
  if constexpr (Stored<T>::scaled) {
    for (int64_t s = 0; s < n; ++s) {
      sc.k_scales[s] = pool.k_scale[sc.rows[s] * pool.kv_heads];
      sc.v_scales[s] = pool.v_scale[sc.rows[s] * pool.kv_heads] * Stored<T>::unit;
    }
  }
}

template <typename T>
void write_new(const float* x, int64_t kv_heads, int64_t dim, T* values, float* scale) {
  thread_local std::vector<float> rotated;  // every decode row of every layer: no allocation per write
  rotated.assign(x, x + kv_heads * dim);
  rotate_heads(rotated.data(), kv_heads, dim);
  quantize_heads(rotated.data(), kv_heads, dim, values, scale);
}
template <>
void write_new(const float* x, int64_t kv_heads, int64_t dim, float* values, float*) {
  std::memcpy(values, x, kv_heads * dim * sizeof(float));
}
// rounded to nearest even, as the PyTorch path's .to(dtype) writes them
template <>
void write_new(const float* x, int64_t kv_heads, int64_t dim, Bf16* values, float*) {
  for (int64_t i = 0; i < kv_heads * dim; ++i) values[i] = Bf16(x[i]);
}
template <>
void write_new(const float* x, int64_t kv_heads, int64_t dim, Fp16* values, float*) {
  for (int64_t i = 0; i < kv_heads * dim; ++i) values[i] = Fp16(x[i]);
}

// The parts of one sequence of more than PART keys, each head's (largest score, sum of weights, sum of
// weighted values), merged into the softmax over all its keys: y = sum_i e^(top_i - top) y_i / sum_i e^(top_i - top)
// l_i.
void merge_parts(const float* parts, int64_t count, int64_t group, int64_t dim, float* y) {
  const int64_t stride = group * (dim + 2);
  for (int64_t h = 0; h < group; ++h) {
    float top = -INFINITY, total = 0.f;
    for (int64_t i = 0; i < count; ++i) top = std::max(top, parts[i * stride + h * (dim + 2)]);
    for (int64_t d = 0; d < dim; ++d) y[h * dim + d] = 0.f;
    std::vector<float> weights(count);
    for (int64_t i = 0; i < count; ++i) {
      const float* part = parts + i * stride + h * (dim + 2);
      weights[i] = std::exp(part[0] - top);
      total += weights[i] * part[1];
    }
    for (int64_t i = 0; i < count; ++i) {
      const float* sums = parts + i * stride + h * (dim + 2) + 2;
      const float w = weights[i] / total;
      for (int64_t d = 0; d < dim; ++d) y[h * dim + d] += w * sums[d];
    }
  }
}

// `bytes` from src to dst in vector moves, inlined. A row is a few hundred bytes and a task copies thousands of rows:
// a libc call per row takes longer than the copy. GCC turns a loop that only copies, whether written as std::memcpy
// or as vector loads and stores, into one such call per row (loop distribution); each value passing through an empty
// asm statement is no longer a copy it can see.
inline void copy_row(void* dst, const void* src, int64_t bytes) {
  auto* to = static_cast<uint8_t*>(dst);
  const auto* from = static_cast<const uint8_t*>(src);
  int64_t i = 0;
#if defined(ROOFTOP_AVX512)
  for (; i + 64 <= bytes; i += 64) {
    __m512i v = _mm512_loadu_si512(from + i);
    __asm__("" : "+v"(v));
    _mm512_storeu_si512(to + i, v);
  }
#elif defined(ROOFTOP_AVX2)
  for (; i + 32 <= bytes; i += 32) {
    __m256i v = load32(from + i);
    __asm__("" : "+x"(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + i), v);
  }
#endif
  if (i < bytes) std::memcpy(to + i, from + i, bytes - i);
}

template <typename T>
at::Tensor attend(const at::Tensor& qkv, T* kp, T* vp, float* ks, float* vs, const int64_t* write, const int64_t* tb,
                  const int64_t* len, int64_t blocks, int64_t block_size, int64_t heads, int64_t kv_heads, int64_t dim,
                  float scale) {
  const int64_t b_count = qkv.size(0), width = qkv.size(1), kv_width = kv_heads * dim, group = heads / kv_heads;
  const float* in = qkv.data_ptr<float>();
  for (int64_t b = 0; b < b_count; ++b) {
    const float* row = in + b * width;
    write_new(row + heads * dim, kv_heads, dim, kp + write[b] * kv_width, ks ? ks + write[b] * kv_heads : nullptr);
    write_new(row + (heads + kv_heads) * dim, kv_heads, dim, vp + write[b] * kv_width, vs ? vs + write[b] * kv_heads : nullptr);
  }
  std::vector<Task> tasks;
  bool split = false;
  for (int64_t b = 0; b < b_count; ++b) {
    for (int64_t first = 0; first < len[b]; first += PART) tasks.push_back({b, first, std::min(PART, len[b] - first)});
    split = split || len[b] > PART;
  }
  // each task of a split sequence: per head its largest score, its sum of weights and its weighted sum of values
  std::vector<float> parts(split ? tasks.size() * heads * (dim + 2) : 0);
  auto out = cpu_empty({b_count, heads * dim}, qkv.options());
  float* o = out.data_ptr<float>();
  // a quantized pool's queries, rotated (and for int8 keys quantized) once per step, not once per part
  std::vector<float> rotated(Stored<T>::scaled ? b_count * heads * dim : 0);
  std::vector<int16_t> q16(std::is_same_v<T, int8_t> ? b_count * heads * dim : 0);
  std::vector<float> q_scale(std::is_same_v<T, int8_t> ? b_count * heads : 0);
  if constexpr (Stored<T>::scaled) {
    for (int64_t b = 0; b < b_count; ++b) {
      float* q = rotated.data() + b * heads * dim;
      std::copy_n(in + b * width, heads * dim, q);
      rotate_heads(q, heads, dim);
      if constexpr (std::is_same_v<T, int8_t>) quantize_heads(q, heads, dim, q16.data() + b * heads * dim, q_scale.data() + b * heads);
    }
  }
  // tasks whose every block an earlier sequence of this step reads too (a shared prefix): those blocks are in the cache
  // by then, where copying them costs more than reading them where they lie
  std::vector<char> shared(tasks.size(), 0);
  std::unordered_set<int64_t> seen;
  for (size_t t = 0; t < tasks.size();) {
    const int64_t b = tasks[t].b;
    for (; t < tasks.size() && tasks[t].b == b; ++t) {
      bool all = true;
      for (int64_t i = tasks[t].first / block_size; all && i <= (tasks[t].first + tasks[t].count - 1) / block_size; ++i) {
        all = seen.count(tb[b * blocks + i]) > 0;
      }
      shared[t] = all;
    }
    if (t == tasks.size()) break;  // the last sequence's blocks: no later one to share them
    for (int64_t i = 0; i < (len[b] + block_size - 1) / block_size; ++i) seen.insert(tb[b * blocks + i]);
  }
  // one thread while the caches are short, since a parallel region costs more than a few heads' work
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / (std::min(blocks * block_size, PART) * dim * heads));
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), grain, [&](int64_t t0, int64_t t1) {
    const int64_t scaled = Stored<T>::scaled ? PART : 0;
    Scratch sc{std::vector<float>(group * PART),   std::vector<int64_t>(PART),       std::vector<float>(scaled),
               std::vector<float>(scaled),         std::vector<float>(KEY_TILE * dim), std::vector<int64_t>(std::max(KEY_TILE, PART)),
               std::vector<float>(group * dim)};
    std::iota(sc.in_order.begin(), sc.in_order.end(), 0);
    // (K and V, kv_heads, PART, dim): a task's rows by KV head, each written by its copy before it is read. Left
    // unset: a std::vector of bfloat16, float16 or e4m3 values zeroed them one at a time on every call
    // (docs/PERFORMANCE.md)
    const std::unique_ptr<T[]> staged(new T[2 * kv_heads * PART * dim]);
    for (int64_t t = t0; t < t1; ++t) {
      const Task task = tasks[t];
      const int64_t b = task.b, n = task.count;
      for (int64_t s = 0; s < n;) {  // a block's keys at a time: one division per block, not per key
        const int64_t at = task.first + s, offset = at % block_size;
        const int64_t first = tb[b * blocks + at / block_size] * block_size + offset;
        const int64_t run = std::min(block_size - offset, n - s);
        for (int64_t i = 0; i < run; ++i) sc.rows[s + i] = first + i;
        s += run;
      }
      // the task's slots read whole and in order, each KV head's rows into a block of their own; a task whose blocks
      // an earlier sequence of the step reads too attends from the pool itself (rows sc.rows, kv_width apart)
      const bool copied = !shared[t];
      const int64_t* at = copied ? sc.in_order.data() : sc.rows.data();
      const int64_t stride = copied ? dim : kv_width;
      const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(T));
      for (int64_t s = 0; copied && s < n; ++s) {
        const T* k = kp + sc.rows[s] * kv_width;
        const T* v = vp + sc.rows[s] * kv_width;
        for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
          copy_row(staged.get() + (kvh * PART + s) * dim, k + kvh * dim, row_bytes);
          copy_row(staged.get() + ((kv_heads + kvh) * PART + s) * dim, v + kvh * dim, row_bytes);
        }
      }
      for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
        gather_scales(HeadRows<T>{kp, vp, ks ? ks + kvh : nullptr, vs ? vs + kvh : nullptr, kv_width, kv_heads}, n, sc);
        const HeadRows<T> pool{copied ? staged.get() + kvh * PART * dim : kp + kvh * dim,
                               copied ? staged.get() + (kv_heads + kvh) * PART * dim : vp + kvh * dim, nullptr, nullptr,
                               stride, kv_heads};
        // the group's query heads are consecutive
        const float* q = Stored<T>::scaled ? rotated.data() + (b * heads + kvh * group) * dim : in + b * width + kvh * group * dim;
        if constexpr (std::is_same_v<T, int8_t>) {
          sc.q16 = q16.data() + (b * heads + kvh * group) * dim, sc.q_scale = q_scale.data() + b * heads + kvh * group;
        }
        group_scores(q, group, dim, scale, pool, at, n, sc);
        const float* factor = sc.v_scales.empty() ? nullptr : sc.v_scales.data();
        float* y = o + b * heads * dim + kvh * group * dim;
        if (n == len[b]) {  // the whole sequence: its softmax, then the weighted sum
          for (int64_t h = 0; h < group; ++h) {
            float* p = sc.p.data() + h * n;
            normalize_(p, n, 1.f / exponentiate_(p, n).second, factor);
          }
          weighted_sum(sc.p.data(), group, pool.v, at, stride, n, dim, y);
          if constexpr (Stored<T>::scaled) rotate_heads(y, group, dim);
          continue;
        }
        float* part = parts.data() + (t * heads + kvh * group) * (dim + 2);
        for (int64_t h = 0; h < group; ++h) {
          float* p = sc.p.data() + h * n;
          const auto [top, total] = exponentiate_(p, n);
          if (factor) normalize_(p, n, 1.f, factor);
          part[h * (dim + 2)] = top;
          part[h * (dim + 2) + 1] = total;
        }
        weighted_sum(sc.p.data(), group, pool.v, at, stride, n, dim, sc.sums.data());
        for (int64_t h = 0; h < group; ++h) std::copy_n(sc.sums.data() + h * dim, dim, part + h * (dim + 2) + 2);
      }
    }
  });
  for (size_t t = 0; t < tasks.size();) {  // each split sequence's parts are consecutive tasks
    const int64_t b = tasks[t].b, count = (len[b] + PART - 1) / PART;
    if (count > 1) {
      merge_parts(parts.data() + t * heads * (dim + 2), count, heads, dim, o + b * heads * dim);
      // the merge is linear in the parts' sums: rotated back once, after it
      if constexpr (Stored<T>::scaled) rotate_heads(o + b * heads * dim, heads, dim);
    }
    t += count;
  }
  return out;
}

// What the decode step takes besides its pools: qkv's width, the heads' grouping, and every row's slot, length and
// blocks within the pool (check_decode_rows).
void check_decode_step(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t dim, int64_t pool_slots,
                       const at::Tensor& slot_mapping, const at::Tensor& tables, const at::Tensor& lengths,
                       int64_t block_size) {
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim, "qkv width must be (heads + 2 * kv_heads) * head_dim");
  check_decode_rows(qkv.size(0), pool_slots, slot_mapping, tables, lengths, block_size);
}

// A quantized pool's scales: contiguous float32 (slots, kv_heads).
float* scales_of(const c10::optional<at::Tensor>& scale, const at::Tensor& pool) {
  TORCH_CHECK(scale && scale->scalar_type() == at::kFloat && scale->is_contiguous() && scale->dim() == 2 &&
                  scale->size(0) == pool.size(0) && scale->size(1) == pool.size(1),
              "an int8 or fp8 pool needs its scales, contiguous float32 (slots, kv_heads)");
  return scale->data_ptr<float>();
}

}  // namespace

// Each of `rows` decodes' slot, length and blocks within a pool of `pool_slots` slots.
void check_decode_rows(int64_t rows, int64_t pool_slots, const at::Tensor& slot_mapping, const at::Tensor& tables,
                       const at::Tensor& lengths, int64_t block_size) {
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == rows &&
                  tables.scalar_type() == at::kLong && tables.dim() == 2 && tables.is_contiguous() &&
                  tables.size(0) == rows && lengths.scalar_type() == at::kLong && lengths.is_contiguous() &&
                  lengths.numel() == rows && block_size > 0,
              "slot_mapping (B,), tables (B, blocks) and lengths (B,) must be contiguous int64");
  const int64_t blocks = tables.size(1), s_max = blocks * block_size;
  const int64_t* write = slot_mapping.data_ptr<int64_t>();
  const int64_t* tb = tables.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    TORCH_CHECK(write[b] >= 0 && write[b] < pool_slots && len[b] >= 1 && len[b] <= s_max, "slot or length out of range");
    for (int64_t i = 0; i < blocks; ++i)
      TORCH_CHECK(tb[b * blocks + i] >= 0 && (tb[b * blocks + i] + 1) * block_size <= pool_slots, "block out of range");
  }
}

// Decode attention straight from the paged pool. qkv (B, (H + 2*KVH)*D) holds each sequence's new q, k, v (RoPE
// applied); k and v are written to their slots (quantized for an int8 or fp8 pool, whose scales k_scale, v_scale
// are (slots, KVH) float32), then each query head attends over its sequence's first `lengths[b]` positions,
// position p at slot tables[b, p / block_size] * block_size + p % block_size, with KV head h / (H / KVH). Returns
// (B, H*D).
at::Tensor decode_attention(const at::Tensor& qkv, at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& slot_mapping,
                            const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size, int64_t heads,
                            int64_t kv_heads, double scale, const c10::optional<at::Tensor>& k_scale,
                            const c10::optional<at::Tensor>& v_scale) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32 (B, W)");
  const auto dtype = k_pool.scalar_type();
  const bool unscaled = dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
  TORCH_CHECK((unscaled || dtype == at::kChar || dtype == c10::ScalarType::Float8_e4m3fn) && v_pool.scalar_type() == dtype &&
                  k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 3 && k_pool.size(1) == kv_heads &&
                  v_pool.sizes() == k_pool.sizes(),
              "pools must be contiguous (slots, kv_heads, head_dim), both float32, bfloat16, float16, int8 or float8_e4m3fn");
  const int64_t dim = k_pool.size(2);
  check_decode_step(qkv, heads, kv_heads, dim, k_pool.size(0), slot_mapping, tables, lengths, block_size);
  const int64_t* write = slot_mapping.data_ptr<int64_t>();
  const int64_t* tb = tables.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t blocks = tables.size(1);
  const float sc = static_cast<float>(scale);
  if (unscaled) {
    TORCH_CHECK(!k_scale && !v_scale, "a float32, bfloat16 or float16 pool has no scales");
    if (dtype == at::kBFloat16) {
      return attend(qkv, k_pool.data_ptr<Bf16>(), v_pool.data_ptr<Bf16>(), nullptr, nullptr, write, tb, len, blocks,
                    block_size, heads, kv_heads, dim, sc);
    }
    if (dtype == at::kHalf) {
      return attend(qkv, k_pool.data_ptr<Fp16>(), v_pool.data_ptr<Fp16>(), nullptr, nullptr, write, tb, len, blocks,
                    block_size, heads, kv_heads, dim, sc);
    }
    return attend(qkv, k_pool.data_ptr<float>(), v_pool.data_ptr<float>(), nullptr, nullptr, write, tb, len, blocks,
                  block_size, heads, kv_heads, dim, sc);
  }
  float* ks = scales_of(k_scale, k_pool);
  float* vs = scales_of(v_scale, v_pool);
  if (dtype == at::kChar) {
    return attend(qkv, k_pool.data_ptr<int8_t>(), v_pool.data_ptr<int8_t>(), ks, vs, write, tb, len, blocks, block_size,
                  heads, kv_heads, dim, sc);
  }
  return attend(qkv, k_pool.data_ptr<Fp8>(), v_pool.data_ptr<Fp8>(), ks, vs, write, tb, len, blocks, block_size, heads,
                kv_heads, dim, sc);
}

// Decode attention of a gated attention layer (Qwen3.5's; models/hybrid.py's GatedAttentionBlock) from its fused
// projection's rows: per q head its head_dim query values then as many of its output gate's, then k's and v's heads.
// q and k heads get their RMSNorm (q_norm, k_norm: (head_dim,)) and RoPE on the first rotary dims (the tables'
// width), then decode_attention (the step's K/V into the pool, each q head over its sequence's cache), then each
// output value times the sigmoid of its gate. proj: (B, (2 * heads + 2 * kv_heads) * head_dim) float32 rows (their
// stride may be wider); positions (B,). Returns (B, heads * head_dim), what o_proj takes.
at::Tensor gated_decode_attention(const at::Tensor& proj, const at::Tensor& q_norm, const at::Tensor& k_norm,
                                  const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& signed_sin,
                                  double eps, at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& slot_mapping,
                                  const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size, int64_t heads,
                                  int64_t kv_heads, double scale, const c10::optional<at::Tensor>& k_scale,
                                  const c10::optional<at::Tensor>& v_scale) {
  TORCH_CHECK(proj.dim() == 2 && proj.scalar_type() == at::kFloat && proj.stride(1) == 1 && proj.device().is_cpu(),
              "proj must be float32 rows (B, W) on the CPU");
  TORCH_CHECK(k_pool.dim() == 3, "pools must be (slots, kv_heads, head_dim)");
  const int64_t rows = proj.size(0), dim = k_pool.size(2);
  TORCH_CHECK(heads >= 1 && kv_heads >= 1 && proj.size(1) == (2 * heads + 2 * kv_heads) * dim,
              "proj width must be (2 * heads + 2 * kv_heads) * head_dim = ", (2 * heads + 2 * kv_heads) * dim, ", got ",
              proj.size(1));
  for (const at::Tensor* t : {&q_norm, &k_norm})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == dim,
                "q_norm and k_norm must be contiguous float32 (head_dim,)");
  check_rope_tables(positions, rows, cos, signed_sin, dim);
  auto qkv = cpu_empty({rows, (heads + 2 * kv_heads) * dim}, proj.options());
  const int64_t rotary = cos.size(1), width = qkv.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float *in = proj.data_ptr<float>(), *c = cos.data_ptr<float>(), *s = signed_sin.data_ptr<float>();
  float* packed = qkv.data_ptr<float>();
  at::parallel_for(0, rows * (heads + kv_heads), std::max<int64_t>(1, 8192 / dim), [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(dim);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / (heads + kv_heads), h = i % (heads + kv_heads);
      const float* row = in + r * proj.stride(0);
      float* head = packed + r * width + h * dim;
      const bool query = h < heads;
      std::memcpy(head, query ? row + h * 2 * dim : row + 2 * heads * dim + (h - heads) * dim, dim * sizeof(float));
      norm_rope_head(head, dim, (query ? q_norm : k_norm).data_ptr<float>(), static_cast<float>(eps),
                     c + pos[r] * rotary, s + pos[r] * rotary, rotary, scratch.data());
      if (h == heads)  // v once a row, beside its first k head
        std::memcpy(packed + r * width + (heads + kv_heads) * dim, row + (2 * heads + kv_heads) * dim,
                    kv_heads * dim * sizeof(float));
    }
  });
  at::Tensor out = decode_attention(qkv, k_pool, v_pool, slot_mapping, tables, lengths, block_size, heads, kv_heads,
                                    scale, k_scale, v_scale);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows * heads, std::max<int64_t>(1, 8192 / dim), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / heads, h = i % heads;
      const float* gate = in + r * proj.stride(0) + h * 2 * dim + dim;
      float* y = o + i * dim;
      for (int64_t j = 0; j < dim; ++j) y[j] = y[j] * (1.f / (1.f + std::exp(-gate[j])));
    }
  });
  return out;
}
