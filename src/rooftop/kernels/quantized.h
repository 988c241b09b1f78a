// What every quantized linear of rooftop's CPU kernels shares: activations quantized to int8 per group of 32,
// the integer dot products (AVX2's maddubs, or VNNI's dpbusd where the host has it), and the loop that reads each
// weight row once for a few activation rows (blocks.cpp's; tiles.cpp has its own loop over tiles of 16 rows).

#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define ROOFTOP_AVX2 1
#endif

// 512-bit integer dots where the host has AVX-512 with VNNI (Intel Xeon since Cascade Lake, AMD Zen 4): a dpbusd
// multiplies 64 byte pairs, twice AVX2's 32.
#if defined(ROOFTOP_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ROOFTOP_AVX512 1
#endif

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t ROWS_AT_ONCE = 4;  // activation rows dotted with each weight row as it is read

// Activation rows quantized per group of 32: x ~= d * q. Formats whose weights carry an offset (x = a*u - b, with
// u unsigned) subtract b times the sum of the activations it meets: s = d * sum(q) per 32 (Q4_1's min term), and
// s16 = d * sum(q) per 16 (K-quants whose scales change every 16 weights).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s, s16;
  std::vector<int32_t> sum;  // sum(q) per 32, for the tiled kernels' offsets (tiles.cpp)
};

inline QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / GROUP;
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups), std::vector<float>(rows * groups),
                    std::vector<float>(rows * groups * 2), std::vector<int32_t>(rows * groups)};
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float* v = x + g * GROUP;
    float amax = 0.f;
    for (int64_t i = 0; i < GROUP; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
    int sum[2] = {0, 0};
    for (int64_t i = 0; i < GROUP; ++i) {
      const int q = static_cast<int>(std::nearbyint(v[i] * inv));
      out.q[g * GROUP + i] = static_cast<int8_t>(q);
      sum[i / 16] += q;
    }
    out.d[g] = d;
    out.sum[g] = sum[0] + sum[1];
    out.s[g] = d * static_cast<float>(sum[0] + sum[1]);
    out.s16[2 * g] = d * static_cast<float>(sum[0]);
    out.s16[2 * g + 1] = d * static_cast<float>(sum[1]);
  }
  return out;
}

#ifdef ROOFTOP_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Eight float16 scales as float32 (F16C): the scales stay at the file's 16 bits, a fifth of Q4's bytes.
inline __m256 half8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Dot products of 32 unsigned x signed bytes, as 8 int32 lanes (lane i: bytes 4i..4i+3). VNNI does it in one
// instruction; AVX2 multiplies byte pairs into int16 first, which never saturates for rooftop's formats (unsigned
// weights of at most 8 bits against activations in -127..127), so both give the same integers.
inline __m256i dot_i32(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Four groups' int32 lanes reduced to [g0 g1 g2 g3 | g0 g1 g2 g3]: the low half holds each group's first 16
// products, the high half its last 16. They are converted once and multiplied by `scales` (per half, so formats
// with a scale per 16 weights fit too) in one FMA, instead of a conversion, a scalar scale product and an FMA per
// group: the multiply ports, not the bytes, bound these kernels on 2 AVX2 cores.
inline __m256 fma4(__m256i p0, __m256i p1, __m256i p2, __m256i p3, __m256 scales, __m256 acc) {
  const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scales, acc);
}

#ifdef ROOFTOP_AVX512
// fma4 at 512 bits: groups 0-1 and 2-3 of a chunk as 64 unsigned bytes each, dotted with the chunk's 128
// activations at x in two dpbusd. The int32 lanes are scaled lane by lane (lanes 0-3 of a group are its first 16
// products, 4-7 its last 16; `scales` in fma4's order) instead of reduced first: on Zen 4 and Xeon a 512-bit
// permute, conversion and FMA cost less than AVX2's three hadds. Two accumulators, so that the two FMAs do not
// wait on each other.
inline void fma4_wide(__m512i w01, __m512i w23, const int8_t* x, __m256 scales, __m512 acc[2]) {
  const __m512i first = _mm512_set_epi32(5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(2));
  const __m512 s = _mm512_castps256_ps512(scales);
  const __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w01, _mm512_loadu_si512(x));
  const __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w23, _mm512_loadu_si512(x + 64));
  acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), _mm512_permutexvar_ps(first, s), acc[0]);
  acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), _mm512_permutexvar_ps(second, s), acc[1]);
}

inline __m512i join(__m256i low, __m256i high) { return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1); }

