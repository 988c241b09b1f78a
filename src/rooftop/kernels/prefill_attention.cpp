// Prefill attention: a chunk of n new queries of one sequence over its cached + n keys, causal, in float32.
//
// PyTorch's CPU flash attention ran a 1B model's 512-token prefill at 50-110 GFLOP/s of useful work (its causal
// path skips little, and a chunk after the first takes an explicit mask, so every masked block is computed too):
// an eighth of the prefill's time, beside integer linears running at ~1 TFLOP/s (docs/PERFORMANCE.md). Here the
// work is cut where causality cuts it, and the query heads that share a KV head read each block of its keys and
// values together.
//
// One task per (KV head, QUERY_ROWS rows of the chunk): its query vectors (each row's heads of that KV head) pass
// over the keys up to the last row's position, KEY_BLOCK keys at a time. Each block's keys are transposed once per
// chunk (HeadMajor, beside each head's values one after another) so that QUERIES_AT_ONCE query vectors' scores over
// it are register-blocked FMAs (a broadcast query value times a vector of keys); then each query's online softmax
// (its running maximum m, sum l and weighted sum of values, as flash attention keeps them) takes the block, and the
// same queries' weighted sums add the block's value rows, each row loaded once for all of them. Keys past a query's
// position get weight 0, and a block wholly past it is skipped. Plain loops (no AVX2, or a head dim not a whole
// number of vectors) do the same arithmetic one query and one value at a time; the sums' order differs, so the paths
// agree to float32's rounding, not bit for bit.

#include "exp.h"

#include <limits>
#include <optional>

namespace {

constexpr int64_t QUERY_ROWS = 16;  // rows of the chunk per task
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

#if defined(ROOFTOP_AVX512)
constexpr int W = 16;  // floats per vector
constexpr int QUERIES_AT_ONCE = 4;  // 4 x 4 accumulators, 4 key vectors, broadcasts: within 32 registers
using Vec = __m512;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
inline float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec exp_v(Vec x) { return exp16_ps(x); }
#elif defined(ROOFTOP_AVX2)
constexpr int W = 8;
constexpr int QUERIES_AT_ONCE = 2;  // 2 x 4 accumulators, 4 key vectors, broadcasts: within 16 registers
using Vec = __m256;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline float reduce_max(Vec v) { return hmax(v); }
inline float reduce_add(Vec v) { return hsum(v); }
inline Vec exp_v(Vec x) { return exp_ps(x); }
#endif

// One sequence's chunk: q (n, heads, dim), keys and values (cached + n, kv_heads, dim), out (n, heads, dim).
struct Chunk {
  const float *q, *keys, *values;
  float* out;
  int64_t n, cached, heads, kv_heads, dim, q_stride;  // q_stride: floats from one row of q to the next
  float scale;

  int64_t group() const { return heads / kv_heads; }
  // Query vector r of the task's rows starting at i0 for KV head h: row i0 + r / group, head h * group + r % group.
  int64_t row(int64_t i0, int64_t r) const { return i0 + r / group(); }
  int64_t head(int64_t h, int64_t r) const { return h * group() + r % group(); }
  const float* query(int64_t i0, int64_t h, int64_t r) const { return q + row(i0, r) * q_stride + head(h, r) * dim; }
  float* output(int64_t i0, int64_t h, int64_t r) const { return out + (row(i0, r) * heads + head(h, r)) * dim; }
  // Keys a row sees: up to and including its own position.
  int64_t seen(int64_t i) const { return cached + i + 1; }
  const float* key(int64_t s, int64_t h) const { return keys + (s * kv_heads + h) * dim; }
  const float* value(int64_t s, int64_t h) const { return values + (s * kv_heads + h) * dim; }
};

struct HeadMajor;  // the vector loops' copy of a chunk's keys and values (below; none without AVX2)

#ifdef ROOFTOP_AVX2
constexpr int64_t KEY_BLOCK = 4 * W;  // keys per block: four vectors of scores per query

// Each KV head's keys in blocks of KEY_BLOCK, each block transposed (dim, KEY_BLOCK) and zero past the last key,
// and its values one after another: made once per chunk. Each task had transposed every block it read, and a block
// is read by every task of the rows after it; and a block's value rows, read where they lie (a position's heads
// apart), fell into a few sets of the L1 cache and were fetched again for each pair of queries.
struct HeadMajor {
  int64_t blocks;  // per head
  std::vector<float> kt, values;  // (kv_heads, blocks, dim, KEY_BLOCK), (kv_heads, cached + n, dim)

