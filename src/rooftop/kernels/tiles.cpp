// GGUF's block formats as linears on weights repacked in tiles of 16 output rows: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1 and
// the K-quants Q4_K, Q5_K, Q6_K, each with the file's own levels and scales, so that a decode step's extra
// activation rows (a batch, a speculative verify) cost little more than the first.
//
// A row-by-row kernel dots one weight row with a few activation rows, 32 weights per integer dot: each group's
// int32 lanes must be summed, converted and scaled on their own, and the weights are unpacked again for every row
// of weights. Those multiply-port ops, not the bytes, bounded it (254 µs for 1 row of a 2048x8192 Q4_0 linear, 935
// µs for 5). Here a tile holds, per group of 32 inputs, the 16 rows' levels interleaved four bytes at a time: one
// dpbusd multiplies four of a row's activations (broadcast) with four levels of each of the 16 output rows, so the
// lanes are the 16 outputs and eight dpbusd finish a group with no reduction. The unpacked levels stay in registers
// for up to 8 activation rows, and each row's group costs one conversion and one or two FMAs for all 16 outputs.
//
// Every format reads as w = a·(u - c) + m; tiles.h has each one's a, c and m and the tiles' layout.
//
// A prefill chunk's rows of a K-quant may take the super-block form (super_blocks; quant/tiles.py says which):
// activations with one scale per 256 inputs (quantize_super_rows), each group's integer dots times its integer
// sub-block scale summed over the super-block in integers, the minima's integer dot with the activations' sums per
// 32 (vpdpwssd), and one conversion to float per super-block: acc += float(sum)·(d·xd), then (Q4_K, Q5_K)
// acc += float(minima)·(-dmin·xd).
// Every path (512-bit, 256-bit, plain loops) computes the same exact integer dots and the same float operations in
// the same order: each row's result is bit for bit the same at any batch size and on any of them.

#include "tiles.h"

namespace {

#ifdef ROOFTOP_AVX512
constexpr int TILE_ROWS = 8;  // activation rows per pass over a tile's unpacked weights (8 + 8 + temporaries fit 32 zmm)
#else
constexpr int TILE_ROWS = 4;  // 16 ymm registers
#endif

// Activation rows per pass. Q4_K's and Q5_K's super-block sums take a register per row beside its float accumulator,
// and their minima more at each super-block's end: at 8 rows a pass spilled, and ran slower than in passes of 4
// (docs/PERFORMANCE.md).
constexpr int64_t tile_rows(Format f, bool super) { return super && minimum(f) ? std::min(TILE_ROWS, 4) : TILE_ROWS; }

struct Tiled {
  const uint8_t* q;  // (tiles, groups, group_bytes)
  const at::Half* dm;  // (tiles, groups / groups_per_scale, parts, 16)
  int64_t n, groups;

  const uint8_t* group(Format f, int64_t t, int64_t g) const { return q + (t * groups + g) * group_bytes(f); }
  const at::Half* scales(Format f, int64_t t, int64_t g) const {
    return dm + (t * (groups / groups_per_scale(f)) + g / groups_per_scale(f)) * parts(f) * TILE;
  }
};

// Memory asked now for what is read PREFETCH_BYTES on: the group that far ahead in the tiles' stream, and scales as
// far ahead in theirs. A decode row's dots over a group take less time than DRAM's latency, and the hardware's
// prefetchers alone left a 1B model's decode linears well below the read roof (docs/PERFORMANCE.md). A prefetch
// past the end of the weights is harmless: it never faults.
constexpr int64_t PREFETCH_BYTES = 2048;

// Always inlined: GCC 12 left it out of line in the K-quants' larger loops, found that a function of prefetches
// alone changes nothing it can see, and dropped the calls, so Q4_K, Q5_K and Q6_K ran with no prefetch at all.
template <Format F>
__attribute__((always_inline)) inline void fetch_ahead(const Tiled& w, int64_t t, int64_t g) {
  const uint8_t* ahead = w.group(F, t, g) + PREFETCH_BYTES;
  for (int64_t line = 0; line < group_bytes(F); line += 64) __builtin_prefetch(ahead + line);
  __builtin_prefetch(reinterpret_cast<const uint8_t*>(w.scales(F, t, g)) + PREFETCH_BYTES / 4);
}

// The stored level of input k (0..31) of output row o in a tile's group: signed q for Q8_0, unsigned u otherwise.
template <Format F>
inline int level(const uint8_t* b, int64_t o, int64_t k) {
  const int64_t v = k / 4, at = 4 * o + k % 4;  // vector v's byte `at` of its chunk
  if constexpr (F == Q8_0) {
    return static_cast<int8_t>(b[64 * v + at]);
  } else if constexpr (level_bits(F) == 4) {
    return (b[64 * (v / 2) + at] >> (4 * (v % 2))) & 15;
  } else {
    constexpr int bits = level_bits(F), spare = 8 - bits;
    if (v < bits) return b[64 * v + at] & ((1 << bits) - 1);
    int u = 0;
    for (int j = 0; j < bits; ++j) {
      const int64_t s = (v - bits) * bits + j;  // the spare bit that is bit j of vector v
      u |= ((b[64 * (s / spare) + at] >> (bits + s % spare)) & 1) << j;
    }
    return u;
  }
}

// The scales of output row o for a group: a for its first 16 inputs, a2 for the last 16 (Q6_K; else a2 = a),
// m per unit of the activations' sum.
template <Format F>
inline void row_scales(const Tiled& w, int64_t t, int64_t g, int64_t o, float& a, float& a2, float& m) {
  const at::Half* s = w.scales(F, t, g);
  const uint8_t* sub = w.group(F, t, g) + sub_scales_at(F);
  const float d = s[o], second = parts(F) == 2 ? float(s[TILE + o]) : 0.f;
  if constexpr (F == Q6_K) {
    a = static_cast<float>(static_cast<int8_t>(sub[o])) * d, a2 = static_cast<float>(static_cast<int8_t>(sub[TILE + o])) * d;
    m = 0.f;
  } else if constexpr (k_quant(F)) {
    a = a2 = static_cast<float>(sub[o]) * d;
    m = static_cast<float>(sub[TILE + o]) * -second;
  } else {
    a = a2 = d, m = second;
  }
}

// What an activation row's dots with group ag start from: -c times the row's sum of the inputs they cover (Q6_K:
// its half of 16 inputs; else all 32, in half 0), which they would otherwise take off after.
template <Format F>
inline int32_t dots_start(const QuantizedRows& a, int64_t ag, int half, int c) {
  if constexpr (F == Q6_K) return -c * a.sum16[2 * ag + half];
  return half == 0 ? -c * a.sum[ag] : 0;
}

inline int32_t four_bytes(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}

// A piece of the spare bits that make vector v (b <= v < 8) of a b-bit format's group (tiles.h): `count` bits of
// chunk `chunk` from bit `from`, which go to bits `to`.. of the vector's bytes. A piece never crosses a byte, and
// from > to: it moves right.
struct Piece {
  int chunk, from, to, count;
};

template <Format F>
constexpr Piece piece(int v, int to) {
  constexpr int bits = level_bits(F), spare = 8 - bits;
  const int s = (v - bits) * bits + to, from = bits + s % spare;
  return {s / spare, from, to, std::min(bits - to, 8 - from)};
}

// A piece's bits where they go, in each byte.
constexpr char piece_mask(const Piece& p) { return static_cast<char>(((1 << p.count) - 1) << p.to); }

#ifdef ROOFTOP_AVX2
// What gathering a piece takes at each width: w | (bits & mask), its mask in every byte, a 16-bit lane's shift.
inline __m256i or_masked(__m256i w, __m256i bits, __m256i mask) {
  return _mm256_or_si256(w, _mm256_and_si256(bits, mask));
}
inline __m256i byte_mask(__m256i /* the width */, char mask) { return _mm256_set1_epi8(mask); }
template <int N>
inline __m256i shift_right16(__m256i v) { return _mm256_srli_epi16(v, N); }
#endif
#ifdef ROOFTOP_AVX512
inline __m512i or_masked(__m512i w, __m512i bits, __m512i mask) {
  return _mm512_ternarylogic_epi32(w, bits, mask, 0xf8);
}
inline __m512i byte_mask(__m512i /* the width */, char mask) { return _mm512_set1_epi8(mask); }
template <int N>
inline __m512i shift_right16(__m512i v) { return _mm512_srli_epi16(v, N); }
#endif

#ifdef ROOFTOP_AVX2
// Vector V of a b-bit format's group (or, at 256 bits, rows 8h..8h+7 of it: bytes 32h.. of each chunk) from its
// chunks' spare bits, its pieces from bit To on added to w. Shifting a 16-bit lane right moves the next byte's low
// bits into a byte's top, never into a piece's place: each piece needs one shift and one masked merge.
template <Format F, int V, int To = 0, typename Vec>
__attribute__((always_inline)) inline Vec gathered(const Vec chunk[], Vec w) {
  if constexpr (To == level_bits(F)) {
    return w;
  } else {
    constexpr Piece p = piece<F>(V, To);
    w = or_masked(w, shift_right16<p.from - p.to>(chunk[p.chunk]), byte_mask(w, piece_mask(p)));
    return gathered<F, V, To + p.count>(chunk, w);
  }
}

// Vectors b..7 of a b-bit format's group.
template <Format F, int V = level_bits(F), typename Vec>
__attribute__((always_inline)) inline void gather_all(const Vec chunk[], Vec w[8]) {
  if constexpr (V < 8) {
    w[V] = gathered<F, V>(chunk, Vec{});
    gather_all<F, V + 1>(chunk, w);
  }
}
#endif

#ifdef ROOFTOP_AVX512
// The 8 vectors of unsigned bytes of a tile's group, vector v against activations 4v..4v+3. dpbusd takes unsigned
// weights: Q8_0's signed bytes go in as q + 128 (the sign bit flipped), and the dots start from -128 * sum(x).
template <Format F>
inline void unpack512(const uint8_t* b, __m512i w[8]) {
  if constexpr (F == Q8_0) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int v = 0; v < 8; ++v) w[v] = _mm512_xor_si512(_mm512_loadu_si512(b + 64 * v), flip);
  } else if constexpr (level_bits(F) == 4) {
    const __m512i mask = _mm512_set1_epi8(15);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(b + 64 * j);
      w[2 * j] = _mm512_and_si512(v, mask);
      w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
  } else {
    constexpr int bits = level_bits(F);
    __m512i chunk[bits];
    for (int c = 0; c < bits; ++c) {
      chunk[c] = _mm512_loadu_si512(b + 64 * c);
      w[c] = _mm512_and_si512(chunk[c], _mm512_set1_epi8((1 << bits) - 1));
    }
    gather_all<F>(chunk, w);
  }
}

// 16 bytes of sub-block scales as floats, times the scale block's d.
template <bool Signed>
inline __m512 sub_scales512(const uint8_t* p, __m512 d) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(Signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes)), d);
}

// acc + the dots of u's unsigned bytes with the four signed bytes at x, broadcast. GCC 12 broadcasts them in an
// instruction of its own before each dpbusd; embedded in the dpbusd's memory operand they cost none, and a prefill
// row's group is 8 instructions shorter (docs/PERFORMANCE.md).
typedef int32_t unaligned_int32 __attribute__((may_alias, aligned(1)));
inline __m512i dpbusd_broadcast(__m512i acc, __m512i u, const int8_t* x) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const unaligned_int32*>(x)));
  return acc;
}

