// A GGUF block-format matrix, its rows of blocks as the file holds them, repacked into tiles.h's tiles at load: each
// tile's group decodes its 16 rows' levels and sub-block scales from the blocks as gguf's dequantizer reads them,
// then interleaves them. In PyTorch's byte ops (a decode to levels, then a permute per part) this took most of a
// 1B model's load; here each weight's bytes are read once and each tile's written once (docs/PERFORMANCE.md).
//
// The rows are read where they are: in the file's mapping, in the order the model wants them (llama.cpp's Q/K row
// order undone) and from several matrices fused into one (Q, K, V; gate and up), so no copy of the rows is made
// on the way to the tiles.

#include "tiles.h"

namespace {

// The block formats a file's rows hold as they are (quant/weights.py's BLOCK_FORMATS).
constexpr bool stored(Format f) { return f == Q4_0 || f == Q5_0 || f == Q5_1 || k_quant(f); }
constexpr int64_t block_weights(Format f) { return k_quant(f) ? 256 : GROUP; }
constexpr int64_t block_bytes(Format f) {
  switch (f) {
    case Q4_0: return 18;  // d, 16 bytes of nibbles
    case Q5_0: return 22;  // d, 32 fifth bits, nibbles
    case Q5_1: return 24;  // d, m, 32 fifth bits, nibbles
    case Q4_K: return 144;  // d, dmin, 12 bytes of 6-bit scales and minima, 128 of nibbles
    case Q5_K: return 176;  // as Q4_K, with 32 bytes of fifth bits before the nibbles
    default: return 210;  // Q6_K: 128 bytes of low nibbles, 64 of 2-bit pairs, 16 int8 scales, d
  }
}
// Where a block keeps its float16 scales: d, and the second part's m or dmin.
constexpr int64_t half_at(Format f, int part) { return f == Q6_K ? 208 : 2 * part; }

// Q4_K's and Q5_K's 6-bit scale (or, from byte 8, minimum) of sub-block j: bytes 4-7 hold scales 0-3 and the
// high bits of 4-7, bytes 8-11 the same for the minima, bytes 12-15 the low four bits of both for 4-7.
inline uint8_t k4_scale(const uint8_t* block, int64_t j, int64_t at) {
  const uint8_t* s = block + at;
  if (j < 4) return s[j] & 63;
  const uint8_t packed = block[12 + j - 4];
  return (at == 4 ? packed & 15 : packed >> 4) | ((s[j - 4] >> 2) & 48);
}

// The 32 levels of group g of one row of blocks, and its sub-block scales (Q4_K, Q5_K: scale and minimum; Q6_K: the
// int8 scales of inputs 0-15 and 16-31), as gguf's dequantizer reads them.
template <Format F>
inline void row_group(const uint8_t* row, int64_t g, uint8_t u[GROUP], uint8_t sub[2]) {
  const uint8_t* block = row + g / groups_per_scale(F) * block_bytes(F);
  if constexpr (F == Q4_0 || F == Q5_0 || F == Q5_1) {
    const uint8_t* qs = block + (F == Q4_0 ? 2 : F == Q5_0 ? 6 : 8);
    for (int l = 0; l < 16; ++l) u[l] = qs[l] & 15, u[l + 16] = qs[l] >> 4;
    if constexpr (F != Q4_0) {
      uint32_t fifth;
      std::memcpy(&fifth, block + (F == Q5_0 ? 2 : 4), 4);  // little-endian, as the file is
      for (int l = 0; l < GROUP; ++l) u[l] |= ((fifth >> l) & 1) << 4;
    }
  } else if constexpr (F == Q4_K || F == Q5_K) {
    const int64_t j = g % 8;  // sub-block: pair j / 2 of 32 bytes, low nibbles for even j, high for odd
    const uint8_t* qs = block + (F == Q4_K ? 16 : 48) + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < GROUP; ++l) u[l] = (qs[l] >> shift) & 15;
    if constexpr (F == Q5_K) {
      for (int l = 0; l < GROUP; ++l) u[l] |= ((block[16 + l] >> j) & 1) << 4;
    }
    sub[0] = k4_scale(block, j, 4), sub[1] = k4_scale(block, j, 8);
  } else {  // Q6_K: per half of 128 weights, 64 bytes of low nibbles (sub-blocks 0-1 low, 2-3 high), 32 of pairs
    const int64_t j = g % 8, half = j / 4, quarter = j % 4;
    const uint8_t* low = block + 64 * half + 32 * (quarter % 2);
    const uint8_t* high = block + 128 + 32 * half;
    for (int l = 0; l < GROUP; ++l) u[l] = ((low[l] >> (4 * (quarter / 2))) & 15) | (((high[l] >> (2 * quarter)) & 3) << 4);
    sub[0] = block[192 + 2 * j], sub[1] = block[192 + 2 * j + 1];
  }
}

// One tile's group from its `rows` rows of blocks (the rest of the 16 are zeros): the layout tiles.h gives.
template <Format F>
void tile_group(const uint8_t* const* rows_of_blocks, int64_t rows, int64_t g, uint8_t* out) {
  uint8_t u[TILE][GROUP] = {}, sub[2][TILE] = {};
  for (int64_t o = 0; o < rows; ++o) {
    uint8_t s[2] = {0, 0};
    row_group<F>(rows_of_blocks[o], g, u[o], s);
    sub[0][o] = s[0], sub[1][o] = s[1];
  }
  for (int o = 0; o < TILE; ++o) {
    for (int i = 0; i < 4; ++i) {
      const auto vector = [&](int v) { return u[o][4 * v + i]; };  // row o's level of vector v's input i
      if constexpr (level_bits(F) == 4) {
        for (int j = 0; j < 4; ++j) out[64 * j + 4 * o + i] = vector(2 * j) | (vector(2 * j + 1) << 4);
      } else {
        constexpr int b = level_bits(F), spare = 8 - b;
        uint32_t spares = 0;  // spare bit s at bit s: the other vectors' levels, b bits each
        for (int e = 0; e < spare; ++e) spares |= static_cast<uint32_t>(vector(b + e)) << (b * e);
        for (int c = 0; c < b; ++c) {
          out[64 * c + 4 * o + i] = vector(c) | ((spares >> (spare * c)) & ((1 << spare) - 1)) << b;
        }
      }
    }
  }
  if constexpr (k_quant(F)) {
    std::memcpy(out + sub_scales_at(F), sub[0], TILE);
    std::memcpy(out + sub_scales_at(F) + TILE, sub[1], TILE);
  }
}

// `row[r]`: where output row r's blocks start.
template <Format F>
void tile_blocks(const std::vector<const uint8_t*>& row, int64_t k, uint8_t* q, uint16_t* dm) {
  const int64_t n = static_cast<int64_t>(row.size()), groups = k / GROUP, tiles = (n + TILE - 1) / TILE;
  const int64_t scale_blocks = k / block_weights(F);
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* const* first = row.data() + t * TILE;
      const int64_t rows = std::min(TILE, n - t * TILE);
      for (int64_t g = 0; g < groups; ++g) tile_group<F>(first, rows, g, q + (t * groups + g) * group_bytes(F));
      for (int64_t b = 0; b < scale_blocks; ++b) {
        uint16_t* out = dm + (t * scale_blocks + b) * parts(F) * TILE;
        for (int part = 0; part < parts(F); ++part) {
          for (int64_t o = 0; o < TILE; ++o) {
            uint16_t bits = 0;  // the padding rows' scales are zero
            if (o < rows) std::memcpy(&bits, first[o] + b * block_bytes(F) + half_at(F, part), 2);
            out[part * TILE + o] = bits;
          }
        }
      }
    }
  });
}

}  // namespace

// A block-format matrix's rows of blocks -> tiles.h's tiles, written into q and dm (`tiled_shapes`' numbers of uint8
// and float16), which the caller allocates where it wants them (2 MiB pages). The rows are those of `parts` (uint8
// (N_i, bytes per row) each, as the file holds them: any row stride, bytes in a row contiguous) stacked, taken in
// `order` where it is given (row r of the matrix is row order[r] of the stack).
void tile_blocks(const std::vector<at::Tensor>& parts, const c10::optional<at::Tensor>& order, int64_t format, int64_t k,
                 at::Tensor& q, at::Tensor& dm) {
  TORCH_CHECK(format == Q4_0 || format == Q5_0 || format == Q5_1 || (format >= Q4_K && format <= Q6_K),
              "format must be 0 (Q4_0), 3 (Q5_0), 4 (Q5_1), 5 (Q4_K), 6 (Q5_K) or 7 (Q6_K), not ", format);
  by_format(format, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    if constexpr (stored(F)) {
      TORCH_CHECK(k > 0 && k % block_weights(F) == 0, "k must be a positive multiple of ", block_weights(F));
      const int64_t row_bytes = k / block_weights(F) * block_bytes(F);
      std::vector<const uint8_t*> stacked;
      for (const at::Tensor& p : parts) {
        TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == at::kByte && p.dim() == 2 && p.size(1) == row_bytes &&
                        p.stride(1) == 1,
                    "each part must be uint8 (N, ", row_bytes, ") on the CPU with contiguous rows");
        for (int64_t r = 0; r < p.size(0); ++r) stacked.push_back(p.data_ptr<uint8_t>() + r * p.stride(0));
      }
      std::vector<const uint8_t*> row = stacked;
      if (order.has_value()) {
        const at::Tensor o = order->contiguous();
        TORCH_CHECK(o.device().is_cpu() && o.scalar_type() == at::kLong && o.dim() == 1, "order must be int64 (N) on the CPU");
        row.resize(o.size(0));
        const int64_t* at = o.data_ptr<int64_t>();
        for (int64_t r = 0; r < o.size(0); ++r) {
          TORCH_CHECK(at[r] >= 0 && at[r] < static_cast<int64_t>(stacked.size()), "order holds row ", at[r], " of ",
                      stacked.size());
          row[r] = stacked[at[r]];
        }
      }
      const int64_t n = static_cast<int64_t>(row.size());
      const auto [q_shape, dm_shape] = tile_shapes(F, n, k);
      TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.sizes() == q_shape, "q must be contiguous uint8 ",
                  at::IntArrayRef(q_shape));
      TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.sizes() == dm_shape,
                  "dm must be contiguous float16 ", at::IntArrayRef(dm_shape));
      tile_blocks<F>(row, k, q.data_ptr<uint8_t>(), reinterpret_cast<uint16_t*>(dm.data_ptr<at::Half>()));
    }
  });
}

// The shapes tile_blocks writes for N rows of K inputs in `format`: q's and dm's.
std::pair<std::vector<int64_t>, std::vector<int64_t>> tiled_shapes(int64_t format, int64_t n, int64_t k) {
  TORCH_CHECK(format >= Q4_0 && format <= Q6_K, "format must be a tiles.h Format id (0-7), not ", format);
  return tile_shapes(static_cast<Format>(format), n, k);
}
