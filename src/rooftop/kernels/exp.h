// e^x for eight floats at once, shared by SiLU (cpu.cpp) and the softmax of decode attention (attention.cpp).

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

}  // namespace
#endif
