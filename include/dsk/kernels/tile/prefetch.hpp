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

// The walk every feed makes over rows of row_bytes bytes, row i starting at address(i): the lines
// left from (row, offset), and the next `lines` of them prefetched into L2 (fewer at the end).
inline int64_t feed_lines_left(int64_t rows, int64_t row_bytes, int64_t row, int64_t offset) {
  if (row >= rows) return 0;
  return (rows - row) * ((row_bytes + 63) / 64) - offset / 64;
}
template <class Address>
void feed_lines(const Address& address, int64_t rows, int64_t row_bytes, int64_t& row,
                int64_t& offset, int64_t lines) {
  for (; lines > 0 && row < rows; --lines) {
    __builtin_prefetch(static_cast<const char*>(address(row)) + offset, 0, 2);
    offset += 64;
    if (offset >= row_bytes) offset = 0, ++row;
  }
}

// A range of rows (rows of row_bytes, row_stride apart) handed to prefetch_l2 a few lines at a
// time: a kernel feeds it between its steps, so the next stage's operands arrive in L2 while the
// current stage computes, without a burst of prefetches that would stall the loads it needs now.
struct PrefetchFeed {
  const std::byte* base = nullptr;
  int64_t row_stride = 0, row_bytes = 0, rows = 0;
  int64_t row = 0, offset = 0;  // the next line to prefetch

  int64_t lines_left() const { return feed_lines_left(rows, row_bytes, row, offset); }
  // Prefetches the next `lines` cache lines of the range (fewer at its end).
  void feed(int64_t lines) {
    const auto address = [this](int64_t r) -> const void* { return base + r * row_stride; };
    feed_lines(address, rows, row_bytes, row, offset, lines);
  }
  void finish() { feed(lines_left()); }
};

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile
