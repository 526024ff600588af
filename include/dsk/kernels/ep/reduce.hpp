// The reductions of dsk::ep's combines: one token's BF16 rows summed in f32 in the order given,
// rounded once to BF16.
//   sum_bf16_rows (combine):
//     acc = from_zero ? 0 + rows[0] : rows[0];  acc = acc + rows[i] for i = 1 .. n - 1
//     (the owner's sum starts from the bias rows as they are, or from 0 when there is no bias, as
//     refs.py does; 0 + -0 is +0, so the two starts differ in the sign of zeros);
//   weighted_sum_bf16_rows (low_latency_combine):
//     acc = 0;  acc = acc + weights[i] * rows[i] for i = 0 .. n - 1  (product rounded, then sum;
//     no FMA), so n = 0 gives +0;
//   out = bf16(acc).
// Each row is read once and the accumulators stay in registers, 128 values at a time (the
// weighted sum is tk's reduce_fused sum, dsk/kernels/tk/moe.hpp).
#pragma once

#include <cstdint>

#include <dsk/kernels/tk/moe.hpp>
#include <dsk/kernels/tk/simd.hpp>

namespace dsk::ep::kernels {

// Both reductions of one instance, as src/ep picks them for the running backend (outside the ABI
// namespace: builds for different ISAs hand these to each other).
using SumRowsFn = void (*)(const bf16* const* rows, int n, bool from_zero, int64_t cols, bf16* out);
using WeightedSumRowsFn = void (*)(const bf16* const* rows, const float* weights, int n,
                                   int64_t cols, bf16* out);
struct RowSums {
  SumRowsFn sum = nullptr;
  WeightedSumRowsFn weighted = nullptr;
};

inline namespace DSK_TILE_ABI {

namespace reduce_detail {

// sum_bf16_rows over columns [c, c + 32 * kBlocks): 2 * kBlocks accumulators (independent add
// chains), the rows read in even/odd pairs, as tk::kernels::weighted_sum_block.
template <class S, int kBlocks>
DSK_TK_INLINE void sum_block(const bf16* const* rows, int n, bool from_zero, int64_t c, bf16* out) {
  typename S::F acc[2 * kBlocks];
  for (int k = 0; k < kBlocks; ++k) {
    S::load_bf16_pairs(rows[0] + c + 32 * k, &acc[2 * k], &acc[2 * k + 1]);
    if (from_zero) {
      acc[2 * k] = S::add(S::zero(), acc[2 * k]);
      acc[2 * k + 1] = S::add(S::zero(), acc[2 * k + 1]);
    }
  }
  for (int i = 1; i < n; ++i)
    for (int k = 0; k < kBlocks; ++k) {
      typename S::F x0, x1;
      S::load_bf16_pairs(rows[i] + c + 32 * k, &x0, &x1);
      acc[2 * k] = S::add(acc[2 * k], x0);
      acc[2 * k + 1] = S::add(acc[2 * k + 1], x1);
    }
  for (int k = 0; k < kBlocks; ++k) S::store_pairs(out + c + 32 * k, acc[2 * k], acc[2 * k + 1]);
}

}  // namespace reduce_detail

template <tile::Isa I>
void sum_bf16_rows(const bf16* const* rows, int n, bool from_zero, int64_t cols, bf16* out) {
  using S = tk::kernels::SimdOf<I>;
  using F = typename S::F;
  constexpr int64_t kBlock = tk::kernels::kSumBlockColumns;
  int64_t c = 0;
  for (; c + kBlock <= cols; c += kBlock)
    reduce_detail::sum_block<S, kBlock / 32>(rows, n, from_zero, c, out);
  for (; c + 32 <= cols; c += 32) reduce_detail::sum_block<S, 1>(rows, n, from_zero, c, out);
  for (; c < cols; c += 16) {
    const int w = static_cast<int>(cols - c < 16 ? cols - c : 16);
    F acc = S::load_n(rows[0] + c, w);
    if (from_zero) acc = S::add(S::zero(), acc);
    for (int i = 1; i < n; ++i) acc = S::add(acc, S::load_n(rows[i] + c, w));
    S::store_n(out + c, acc, w);
  }
}

template <tile::Isa I>
void weighted_sum_bf16_rows(const bf16* const* rows, const float* weights, int n, int64_t cols,
                            bf16* out) {
  tk::kernels::weighted_sum_columns<tk::kernels::SimdOf<I>>(rows, weights, n, 0, cols, out, nullptr,
                                                            [](int64_t) {});
}

template <tile::Isa I>
RowSums row_sums() {
  return {&sum_bf16_rows<I>, &weighted_sum_bf16_rows<I>};
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::ep::kernels