// acc + the int16 pairs of u times the pair of int16 at x, broadcast: dpwssd with the broadcast in its memory operand,
// as dpbusd_broadcast.
inline __m512i dpwssd_broadcast(__m512i acc, __m512i u, const int32_t* x) {
  __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const unaligned_int32*>(x)));
  return acc;
}

// p0, p1 plus the dots of a group's 16 output rows with one activation row's 32 levels at x: p0 of inputs 0-15, p1
// of 16-31.
__attribute__((always_inline)) inline void dots512(const __m512i u[8], const int8_t* x, __m512i& p0, __m512i& p1) {
  for (int v = 0; v < 4; ++v) {
    p0 = dpbusd_broadcast(p0, u[v], x + 4 * v);
    p1 = dpbusd_broadcast(p1, u[v + 4], x + 16 + 4 * v);
  }
}

// A tile's group as the dots take it: the 8 vectors of levels, and the scales a (inputs 0-15), a2 (16-31) and m.
struct Group512 {
  __m512i u[8];
  __m512 sa, sa2, m;
};

// Group g of tile t; d and second hold the scale block's d and m (the K-quants': 8 groups long), loaded at its
// first group.
template <Format F>
__attribute__((always_inline)) inline Group512 group512(const Tiled& w, int64_t t, int64_t g, __m512& d, __m512& second) {
  const uint8_t* b = w.group(F, t, g);
  Group512 q;
  unpack512<F>(b, q.u);
  if (g % groups_per_scale(F) == 0) {
    const at::Half* s = w.scales(F, t, g);
    d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    if constexpr (parts(F) == 2) second = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + TILE)));
    if constexpr (k_quant(F)) second = _mm512_sub_ps(_mm512_setzero_ps(), second);
  }
  q.sa = q.sa2 = d, q.m = second;
  if constexpr (F == Q6_K) {
    q.sa = sub_scales512<true>(b + sub_scales_at(F), d), q.sa2 = sub_scales512<true>(b + sub_scales_at(F) + 16, d);
  } else if constexpr (k_quant(F)) {
    q.sa = sub_scales512<false>(b + sub_scales_at(F), d);
    q.m = sub_scales512<false>(b + sub_scales_at(F) + 16, second);
  }
  return q;
}

// acc + one activation row's group ag (row * groups + g) dotted with the group's 16 output rows.
template <Format F>
__attribute__((always_inline)) inline __m512 row512(__m512 acc, const Group512& q, const QuantizedRows& a, int64_t ag) {
  constexpr int c = F == Q8_0 ? 128 : offset(F);
  __m512i p0 = _mm512_set1_epi32(dots_start<F>(a, ag, 0, c)), p1 = _mm512_set1_epi32(dots_start<F>(a, ag, 1, c));
  dots512(q.u, a.q.data() + ag * GROUP, p0, p1);
  const __m512 xd = _mm512_set1_ps(a.d[ag]);
  if constexpr (F == Q6_K) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(q.sa, xd), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(q.sa2, xd), acc);
  } else {
    const __m512i dots = _mm512_add_epi32(p0, p1);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(q.sa, xd), acc);
    if constexpr (minimum(F)) acc = _mm512_fmadd_ps(q.m, _mm512_set1_ps(a.s[ag]), acc);
    return acc;
  }
}

// A K-quant tile's group: its levels, and its 16 rows' integer sub-block scales (Q6_K: of inputs 0-15, then 16-31).
struct KGroup512 {
  __m512i u[8];
  __m512i sc, sc2;
};

template <Format F>
__attribute__((always_inline)) inline KGroup512 k_group512(const Tiled& w, int64_t t, int64_t g) {
  const uint8_t* b = w.group(F, t, g);
  KGroup512 q;
  unpack512<F>(b, q.u);
  const auto bytes = [&](int at) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + sub_scales_at(F) + at)); };
  if constexpr (F == Q6_K) {
    q.sc = _mm512_cvtepi8_epi32(bytes(0)), q.sc2 = _mm512_cvtepi8_epi32(bytes(16));
  } else {
    q.sc = q.sc2 = _mm512_cvtepu8_epi32(bytes(0));
  }
  return q;
}

// sum + one activation row's group ag dotted with the group's 16 output rows, times their sub-block scales: integers.
template <Format F>
__attribute__((always_inline)) inline __m512i k_row512(__m512i sum, const KGroup512& q, const QuantizedRows& a, int64_t ag) {
  __m512i p0 = _mm512_set1_epi32(dots_start<F>(a, ag, 0, offset(F))), p1 = _mm512_set1_epi32(dots_start<F>(a, ag, 1, offset(F)));
  dots512(q.u, a.q.data() + ag * GROUP, p0, p1);
  if constexpr (F == Q6_K) {
    return _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_mullo_epi32(p0, q.sc), _mm512_mullo_epi32(p1, q.sc2)));
  }
  return _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_add_epi32(p0, p1), q.sc));
}

