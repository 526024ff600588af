// Sample kernel of the JIT: the sum of each row of a float matrix. The JIT tests compile it, the
// library carries ahead-of-time instantiations of it, and `dsk jit warmup` times it.
//
// Contract: y[r] = sum over c in [0, cols) of x[r * ld + c], for r in [0, rows), accumulated in
// the fixed order of LaneSums, so every instantiation (JIT, ahead-of-time, runtime-shape) gives
// bitwise-identical results. Callers guarantee rows >= 0, ld >= cols >= 0, cols == kConfig.cols
// when that is non-zero, and valid pointers.
#pragma once

#include <cstdint>

#include <dsk/kernels/jit_test/lane_sum.hpp>

namespace dsk::kernels::jit_test {

struct RowsumConfig {
  int cols;           // row length fixed at compile time; 0 = RowsumArgs::cols (runtime shape)
  int rows_per_step;  // rows summed together with independent accumulators; >= 1
};

struct RowsumArgs {
  const float* x;  // rows x cols, row stride ld (elements)
  float* y;        // rows
  int64_t rows;
  int64_t cols;
  int64_t ld;
};

// Sums kRows rows starting at `x` into y[0..kRows).
template <int kRows>
void rowsum_block(const float* x, int64_t ld, int64_t cols, float* y) {
  LaneSums sums[kRows];
  int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes)
    for (int i = 0; i < kRows; ++i) sums[i].add_full(x + i * ld + c);
  if (c < cols)
    for (int i = 0; i < kRows; ++i) sums[i].add_partial(x + i * ld + c, cols - c);
  for (int i = 0; i < kRows; ++i) y[i] = sums[i].total();
}

template <RowsumConfig kConfig>
void rowsum(const RowsumArgs& args) {
  static_assert(kConfig.cols >= 0, "cols is a row length, or 0 for the runtime shape");
  static_assert(kConfig.rows_per_step >= 1, "rows_per_step must be at least 1");
  constexpr int kRows = kConfig.rows_per_step;
  const int64_t cols = kConfig.cols != 0 ? kConfig.cols : args.cols;
  int64_t r = 0;
  for (; r + kRows <= args.rows; r += kRows)
    rowsum_block<kRows>(args.x + r * args.ld, args.ld, cols, args.y + r);
  for (; r < args.rows; ++r) rowsum_block<1>(args.x + r * args.ld, args.ld, cols, args.y + r);
}

}  // namespace dsk::kernels::jit_test
