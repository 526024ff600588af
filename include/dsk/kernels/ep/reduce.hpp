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
// Each row is read once and the accumulators stay in registers, 64 values at a time.
#pragma once

#include <cstdint>

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

template <tile::Isa I>
void sum_bf16_rows(const bf16* const* rows, int n, bool from_zero, int64_t cols, bf16* out) {
  using S = tk::kernels::SimdOf<I>;
  using F = typename S::F;
  constexpr int kVectors = 4;  // four independent accumulators per pass
  int64_t c = 0;
  for (; c + 16 * kVectors <= cols; c += 16 * kVectors) {
    F acc[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      acc[v] = S::load(rows[0] + c + 16 * v);
      if (from_zero) acc[v] = S::add(S::zero(), acc[v]);
    }
    for (int i = 1; i < n; ++i)
      for (int v = 0; v < kVectors; ++v) acc[v] = S::add(acc[v], S::load(rows[i] + c + 16 * v));
    for (int v = 0; v < kVectors; ++v) S::store(out + c + 16 * v, acc[v]);
  }
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
  using S = tk::kernels::SimdOf<I>;
  using F = typename S::F;
  constexpr int kVectors = 4;
  int64_t c = 0;
  for (; c + 16 * kVectors <= cols; c += 16 * kVectors) {
    F acc[kVectors];
    for (int v = 0; v < kVectors; ++v) acc[v] = S::zero();
    for (int i = 0; i < n; ++i) {
      const F w = S::set1(weights[i]);
      for (int v = 0; v < kVectors; ++v)
        acc[v] = S::add(acc[v], S::mul(w, S::load(rows[i] + c + 16 * v)));
    }
    for (int v = 0; v < kVectors; ++v) S::store(out + c + 16 * v, acc[v]);
  }
  for (; c < cols; c += 16) {
    const int live = static_cast<int>(cols - c < 16 ? cols - c : 16);
    F acc = S::zero();
    for (int i = 0; i < n; ++i)
      acc = S::add(acc, S::mul(S::set1(weights[i]), S::load_n(rows[i] + c, live)));
    S::store_n(out + c, acc, live);
  }
}

template <tile::Isa I>
RowSums row_sums() {
  return {&sum_bf16_rows<I>, &weighted_sum_bf16_rows<I>};
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::ep::kernels