// The end of a K-quant super-block whose first group is `first`: each of the R rows from r0 adds its integer sum
// times d times its own d, and (Q4_K, Q5_K) the minima's integer dot with its sums of q per 32, times -dmin and
// its d; the sums start again.
template <Format F, int R>
__attribute__((always_inline)) inline void k_super512(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t first,
                                                      int64_t r0, __m512 acc[R], __m512i sum[R]) {
  const at::Half* s = w.scales(F, t, first);
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  __m512 minus_dmin = _mm512_setzero_ps();
  __m512i minima[4];  // lane o: row o's minima of groups 2j and 2j + 1, as two int16
  if constexpr (minimum(F)) {
    minus_dmin = _mm512_sub_ps(minus_dmin, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + TILE))));
    const auto of = [&](int64_t g) {
      return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.group(F, t, g) + sub_scales_at(F) + 16)));
    };
    for (int j = 0; j < 4; ++j) minima[j] = _mm512_or_si512(of(first + 2 * j), _mm512_slli_epi32(of(first + 2 * j + 1), 16));
  }
  for (int r = 0; r < R; ++r) {
    const int64_t ag = (r0 + r) * w.groups + first;
    const __m512 xd = _mm512_set1_ps(a.d[ag / groups_per_scale(F)]);
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_mul_ps(d, xd), acc[r]);
    if constexpr (minimum(F)) {
      __m512i m = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) m = dpwssd_broadcast(m, minima[j], a.sum_pairs.data() + ag / 2 + j);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(minus_dmin, xd), acc[r]);
    }
    sum[r] = _mm512_setzero_si512();
  }
}

// Super: a K-quant's super-block sums in integers (activations quantized per 256, `quantize_super_rows`); else each
// group's dots are scaled in floats.
template <Format F, int R, bool Super>
void tile512(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  if constexpr (Super) {
    __m512i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < w.groups; ++g) {
      fetch_ahead<F>(w, t, g);
      const KGroup512 q = k_group512<F>(w, t, g);
      for (int r = 0; r < R; ++r) sum[r] = k_row512<F>(sum[r], q, a, (r0 + r) * w.groups + g);
      if (g % groups_per_scale(F) == groups_per_scale(F) - 1) k_super512<F, R>(w, a, t, g + 1 - groups_per_scale(F), r0, acc, sum);
    }
  } else {
    __m512 d = _mm512_setzero_ps(), second = _mm512_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
      fetch_ahead<F>(w, t, g);
      const Group512 q = group512<F>(w, t, g, d, second);
      for (int r = 0; r < R; ++r) acc[r] = row512<F>(acc[r], q, a, (r0 + r) * w.groups + g);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * TILE, acc[r]);
}

// Tiles t and t2 for the call's R activation rows, their groups taken in turn: two streams of weights in flight on the
// thread instead of one. Each tile's arithmetic is tile512's, so its outputs are the same bits. Tile t's rows go to
// out, tile t2's to out + R * TILE.
template <Format F, int R>
void tile_pair512(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t t2, float* out) {
  __m512 acc[R], acc2[R];
  for (int r = 0; r < R; ++r) acc[r] = acc2[r] = _mm512_setzero_ps();
  __m512 d = _mm512_setzero_ps(), second = d, d2 = d, second2 = d;
  for (int64_t g = 0; g < w.groups; ++g) {
    fetch_ahead<F>(w, t, g);
    fetch_ahead<F>(w, t2, g);
    const Group512 q = group512<F>(w, t, g, d, second);
    for (int r = 0; r < R; ++r) acc[r] = row512<F>(acc[r], q, a, r * w.groups + g);
    const Group512 q2 = group512<F>(w, t2, g, d2, second2);
    for (int r = 0; r < R; ++r) acc2[r] = row512<F>(acc2[r], q2, a, r * w.groups + g);
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * TILE, acc[r]);
    _mm512_storeu_ps(out + (R + r) * TILE, acc2[r]);
  }
}

// The most activation rows read as two streams: a decode step of a small batch or a speculative verify, whose
// weights dominate its time. 2 x 4 accumulators beside a group's 11 vectors fit the 32 registers.
constexpr int64_t PAIR_ROWS = 4;
static_assert(2 * PAIR_ROWS <= TILE_ROWS, "a pair's rows fill tiled_linear's buffer of TILE_ROWS tiles' outputs");

template <Format F>
void tile_pair_any(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t t2, int64_t count, float* out) {
  switch (count) {
    case 1: return tile_pair512<F, 1>(w, a, t, t2, out);
    case 2: return tile_pair512<F, 2>(w, a, t, t2, out);
    case 3: return tile_pair512<F, 3>(w, a, t, t2, out);
    default: return tile_pair512<F, 4>(w, a, t, t2, out);
  }
}
#endif

#ifdef ROOFTOP_AVX2
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define ROOFTOP_DPBUSD256 1
// acc + the dots of u's unsigned bytes with s's signed bytes, four at a time (lane i: bytes 4i..4i+3).
inline __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#endif

// Half h of a tile (output rows 8h..8h+7) as 8 vectors of bytes, vector v against activations 4v..4v+3. With
// VNNI they are unsigned as at 512 bits; without it Q8_0 stays signed, for maddubs' sign trick.
template <Format F>
inline void unpack256(const uint8_t* b, int h, __m256i w[8]) {
  if constexpr (F == Q8_0) {
    for (int v = 0; v < 8; ++v) {
      w[v] = load32(b + 64 * v + 32 * h);
#ifdef ROOFTOP_DPBUSD256
      w[v] = _mm256_xor_si256(w[v], _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
    }
  } else if constexpr (level_bits(F) == 4) {
    const __m256i mask = _mm256_set1_epi8(15);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load32(b + 64 * j + 32 * h);
      w[2 * j] = _mm256_and_si256(v, mask);
      w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
  } else {
    constexpr int bits = level_bits(F);
    __m256i chunk[bits];
    for (int c = 0; c < bits; ++c) {
      chunk[c] = load32(b + 64 * c + 32 * h);
      w[c] = _mm256_and_si256(chunk[c], _mm256_set1_epi8((1 << bits) - 1));
    }
    gather_all<F>(chunk, w);
  }
}

// acc + the dots of 8 outputs' 16 weights (4 vectors w, vector v against x[4v..4v+3]) with 16 activations, as
// int32. Without VNNI, maddubs gives each output's pairs of products as int16 (never saturating: unsigned levels
// of at most 8 bits against activations in -127..127) and madd sums those to int32: the int16 sums of several
// vectors are added before the one madd while they cannot overflow (levels u below 16, 32, 64: four, four, two
// vectors; Q8_0's signed levels, made positive against x's flipped signs: one). Both give the same integers.
template <Format F>
inline __m256i dots16(const __m256i w[4], const int8_t* x, __m256i acc) {
#ifdef ROOFTOP_DPBUSD256
  for (int v = 0; v < 4; ++v) acc = dpbusd256(acc, w[v], _mm256_set1_epi32(four_bytes(x + 4 * v)));
#else
  constexpr int chain = F == Q8_0 ? 1 : level_bits(F) == 6 ? 2 : 4;
  const auto pairs_of = [&](int v) {
    const __m256i xs = _mm256_set1_epi32(four_bytes(x + 4 * v));
    if constexpr (F == Q8_0) return _mm256_maddubs_epi16(_mm256_sign_epi8(w[v], w[v]), _mm256_sign_epi8(xs, w[v]));
    return _mm256_maddubs_epi16(w[v], xs);
  };
  for (int v0 = 0; v0 < 4; v0 += chain) {
    __m256i pairs = pairs_of(v0);
    for (int v = v0 + 1; v < v0 + chain; ++v) pairs = _mm256_add_epi16(pairs, pairs_of(v));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
#endif
  return acc;
}

template <bool Signed>
inline __m256 sub_scales256(const uint8_t* p, __m256 d) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes)), d);
}

// A K-quant super-block's end for half h of a tile (output rows 8h..8h+7), as k_super512 does it at 512 bits.
template <Format F, int R>
inline void k_super256(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t first, int64_t r0, int h,
                       __m256 acc[R], __m256i sum[R]) {
  const at::Half* s = w.scales(F, t, first) + 8 * h;
  const __m256 d = half8(s);
  __m256 minus_dmin = _mm256_setzero_ps();
  __m256i minima[4];
  if constexpr (minimum(F)) {
    minus_dmin = _mm256_sub_ps(minus_dmin, half8(s + TILE));
    const auto of = [&](int64_t g) {
      return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.group(F, t, g) + sub_scales_at(F) + 16 + 8 * h)));
    };
    for (int j = 0; j < 4; ++j) minima[j] = _mm256_or_si256(of(first + 2 * j), _mm256_slli_epi32(of(first + 2 * j + 1), 16));
  }
  for (int r = 0; r < R; ++r) {
    const int64_t ag = (r0 + r) * w.groups + first;
    const __m256 xd = _mm256_set1_ps(a.d[ag / groups_per_scale(F)]);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(d, xd), acc[r]);
    if constexpr (minimum(F)) {
      __m256i m = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) m = _mm256_add_epi32(m, _mm256_madd_epi16(minima[j], _mm256_set1_epi32(a.sum_pairs[ag / 2 + j])));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(minus_dmin, xd), acc[r]);
    }
    sum[r] = _mm256_setzero_si256();
  }
}

// A tile at 256 bits is two halves of 8 output rows, both taken in one pass over the groups. Taken one after the
// other, as they were, the second half's dots ran from the cache with no read of memory in flight (the first had
// fetched every line), and a decode's linears read well below `stream_read` (docs/PERFORMANCE.md). At 3 or 4
// rows the accumulators and the levels outgrow the 16 registers, and the pass is still the faster.
template <Format F, int R, bool Super>
void tile256(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
#ifdef ROOFTOP_DPBUSD256
  constexpr int c = F == Q8_0 ? 128 : offset(F);
#else
  constexpr int c = offset(F);
#endif
  __m256 acc[2][R];
  __m256i sum[2][R];  // Super: the super-block's integer sums
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps(), sum[h][r] = _mm256_setzero_si256();
  for (int64_t g = 0; g < w.groups; ++g) {
    fetch_ahead<F>(w, t, g);
    const uint8_t* b = w.group(F, t, g);
    for (int h = 0; h < 2; ++h) {
      __m256i u[8];
      unpack256<F>(b, h, u);
      if constexpr (Super) {
        const auto bytes = [&](int at) {
          return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + sub_scales_at(F) + at + 8 * h));
        };
        const __m256i sc = F == Q6_K ? _mm256_cvtepi8_epi32(bytes(0)) : _mm256_cvtepu8_epi32(bytes(0));
        const __m256i sc2 = F == Q6_K ? _mm256_cvtepi8_epi32(bytes(16)) : sc;
        for (int r = 0; r < R; ++r) {
          const int64_t ag = (r0 + r) * w.groups + g;
          const int8_t* x = a.q.data() + ag * GROUP;
          const __m256i p0 = dots16<F>(u, x, _mm256_set1_epi32(dots_start<F>(a, ag, 0, c)));
          const __m256i p1 = dots16<F>(u + 4, x + 16, _mm256_set1_epi32(dots_start<F>(a, ag, 1, c)));
          if constexpr (F == Q6_K) {
            sum[h][r] = _mm256_add_epi32(sum[h][r], _mm256_add_epi32(_mm256_mullo_epi32(p0, sc), _mm256_mullo_epi32(p1, sc2)));
          } else {
            sum[h][r] = _mm256_add_epi32(sum[h][r], _mm256_mullo_epi32(_mm256_add_epi32(p0, p1), sc));
          }
        }
        if (g % groups_per_scale(F) == groups_per_scale(F) - 1) k_super256<F, R>(w, a, t, g + 1 - groups_per_scale(F), r0, h, acc[h], sum[h]);
        continue;
      }
      const at::Half* s = w.scales(F, t, g) + 8 * h;
      const __m256 d = half8(s);
      __m256 sa = d, sa2 = d, m = parts(F) == 2 ? half8(s + TILE) : _mm256_setzero_ps();
      if constexpr (F == Q6_K) {
        sa = sub_scales256<true>(b + sub_scales_at(F) + 8 * h, d);
        sa2 = sub_scales256<true>(b + sub_scales_at(F) + 16 + 8 * h, d);
      } else if constexpr (k_quant(F)) {
        sa = sub_scales256<false>(b + sub_scales_at(F) + 8 * h, d);
        m = sub_scales256<false>(b + sub_scales_at(F) + 16 + 8 * h, _mm256_sub_ps(_mm256_setzero_ps(), m));
      }
      for (int r = 0; r < R; ++r) {
        const int64_t ag = (r0 + r) * w.groups + g;
        const int8_t* x = a.q.data() + ag * GROUP;
        const __m256i p0 = dots16<F>(u, x, _mm256_set1_epi32(dots_start<F>(a, ag, 0, c)));
        const __m256i p1 = dots16<F>(u + 4, x + 16, _mm256_set1_epi32(dots_start<F>(a, ag, 1, c)));
        const __m256 xd = _mm256_set1_ps(a.d[ag]);
        if constexpr (F == Q6_K) {
          acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(sa, xd), acc[h][r]);
          acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(sa2, xd), acc[h][r]);
        } else {
          acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), _mm256_mul_ps(sa, xd), acc[h][r]);
          if constexpr (minimum(F)) acc[h][r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s[ag]), acc[h][r]);
        }
      }
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * TILE + 8 * h, acc[h][r]);
}
#endif

