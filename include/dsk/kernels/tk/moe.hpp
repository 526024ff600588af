// The MoE combine kernel: each token gathers its expert outputs back from the fused (expert-major)
// layout, weighted by its routing weights, in a fixed order:
//   acc = 0;  for j = 0 .. num_topk - 1 with p = pos[t, j] >= 0:
//     s = (weights ? weights[t, j] : 1) * (x_sf ? x_sf[p] : 1);   acc = acc + x[p, :] * s
//   out[t, :] = has_sf ? acc * sf : acc
// in f32, every product and sum rounded once; then stored as the output type (e4m3 saturates).
#pragma once

#include <cstdint>
#include <type_traits>

#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {

// The most selections per token reduce_rows gathers.
inline constexpr int kMaxReduceSlots = 64;

struct ReduceArgs {
  const void* x = nullptr;  // [num_expanded_tokens, cols]
  int64_t x_stride = 0;
  const float* x_sf = nullptr;     // [num_expanded_tokens] or null
  const float* weights = nullptr;  // [num_tokens, num_topk] contiguous or null
  const int32_t* pos = nullptr;    // [num_tokens, num_topk] contiguous
  int num_topk = 0;
  int64_t cols = 0;
  bool has_sf = false;
  float sf = 1.0f;
  void* out = nullptr;  // [num_tokens, cols]
  int64_t out_stride = 0;
};

inline namespace DSK_TILE_ABI {

// Tokens [t0, t1). X is float, bf16 or e4m3; O is float, bf16 or e4m3.
template <tile::Isa I, class X, class O>
void reduce_rows(const ReduceArgs& a, int64_t t0, int64_t t1) {
  using S = SimdOf<I>;
  const X* rows[kMaxReduceSlots];
  float scale[kMaxReduceSlots];
  for (int64_t t = t0; t < t1; ++t) {
    int live = 0;
    for (int j = 0; j < a.num_topk; ++j) {
      const int32_t p = a.pos[t * a.num_topk + j];
      if (p < 0) continue;
      rows[live] = static_cast<const X*>(a.x) + p * a.x_stride;
      float s = a.weights != nullptr ? a.weights[t * a.num_topk + j] : 1.0f;
      if (a.x_sf != nullptr) s = s * a.x_sf[p];
      scale[live++] = s;
    }
    O* out = static_cast<O*>(a.out) + t * a.out_stride;
    for (int64_t c = 0; c < a.cols; c += 16) {
      const int n = static_cast<int>(a.cols - c < 16 ? a.cols - c : 16);
      auto acc = S::zero();
      for (int j = 0; j < live; ++j) {
        typename S::F x;
        if constexpr (std::is_same_v<X, e4m3>)
          x = S::load_e4m3_n(rows[j] + c, n);
        else
          x = n == 16 ? S::load(rows[j] + c) : S::load_n(rows[j] + c, n);
        acc = S::add(acc, S::mul(x, S::set1(scale[j])));
      }
      if (a.has_sf) acc = S::mul(acc, S::set1(a.sf));
      if constexpr (std::is_same_v<O, e4m3>) {
        if (n == 16)
          S::store_e4m3(out + c, acc);
        else
          S::store_e4m3_n(out + c, acc, n);
      } else {
        if (n == 16)
          S::store(out + c, acc);
        else
          S::store_n(out + c, acc, n);
      }
    }
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels
