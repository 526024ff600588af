// Software prefetch for the tile layer's kernels: a range of bytes brought towards L2 ahead of its
// use, for data the hardware prefetchers cannot predict (gathered rows, paged blocks, the next
// pass of a stream that jumps).
#pragma once

#include <cstddef>
#include <cstdint>

#include <dsk/kernels/abi.hpp>

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

// Every cache line of [p, p + bytes) into L2 (a hint: it never faults, whatever p holds).
inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 2);
}

// A range of rows (rows of row_bytes, row_stride apart) handed to prefetch_l2 a few lines at a
// time: a kernel feeds it between its steps, so the next stage's operands arrive in L2 while the
// current stage computes, without a burst of prefetches that would stall the loads it needs now.
struct PrefetchFeed {
  const std::byte* base = nullptr;
  int64_t row_stride = 0, row_bytes = 0, rows = 0;
  int64_t row = 0, offset = 0;  // the next line to prefetch

  int64_t lines_left() const {
    if (row >= rows) return 0;
    const int64_t per_row = (row_bytes + 63) / 64;
    return (rows - row) * per_row - offset / 64;
  }
  // Prefetches the next `lines` cache lines of the range (fewer at its end).
  void feed(int64_t lines) {
    for (; lines > 0 && row < rows; --lines) {
      __builtin_prefetch(base + row * row_stride + offset, 0, 2);
      offset += 64;
      if (offset >= row_bytes) offset = 0, ++row;
    }
  }
};

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile
