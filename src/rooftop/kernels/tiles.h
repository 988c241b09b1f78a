// The layout of rooftop's tiled weights, which tiles.cpp's linears read and repack.cpp writes at load: GGUF's
// block formats with the file's own levels and scales, repacked in tiles of 16 output rows (quant/tiles.py).
//
// Every format reads as w = a·(u - c) + m per 32 weights (Q6_K: per 16), with u an unsigned level, c a constant
// taken off the integer dots (Q4_0 8, Q5_0 16, Q6_K 32) and m a minimum (Q4_1, Q5_1; the K-quants' -dmin·min):
//   Q4_0 a = d; Q4_1 a = d, m; Q8_0 a = d (signed levels); Q5_0 a = d; Q5_1 a = d, m;
//   Q4_K, Q5_K a = d·scale, m = -dmin·min per 32 (6-bit scale and min per sub-block, float16 d, dmin per 256);
//   Q6_K a = d·scale per 16 (int8 scales, float16 d per 256).
//
// Layout of a tile's group (q: `group_bytes` per tile and group). Vector v of a group is inputs 4v..4v+3 of its 16
// rows, a 64-byte chunk's byte 4o + i belonging to output row o:
//   Q4_0, Q4_1, Q4_K: 4 chunks of nibbles, chunk j holding vector 2j in its low nibbles and 2j + 1 in its high ones;
//   Q5_0, Q5_1, Q5_K (b = 5 bits) and Q6_K (b = 6): b chunks, chunk c holding vector c in its low b bits; their
//     8 - b high bits are spare bits (8 - b)·c, (8 - b)·c + 1, ..., spare bit s being bit s % b of vector b + s / b.
//     So b vectors unpack with one AND each, and the other 8 - b are gathered from the spares;
//   Q8_0: 8 chunks, chunk v holding vector v as signed bytes;
//   then the K-quants' 32 bytes of sub-block scales: Q4_K, Q5_K the 16 rows' 6-bit scales, then their 6-bit minima
//     (a byte each); Q6_K the 16 rows' int8 scales of inputs 0-15, then of inputs 16-31.
// dm, float16 per tile and scale block (a group; the K-quants' 256 inputs): 16 d, then (Q4_1, Q5_1, K-quants' dmin)
// 16 of the second part.

#pragma once

#include "quantized.h"

#include <utility>

namespace {

constexpr int64_t TILE = 16;  // output rows per tile: one 512-bit vector of int32 lanes

enum Format : int64_t { Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K };  // quant/tiles.py's TILE_FORMATS

constexpr bool k_quant(Format f) { return f >= Q4_K; }
constexpr int level_bits(Format f) {
  return f == Q8_0 ? 8 : f == Q6_K ? 6 : (f == Q5_0 || f == Q5_1 || f == Q5_K) ? 5 : 4;
}
constexpr bool unsigned_levels(Format f) { return f != Q8_0; }
constexpr int offset(Format f) { return f == Q4_0 ? 8 : f == Q5_0 ? 16 : f == Q6_K ? 32 : 0; }  // c above
constexpr bool minimum(Format f) { return f == Q4_1 || f == Q5_1 || f == Q4_K || f == Q5_K; }  // m above
constexpr int parts(Format f) { return minimum(f) ? 2 : 1; }  // float16 vectors per tile and scale block
constexpr int64_t groups_per_scale(Format f) { return k_quant(f) ? 8 : 1; }
constexpr int64_t sub_scales_at(Format f) { return 64 * level_bits(f); }
constexpr int64_t group_bytes(Format f) { return sub_scales_at(f) + (k_quant(f) ? 32 : 0); }

// The shapes of N rows of K inputs in tiles: q (tiles, K / 32 groups, group bytes) uint8 and dm (tiles, scale
// blocks, parts, 16) float16.
inline std::pair<std::vector<int64_t>, std::vector<int64_t>> tile_shapes(Format f, int64_t n, int64_t k) {
  const int64_t tiles = (n + TILE - 1) / TILE, groups = k / GROUP;
  return {{tiles, groups, group_bytes(f)}, {tiles, groups / groups_per_scale(f), parts(f), TILE}};
}

// fn(std::integral_constant<Format, F>{}) for the format id (TORCH_CHECKed by the caller).
template <typename Fn>
auto by_format(int64_t format, Fn&& fn) {
  switch (format) {
    case Q4_0: return fn(std::integral_constant<Format, Q4_0>{});
    case Q4_1: return fn(std::integral_constant<Format, Q4_1>{});
    case Q8_0: return fn(std::integral_constant<Format, Q8_0>{});
    case Q5_0: return fn(std::integral_constant<Format, Q5_0>{});
    case Q5_1: return fn(std::integral_constant<Format, Q5_1>{});
    case Q4_K: return fn(std::integral_constant<Format, Q4_K>{});
    case Q5_K: return fn(std::integral_constant<Format, Q5_K>{});
    default: return fn(std::integral_constant<Format, Q6_K>{});
  }
}

}  // namespace
