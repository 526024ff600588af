// Row-major traversal of strided tensors, with elements read as fp64 values: the harness's one way
// of visiting data, so every metric handles every dtype and stride the same way. Private to
// src/ref.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <dsk/core/tensor.hpp>

namespace dsk::ref::detail {

// One innermost row of a tensor: `length` elements from `first`, `stride_bytes` apart.
struct RawRow {
  char* first;
  int64_t length;
  int64_t stride_bytes;
};

// Calls fn(row) for every innermost row in row-major order (a 0-d tensor is one row of 1).
void for_each_raw_row(const Tensor& t, const std::function<void(const RawRow&)>& fn);

// The values a tensor holds: numel(), or 2 * numel() for fp4x2 (two e2m1 values per byte).
int64_t value_count(const Tensor& t);
int64_t values_per_element(DType dtype);

// Appends the values of one row to `out` as fp64 (fp4x2: low nibble first). Any dtype.
void read_row(DType dtype, const RawRow& row, std::vector<double>& out);

// Calls fn(first_value_index, a, b, count) for each row of two tensors of the same shape, values
// in row-major order. Raises dsk::Error (naming `function`) when the shapes differ.
void for_each_row_pair(
    const char* function, const Tensor& x, const Tensor& y,
    const std::function<void(int64_t, const double*, const double*, int64_t)>& fn);

// The coordinates of value `index` (fp4x2: of the byte holding it).
Shape coordinates(const Tensor& t, int64_t index);

}  // namespace dsk::ref::detail