  explicit HeadMajor(const Chunk& c)
      : blocks((c.cached + c.n + KEY_BLOCK - 1) / KEY_BLOCK),
        kt(c.kv_heads * blocks * c.dim * KEY_BLOCK),
        values(c.kv_heads * (c.cached + c.n) * c.dim) {
    const int64_t total = c.cached + c.n;
    at::parallel_for(0, c.kv_heads * blocks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t h = t / blocks, k0 = (t % blocks) * KEY_BLOCK, width = std::min(KEY_BLOCK, total - k0);
        float* block = kt.data() + t * c.dim * KEY_BLOCK;
        for (int64_t j = 0; j < KEY_BLOCK; ++j) {
          const float* key = j < width ? c.key(k0 + j, h) : nullptr;
          for (int64_t d = 0; d < c.dim; ++d) block[d * KEY_BLOCK + j] = key ? key[d] : 0.f;
        }
        for (int64_t j = 0; j < width; ++j)
          std::copy_n(c.value(k0 + j, h), c.dim, values.data() + (h * total + k0 + j) * c.dim);
      }
    });
  }

  const float* key_block(const Chunk& c, int64_t h, int64_t k0) const {
    return kt.data() + (h * blocks + k0 / KEY_BLOCK) * c.dim * KEY_BLOCK;
  }
  const float* value(const Chunk& c, int64_t s, int64_t h) const {
    return values.data() + (h * (c.cached + c.n) + s) * c.dim;
  }
};
#endif

// Each query's state over the blocks so far: running maximum, sum of weights, weighted sum of values (dim each;
// one spare row that the vector loops' missing queries write to).
struct Running {
  std::vector<float> m, l, acc;
  Running(int64_t queries, int64_t dim) : m(queries, NEG_INF), l(queries, 0.f), acc((queries + 1) * dim, 0.f) {}
};

// The plain loops' softmax of a block: scores s[0..valid) of query r into its running state, s becoming the
// weights (0 past `valid`), its weighted sum of values scaled to the new maximum. False where the block has
// nothing the query sees.
inline bool softmax_block(Running& run, int64_t r, int64_t dim, float* s, int64_t width, int64_t valid) {
  std::fill(s + std::max<int64_t>(valid, 0), s + width, 0.f);
  if (valid <= 0) return false;
  float mx = NEG_INF;
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
  const float m_new = std::max(run.m[r], mx), correction = run.m[r] == NEG_INF ? 0.f : std::exp(run.m[r] - m_new);
  float sum = 0.f;
  for (int64_t j = 0; j < valid; ++j) sum += (s[j] = std::exp(s[j] - m_new));
  run.l[r] = run.l[r] * correction + sum;
  run.m[r] = m_new;
  for (int64_t d = 0; d < dim; ++d) run.acc[r * dim + d] *= correction;
  return true;
}

#ifdef ROOFTOP_AVX2
// v, held in a register: a vector loaded once for several queries' multiply-adds. GCC otherwise folds the load into
// each of them, and at 256 bits the loads, two a cycle, and not the multiply-adds then bound the loop.
inline Vec in_register(Vec v) {
  __asm__("" : "+v"(v));
  return v;
}

// sums[g][d0 .. d0 + PARTS * W) = correction[g] * (the same) + sum_j w[g][j] * (value row k0 + j): each value row
// loaded once for all the queries, their sums in registers (PARTS a constant, so that they stay there).
template <int PARTS>
void add_values(const Chunk& c, const HeadMajor& hm, int64_t h, int64_t k0, int64_t width, int64_t d0,
                const float (*w)[KEY_BLOCK], const float* correction, float* const* sums) {
  Vec y[QUERIES_AT_ONCE][PARTS];
  for (int g = 0; g < QUERIES_AT_ONCE; ++g)
    for (int v = 0; v < PARTS; ++v) y[g][v] = mul(load(sums[g] + d0 + v * W), splat(correction[g]));
  for (int64_t j = 0; j < width; ++j) {
    const float* row = hm.value(c, k0 + j, h) + d0;
    Vec val[PARTS];
    for (int v = 0; v < PARTS; ++v) val[v] = in_register(load(row + v * W));
    for (int g = 0; g < QUERIES_AT_ONCE; ++g) {
      const Vec p = splat(w[g][j]);
      for (int v = 0; v < PARTS; ++v) y[g][v] = fma(p, val[v], y[g][v]);
    }
  }
  for (int g = 0; g < QUERIES_AT_ONCE; ++g)
    for (int v = 0; v < PARTS; ++v) store(sums[g] + d0 + v * W, y[g][v]);
}

// The task's query vectors over keys [k0, k0 + width): scores against the block's transposed keys, softmax, values.
void attend_block(const Chunk& c, const HeadMajor& hm, int64_t h, int64_t i0, int64_t queries, int64_t k0,
                  int64_t width, Running& run) {
  const float* kt = hm.key_block(c, h, k0);
  alignas(64) float s[QUERIES_AT_ONCE][KEY_BLOCK];
  for (int64_t r0 = 0; r0 < queries; r0 += QUERIES_AT_ONCE) {
    const int64_t count = std::min<int64_t>(QUERIES_AT_ONCE, queries - r0);
    const float* qs[QUERIES_AT_ONCE];
    for (int g = 0; g < QUERIES_AT_ONCE; ++g) qs[g] = c.query(i0, h, r0 + std::min<int64_t>(g, count - 1));
    Vec acc[QUERIES_AT_ONCE][4];
    for (int g = 0; g < QUERIES_AT_ONCE; ++g)
      for (int v = 0; v < 4; ++v) acc[g][v] = splat(0.f);
    for (int64_t d = 0; d < c.dim; ++d) {
      const Vec k[4] = {in_register(load(kt + d * KEY_BLOCK)), in_register(load(kt + d * KEY_BLOCK + W)),
                        in_register(load(kt + d * KEY_BLOCK + 2 * W)), in_register(load(kt + d * KEY_BLOCK + 3 * W))};
      for (int g = 0; g < QUERIES_AT_ONCE; ++g) {
        const Vec x = splat(qs[g][d]);
        for (int v = 0; v < 4; ++v) acc[g][v] = fma(x, k[v], acc[g][v]);
      }
    }
    // The scores, scaled, leave the registers once, here: read below at a query index known only at run time, the
    // accumulators had lived in memory, and GCC stored all of them at every step of the loop above.
    for (int g = 0; g < QUERIES_AT_ONCE; ++g)
      for (int v = 0; v < 4; ++v) store(s[g] + v * W, mul(acc[g][v], splat(c.scale)));
    // Each query's softmax over the block, in registers: the scores' maximum, the weights e^(score - maximum) (0
    // past the query's position), their sum; `correction` rescales what its earlier blocks summed.
    float correction[QUERIES_AT_ONCE] = {};
    for (int g = count; g < QUERIES_AT_ONCE; ++g) std::fill(s[g], s[g] + KEY_BLOCK, 0.f);
    bool any = false;
    for (int g = 0; g < count; ++g) {
      const int64_t r = r0 + g, valid = std::min(width, c.seen(c.row(i0, r)) - k0);
      correction[g] = 1.f;
      if (valid <= 0) {
        std::fill(s[g], s[g] + KEY_BLOCK, 0.f);
        continue;
      }
      any = true;
      if (valid < KEY_BLOCK) std::fill(s[g] + valid, s[g] + KEY_BLOCK, NEG_INF);  // keys past the query's position
      Vec x[4];
      for (int v = 0; v < 4; ++v) x[v] = load(s[g] + v * W);
      const float m_new = std::max(run.m[r], reduce_max(vmax(vmax(x[0], x[1]), vmax(x[2], x[3]))));
      correction[g] = run.m[r] == NEG_INF ? 0.f : std::exp(run.m[r] - m_new);
      for (int v = 0; v < 4; ++v) store(s[g] + v * W, exp_v(sub(x[v], splat(m_new))));
      if (valid < KEY_BLOCK) std::fill(s[g] + valid, s[g] + KEY_BLOCK, 0.f);  // exp_v's floor is e^-87, not 0
      const Vec sum = add(add(load(s[g]), load(s[g] + W)), add(load(s[g] + 2 * W), load(s[g] + 3 * W)));
      run.l[r] = run.l[r] * correction[g] + reduce_add(sum);
      run.m[r] = m_new;
    }
    if (!any) continue;
    float* sums[QUERIES_AT_ONCE];  // each query's weighted sum of values; a missing query's goes to the spare row
    for (int g = 0; g < QUERIES_AT_ONCE; ++g) sums[g] = run.acc.data() + (g < count ? r0 + g : queries) * c.dim;
    for (int64_t d0 = 0; d0 < c.dim; d0 += 4 * W) {
      switch ((c.dim - d0) / W) {
        case 1: add_values<1>(c, hm, h, k0, width, d0, s, correction, sums); break;
        case 2: add_values<2>(c, hm, h, k0, width, d0, s, correction, sums); break;
        case 3: add_values<3>(c, hm, h, k0, width, d0, s, correction, sums); break;
        default: add_values<4>(c, hm, h, k0, width, d0, s, correction, sums);
      }
    }
  }
}
#endif

