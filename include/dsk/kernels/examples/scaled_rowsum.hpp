// Worked example of the tile layer (docs/tile.md): a fused scaled row-sum written once for every
// ISA and compiled through dsk::jit.
//
//   y[r] = scale[r] * sum_c x[r][c]     x bf16 [rows, cols] (row stride ld), scale and y f32 [rows]
//
// The sum is a tile multiply by a matrix of ones, so it follows the tile layer's numerics
// contract: the products are exact, the sum runs over c in ascending pairs with one f32 rounding
// per step, and every backend (amx, avx512, generic) gives the same bits. Callers guarantee
// rows >= 0, ld >= cols >= 0, cols == kConfig.cols when that is non-zero, valid pointers.
#pragma once

#include <algorithm>
#include <cstdint>

#include <dsk/kernels/tile/tile.hpp>

namespace dsk::kernels::examples {

struct ScaledRowsumConfig {
  int cols;  // row length fixed at compile time; 0 = ScaledRowsumArgs::cols (runtime shape)
};

struct ScaledRowsumArgs {
  const bf16* x;
  const float* scale;
  float* y;
  int64_t rows, cols, ld;
};

template <tile::Isa I, ScaledRowsumConfig kConfig>
void scaled_rowsum(const ScaledRowsumArgs& args) {
  using C = tile::TileC<0, bf16, 16, 16>;  // 16 rows x 16 sums (all columns equal)
  using A = tile::TileA<1, bf16, 16, 32>;  // 16 rows x 32 values of x
  using B = tile::TileB<2, bf16, 32, 16>;  // ones, in VNNI form
  constexpr int kRows = 16, kCols = 32;
  const int64_t cols = kConfig.cols != 0 ? kConfig.cols : args.cols;

  alignas(64) bf16 ones[kRows * kCols];
  std::fill(ones, ones + kRows * kCols, numeric::f32_to_bf16(1.0f));
  alignas(64) bf16 padded[kRows * kCols];  // an edge block of x, zero-extended
  alignas(64) float sums[kRows * 16];

  tile::TileUnit<I, C, A, B> unit;
  unit.load(B{}, ones, kCols * sizeof(bf16));
  for (int64_t r0 = 0; r0 < args.rows; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, args.rows - r0));
    unit.zero(C{});
    for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
      const bf16* block = args.x + r0 * args.ld + c0;
      const int block_cols = static_cast<int>(std::min<int64_t>(kCols, cols - c0));
      if (rows == kRows && block_cols == kCols) {
        unit.load(A{}, block, args.ld * static_cast<int64_t>(sizeof(bf16)));
      } else {
        tile::copy_padded(block, args.ld, rows, block_cols, padded, kCols, kRows, kCols);
        unit.load(A{}, padded, kCols * sizeof(bf16));
      }
      unit.mma(C{}, A{}, B{});
    }
    unit.store(C{}, sums, 16 * sizeof(float));
    tile::scale_rows<I>(sums, 16, rows, 1, args.scale + r0);
    for (int r = 0; r < rows; ++r) args.y[r0 + r] = sums[r * 16];
  }
}

}  // namespace dsk::kernels::examples
