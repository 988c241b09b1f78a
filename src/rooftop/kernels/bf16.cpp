// bfloat16 weights against float32 activations: a bf16 checkpoint's own values (most Hugging Face models ship in
// bf16) held at half float32's bytes, so that a decode step, which streams every weight once, reads half as much.
// Each weight is widened exactly in a register (a bf16 is the top half of a float32) and multiplied in float32, so
// the model is the float32 model of the same values; only the order of the sums differs from a BLAS matmul's.
//
// The order is fixed, the same on every path (512-bit, 256-bit, plain loops) and for every row count: output (r, n)
// keeps 32 partial sums, one per lane l (0-15) of two accumulators h (0, 1); block c of 32 inputs goes to h = c % 2,
// its input 2l to lane l by one fused multiply-add, then its input 2l + 1 by another. The 32 sums meet as
// (h0 + h1), then halves added (lane l + lane l + 8, + 4, + 2, + 1), then the bias, then the residual. So a row's
// result never depends on the other rows of its call: the kernel is batch invariant by construction.

#include "quantized.h"

namespace {

constexpr int64_t BLOCK = 32;  // inputs per step: one 512-bit load of bf16 weights
constexpr int ROWS = 4;  // activation rows per pass over two weight rows (2 x 4 x 2 accumulators: 16 of 32 zmm)

// Each activation row with every block of 32 inputs as its 16 even inputs, then its 16 odd: a block's weights
// widen to those two halves (even: the low bf16 of each 32-bit lane, odd: the high one). In a tensor, whose memory
// starts on a cache line: a 512-bit load of a block's half then never straddles two lines.
at::Tensor split_pairs(const float* x, int64_t rows, int64_t k) {
  auto out = cpu_empty({rows, k}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  for (int64_t b = 0; b < rows * k; b += BLOCK) {
    for (int64_t l = 0; l < BLOCK / 2; ++l) {
      o[b + l] = x[b + 2 * l];
      o[b + BLOCK / 2 + l] = x[b + 2 * l + 1];
    }
  }
  return out;
}

// Blocks 0, 1, 2, ... of the inputs into accumulators h0, h1, h0, ... (the order above), on any path.
template <typename H, typename Step>
__attribute__((always_inline)) inline void in_turn(int64_t blocks, H& h0, H& h1, Step&& step) {
  int64_t c = 0;
  for (; c + 2 <= blocks; c += 2) {
    step(h0, c);
    step(h1, c + 1);
  }
  if (c < blocks) step(h0, c);
}

// Memory asked now for a weight row's bytes this far on (a decode's dots take less time than DRAM's latency).
constexpr int64_t PREFETCH_BYTES = 2048;

#ifdef ROOFTOP_AVX512
inline float finish512(__m512 h0, __m512 h1) {
  const __m512 s = _mm512_add_ps(h0, h1);
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1)));
}

// Weight row o's block c as float32: its 16 even inputs and its 16 odd.
struct Widened512 {
  __m512 even, odd;
};

__attribute__((always_inline)) inline Widened512 widen512(const uint16_t* p) {
  __builtin_prefetch(reinterpret_cast<const uint8_t*>(p) + PREFETCH_BYTES);
  const __m512i v = _mm512_loadu_si512(p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
          _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// O weight rows (w[o], k bf16 each) dotted with R activation rows (xs, split_pairs order): out[o * R + r]. The
// accumulators are flat arrays indexed by constants once the loops unroll: GCC 12 kept a 3-D array of them on the
// stack, and every multiply-add went through memory.
template <int R, int O>
void dot512(const uint16_t* const* w, const float* xs, int64_t k, float* out) {
  __m512 h0[O * R], h1[O * R];
#pragma GCC unroll 16
  for (int i = 0; i < O * R; ++i) h0[i] = h1[i] = _mm512_setzero_ps();
  const int64_t blocks = k / BLOCK;
  // Each activation load serves the O weight rows (taken in every multiply-add, they were twice the loads).
  const auto step = [&](__m512(&h)[O * R], int64_t c) __attribute__((always_inline)) {
    Widened512 a[O];
#pragma GCC unroll 4
    for (int o = 0; o < O; ++o) a[o] = widen512(w[o] + c * BLOCK);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xe = _mm512_loadu_ps(xs + r * k + c * BLOCK), xo = _mm512_loadu_ps(xs + r * k + c * BLOCK + 16);
#pragma GCC unroll 4
      for (int o = 0; o < O; ++o) {
        h[o * R + r] = _mm512_fmadd_ps(a[o].even, xe, h[o * R + r]);
        h[o * R + r] = _mm512_fmadd_ps(a[o].odd, xo, h[o * R + r]);
      }
    }
  };
  in_turn(blocks, h0, h1, step);
#pragma GCC unroll 16
  for (int i = 0; i < O * R; ++i) out[i] = finish512(h0[i], h1[i]);
}
#endif

#if defined(ROOFTOP_AVX2) && !defined(ROOFTOP_AVX512)
// The same sums in 256-bit halves, in dot512's loop: lanes 0-7 of an accumulator in one ymm (index 2i), lanes 8-15
// in the next (2i + 1). Sixteen registers do not hold a pass's accumulators beyond one activation row: more spill.
template <int R, int O>
void dot256(const uint16_t* const* w, const float* xs, int64_t k, float* out) {
  __m256 h0[2 * O * R], h1[2 * O * R];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * O * R; ++i) h0[i] = h1[i] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const int64_t blocks = k / BLOCK;
  const auto step = [&](__m256(&h)[2 * O * R], int64_t c) __attribute__((always_inline)) {
#pragma GCC unroll 4
    for (int o = 0; o < O; ++o) {
      const uint16_t* p = w[o] + c * BLOCK;
      __builtin_prefetch(reinterpret_cast<const uint8_t*>(p) + PREFETCH_BYTES);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const __m256i v = load32(p + 16 * half);
        const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), odd = _mm256_castsi256_ps(_mm256_and_si256(v, high));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const float* x = xs + r * k + c * BLOCK + 8 * half;
          __m256& acc = h[2 * (o * R + r) + half];
          acc = _mm256_fmadd_ps(even, _mm256_loadu_ps(x), acc);
          acc = _mm256_fmadd_ps(odd, _mm256_loadu_ps(x + 16), acc);
        }
      }
    }
  };
  in_turn(blocks, h0, h1, step);
#pragma GCC unroll 16
  for (int i = 0; i < O * R; ++i)
    out[i] = hsum(_mm256_add_ps(_mm256_add_ps(h0[2 * i], h1[2 * i]), _mm256_add_ps(h0[2 * i + 1], h1[2 * i + 1])));
}
#endif

// The plain loops every path must equal (and what hosts without AVX2 run).
template <int R, int O>
void dot_loops(const uint16_t* const* w, const float* xs, int64_t k, float* out) {
  for (int o = 0; o < O; ++o) {
    for (int r = 0; r < R; ++r) {
      float acc[2][16] = {};
      for (int64_t c = 0; c < k / BLOCK; ++c) {
        const uint16_t* p = w[o] + c * BLOCK;
        const float* x = xs + r * k + c * BLOCK;
        for (int l = 0; l < 16; ++l) {
          const uint32_t even = static_cast<uint32_t>(p[2 * l]) << 16, odd = static_cast<uint32_t>(p[2 * l + 1]) << 16;
          float we, wo;
          std::memcpy(&we, &even, 4);
          std::memcpy(&wo, &odd, 4);
          acc[c % 2][l] = std::fma(we, x[l], acc[c % 2][l]);
          acc[c % 2][l] = std::fma(wo, x[16 + l], acc[c % 2][l]);
        }
      }
      float s[16];
      for (int l = 0; l < 16; ++l) s[l] = acc[0][l] + acc[1][l];
      for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; ++l) s[l] += s[l + width];
      out[o * R + r] = s[0];
    }
  }
}

