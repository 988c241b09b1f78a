// bfloat16 weights against float32 activations: a bf16 checkpoint's own values (most Hugging Face models ship in
// bf16) held at half float32's bytes, so that a decode step, which streams every weight once, reads half as much.
// Each weight is widened exactly in a register (a bf16 is the top half of a float32) and multiplied in float32, so
// the model is the float32 model of the same values; only the order of the sums differs from a BLAS matmul's.
// float32 weights take the same loops (f32_linear: a mixture of experts' router, which oneDNN's matmul read at a
// fraction of the memory's rate), so a bf16 matrix widened to float32 gives the same bits on either.
//
// The order is fixed, the same on every path (512-bit, 256-bit, plain loops) and for every row count: output (r, n)
// keeps 32 partial sums, one per lane l (0-15) of two accumulators h (0, 1); block c of 32 inputs goes to h = c % 2,
// its input 2l to lane l by one fused multiply-add, then its input 2l + 1 by another. The 32 sums meet as
// (h0 + h1), then halves added (lane l + lane l + 8, + 4, + 2, + 1), then the bias, then the residual. So a row's
// result never depends on the other rows of its call: the kernel is batch invariant by construction.

#include "quantized.h"

namespace {

constexpr int64_t BLOCK = 32;  // inputs per step: one 512-bit load of bf16 weights, two of float32
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

// Each cache line of a block of BLOCK weights starting at p, asked for PREFETCH_BYTES on.
template <typename W>
__attribute__((always_inline)) inline void fetch_ahead(const W* p) {
  for (int64_t line = 0; line < BLOCK * static_cast<int64_t>(sizeof(W)); line += 64)
    __builtin_prefetch(reinterpret_cast<const uint8_t*>(p) + PREFETCH_BYTES + line);
}

// Weight i of a row as float32: a bf16 widened exactly, a float32 as it is.
inline float weight(const uint16_t* p, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float w;
  std::memcpy(&w, &bits, 4);
  return w;
}
inline float weight(const float* p, int64_t i) { return p[i]; }

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
  fetch_ahead(p);
  const __m512i v = _mm512_loadu_si512(p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
          _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

__attribute__((always_inline)) inline Widened512 widen512(const float* p) {
  fetch_ahead(p);
  const __m512 lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return {_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi)};
}

// O weight rows (w[o], k bf16 each) dotted with R activation rows (xs, split_pairs order): out[o * R + r]. The
// accumulators are flat arrays indexed by constants once the loops unroll: GCC 12 kept a 3-D array of them on the
// stack, and every multiply-add went through memory.
template <int R, int O, typename W>
void dot512(const W* const* w, const float* xs, int64_t k, float* out) {
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
// Inputs 16 * half to 16 * half + 15 of a block as float32: the 8 even, the 8 odd.
__attribute__((always_inline)) inline std::pair<__m256, __m256> widen256(const uint16_t* p, int half) {
  const __m256i v = load32(p + 16 * half);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
}

__attribute__((always_inline)) inline std::pair<__m256, __m256> widen256(const float* p, int half) {
  const __m256 lo = _mm256_loadu_ps(p + 16 * half), hi = _mm256_loadu_ps(p + 16 * half + 8);
  // within each 128-bit lane: lo's evens then hi's (w0 w2 w8 w10 | w4 w6 w12 w14); the middle quarters swapped
  const auto order = [](__m256 v) { return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xd8)); };
  return {order(_mm256_shuffle_ps(lo, hi, 0x88)), order(_mm256_shuffle_ps(lo, hi, 0xdd))};
}

