// NaN poisoning of outputs and the check that a kernel overwrote every element (DESIGN §6).
#include <cstring>

#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref {

void poison(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  Tensor view = t;  // fill_bytes_ writes through the shared storage
  view.fill_bytes_(poison_byte(t.dtype()));
}

int64_t count_poisoned(const Tensor& t) {
  if (!t.defined()) return 0;
  const size_t es = t.element_size();
  uint8_t pattern[8];
  std::memset(pattern, poison_byte(t.dtype()), sizeof(pattern));
  int64_t count = 0;
  detail::for_each_raw_row(t, [&](const detail::RawRow& row) {
    for (int64_t i = 0; i < row.length; ++i)
      count += std::memcmp(row.first + i * row.stride_bytes, pattern, es) == 0;
  });
  return count;
}

}  // namespace dsk::ref