// The plain loops: the same integers and the same FMAs, one output at a time.
template <Format F, int R, bool Super>
void tile_plain(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
  constexpr int c = offset(F);
  for (int64_t o = 0; o < TILE; ++o) {
    for (int r = 0; r < R; ++r) {
      float acc = 0.f;
      int32_t sum = 0, minima = 0;  // Super: the super-block's integer sums
      for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* b = w.group(F, t, g);
        const int64_t ag = (r0 + r) * w.groups + g;
        const int8_t* x = a.q.data() + ag * GROUP;
        int32_t dots[2] = {dots_start<F>(a, ag, 0, c), dots_start<F>(a, ag, 1, c)};
        for (int64_t k = 0; k < GROUP; ++k) dots[k / 16] += level<F>(b, o, k) * x[k];
        if constexpr (Super) {
          const uint8_t* sub = b + sub_scales_at(F);
          if constexpr (F == Q6_K) {
            sum += static_cast<int8_t>(sub[o]) * dots[0] + static_cast<int8_t>(sub[TILE + o]) * dots[1];
          } else {
            sum += sub[o] * (dots[0] + dots[1]);
            minima += sub[TILE + o] * a.sum[ag];
          }
          if (g % groups_per_scale(F) == groups_per_scale(F) - 1) {
            const at::Half* s = w.scales(F, t, g);
            const float xd = a.d[ag / groups_per_scale(F)];
            acc = std::fma(static_cast<float>(sum), static_cast<float>(s[o]) * xd, acc);
            if constexpr (minimum(F)) acc = std::fma(static_cast<float>(minima), (0.f - static_cast<float>(s[TILE + o])) * xd, acc);
            sum = minima = 0;
          }
          continue;
        }
        float sa, sa2, m;
        row_scales<F>(w, t, g, o, sa, sa2, m);
        if constexpr (F == Q6_K) {
          acc = std::fma(static_cast<float>(dots[0]), sa * a.d[ag], acc);
          acc = std::fma(static_cast<float>(dots[1]), sa2 * a.d[ag], acc);
        } else {
          acc = std::fma(static_cast<float>(dots[0] + dots[1]), sa * a.d[ag], acc);
          if constexpr (minimum(F)) acc = std::fma(m, a.s[ag], acc);
        }
      }
      out[r * TILE + o] = acc;
    }
  }
}

template <Format F, int R, bool Super>
void tile(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, float* out) {
#if defined(ROOFTOP_AVX512)
  tile512<F, R, Super>(w, a, t, r0, out);
#elif defined(ROOFTOP_AVX2)
  tile256<F, R, Super>(w, a, t, r0, out);
#else
  tile_plain<F, R, Super>(w, a, t, r0, out);
#endif
}

template <Format F, bool Super>
void tile_any(const Tiled& w, const QuantizedRows& a, int64_t t, int64_t r0, int64_t count, float* out) {
  switch (count) {
    case 1: return tile<F, 1, Super>(w, a, t, r0, out);
    case 2: return tile<F, 2, Super>(w, a, t, r0, out);
    case 3: return tile<F, 3, Super>(w, a, t, r0, out);
#ifdef ROOFTOP_AVX512
    case 5: return tile<F, 5, Super>(w, a, t, r0, out);
    case 6: return tile<F, 6, Super>(w, a, t, r0, out);
    case 7: return tile<F, 7, Super>(w, a, t, r0, out);
    case 8: return tile<F, 8, Super>(w, a, t, r0, out);
#endif
    default: return tile<F, 4, Super>(w, a, t, r0, out);
  }
}

