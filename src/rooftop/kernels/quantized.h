// What rooftop's quantized linears (tiles.cpp) share: activations quantized to int8 per group of 32, and the
// widening of weights for prefill.

#pragma once

// The tensor, parallel_for and CPU allocation: not ATen/ATen.h, whose every operator (at::empty's header alone pulls in
// ATen's context) takes ~10 s more to parse per file, nor torch/extension.h (~25 s).
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

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

// Activation rows quantized per group of 32: x ~= d * q. The sums of q come off the integer dots of formats whose
// levels sit above the weights' value (Q4_0's 8, Q8_0's 128 under dpbusd: per 32; Q6_K's 32: per 16), and s = d *
// sum(q) per 32 meets the minima of the formats that have one (Q4_1, Q5_1).
// The K-quants' rows take one d per 256 inputs instead (llama.cpp's Q8_K): a super-block's dots, each group's
// times its integer sub-block scale, then add up in integers, and its minima meet the sums of q per 32 in an
// integer dot too; each super-block costs one conversion to float, not each group.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;  // d per 32 (the K-quants': per 256); s per 32 (not the K-quants')
  std::vector<int32_t> sum, sum16;
  std::vector<int32_t> sum_pairs;  // the K-quants': per 64 inputs, the two groups' sums as int16, the first's low
};

#ifdef ROOFTOP_AVX2
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}
#endif

// max|v| over a group of 32 floats.
inline float group_amax(const float* v) {
#ifdef ROOFTOP_AVX2
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 f[4];
  for (int i = 0; i < 4; ++i) f[i] = _mm256_andnot_ps(sign, _mm256_loadu_ps(v + 8 * i));
  return hmax(_mm256_max_ps(_mm256_max_ps(f[0], f[1]), _mm256_max_ps(f[2], f[3])));
#else
  float amax = 0.f;
  for (int64_t i = 0; i < GROUP; ++i) amax = std::max(amax, std::fabs(v[i]));
  return amax;
#endif
}

// A group of 32 floats to int8 levels q = round(v * inv), and the sums of q per 16 in sums. The vector path rounds
// as nearbyint does (to nearest even): the same bits.
inline void group_levels(const float* v, float inv, int8_t* q, int32_t sums[2]) {
#ifdef ROOFTOP_AVX2
  const __m256 scale = _mm256_set1_ps(inv);
  __m256i qi[4];
  for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), scale));
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  sums[0] = hsum_i32(_mm256_add_epi32(qi[0], qi[1]));
  sums[1] = hsum_i32(_mm256_add_epi32(qi[2], qi[3]));
#else
  sums[0] = sums[1] = 0;
  for (int64_t i = 0; i < GROUP; ++i) {
    const int level = static_cast<int>(std::nearbyint(v[i] * inv));
    q[i] = static_cast<int8_t>(level);
    sums[i / 16] += level;
  }
#endif
}

inline float inverse(float d) { return d > 0.f ? 1.f / d : 0.f; }

inline QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = rows * (k / GROUP);
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(groups), std::vector<float>(groups),
                    std::vector<int32_t>(groups), std::vector<int32_t>(2 * groups), {}};
  for (int64_t g = 0; g < groups; ++g) {
    int32_t* sums = out.sum16.data() + 2 * g;
    const float d = group_amax(x + g * GROUP) / 127.f;  // d = max|v| / 127
    group_levels(x + g * GROUP, inverse(d), out.q.data() + g * GROUP, sums);
    out.d[g] = d;
    out.sum[g] = sums[0] + sums[1];
    out.s[g] = d * static_cast<float>(out.sum[g]);
  }
  return out;
}

constexpr int64_t SUPER = 256;  // the K-quants' super-block: 8 groups

// The K-quants' rows (k a multiple of SUPER): d = max|v| / 127 per 256 inputs, levels and sums per 32 and 16 as
// above, and each pair of groups' sums packed as two int16 (|sum| <= 32 * 127) for the minima's vpdpwssd.
inline QuantizedRows quantize_super_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = rows * (k / GROUP), supers = rows * (k / SUPER);
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(supers), {}, std::vector<int32_t>(groups),
                    std::vector<int32_t>(2 * groups), std::vector<int32_t>(groups / 2)};
  constexpr int64_t per = SUPER / GROUP;
  for (int64_t b = 0; b < supers; ++b) {
    const float* v = x + b * SUPER;
    float amax = 0.f;
    for (int64_t g = 0; g < per; ++g) amax = std::max(amax, group_amax(v + g * GROUP));
    const float d = amax / 127.f;
    out.d[b] = d;
    for (int64_t g = b * per; g < (b + 1) * per; ++g) {
      int32_t* sums = out.sum16.data() + 2 * g;
      group_levels(x + g * GROUP, inverse(d), out.q.data() + g * GROUP, sums);
      out.sum[g] = sums[0] + sums[1];
    }
    for (int64_t g = b * per; g < (b + 1) * per; g += 2) {
      const uint32_t low = static_cast<uint16_t>(out.sum[g]), high = static_cast<uint16_t>(out.sum[g + 1]);
      out.sum_pairs[g / 2] = static_cast<int32_t>(low | high << 16);
    }
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

#endif

// Widened weights for a prefill chunk's matmul, as float32 or (where the host has AMX) bfloat16.
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
#endif

// A new uninitialized tensor, as at::empty makes it for the CPU tensors every kernel takes (see the includes above).
inline at::Tensor cpu_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::Tensor(at::detail::empty_cpu(sizes, options));
}

template <typename Fn>
at::Tensor widened(int64_t n, int64_t k, bool bf16, const at::TensorOptions& options, Fn&& fill) {
  auto out = cpu_empty({n, k}, options.dtype(bf16 ? at::kBFloat16 : at::kFloat));
  if (bf16) {
    fill(out.data_ptr<at::BFloat16>());
  } else {
    fill(out.data_ptr<float>());
  }
  return out;
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

}  // namespace
