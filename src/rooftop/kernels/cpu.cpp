// rooftop's CPU kernels: the decode step's work in few calls, on float32 activations.
//
// Decode reads every weight once per token, so its time is the weight bytes and the overhead around them.
// The linears here read 4-bit (Q4_1-style) or 8-bit (Q8_0-style) weight groups and dot them with the
// activations quantized to int8 per group of 32, as llama.cpp does: AVX2's maddubs (VNNI's dpbusd) multiplies 32
// byte pairs per instruction, so the nibbles are never widened to floats; GGUF's other block formats are in
// blocks.cpp. The small ops around them (RMSNorm, RoPE, SiLU-mul, attention over the paged cache) are one call
// each instead of a handful of PyTorch ops.
// Compiled on first use by rooftop/kernels/cpu.py with -march=native; without AVX2 and F16C plain loops run.

#include "quantized.h"

namespace {

#ifdef ROOFTOP_AVX2

// 32 bytes of nibbles -> two groups of 32 unsigned bytes: the low nibbles and the high nibbles.
inline void unpack_pair(const uint8_t* p, __m256i& low, __m256i& high) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i mask = _mm256_set1_epi8(15);
  low = _mm256_and_si256(b, mask);
  high = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
}

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
#endif

// Where group g of a Q4 row's `groups` lies: each four groups share 64 bytes, groups 4q and 4q + 1 in the low
// nibbles and 4q + 2 and 4q + 3 in the high nibbles, so one 512-bit load and two masks give 128 weights in the
// order of the activations (a 256-bit host reads the two halves); the last 1-3 groups pair up in 32 bytes, g low
// and g + 1 high, so a row takes ceil(groups / 2) * 32 bytes, no padding.
inline const uint8_t* q4_group(const uint8_t* row, int64_t g, int64_t groups, int& shift) {
  const int64_t quads = groups / 4 * 4;
  if (g < quads) {
    shift = 4 * ((g % 4) / 2);
    return row + (g / 4) * 64 + (g % 2) * 32;
  }
  shift = 4 * ((g - quads) % 2);
  return row + quads * 16 + ((g - quads) / 2) * 32;
}

// One output row of Q4 weights dotted with R activation rows (R a template constant, so the accumulators live
// in registers), four groups at a time, the last 0-3 singly. The min term sum_g m[g] * s[g] is a separate short
// dot. Q4_0 (w = d·(q - 8)) runs the same loop with the mins read from d and scaled by -8: `parts` is 1 there, 2
// for Q4_1's d and m, and `min_scale` -8 and 1.
struct Q4Weights {
  const uint8_t* q;  // (N, ceil(G / 2), 32) nibbles, groups placed as q4_group says
  const at::Half* dm;  // (N, parts, G): the scales d, then (Q4_1) the mins m, of each row
  const QuantizedRows* a;
  int64_t groups, parts;
  float min_scale;

  template <int R>
  void dot(int64_t n, int64_t r0, float* acc) const {
    const int64_t pairs = (groups + 1) / 2, quads = groups / 4 * 4;
    const uint8_t* wq = q + n * pairs * 32;
    const at::Half *d = dm + n * parts * groups, *m = d + (parts - 1) * groups;
    const int8_t* xq = a->q.data() + r0 * groups * GROUP;
    const float *xd = a->d.data() + r0 * groups, *xs = a->s.data() + r0 * groups;
#ifdef ROOFTOP_AVX2
    __m256 sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_ps();
    int64_t g = 0;
#ifdef ROOFTOP_AVX512
    __m512 wide[R][2];
    for (int r = 0; r < R; ++r) wide[r][0] = wide[r][1] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi8(15);
    for (; g < quads; g += 4) {
      const __m512i b = _mm512_loadu_si512(wq + g * 16);
      const __m512i low = _mm512_and_si512(b, mask), high = _mm512_and_si512(_mm512_srli_epi16(b, 4), mask);
      const __m128 dw = half4(d + g);
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        const __m128 scales = _mm_mul_ps(dw, _mm_loadu_ps(xd + ag));
        fma4_wide(low, high, xq + ag * GROUP, _mm256_set_m128(scales, scales), wide[r]);
      }
    }
    for (int r = 0; r < R; ++r) sum[r] = fold(wide[r]);
#else
    for (; g < quads; g += 4) {
      __m256i w0, w1, w2, w3;
      unpack_pair(wq + g * 16, w0, w2);
      unpack_pair(wq + g * 16 + 32, w1, w3);
      const __m128 dw = half4(d + g);
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        const int8_t* x = xq + ag * GROUP;
        sum[r] = fma4(dot_i32(w0, load32(x)), dot_i32(w1, load32(x + 32)), dot_i32(w2, load32(x + 64)),
                      dot_i32(w3, load32(x + 96)), _mm_mul_ps(dw, _mm_loadu_ps(xd + ag)), sum[r]);
      }
    }
#endif
    for (; g < groups; ++g) {
      int shift;
      const uint8_t* p = q4_group(wq, g, groups, shift);
      const __m256i w = _mm256_and_si256(_mm256_srli_epi16(load32(p), shift), _mm256_set1_epi8(15));
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        sum[r] = _mm256_fmadd_ps(_mm256_set1_ps(float(d[g]) * xd[ag]), _mm256_cvtepi32_ps(dot_i32(w, load32(xq + ag * GROUP))), sum[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m256 mins = _mm256_setzero_ps();
      int64_t j = 0;
      for (; j + 8 <= groups; j += 8) mins = _mm256_fmadd_ps(half8(m + j), _mm256_loadu_ps(xs + r * groups + j), mins);
      acc[r] = hsum(_mm256_fmadd_ps(mins, _mm256_set1_ps(min_scale), sum[r]));
      for (; j < groups; ++j) acc[r] += min_scale * float(m[j]) * xs[r * groups + j];
    }
#else
    for (int r = 0; r < R; ++r) {
      acc[r] = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int shift;
        const uint8_t* b = q4_group(wq, g, groups, shift);
        const int8_t* xa = xq + (r * groups + g) * GROUP;
        int sum = 0;
        for (int i = 0; i < GROUP; ++i) sum += ((b[i] >> shift) & 15) * xa[i];
        acc[r] += float(d[g]) * xd[r * groups + g] * sum + min_scale * float(m[g]) * xs[r * groups + g];
      }
    }
#endif
  }
};

// One output row of Q8_0 weights dotted with R activation rows, four groups at a time like Q4Weights. maddubs
// takes unsigned x signed bytes, so |w| goes in as unsigned and w's sign moves onto x, as llama.cpp does.
struct Q8Weights {
  const int8_t* q;  // (N, K)
  const at::Half* d;  // (N, G)
  const QuantizedRows* a;
  int64_t groups;

  template <int R>
  void dot(int64_t n, int64_t r0, float* acc) const {
    const int8_t* w = q + n * groups * GROUP;
    const at::Half* dw = d + n * groups;
    const int8_t* xq = a->q.data() + r0 * groups * GROUP;
    const float* xd = a->d.data() + r0 * groups;
#ifdef ROOFTOP_AVX2
    __m256 sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_ps();
    auto signed_dot = [](__m256i wv, const int8_t* x) {
      return dot_i32(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(load32(x), wv));
    };
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
      const __m256i w0 = load32(w + g * GROUP), w1 = load32(w + g * GROUP + 32);
      const __m256i w2 = load32(w + g * GROUP + 64), w3 = load32(w + g * GROUP + 96);
      const __m128 scales = half4(dw + g);
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        const int8_t* x = xq + ag * GROUP;
        sum[r] = fma4(signed_dot(w0, x), signed_dot(w1, x + 32), signed_dot(w2, x + 64), signed_dot(w3, x + 96),
                      _mm_mul_ps(scales, _mm_loadu_ps(xd + ag)), sum[r]);
      }
    }
    for (; g < groups; ++g) {
      const __m256i wv = load32(w + g * GROUP);
      for (int r = 0; r < R; ++r) {
        const int64_t ag = r * groups + g;
        sum[r] = _mm256_fmadd_ps(_mm256_set1_ps(float(dw[g]) * xd[ag]), _mm256_cvtepi32_ps(signed_dot(wv, xq + ag * GROUP)), sum[r]);
      }
    }
    for (int r = 0; r < R; ++r) acc[r] = hsum(sum[r]);
