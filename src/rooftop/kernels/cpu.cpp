// rooftop's CPU kernels: the decode step's work in few calls, on float32 activations.
//
// Decode reads every weight once per token, so its time is the weight bytes and the overhead around them.
// The linears (tiles.cpp: GGUF's block formats, Q4_0 to Q6_K, in tiles of 16 output rows) dot the weights with the
// activations quantized to int8 per group of 32, as llama.cpp does: AVX2's maddubs (VNNI's dpbusd) multiplies
// byte pairs, so the nibbles are never widened to floats. The small ops around them (RMSNorm, RoPE, SiLU-mul, attention over the paged cache) are one call
// each instead of a handful of PyTorch ops.
// Compiled on first use by rooftop/kernels/cpu.py with -march=native; without AVX2 and F16C plain loops run.

#include "quantized.h"

namespace {

#ifdef ROOFTOP_AVX2

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

}  // namespace

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

// GGUF's block formats in tiles of 16 output rows (tiles.cpp).
at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual);
at::Tensor tiled_dequantize(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n, bool bf16);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_linear", &tiled_linear, "x @ tiled block-format weights^T (+bias) (+residual)", py::arg("x"),
        py::arg("q"), py::arg("dm"), py::arg("format"), py::arg("n"), py::arg("bias") = py::none(),
        py::arg("residual") = py::none());
  m.def("tiled_dequantize", &tiled_dequantize, "tiled block-format weights -> float32 or bfloat16 (N, K)",
        py::arg("q"), py::arg("dm"), py::arg("format"), py::arg("n"), py::arg("bf16") = false);
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 rows");
  m.def("argmax_rows", &argmax_rows, "torch.argmax(logits, -1) for float32 rows");
  m.def("rope_", &rope_, "optional per-head RMSNorm, then RoPE, in place", py::arg("qkv"), py::arg("heads"),
        py::arg("head_dim"), py::arg("positions"), py::arg("cos"), py::arg("signed_sin"), py::arg("norm") = py::none(),
        py::arg("eps") = 1e-6);
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("decode_attention", &decode_attention, "decode attention over the paged KV pool");
  m.def("decode_attention_q8", &decode_attention_q8, "decode attention over an int8 paged KV pool with scales");
}
