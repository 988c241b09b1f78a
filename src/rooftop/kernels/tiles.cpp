// Q4_0, Q4_1 and Q8_0 linears on weights repacked in tiles of 16 output rows, so that a decode step's extra
// activation rows (a batch, a speculative verify) cost little more than the first.
//
// Row-by-row kernels (blocks.cpp) dot one weight row with a few activation rows, 32 weights per integer dot: each
// group's int32 lanes must be summed, converted and scaled on their own, and the nibbles are unpacked again for
// every row of weights. Those multiply-port ops, not the bytes, bounded the old Q4 loop (254 µs for 1 row of a
// 2048x8192 Q4_0 linear, 935 µs for 5). Here a tile holds, per group of 32 inputs, the 16 rows' weights interleaved
// four bytes at a time: one dpbusd multiplies four of a row's activations (broadcast) with four weights of each of
// the 16 output rows, so the lanes are the 16 outputs and eight dpbusd finish a group with no reduction. The
// unpacked weights stay in registers for up to 8 activation rows, and each row's group costs one conversion and
// one or two FMAs for all 16 outputs.
//
// Layout of a tile's group (64-byte chunks, byte 4o + i of a chunk belonging to output row o of the tile):
//   Q4_0, Q4_1: 4 chunks; chunk j holds inputs 8j + i in its low nibbles and 8j + 4 + i in its high nibbles;
//   Q8_0: 8 chunks; chunk m holds inputs 4m + i as signed bytes.
// Scales: per tile and group, 16 float16 d (Q4_1: then 16 minima m). w = d·(q - 8), d·q + m and d·q.
// Every path (512-bit, 256-bit, plain loops) computes the same exact integer dots and the same float operations in
// the same order: each row's result is bit for bit the same at any batch size and on any of them.

#include "quantized.h"

namespace {

constexpr int64_t TILE = 16;  // output rows per tile: one 512-bit vector of int32 lanes
#ifdef ROOFTOP_AVX512
constexpr int TILE_ROWS = 8;  // activation rows per pass over a tile's unpacked weights (8 + 8 + temporaries fit 32 zmm)
#else
constexpr int TILE_ROWS = 4;  // 16 ymm registers
#endif

enum Format : int64_t { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };

constexpr bool nibbles(Format f) { return f != Q8_0; }
constexpr int parts(Format f) { return f == Q4_1 ? 2 : 1; }
constexpr int64_t group_bytes(Format f) { return nibbles(f) ? 256 : 512; }

struct Tiled {
  const uint8_t* q;  // (tiles, groups, group_bytes)
  const at::Half* dm;  // (tiles, groups, parts, 16)
  int64_t n, groups;
};

// The stored level of input k (0..31) of output row o in a tile's group: q for Q8_0, the unsigned nibble otherwise.
template <Format F>
inline int level(const uint8_t* b, int64_t o, int64_t k) {
  if constexpr (F == Q8_0) {
    return static_cast<int8_t>(b[64 * (k / 4) + 4 * o + k % 4]);
  } else {
    const uint8_t byte = b[64 * (k / 8) + 4 * o + k % 4];
    return (k % 8) < 4 ? (byte & 15) : (byte >> 4);
  }
}

inline int32_t four_bytes(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}

#ifdef ROOFTOP_AVX512
// The 8 vectors of unsigned bytes of a tile's group, vector m against activations 4m..4m+3. dpbusd takes unsigned
// weights: Q8_0's signed bytes go in as q + 128 (the sign bit flipped), and 128 * sum(x) comes off the dots.
template <Format F>
inline void unpack512(const uint8_t* b, __m512i w[8]) {
  if constexpr (F == Q8_0) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int m = 0; m < 8; ++m) w[m] = _mm512_xor_si512(_mm512_loadu_si512(b + 64 * m), flip);
  } else {
    const __m512i mask = _mm512_set1_epi8(15);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(b + 64 * j);
      w[2 * j] = _mm512_and_si512(v, mask);
      w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
  }
}

