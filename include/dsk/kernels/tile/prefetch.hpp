// Software prefetch for the tile layer's kernels: a range of bytes brought towards L2 ahead of its
// use, for data the hardware prefetchers cannot predict (gathered rows, paged blocks, the next
// pass of a stream that jumps).
#pragma once

#include <cstdint>

#include <dsk/kernels/abi.hpp>

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

// Every cache line of [p, p + bytes) into L2 (a hint: it never faults, whatever p holds).
inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 2);
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile
