// e^x for eight (or sixteen) floats at once, shared by SiLU (cpu.cpp's silu_mul, and silu_in_place below for
// delta_rule.cpp) and the softmax of decode and prefill attention (attention.cpp, prefill_attention.cpp).

#pragma once

#include "quantized.h"

#ifdef ROOFTOP_AVX2
namespace {

// e^x as 2^n * 2^f (n = round(x log2 e), |f| <= 1/2) with 2^f's Taylor series to degree 6: relative error
// ~1e-7, float32's own. libm's scalar expf made SiLU-mul cost 15 µs per layer of the bundled model.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.f)), _mm256_set1_ps(-87.f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  const float c[] = {1.54035304e-4f, 1.33335581e-3f, 9.61812911e-3f, 5.55041087e-2f, 2.40226507e-1f, 6.93147181e-1f, 1.f};
  __m256 p = _mm256_set1_ps(c[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[i]));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

#ifdef ROOFTOP_AVX512
// exp_ps for sixteen floats: the same steps at 512 bits.
inline __m512 exp16_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.f)), _mm512_set1_ps(-87.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  const float c[] = {1.54035304e-4f, 1.33335581e-3f, 9.61812911e-3f, 5.55041087e-2f, 2.40226507e-1f, 6.93147181e-1f, 1.f};
  __m512 p = _mm512_set1_ps(c[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
  const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(scale));
}
#endif

}  // namespace
#endif

// x / (1 + e^-x) in place for n floats (SiLU): sixteen or eight at a time with exp16_ps / exp_ps where built, libm's
// exp for the rest. A value's result depends only on where it falls in the n (vector body or tail), not on any
// other value.
namespace {

inline void silu_in_place(float* x, int64_t n) {
  int64_t i = 0;
#ifdef ROOFTOP_AVX512
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 e = exp16_ps(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_storeu_ps(x + i, _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
  }
#endif
#ifdef ROOFTOP_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.f), e)));
  }
#endif
  for (; i < n; ++i) x[i] = x[i] / (1.f + std::exp(-x[i]));
}

}  // namespace