template <Format F, int R>
void tile512(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
  constexpr int offset = F == Q4_0 ? 8 : F == Q8_0 ? 128 : 0;  // what each stored level is above the weight's q
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    __m512i u[8];
    unpack512<F>(w.q + (t * w.groups + g) * group_bytes(F), u);
    const at::Half* s = w.dm + (t * w.groups + g) * parts(F) * TILE;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    __m512 m = _mm512_setzero_ps();
    if constexpr (parts(F) == 2) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + TILE)));
    for (int r = 0; r < R; ++r) {
      const int64_t ag = (r0 + r) * w.groups + g;
      const int8_t* x = a.q.data() + ag * GROUP;
      __m512i p0 = _mm512_setzero_si512(), p1 = _mm512_setzero_si512();
      for (int k = 0; k < 8; k += 2) {  // two chains, so that each dpbusd waits on every other one only
        p0 = _mm512_dpbusd_epi32(p0, u[k], _mm512_set1_epi32(four_bytes(x + 4 * k)));
        p1 = _mm512_dpbusd_epi32(p1, u[k + 1], _mm512_set1_epi32(four_bytes(x + 4 * k + 4)));
      }
      __m512i dots = _mm512_add_epi32(p0, p1);
      if constexpr (offset != 0) dots = _mm512_sub_epi32(dots, _mm512_set1_epi32(offset * a.sum[ag]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(d, _mm512_set1_ps(a.d[ag])), acc[r]);
      if constexpr (parts(F) == 2) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.s[ag]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * TILE, acc[r]);
}
#endif

#ifdef ROOFTOP_AVX2
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define ROOFTOP_DPBUSD256 1
#endif

// Half h of a tile (output rows 8h..8h+7) as 8 vectors of bytes, vector m against activations 4m..4m+3. With
// VNNI they are unsigned as at 512 bits; without it Q8_0 stays signed, for maddubs' sign trick.
template <Format F>
inline void unpack256(const uint8_t* b, int h, __m256i w[8]) {
  if constexpr (F == Q8_0) {
    for (int m = 0; m < 8; ++m) {
      w[m] = load32(b + 64 * m + 32 * h);
#ifdef ROOFTOP_DPBUSD256
      w[m] = _mm256_xor_si256(w[m], _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
    }
  } else {
    const __m256i mask = _mm256_set1_epi8(15);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load32(b + 64 * j + 32 * h);
      w[2 * j] = _mm256_and_si256(v, mask);
      w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
  }
}

// acc + the dots of 8 outputs' four weights with four activations x (broadcast).
template <Format F>
inline __m256i dot_add(__m256i acc, __m256i w, int32_t x) {
  const __m256i xs = _mm256_set1_epi32(x);
#ifdef ROOFTOP_DPBUSD256
  return _mm256_add_epi32(acc, dot_i32(w, xs));
#else
  if constexpr (F == Q8_0) return _mm256_add_epi32(acc, dot_i32(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xs, w)));
  return _mm256_add_epi32(acc, dot_i32(w, xs));
#endif
}

template <Format F, int R>
void tile256(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
#ifdef ROOFTOP_DPBUSD256
  constexpr int offset = F == Q4_0 ? 8 : F == Q8_0 ? 128 : 0;
#else
  constexpr int offset = F == Q4_0 ? 8 : 0;
#endif
  for (int h = 0; h < 2; ++h) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
      __m256i u[8];
      unpack256<F>(w.q + (t * w.groups + g) * group_bytes(F), h, u);
      const at::Half* s = w.dm + (t * w.groups + g) * parts(F) * TILE + 8 * h;
      const __m256 d = half8(s);
      const __m256 m = parts(F) == 2 ? half8(s + TILE) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const int64_t ag = (r0 + r) * w.groups + g;
        const int8_t* x = a.q.data() + ag * GROUP;
        __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
        for (int k = 0; k < 8; k += 2) {
          p0 = dot_add<F>(p0, u[k], four_bytes(x + 4 * k));
          p1 = dot_add<F>(p1, u[k + 1], four_bytes(x + 4 * k + 4));
        }
        __m256i dots = _mm256_add_epi32(p0, p1);
        if constexpr (offset != 0) dots = _mm256_sub_epi32(dots, _mm256_set1_epi32(offset * a.sum[ag]));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(d, _mm256_set1_ps(a.d[ag])), acc[r]);
        if constexpr (parts(F) == 2) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s[ag]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * TILE + 8 * h, acc[r]);
  }
}
#endif