#else
    for (int r = 0; r < R; ++r) {
      acc[r] = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int sum = 0;
        for (int i = 0; i < GROUP; ++i) sum += w[g * GROUP + i] * xq[(r * groups + g) * GROUP + i];
        acc[r] += float(dw[g]) * xd[r * groups + g] * sum;
      }
    }
#endif
  }
};

}  // namespace

// x (rows, K) float32; qs (N, ceil(K/64), 32) uint8 nibbles (q4_group); dm (N, 2, K/32) float16 scales d and
// mins m: w = d*q + m (GGUF's Q4_1), or dm (N, 1, K/32) the scales alone: w = d*(q - 8) (GGUF's Q4_0).
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& dm,
                     const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual) {
  const int64_t k = x.size(1), n = qs.size(0), groups = k / GROUP;
  check_linear_inputs(x, bias, residual, n);
  TORCH_CHECK(qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.numel() == n * ((groups + 1) / 2) * 32,
              "qs must be uint8 (N, ceil(K/64), 32)");
  TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.dim() == 3 && dm.size(0) == n &&
                  (dm.size(1) == 1 || dm.size(1) == 2) && dm.size(2) == groups,
              "dm must be float16 (N, 2, K/32) or (N, 1, K/32)");
  const int64_t parts = dm.size(1);
  return run_linear(Q4Weights{qs.data_ptr<uint8_t>(), dm.data_ptr<at::Half>(), nullptr, groups, parts, parts == 2 ? 1.f : -8.f},
                    x, n, bias, residual);
}

// x (rows, K) float32; q (N, K) int8; d (N, K/32) float16: w = d*q (GGUF's Q8_0).
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                     const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual) {
  const int64_t k = x.size(1), n = q.size(0), groups = k / GROUP;
  check_linear_inputs(x, bias, residual, n);
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous() && q.numel() == n * k, "q must be int8 (N, K)");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.numel() == n * groups, "d must be float16 (N, K/32)");
  return run_linear(Q8Weights{q.data_ptr<int8_t>(), d.data_ptr<at::Half>(), nullptr, groups}, x, n, bias, residual);
}

// Float32 or bfloat16 (N, K) from Q4 groups: the weights a prefill chunk widens to run as one sgemm.
at::Tensor q4_dequantize(const at::Tensor& qs, const at::Tensor& dm, bool bf16) {
  TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.dim() == 3 && (dm.size(1) == 1 || dm.size(1) == 2),
              "dm must be float16 (N, 2, K/32) or (N, 1, K/32)");
  const int64_t n = dm.size(0), groups = dm.size(2), pairs = (groups + 1) / 2, parts = dm.size(1);
  TORCH_CHECK(qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.numel() == n * pairs * 32, "qs must be uint8 (N, ceil(K/64), 32)");
  const float min_scale = parts == 2 ? 1.f : -8.f;
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const at::Half* dmp = dm.data_ptr<at::Half>();
  return widened(n, groups * GROUP, bf16, dm.options(), [&](auto* o) {
    at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t row = n0; row < n1; ++row) {
        const at::Half *d = dmp + row * parts * groups, *m = d + (parts - 1) * groups;
        for (int64_t g = 0; g < groups; ++g) {
          int shift;
          const uint8_t* b = q4_group(q + row * pairs * 32, g, groups, shift);
          const float dg = d[g], mg = min_scale * float(m[g]);
          auto* y = o + (row * groups + g) * GROUP;
#ifdef ROOFTOP_AVX2
          const __m256i bytes = load32(b);
          const __m256i u = _mm256_and_si256(shift ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(15));
          widen32(u, dg, -mg, dg, -mg, y);
#else
          for (int i = 0; i < GROUP; ++i) put(y + i, dg * ((b[i] >> shift) & 15) + mg);
#endif
        }
      }
    });
  });
}

// weight * x / rms(x) per row, float32 (T, D).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 (T, D)");
  const int64_t t = x.size(0), dim = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.numel() == dim && weight.is_contiguous(), "weight must be float32 (D,)");
  auto out = at::empty_like(x);
  const float* in = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, t, std::max<int64_t>(1, 16384 / dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* v = in + r * dim;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < dim; ++i) ss += v[i] * v[i];
      const float inv = 1.f / std::sqrt(ss / dim + static_cast<float>(eps));
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[r * dim + i] = w[i] * (v[i] * inv);
    }
  });
  return out;
}

// In place on the first `heads` heads of each row of qkv (T, ...): an optional per-head RMSNorm (Qwen3's q/k
// norm, weights (heads, D)), then rotate-half RoPE: x*cos + roll(x, D/2)*signed_sin at the row's position.
void rope_(at::Tensor& qkv, int64_t heads, int64_t head_dim, const at::Tensor& positions, const at::Tensor& cos,
           const at::Tensor& signed_sin, const c10::optional<at::Tensor>& norm, double eps) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32 (T, W)");
  TORCH_CHECK(heads * head_dim <= qkv.size(1) && head_dim % 2 == 0, "heads * head_dim exceeds the row");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == qkv.size(0), "positions must be int64 (T,)");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && signed_sin.is_contiguous() && cos.size(1) == head_dim,
              "cos/sin tables must be float32 (positions, head_dim)");
  TORCH_CHECK(!norm || (norm->scalar_type() == at::kFloat && norm->is_contiguous() && norm->numel() == heads * head_dim),
              "norm must be float32 (heads, head_dim)");
  const int64_t t = qkv.size(0), width = qkv.size(1), half = head_dim / 2, table = cos.size(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < t; ++r) TORCH_CHECK(pos[r] >= 0 && pos[r] < table, "position ", pos[r], " is past the RoPE table");
  float* data = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = signed_sin.data_ptr<float>();
  const float* nw = norm ? norm->data_ptr<float>() : nullptr;
  at::parallel_for(0, t * heads, std::max<int64_t>(1, 8192 / head_dim), [&](int64_t i0, int64_t i1) {
    std::vector<float> x(head_dim);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / heads, h = i % heads;
      float* v = data + r * width + h * head_dim;
      std::memcpy(x.data(), v, head_dim * sizeof(float));
      if (nw) {
        float ss = 0.f;
        for (int64_t j = 0; j < head_dim; ++j) ss += x[j] * x[j];
        const float inv = 1.f / std::sqrt(ss / head_dim + static_cast<float>(eps));
        for (int64_t j = 0; j < head_dim; ++j) x[j] = nw[h * head_dim + j] * (x[j] * inv);
      }
      const float* cp = c + pos[r] * head_dim;
      const float* sp = s + pos[r] * head_dim;
      for (int64_t j = 0; j < head_dim; ++j) v[j] = x[j] * cp[j] + x[(j + half) % head_dim] * sp[j];
    }
  });
}

// silu(gate) * up for gate_up (T, 2F) -> (T, F).
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be contiguous float32 (T, 2F)");
  const int64_t t = gate_up.size(0), f = gate_up.size(1) / 2;
  auto out = at::empty({t, f}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, t, std::max<int64_t>(1, 4096 / f), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = in + r * 2 * f;
      float* y = o + r * f;
      int64_t i = 0;
#ifdef ROOFTOP_AVX2
      for (; i + 8 <= f; i += 8) {
        const __m256 gate = _mm256_loadu_ps(g + i);
        const __m256 sig = _mm256_div_ps(gate, _mm256_add_ps(_mm256_set1_ps(1.f), exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gate))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(sig, _mm256_loadu_ps(g + f + i)));
      }