template <int R, int O>
void dot(const uint16_t* const* w, const float* xs, int64_t k, float* out) {
#if defined(ROOFTOP_AVX512)
  dot512<R, O>(w, xs, k, out);
#elif defined(ROOFTOP_AVX2)
  dot256<R, O>(w, xs, k, out);
#else
  dot_loops<R, O>(w, xs, k, out);
#endif
}

template <int O>
void dot_any(int64_t rows, const uint16_t* const* w, const float* xs, int64_t k, float* out) {
  switch (rows) {
    case 1: return dot<1, O>(w, xs, k, out);
    case 2: return dot<2, O>(w, xs, k, out);
    case 3: return dot<3, O>(w, xs, k, out);
    default: return dot<4, O>(w, xs, k, out);
  }
}

}  // namespace

// x (rows, K) float32 @ w (N, K) bfloat16^T (+ bias) (+ residual), float32 out. `loops` runs the plain loops (the
// tests' reference for the vector paths).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& residual, bool loops) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.is_contiguous(), "w must be contiguous bfloat16 (N, K)");
  const int64_t n = w.size(0), k = w.size(1), rows = x.size(0);
  check_linear_inputs(x, bias, residual, n);
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " features, w ", k);
  const at::Tensor split = split_pairs(x.data_ptr<float>(), rows, k);
  const float* xs = split.data_ptr<float>();
  auto out = cpu_empty({rows, n}, x.options());
  const auto* weights = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const float* b = bias ? bias->data_ptr<float>() : nullptr;
  const float* res = residual ? residual->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const auto store = [&](int64_t col, int64_t r0, int64_t count, const float* sums) {
    for (int64_t r = 0; r < count; ++r) {
      const int64_t at = (r0 + r) * n + col;
      const float y = sums[r] + (b ? b[col] : 0.f);
      o[at] = res ? y + res[at] : y;
    }
  };
  // Output rows of one weight row each, `count` activation rows from r0.
  const auto single = [&](int64_t col, int64_t r0, int64_t count) {
    const uint16_t* row = weights + col * k;
    float sums[ROWS];
    if (loops) {
      switch (count) {
        case 1: dot_loops<1, 1>(&row, xs + r0 * k, k, sums); break;
        case 2: dot_loops<2, 1>(&row, xs + r0 * k, k, sums); break;
        case 3: dot_loops<3, 1>(&row, xs + r0 * k, k, sums); break;
        default: dot_loops<4, 1>(&row, xs + r0 * k, k, sums); break;
      }
    } else {
      dot_any<1>(count, &row, xs + r0 * k, k, sums);
    }
    store(col, r0, count, sums);
  };
  const int64_t grain = std::max<int64_t>(1, 16384 / k);  // weight rows per task: a small matrix stays on one thread
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    if (loops) {
      for (int64_t col = n0; col < n1; ++col)
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) single(col, r0, std::min<int64_t>(ROWS, rows - r0));
      return;
    }
    // Weight rows two at a time, one from each half of the thread's range: two streams, which follow the memory's
    // fast minutes where one stream per thread fell behind (as the tiled linears do), and each activation load
    // serves both.
    const int64_t half = (n1 - n0) / 2;
    for (int64_t i = n0; i < n0 + half; ++i) {
      const uint16_t* pair[2] = {weights + i * k, weights + (i + half) * k};
      for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int64_t count = std::min<int64_t>(ROWS, rows - r0);
        float sums[2 * ROWS];
        dot_any<2>(count, pair, xs + r0 * k, k, sums);
        store(i, r0, count, sums);
        store(i + half, r0, count, sums + count);
      }
    }
    if ((n1 - n0) % 2)  // an odd range's last row alone
      for (int64_t r0 = 0; r0 < rows; r0 += ROWS) single(n1 - 1, r0, std::min<int64_t>(ROWS, rows - r0));
  });
  return out;
}