// The plain loops: the same integers and the same FMAs, one output at a time.
template <Format F, int R>
void tile_plain(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
  constexpr int offset = F == Q4_0 ? 8 : 0;
  for (int64_t o = 0; o < TILE; ++o) {
    for (int r = 0; r < R; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* b = w.q + (t * w.groups + g) * group_bytes(F);
        const at::Half* s = w.dm + (t * w.groups + g) * parts(F) * TILE;
        const int64_t ag = (r0 + r) * w.groups + g;
        const int8_t* x = a.q.data() + ag * GROUP;
        int32_t dots = 0;
        for (int64_t k = 0; k < GROUP; ++k) dots += (level<F>(b, o, k) - offset) * x[k];
        acc = std::fma(static_cast<float>(dots), float(s[o]) * a.d[ag], acc);
        if constexpr (parts(F) == 2) acc = std::fma(float(s[TILE + o]), a.s[ag], acc);
      }
      out[r * TILE + o] = acc;
    }
  }
}

template <Format F, int R>
void tile(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
#if defined(ROOFTOP_AVX512)
  tile512<F, R>(w, a, t, r0, out);
#elif defined(ROOFTOP_AVX2)
  tile256<F, R>(w, a, t, r0, out);
#else
  tile_plain<F, R>(w, a, t, r0, out);
#endif
}

template <Format F>
void tile_any(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, int64_t count, float* out) {
  switch (count) {
    case 1: return tile<F, 1>(w, a, t, r0, out);
    case 2: return tile<F, 2>(w, a, t, r0, out);
    case 3: return tile<F, 3>(w, a, t, r0, out);
#ifdef ROOFTOP_AVX512
    case 5: return tile<F, 5>(w, a, t, r0, out);
    case 6: return tile<F, 6>(w, a, t, r0, out);
    case 7: return tile<F, 7>(w, a, t, r0, out);
    case 8: return tile<F, 8>(w, a, t, r0, out);
#endif
    default: return tile<F, 4>(w, a, t, r0, out);
  }
}

template <Format F>
at::Tensor tiled_linear(const Tiled& w, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& residual) {
  const int64_t rows = x.size(0), k = x.size(1), n = w.n, tiles = (n + TILE - 1) / TILE;
  const QuantizedRows a = quantize_rows(x.data_ptr<float>(), rows, k);
  auto out = at::empty({rows, n}, x.options());
  const float* b = bias ? bias->data_ptr<float>() : nullptr;
  const float* res = residual ? residual->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / k);  // tiles per task; a small matrix stays on one thread
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    float acc[TILE_ROWS * TILE];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t width = std::min(TILE, n - t * TILE);
      for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
        const int64_t count = std::min<int64_t>(TILE_ROWS, rows - r0);
        tile_any<F>(w, a, t, r0, count, acc);
        for (int64_t r = 0; r < count; ++r) {
          for (int64_t i = 0; i < width; ++i) {
            const int64_t col = t * TILE + i, at = (r0 + r) * n + col;
            const float y = acc[r * TILE + i] + (b ? b[col] : 0.f);
            o[at] = res ? y + res[at] : y;
          }
        }
      }
    }
  });
  return out;
}

// One tile's group as float32 or bfloat16 rows: out[o * k + i] for its 16 rows (those below n) and 32 inputs.
template <Format F, typename T>
void widen_group(const uint8_t* b, const at::Half* s, int64_t rows, int64_t k, T* out) {
  alignas(64) int8_t levels[TILE][GROUP];
#ifdef ROOFTOP_AVX2
  // Inputs 8j..8j+7 of a row are four bytes of two vectors (Q4: a chunk's low and high nibbles; Q8: chunks 2j
  // and 2j + 1): interleaving their 32-bit lanes puts each row's 8 bytes side by side, two rows per 128 bits.
  for (int j = 0; j < 4; ++j) {
    for (int h = 0; h < 2; ++h) {
      __m256i p, q;
      if constexpr (nibbles(F)) {
        const __m256i v = load32(b + 64 * j + 32 * h), mask = _mm256_set1_epi8(15);
        p = _mm256_and_si256(v, mask), q = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      } else {
        p = load32(b + 128 * j + 32 * h), q = load32(b + 128 * j + 64 + 32 * h);
      }
      const __m256i pairs[2] = {_mm256_unpacklo_epi32(p, q), _mm256_unpackhi_epi32(p, q)};
      for (int lane = 0; lane < 2; ++lane) {
        for (int u = 0; u < 2; ++u) {
          const __m128i two = lane ? _mm256_extracti128_si256(pairs[u], 1) : _mm256_castsi256_si128(pairs[u]);
          const int64_t o = 8 * h + 4 * lane + 2 * u;
          _mm_storel_epi64(reinterpret_cast<__m128i*>(&levels[o][8 * j]), two);
          _mm_storeh_pd(reinterpret_cast<double*>(&levels[o + 1][8 * j]), _mm_castsi128_pd(two));
        }
      }
    }
  }
#else
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t i = 0; i < GROUP; ++i) levels[o][i] = static_cast<int8_t>(level<F>(b, o, i));
  }
#endif
  for (int64_t o = 0; o < rows; ++o) {
    const float d = s[o], m = parts(F) == 2 ? float(s[TILE + o]) : F == Q4_0 ? -8.f * d : 0.f;
    T* y = out + o * k;
#ifdef ROOFTOP_AVX2
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int e = 0; e < GROUP; e += 8) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&levels[o][e]));
      const __m256i ints = nibbles(F) ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
      put8(y + e, _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints), dv, mv));
    }
#else
    for (int64_t i = 0; i < GROUP; ++i) put(y + i, std::fma(static_cast<float>(levels[o][i]), d, m));
#endif
  }
}

template <Format F>
at::Tensor tiled_dequantize(const Tiled& w, bool bf16, const at::TensorOptions& options) {
  const int64_t n = w.n, k = w.groups * GROUP, tiles = (n + TILE - 1) / TILE;
  return widened(n, k, bf16, options, [&](auto* out) {
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rows = std::min(TILE, n - t * TILE);
        for (int64_t g = 0; g < w.groups; ++g) {
          widen_group<F>(w.q + (t * w.groups + g) * group_bytes(F), w.dm + (t * w.groups + g) * parts(F) * TILE,
                         rows, k, out + t * TILE * k + g * GROUP);
        }
      }
    });
  });
}

Tiled check_tiled(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n) {
  TORCH_CHECK(format >= Q4_0 && format <= Q8_0, "format must be 0 (Q4_0), 1 (Q4_1) or 2 (Q8_0)");
  const Format f = static_cast<Format>(format);
  const int64_t tiles = (n + TILE - 1) / TILE;
  TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.dim() == 4 && dm.size(0) == tiles &&
                  dm.size(2) == parts(f) && dm.size(3) == TILE,
              "dm must be float16 (ceil(N/16), K/32, parts, 16)");
  const int64_t groups = dm.size(1);
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.numel() == tiles * groups * group_bytes(f),
              "q must be uint8 (ceil(N/16), K/32, ", group_bytes(f), ")");
  return Tiled{q.data_ptr<uint8_t>(), dm.data_ptr<at::Half>(), n, groups};
}

}  // namespace

// x (rows, K) float32 @ tiled weights^T (+bias) (+residual): q and dm as the layout above says, N output rows.
at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual) {
  check_linear_inputs(x, bias, residual, n);
  const Tiled w = check_tiled(q, dm, format, n);
  TORCH_CHECK(x.size(1) == w.groups * GROUP, "x has ", x.size(1), " inputs, the weights ", w.groups * GROUP);
  switch (format) {
    case Q4_0: return tiled_linear<Q4_0>(w, x, bias, residual);
    case Q4_1: return tiled_linear<Q4_1>(w, x, bias, residual);
    default: return tiled_linear<Q8_0>(w, x, bias, residual);
  }
}

// Tiled weights -> float32 or bfloat16 (N, K): what a prefill chunk's sgemm multiplies.
at::Tensor tiled_dequantize(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n, bool bf16) {
  const Tiled w = check_tiled(q, dm, format, n);
  switch (format) {
    case Q4_0: return tiled_dequantize<Q4_0>(w, bf16, dm.options());
    case Q4_1: return tiled_dequantize<Q4_1>(w, bf16, dm.options());
    default: return tiled_dequantize<Q8_0>(w, bf16, dm.options());
  }
}