template <Format F, bool Super>
at::Tensor tiled_linear(const Tiled& w, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& residual) {
  const int64_t rows = x.size(0), k = x.size(1), n = w.n, tiles = (n + TILE - 1) / TILE;
  const QuantizedRows a = Super ? quantize_super_rows(x.data_ptr<float>(), rows, k) : quantize_rows(x.data_ptr<float>(), rows, k);
  auto out = cpu_empty({rows, n}, x.options());
  const float* b = bias ? bias->data_ptr<float>() : nullptr;
  const float* res = residual ? residual->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / k);  // tiles per task; a small matrix stays on one thread
  // Tile t's `count` rows from r0 (in acc) plus bias and residual, into out.
  const auto store = [&](int64_t t, int64_t r0, int64_t count, const float* acc) {
    const int64_t width = std::min(TILE, n - t * TILE);
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t i = 0; i < width; ++i) {
        const int64_t col = t * TILE + i, at = (r0 + r) * n + col;
        const float y = acc[r * TILE + i] + (b ? b[col] : 0.f);
        o[at] = res ? y + res[at] : y;
      }
    }
  };
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    float acc[TILE_ROWS * TILE];
#ifdef ROOFTOP_AVX512
    // A few rows (a decode at a small batch) read the weights with little work per byte: a single stream per thread
    // left the read well below what the memory gave in its fast minutes, two streams (the range's halves) follow it.
    if (!Super && rows >= 1 && rows <= PAIR_ROWS) {
      const int64_t half = (t1 - t0) / 2;
      for (int64_t t = t0; t < t0 + half; ++t) {
        tile_pair_any<F>(w, a, t, t + half, rows, acc);
        store(t, 0, rows, acc);
        store(t + half, 0, rows, acc + rows * TILE);
      }
      t0 += 2 * half;  // an odd range's last tile goes alone below
    }
#endif
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r0 = 0; r0 < rows; r0 += tile_rows(F, Super)) {
        const int64_t count = std::min<int64_t>(tile_rows(F, Super), rows - r0);
        tile_any<F, Super>(w, a, t, r0, count, acc);
        store(t, r0, count, acc);
      }
    }
  });
  return out;
}

// One tile's group as float32 or bfloat16 rows: out[o * k + i] = a·u + m' for its 16 rows (those below n) and 32
// inputs, with m' = m - a·c (Q4_0: -8d; Q6_K: -32a): one rounding of the exact value, as gguf's dequantizer
// gives it (its products of float16 scales and small integers are exact in float32).
template <Format F, typename T>
void widen_group(const Tiled& w, int64_t t, int64_t g, int64_t rows, int64_t k, T* out) {
  const uint8_t* b = w.group(F, t, g);
  alignas(64) uint8_t levels[TILE][GROUP];
#ifdef ROOFTOP_AVX2
  // Inputs 8j..8j+7 of a row are four bytes of each of vectors 2j and 2j + 1: interleaving their 32-bit lanes puts
  // each row's 8 bytes side by side, two rows per 128 bits.
  for (int h = 0; h < 2; ++h) {
    __m256i v[8];
    if constexpr (unsigned_levels(F)) {
      unpack256<F>(b, h, v);
    } else {
      for (int c = 0; c < 8; ++c) v[c] = load32(b + 64 * c + 32 * h);  // as stored, signed
    }
    for (int j = 0; j < 4; ++j) {
      const __m256i pairs[2] = {_mm256_unpacklo_epi32(v[2 * j], v[2 * j + 1]), _mm256_unpackhi_epi32(v[2 * j], v[2 * j + 1])};
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
    for (int64_t i = 0; i < GROUP; ++i) levels[o][i] = static_cast<uint8_t>(level<F>(b, o, i));
  }
#endif
  constexpr int c = offset(F);
  for (int64_t o = 0; o < rows; ++o) {
    float sa, sa2, m;
    row_scales<F>(w, t, g, o, sa, sa2, m);
    T* y = out + o * k;
    for (int half = 0; half < 2; ++half) {
      const float scale = half ? sa2 : sa, shift = m - static_cast<float>(c) * scale;
#ifdef ROOFTOP_AVX2
      const __m256 sv = _mm256_set1_ps(scale), mv = _mm256_set1_ps(shift);
      for (int e = 16 * half; e < 16 * half + 16; e += 8) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&levels[o][e]));
        const __m256i ints = unsigned_levels(F) ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
        put8(y + e, _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints), sv, mv));
      }
#else
      for (int64_t i = 16 * half; i < 16 * half + 16; ++i) {
        const int u = unsigned_levels(F) ? levels[o][i] : static_cast<int8_t>(levels[o][i]);
        put(y + i, std::fma(static_cast<float>(u), scale, shift));
      }
#endif
    }
  }
}

template <Format F>
at::Tensor tiled_dequantize(const Tiled& w, bool bf16, const at::TensorOptions& options) {
  const int64_t n = w.n, k = w.groups * GROUP, tiles = (n + TILE - 1) / TILE;
  return widened(n, k, bf16, options, [&](auto* out) {
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rows = std::min(TILE, n - t * TILE);
        for (int64_t g = 0; g < w.groups; ++g) widen_group<F>(w, t, g, rows, k, out + t * TILE * k + g * GROUP);
      }
    });
  });
}

// Rows `ids` of tiled weights as float32 (an embedding table's lookup): each row's groups widened as
// tiled_dequantize widens them, through one tile's group at a time.
template <Format F>
at::Tensor tiled_rows(const Tiled& w, const int64_t* ids, int64_t count, const at::TensorOptions& options) {
  const int64_t k = w.groups * GROUP;
  at::Tensor out = cpu_empty({count, k}, options.dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  at::parallel_for(0, count, 16, [&](int64_t r0, int64_t r1) {
    alignas(64) float tile[TILE * GROUP];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = ids[r] / TILE, row = ids[r] % TILE;
      for (int64_t g = 0; g < w.groups; ++g) {
        widen_group<F>(w, t, g, row + 1, GROUP, tile);
        std::memcpy(o + r * k + g * GROUP, tile + row * GROUP, GROUP * sizeof(float));
      }
    }
  });
  return out;
}