// The two accumulators of fma4_wide as one of fma4's 8 lanes (their sum is what matters, not the lane order).
inline __m256 fold(const __m512 acc[2]) {
  const __m512 both = _mm512_add_ps(acc[0], acc[1]);
  return _mm256_add_ps(_mm512_castps512_ps256(both), _mm512_extractf32x8_ps(both, 1));
}
#endif
#endif

// Widened weights for a prefill chunk's sgemm, as float32 or (where the host multiplies bfloat16 natively) bfloat16.
inline void put(float* out, float v) { *out = v; }
inline void put(at::BFloat16* out, float v) { *out = at::BFloat16(v); }  // round to nearest even

#ifdef ROOFTOP_AVX2
inline void put8(float* out, __m256 v) { _mm256_storeu_ps(out, v); }
inline void put8(at::BFloat16* out, __m256 v) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), reinterpret_cast<__m128i>(_mm256_cvtneps_pbh(v)));
#else  // round to nearest even on the integer bits, then keep the top halves
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i top = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1)));
#endif
}

// out[i] = a * u[i] - b for 32 unsigned bytes u, with (a, b) for the first 16 and (a2, b2) for the last 16.
template <typename T>
inline void widen32(__m256i u, float a, float b, float a2, float b2, T* out) {
  const __m128i halves[2] = {_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)};
  for (int h = 0; h < 2; ++h) {
    const __m256 scale = _mm256_set1_ps(h ? a2 : a), offset = _mm256_set1_ps(h ? b2 : b);
    for (int e = 0; e < 2; ++e) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e ? _mm_srli_si128(halves[h], 8) : halves[h]));
      put8(out + 16 * h + 8 * e, _mm256_fmsub_ps(v, scale, offset));
    }
  }
}
#endif

template <typename Fn>
at::Tensor widened(int64_t n, int64_t k, bool bf16, const at::TensorOptions& options, Fn&& fill) {
  auto out = at::empty({n, k}, options.dtype(bf16 ? at::kBFloat16 : at::kFloat));
  if (bf16) {
    fill(out.data_ptr<at::BFloat16>());
  } else {
    fill(out.data_ptr<float>());
  }
  return out;
}

// out[r, n] = sum_k w[n, k] x[r, k] (+ bias[n]) (+ residual[r, n]) for every row r and n in [n0, n1);
// each weight row is read once per ROWS_AT_ONCE activation rows.
template <typename Weights>
void linear_rows(const Weights& w, int64_t rows, int64_t n0, int64_t n1, const float* bias, const float* residual,
                 float* out, int64_t n_total) {
  float acc[ROWS_AT_ONCE];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS_AT_ONCE) {
      const int64_t r_count = std::min(ROWS_AT_ONCE, rows - r0);
      switch (r_count) {
        case 4: w.template dot<4>(n, r0, acc); break;
        case 3: w.template dot<3>(n, r0, acc); break;
        case 2: w.template dot<2>(n, r0, acc); break;
        default: w.template dot<1>(n, r0, acc);
      }
      for (int64_t r = 0; r < r_count; ++r) {
        const float y = acc[r] + (bias ? bias[n] : 0.f);
        const int64_t at = (r0 + r) * n_total + n;
        out[at] = residual ? y + residual[at] : y;
      }
    }
  }
}

inline void check_linear_inputs(const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                                const c10::optional<at::Tensor>& residual, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 (rows, K)");
  TORCH_CHECK(x.size(1) % GROUP == 0, "K must be a multiple of 32");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == n && bias->is_contiguous()), "bias must be float32 (N,)");
  TORCH_CHECK(!residual || (residual->scalar_type() == at::kFloat && residual->is_contiguous() &&
                            residual->size(0) == x.size(0) && residual->size(1) == n),
              "residual must be contiguous float32 (rows, N)");
}

template <typename Weights>
at::Tensor run_linear(Weights w, const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& residual) {
  const int64_t rows = x.size(0), k = x.size(1);
  const QuantizedRows a = quantize_rows(x.data_ptr<float>(), rows, k);
  w.a = &a;
  auto out = at::empty({rows, n}, x.options());
  const float* b = bias ? bias->data_ptr<float>() : nullptr;
  const float* res = residual ? residual->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  // chunks of output rows per thread; a small matrix stays on one thread
  const int64_t grain = std::max<int64_t>(16, (1 << 16) / k);
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) { linear_rows(w, rows, n0, n1, b, res, o, n); });
  return out;
}

}  // namespace