template <int R, int O, typename W>
void dot256(const W* const* w, const float* xs, int64_t k, float* out) {
  __m256 h0[2 * O * R], h1[2 * O * R];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * O * R; ++i) h0[i] = h1[i] = _mm256_setzero_ps();
  const int64_t blocks = k / BLOCK;
  const auto step = [&](__m256(&h)[2 * O * R], int64_t c) __attribute__((always_inline)) {
#pragma GCC unroll 4
    for (int o = 0; o < O; ++o) {
      const W* p = w[o] + c * BLOCK;
      fetch_ahead(p);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const auto [even, odd] = widen256(p, half);
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
template <int R, int O, typename W>
void dot_loops(const W* const* w, const float* xs, int64_t k, float* out) {
  for (int o = 0; o < O; ++o) {
    for (int r = 0; r < R; ++r) {
      float acc[2][16] = {};
      for (int64_t c = 0; c < k / BLOCK; ++c) {
        const W* p = w[o] + c * BLOCK;
        const float* x = xs + r * k + c * BLOCK;
        for (int l = 0; l < 16; ++l) {
          acc[c % 2][l] = std::fma(weight(p, 2 * l), x[l], acc[c % 2][l]);
          acc[c % 2][l] = std::fma(weight(p, 2 * l + 1), x[16 + l], acc[c % 2][l]);
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

template <int R, int O, typename W>
void dot(const W* const* w, const float* xs, int64_t k, float* out) {
#if defined(ROOFTOP_AVX512)
  dot512<R, O>(w, xs, k, out);
#elif defined(ROOFTOP_AVX2)
  dot256<R, O>(w, xs, k, out);
#else
  dot_loops<R, O>(w, xs, k, out);
#endif
}

template <int O, typename W>
void dot_any(int64_t rows, const W* const* w, const float* xs, int64_t k, float* out, bool loops) {
  switch (rows) {
    case 1: return loops ? dot_loops<1, O>(w, xs, k, out) : dot<1, O>(w, xs, k, out);
    case 2: return loops ? dot_loops<2, O>(w, xs, k, out) : dot<2, O>(w, xs, k, out);
    case 3: return loops ? dot_loops<3, O>(w, xs, k, out) : dot<3, O>(w, xs, k, out);
    default: return loops ? dot_loops<4, O>(w, xs, k, out) : dot<4, O>(w, xs, k, out);
  }
}

// x (rows, K) float32 @ weights (N, K)^T (+ bias) (+ residual) into a new (rows, N) float32 tensor.
template <typename W>
at::Tensor fixed_order_linear(const at::Tensor& x, const W* weights, int64_t n, int64_t k,
                              const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual,
                              bool loops) {
  const int64_t rows = x.size(0);
  check_linear_inputs(x, bias, residual, n);
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " features, w ", k);
  const at::Tensor split = split_pairs(x.data_ptr<float>(), rows, k);
  const float* xs = split.data_ptr<float>();
  auto out = cpu_empty({rows, n}, x.options());
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
    const W* row = weights + col * k;
    float sums[ROWS];
    dot_any<1>(count, &row, xs + r0 * k, k, sums, loops);
    store(col, r0, count, sums);
  };
  // weight rows per task: 32 KiB of them, so a small matrix stays on one thread
  const int64_t grain = std::max<int64_t>(1, 32768 / (k * static_cast<int64_t>(sizeof(W))));
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
      const W* pair[2] = {weights + i * k, weights + (i + half) * k};
      for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int64_t count = std::min<int64_t>(ROWS, rows - r0);
        float sums[2 * ROWS];
        dot_any<2>(count, pair, xs + r0 * k, k, sums, false);
        store(i, r0, count, sums);
        store(i + half, r0, count, sums + count);
      }
    }
    if ((n1 - n0) % 2)  // an odd range's last row alone
      for (int64_t r0 = 0; r0 < rows; r0 += ROWS) single(n1 - 1, r0, std::min<int64_t>(ROWS, rows - r0));
  });
  return out;
}

}  // namespace

// x (rows, K) float32 @ w (N, K) bfloat16^T (+ bias) (+ residual), float32 out. `loops` runs the plain loops (the
// tests' reference for the vector paths).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& residual, bool loops) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.is_contiguous(), "w must be contiguous bfloat16 (N, K)");
  const auto* weights = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  return fixed_order_linear(x, weights, w.size(0), w.size(1), bias, residual, loops);
}

// The same with float32 weights, in the same order.
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& residual, bool loops) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous(), "w must be contiguous float32 (N, K)");
  return fixed_order_linear(x, w.data_ptr<float>(), w.size(0), w.size(1), bias, residual, loops);
}