Tiled check_tiled(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n) {
  TORCH_CHECK(format >= Q4_0 && format <= Q6_K,
              "format must be 0 (Q4_0), 1 (Q4_1), 2 (Q8_0), 3 (Q5_0), 4 (Q5_1), 5 (Q4_K), 6 (Q5_K) or 7 (Q6_K)");
  const Format f = static_cast<Format>(format);
  const int64_t tiles = (n + TILE - 1) / TILE;
  TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.dim() == 4 && dm.size(0) == tiles &&
                  dm.size(2) == parts(f) && dm.size(3) == TILE,
              "dm must be float16 (ceil(N/16), K/", GROUP * groups_per_scale(f), ", ", parts(f), ", 16)");
  const int64_t groups = dm.size(1) * groups_per_scale(f);
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.numel() == tiles * groups * group_bytes(f),
              "q must be uint8 (ceil(N/16), K/32, ", group_bytes(f), ")");
  return Tiled{q.data_ptr<uint8_t>(), dm.data_ptr<at::Half>(), n, groups};
}


}  // namespace

// x (rows, K) float32 @ tiled weights^T (+bias) (+residual): q and dm as the layout above says, N output rows.
// super_blocks (the K-quants only: a prefill chunk's rows, issue 10's per-sequence rule): the activations take one
// scale per 256 inputs, llama.cpp's Q8_K, and each super-block's dots, times their integer sub-block scales, add up
// in integers, with one conversion to float per super-block instead of one per group: a prefill's many rows run
// faster. A decode's few rows keep scales per 32: read from DRAM, their calls in this form streamed the weights
// slower (docs/PERFORMANCE.md).
at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual,
                        bool super_blocks) {
  check_linear_inputs(x, bias, residual, n);
  const Tiled w = check_tiled(q, dm, format, n);
  TORCH_CHECK(x.size(1) == w.groups * GROUP, "x has ", x.size(1), " inputs, the weights ", w.groups * GROUP);
  TORCH_CHECK(!super_blocks || format >= Q4_K, "super_blocks is for the K-quants (formats 5, 6, 7), not format ", format);
  return by_format(format, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    if constexpr (k_quant(F)) {
      if (super_blocks) return tiled_linear<F, true>(w, x, bias, residual);
    }
    return tiled_linear<F, false>(w, x, bias, residual);
  });
}

// The sum of `data`'s bytes as 64-bit words, read as the tiled linears read their weights: each thread's range as
// one sequential stream (`streams` 1: a prefill's tiles) or as its two halves in turn (2: a decode's one-row calls,
// tile_pair512), asking for memory PREFETCH_BYTES ahead in each. The probe's read roof is the faster: PyTorch's
// `sum` alone read below what the tiled linears then streamed, and a roof below what a kernel reaches makes no bound
// (docs/PERFORMANCE.md). The words' sum is returned so that the reads cannot be left out.
int64_t stream_read(const at::Tensor& data, int64_t streams) {
  TORCH_CHECK(data.scalar_type() == at::kByte && data.is_contiguous() && data.numel() % 64 == 0,
              "data must be contiguous uint8, a multiple of 64 bytes");
  TORCH_CHECK(streams == 1 || streams == 2, "streams must be 1 or 2, not ", streams);
  const uint8_t* bytes = data.data_ptr<uint8_t>();
  std::vector<uint64_t> sums(at::get_num_threads(), 0);
  at::parallel_for(0, data.numel() / 64, 1024, [&](int64_t l0, int64_t l1) {
    uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#ifdef ROOFTOP_AVX2
    // The plain loop below is not vectorized by GCC and reads a third slower than DRAM gives (Zen 3).
    __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
    auto read = [&](int64_t line) {
      const uint8_t* at = bytes + 64 * line;
      __builtin_prefetch(at + PREFETCH_BYTES);
      low = _mm256_add_epi64(low, load32(at));
      high = _mm256_add_epi64(high, load32(at + 32));
    };
#else
    auto read = [&](int64_t line) {
      const uint8_t* at = bytes + 64 * line;
      __builtin_prefetch(at + PREFETCH_BYTES);
      uint64_t words[8];
      std::memcpy(words, at, 64);
      for (int i = 0; i < 8; ++i) acc[i] += words[i];
    };
#endif
    const int64_t half = streams == 2 ? (l1 - l0) / 2 : 0;
    for (int64_t line = l0; line < l0 + half; ++line) {
      read(line);
      read(line + half);
    }
    for (int64_t line = l0 + 2 * half; line < l1; ++line) read(line);
#ifdef ROOFTOP_AVX2
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), _mm256_add_epi64(low, high));
#endif
    for (int i = 0; i < 8; ++i) sums[at::get_thread_num()] += acc[i];
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return static_cast<int64_t>(total);
}

// Rows `ids` (int64, each in [0, n)) of tiled weights -> float32 (len(ids), K), exactly as tiled_dequantize's.
at::Tensor tiled_rows(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n, const at::Tensor& ids) {
  const Tiled w = check_tiled(q, dm, format, n);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(), "ids must be 1-D int64");
  const int64_t* at = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < ids.numel(); ++r) TORCH_CHECK(at[r] >= 0 && at[r] < n, "row ", at[r], " of ", n, " rows");
  return by_format(format, [&](auto f) { return tiled_rows<decltype(f)::value>(w, at, ids.numel(), dm.options()); });
}

// Tiled weights -> float32 or bfloat16 (N, K): what a prefill chunk's sgemm multiplies.
at::Tensor tiled_dequantize(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n, bool bf16) {
  const Tiled w = check_tiled(q, dm, format, n);
  return by_format(format, [&](auto f) { return tiled_dequantize<decltype(f)::value>(w, bf16, dm.options()); });
}