#endif
      for (; i < f; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * g[f + i];
    }
  });
  return out;
}

// The index of each row's largest value, as torch.argmax gives it (the first of equal maxima; a NaN is the
// largest, the first one): greedy decoding's pick. PyTorch's CPU argmax tracks an index per element; this finds
// the maximum with vector compares, then its first index, in two passes over the row.
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() && logits.size(1) > 0,
              "logits must be contiguous float32 (B, vocab)");
  const int64_t b_count = logits.size(0), vocab = logits.size(1);
  auto out = at::empty({b_count}, logits.options().dtype(at::kLong));
  const float* in = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < b_count; ++b) {
    const float* row = in + b * vocab;
    float top = row[0];
    bool nan = false;
    int64_t i = 0;
#ifdef ROOFTOP_AVX2
    __m256 tops = _mm256_set1_ps(row[0]), unordered = _mm256_setzero_ps();
    for (; i + 8 <= vocab; i += 8) {
      const __m256 v = _mm256_loadu_ps(row + i);
      tops = _mm256_max_ps(tops, v);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, tops);
    for (float lane : lanes) top = std::max(top, lane);
    nan = _mm256_movemask_ps(unordered) != 0;
#endif
    for (; i < vocab; ++i) {
      nan = nan || std::isnan(row[i]);
      top = std::max(top, row[i]);
    }
    int64_t at = 0;
    if (nan) {
      while (!std::isnan(row[at])) ++at;
    } else {
      while (row[at] != top) ++at;
    }
    o[b] = at;
  }
  return out;
}

namespace {

// p[s] = scale * (q . the key at rows[s]) for s < n, keys at base + rows[s] * stride. Four keys at a time, so
// four FMA chains run side by side instead of each dot waiting on its own.
void scores(const float* q, const float* base, const int64_t* rows, int64_t stride, int64_t n, int64_t dim, float scale,
            float* p) {
  int64_t s = 0;
#ifdef ROOFTOP_AVX2
  if (dim % 8 == 0) {
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

// y = sum_s p[s] * (the value at rows[s]), values at base + rows[s] * stride. 32 output floats at a time stay in
// registers over all n values.
void weighted_sum(const float* p, const float* base, const int64_t* rows, int64_t stride, int64_t n, int64_t dim, float* y) {
  int64_t d0 = 0;
#ifdef ROOFTOP_AVX2
  for (; d0 + 32 <= dim; d0 += 32) {
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
    for (int64_t s = 0; s < n; ++s) {
      const __m256 w = _mm256_set1_ps(p[s]);
      const float* v = base + rows[s] * stride + d0;
      y0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), y0);
      y1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), y1);
      y2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), y2);
      y3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), y3);
    }
    _mm256_storeu_ps(y + d0, y0), _mm256_storeu_ps(y + d0 + 8, y1);
    _mm256_storeu_ps(y + d0 + 16, y2), _mm256_storeu_ps(y + d0 + 24, y3);
  }
#endif
  for (; d0 < dim; ++d0) {
    float sum = 0.f;
    for (int64_t s = 0; s < n; ++s) sum += p[s] * base[rows[s] * stride + d0];
    y[d0] = sum;
  }
}

// scores over int8 keys with a float32 scale per (slot, KV head): p[s] = scale * kscale[rows[s]] * (q . key).
void scores_q8(const float* q, const int8_t* base, const float* kscale, const int64_t* rows, int64_t stride,
               int64_t sstride, int64_t n, int64_t dim, float scale, float* p) {
  for (int64_t s = 0; s < n; ++s) {
    const int8_t* k = base + rows[s] * stride;
    float sum = 0.f;
    for (int64_t j = 0; j < dim; ++j) sum += q[j] * static_cast<float>(k[j]);
    p[s] = sum * scale * kscale[rows[s] * sstride];
  }
}

// weighted_sum over int8 values: y = sum_s p[s] * vscale[rows[s]] * (the value at rows[s]).
void weighted_sum_q8(const float* p, const int8_t* base, const float* vscale, const int64_t* rows, int64_t stride,
                     int64_t sstride, int64_t n, int64_t dim, float* y) {
  for (int64_t d = 0; d < dim; ++d) y[d] = 0.f;
  for (int64_t s = 0; s < n; ++s) {
    const float w = p[s] * vscale[rows[s] * sstride];
    const int8_t* v = base + rows[s] * stride;
    for (int64_t d = 0; d < dim; ++d) y[d] += w * static_cast<float>(v[d]);
  }
}

// x (kv_heads * dim) -> int8 values and a scale per head: scale = max|x| / 127, q = round(x / scale), as
// kv_cache.quantize_int8 does.
void quantize_heads(const float* x, int64_t kv_heads, int64_t dim, int8_t* q, float* scale) {
  for (int64_t h = 0; h < kv_heads; ++h) {
    const float* xh = x + h * dim;
    float top = 0.f;
    for (int64_t j = 0; j < dim; ++j) top = std::max(top, std::fabs(xh[j]));
    const float sc = top / 127.f, div = sc == 0.f ? 1.f : sc;
    for (int64_t j = 0; j < dim; ++j)
      q[h * dim + j] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, std::nearbyint(xh[j] / div))));
    scale[h] = sc;
  }
}

// p[0..n) -> softmax(p), in place.
void softmax_(float* p, int64_t n) {
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, p[i]);
  float total = 0.f;
  int64_t i = 0;
#ifdef ROOFTOP_AVX2
  __m256 sums = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(p + i), _mm256_set1_ps(top)));
    _mm256_storeu_ps(p + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  total = hsum(sums);
#endif
  for (; i < n; ++i) total += (p[i] = std::exp(p[i] - top));
  const float inv = 1.f / total;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
}

// What both decode attentions take besides their pools: qkv's width, the heads' grouping, and every row's slot,
// length and blocks within the pool.
void check_decode_step(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t dim, int64_t pool_slots,
                       const at::Tensor& slot_mapping, const at::Tensor& tables, const at::Tensor& lengths,
                       int64_t block_size) {
  const int64_t b_count = qkv.size(0);
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim, "qkv width must be (heads + 2 * kv_heads) * head_dim");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == b_count && tables.scalar_type() == at::kLong &&
                  tables.dim() == 2 && tables.is_contiguous() && tables.size(0) == b_count && lengths.scalar_type() == at::kLong &&
                  lengths.numel() == b_count && block_size > 0,
              "slot_mapping (B,), tables (B, blocks) and lengths (B,) must be int64");
  const int64_t blocks = tables.size(1), s_max = blocks * block_size;
  const int64_t* write = slot_mapping.data_ptr<int64_t>();
  const int64_t* tb = tables.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < b_count; ++b) {
    TORCH_CHECK(write[b] >= 0 && write[b] < pool_slots && len[b] >= 1 && len[b] <= s_max, "slot or length out of range");
    for (int64_t i = 0; i < blocks; ++i) TORCH_CHECK(tb[b * blocks + i] >= 0 && (tb[b * blocks + i] + 1) * block_size <= pool_slots, "block out of range");
  }
}

}  // namespace

// Decode attention straight from the paged pool. qkv (B, (H + 2*KVH)*D) holds each sequence's new q, k, v
// (RoPE applied); k and v are written to their slots, then each query head attends over its sequence's first
// `lengths[b]` positions, position p at slot tables[b, p / block_size] * block_size + p % block_size, with KV
// head h / (H / KVH). Returns (B, H*D).
at::Tensor decode_attention(const at::Tensor& qkv, at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& slot_mapping,
                            const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size, int64_t heads,
                            int64_t kv_heads, double scale) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32 (B, W)");
  TORCH_CHECK(k_pool.scalar_type() == at::kFloat && v_pool.scalar_type() == at::kFloat && k_pool.is_contiguous() &&
                  v_pool.is_contiguous() && k_pool.dim() == 3 && k_pool.size(1) == kv_heads,
              "pools must be contiguous float32 (slots, kv_heads, head_dim)");
  const int64_t b_count = qkv.size(0), dim = k_pool.size(2), pool_slots = k_pool.size(0);
  check_decode_step(qkv, heads, kv_heads, dim, pool_slots, slot_mapping, tables, lengths, block_size);
  const int64_t blocks = tables.size(1), s_max = blocks * block_size;
  const float* in = qkv.data_ptr<float>();
  float* kp = k_pool.data_ptr<float>();
  float* vp = v_pool.data_ptr<float>();
  const int64_t* write = slot_mapping.data_ptr<int64_t>();
  const int64_t* tb = tables.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t width = qkv.size(1), kv_width = kv_heads * dim, group = heads / kv_heads;
  for (int64_t b = 0; b < b_count; ++b) {
    std::memcpy(kp + write[b] * kv_width, in + b * width + heads * dim, kv_width * sizeof(float));
    std::memcpy(vp + write[b] * kv_width, in + b * width + (heads + kv_heads) * dim, kv_width * sizeof(float));
  }
  auto out = at::empty({b_count, heads * dim}, qkv.options());
  float* o = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  // one task per (sequence, KV head), whose query heads read the same K and V rows while they are in cache; one
  // thread while the caches are short, since a parallel region costs more than a few heads' work
  at::parallel_for(0, b_count * kv_heads, std::max<int64_t>(1, (1 << 15) / (s_max * dim * group)), [&](int64_t t0, int64_t t1) {
    std::vector<float> p(s_max);
    std::vector<int64_t> seq(s_max);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / kv_heads, kvh = t % kv_heads, n = len[b];
      for (int64_t s = 0; s < n; ++s) seq[s] = tb[b * blocks + s / block_size] * block_size + s % block_size;
      const float* q = in + b * width + kvh * group * dim;  // the group's query heads are consecutive
      float* y = o + b * heads * dim + kvh * group * dim;
      for (int64_t h = 0; h < group; ++h) {
        scores(q + h * dim, kp + kvh * dim, seq.data(), kv_width, n, dim, sc, p.data());
        softmax_(p.data(), n);
        weighted_sum(p.data(), vp + kvh * dim, seq.data(), kv_width, n, dim, y + h * dim);
      }
    }
  });
  return out;
}

// decode_attention over an int8 pool: values (slots, kv_heads, head_dim) int8 and their scales (slots, kv_heads)
// float32; the new k and v are quantized into their slots, then attended as stored (each row times its scale).
at::Tensor decode_attention_q8(const at::Tensor& qkv, at::Tensor& k_pool, at::Tensor& k_scale, at::Tensor& v_pool,
                               at::Tensor& v_scale, const at::Tensor& slot_mapping, const at::Tensor& tables,
                               const at::Tensor& lengths, int64_t block_size, int64_t heads, int64_t kv_heads,
                               double scale) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32 (B, W)");
  TORCH_CHECK(k_pool.scalar_type() == at::kChar && v_pool.scalar_type() == at::kChar && k_pool.is_contiguous() &&
                  v_pool.is_contiguous() && k_pool.dim() == 3 && k_pool.size(1) == kv_heads && v_pool.sizes() == k_pool.sizes(),
              "pools must be contiguous int8 (slots, kv_heads, head_dim)");
  TORCH_CHECK(k_scale.scalar_type() == at::kFloat && v_scale.scalar_type() == at::kFloat && k_scale.is_contiguous() &&
                  v_scale.is_contiguous() && k_scale.dim() == 2 && k_scale.size(0) == k_pool.size(0) &&
                  k_scale.size(1) == kv_heads && v_scale.sizes() == k_scale.sizes(),
              "scales must be contiguous float32 (slots, kv_heads)");
  const int64_t b_count = qkv.size(0), dim = k_pool.size(2), pool_slots = k_pool.size(0);
  check_decode_step(qkv, heads, kv_heads, dim, pool_slots, slot_mapping, tables, lengths, block_size);
  const int64_t blocks = tables.size(1), s_max = blocks * block_size;
  const float* in = qkv.data_ptr<float>();
  int8_t* kp = k_pool.data_ptr<int8_t>();
  int8_t* vp = v_pool.data_ptr<int8_t>();
  float* ks = k_scale.data_ptr<float>();
  float* vs = v_scale.data_ptr<float>();
  const int64_t* write = slot_mapping.data_ptr<int64_t>();
  const int64_t* tb = tables.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t width = qkv.size(1), kv_width = kv_heads * dim, group = heads / kv_heads;
  for (int64_t b = 0; b < b_count; ++b) {
    quantize_heads(in + b * width + heads * dim, kv_heads, dim, kp + write[b] * kv_width, ks + write[b] * kv_heads);
    quantize_heads(in + b * width + (heads + kv_heads) * dim, kv_heads, dim, vp + write[b] * kv_width, vs + write[b] * kv_heads);
  }
  auto out = at::empty({b_count, heads * dim}, qkv.options());
  float* o = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b_count * kv_heads, std::max<int64_t>(1, (1 << 15) / (s_max * dim * group)), [&](int64_t t0, int64_t t1) {
    std::vector<float> p(s_max);
    std::vector<int64_t> seq(s_max);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / kv_heads, kvh = t % kv_heads, n = len[b];
      for (int64_t s = 0; s < n; ++s) seq[s] = tb[b * blocks + s / block_size] * block_size + s % block_size;
      const float* q = in + b * width + kvh * group * dim;
      float* y = o + b * heads * dim + kvh * group * dim;
      for (int64_t h = 0; h < group; ++h) {
        scores_q8(q + h * dim, kp + kvh * dim, ks + kvh, seq.data(), kv_width, kv_heads, n, dim, sc, p.data());
        softmax_(p.data(), n);
        weighted_sum_q8(p.data(), vp + kvh * dim, vs + kvh, seq.data(), kv_width, kv_heads, n, dim, y + h * dim);
      }
    }
  });
  return out;
}

// GGUF's block formats (blocks.cpp).
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& data, int64_t format,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual);
at::Tensor block_dequantize(const at::Tensor& data, int64_t format, int64_t k, bool bf16);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_linear", &block_linear, "x @ GGUF block weights^T (+bias) (+residual)", py::arg("x"), py::arg("data"),
        py::arg("format"), py::arg("bias") = py::none(), py::arg("residual") = py::none());
  m.def("block_dequantize", &block_dequantize, "GGUF block rows -> float32 or bfloat16 (N, K)", py::arg("data"),
        py::arg("format"), py::arg("k"), py::arg("bf16") = false);
  m.def("q4_linear", &q4_linear, "x @ Q4 weights^T (+bias) (+residual)", py::arg("x"), py::arg("qs"), py::arg("dm"),
        py::arg("bias") = py::none(), py::arg("residual") = py::none());
  m.def("q8_linear", &q8_linear, "x @ Q8_0 weights^T (+bias) (+residual)", py::arg("x"), py::arg("q"), py::arg("d"),
        py::arg("bias") = py::none(), py::arg("residual") = py::none());
  m.def("q4_dequantize", &q4_dequantize, "Q4 groups -> float32 or bfloat16 (N, K)", py::arg("qs"), py::arg("dm"),
        py::arg("bf16") = false);
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 rows");
  m.def("argmax_rows", &argmax_rows, "torch.argmax(logits, -1) for float32 rows");
  m.def("rope_", &rope_, "optional per-head RMSNorm, then RoPE, in place", py::arg("qkv"), py::arg("heads"),
        py::arg("head_dim"), py::arg("positions"), py::arg("cos"), py::arg("signed_sin"), py::arg("norm") = py::none(),
        py::arg("eps") = 1e-6);
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("decode_attention", &decode_attention, "decode attention over the paged KV pool");
  m.def("decode_attention_q8", &decode_attention_q8, "decode attention over an int8 paged KV pool with scales");
}
