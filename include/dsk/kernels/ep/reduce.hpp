// The reduction of dsk::ep's combine: one token's BF16 rows summed in f32 in the order given,
// rounded once to BF16:
//   acc = from_zero ? 0 + rows[0] : rows[0];  acc = acc + rows[i] for i = 1 .. n - 1;  out =
//   bf16(acc)
// (the owner's sum starts from the bias rows as they are, or from 0 when there is no bias, as
// refs.py does; 0 + -0 is +0, so the two starts differ in the sign of zeros). Each row is read
// once and the accumulator stays in registers, 64 values at a time.
#pragma once

#include <cstdint>

#include <dsk/kernels/tk/simd.hpp>

namespace dsk::ep::kernels {
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

}  // namespace DSK_TILE_ABI
}  // namespace dsk::ep::kernels
