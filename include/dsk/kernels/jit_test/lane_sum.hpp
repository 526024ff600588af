// A float sum in one fixed order, independent of how the caller unrolls or vectorises: sixteen
// interleaved partial sums (lane l adds elements l, l + 16, l + 32, ...), combined pairwise.
// Header-only; the JIT compiles it with the sample kernel rowsum.hpp.
#pragma once

#include <cstdint>

namespace dsk::kernels::jit_test {

inline constexpr int kLanes = 16;

struct LaneSums {
  float lane[kLanes] = {};

  // Adds p[0..kLanes) to the lanes; one vector add when the compiler vectorises.
  void add_full(const float* p) {
    for (int l = 0; l < kLanes; ++l) lane[l] += p[l];
  }
  // Adds p[0..n) to lanes 0..n (n < kLanes): the tail of a row.
  void add_partial(const float* p, int64_t n) {
    for (int64_t l = 0; l < n; ++l) lane[l] += p[l];
  }
  // lane[0] + ... + lane[15] as a pairwise tree: (0+8, 1+9, ...), then (0+4, ...), ...
  float total() const {
    float t[kLanes];
    for (int l = 0; l < kLanes; ++l) t[l] = lane[l];
    for (int width = kLanes / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) t[l] += t[l + width];
    return t[0];
  }
};

}  // namespace dsk::kernels::jit_test