// One task: KV head h, rows [i0, i1) of the chunk (hm: the head-major copy, where the vector loops run).
void attend_rows(const Chunk& c, [[maybe_unused]] const HeadMajor* hm, int64_t h, int64_t i0, int64_t i1) {
  const int64_t queries = (i1 - i0) * c.group(), end = c.seen(i1 - 1);
  Running run(queries, c.dim);
#ifdef ROOFTOP_AVX2
  if (hm != nullptr) {
    for (int64_t k0 = 0; k0 < end; k0 += KEY_BLOCK)
      attend_block(c, *hm, h, i0, queries, k0, std::min(KEY_BLOCK, end - k0), run);
  } else
#endif
  {
    constexpr int64_t BLOCK = 64;
    std::vector<float> s(BLOCK);
    for (int64_t k0 = 0; k0 < end; k0 += BLOCK) {
      const int64_t width = std::min(BLOCK, end - k0);
      for (int64_t r = 0; r < queries; ++r) {
        const float* x = c.query(i0, h, r);
        for (int64_t j = 0; j < width; ++j) {
          const float* key = c.key(k0 + j, h);
          float dot = 0.f;
          for (int64_t d = 0; d < c.dim; ++d) dot += x[d] * key[d];
          s[j] = dot * c.scale;
        }
        if (!softmax_block(run, r, c.dim, s.data(), width, std::min(width, c.seen(c.row(i0, r)) - k0))) continue;
        float* a = run.acc.data() + r * c.dim;
        for (int64_t j = 0; j < width; ++j) {
          const float* val = c.value(k0 + j, h);
          for (int64_t d = 0; d < c.dim; ++d) a[d] += s[j] * val[d];
        }
      }
    }
  }
  for (int64_t r = 0; r < queries; ++r) {
    float* o = c.output(i0, h, r);
    const float inv = 1.f / run.l[r];
    for (int64_t d = 0; d < c.dim; ++d) o[d] = run.acc[r * c.dim + d] * inv;
  }
}

}  // namespace

// q (n, heads, dim) over keys and values (cached + n, kv_heads, dim), float32: row i attends to keys 0 .. cached + i.
// q's rows may lie apart (a view of the step's qkv rows); each row's heads, keys and values are contiguous.
// Returns (n, heads, dim).
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, int64_t cached,
                             double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q must be float32 (n, heads, dim), each row's heads contiguous");
  const int64_t n = q.size(0), heads = q.size(1), dim = q.size(2);
  for (const at::Tensor* t : {&keys, &values}) {
    TORCH_CHECK(t->dim() == 3 && t->scalar_type() == at::kFloat && t->is_contiguous() && t->size(0) == cached + n &&
                    t->size(2) == dim && t->sizes() == keys.sizes(),
                "keys and values must be contiguous float32 (cached + n, kv_heads, dim)");
  }
  TORCH_CHECK(cached >= 0 && keys.size(1) > 0 && heads % keys.size(1) == 0, "heads must be a multiple of kv_heads");
  auto out = cpu_empty({n, heads, dim}, q.options());
  const Chunk c{q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), out.data_ptr<float>(), n,
                cached, heads, keys.size(1), dim, q.stride(0), static_cast<float>(scale)};
  const HeadMajor* hm = nullptr;
#ifdef ROOFTOP_AVX2
  std::optional<HeadMajor> head_major;
  if (dim % W == 0) hm = &head_major.emplace(c);
#endif
  const int64_t blocks = (n + QUERY_ROWS - 1) / QUERY_ROWS;
  // KV head outer: each thread's share of tasks holds every length of the causal triangle.
  at::parallel_for(0, c.kv_heads * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / blocks, i0 = (t % blocks) * QUERY_ROWS;
      attend_rows(c, hm, h, i0, std::min(n, i0 + QUERY_ROWS));
    }
  });
  return out;
}
