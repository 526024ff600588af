// dsk::ref::select: the top-k oracle, a stable sort of each row (contracts in include/dsk/ref.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <dsk/core/check.hpp>
#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref::select {
namespace {

constexpr const char* kFn = "dsk::ref::select::topk";

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out;
  detail::for_each_raw_row(
      t, [&](const detail::RawRow& row) { detail::read_row(t.dtype(), row, out); });
  return out;
}

std::vector<int64_t> row_bounds(const std::optional<Tensor>& t, int64_t rows, int64_t fallback) {
  if (!t) return std::vector<int64_t>(static_cast<size_t>(rows), fallback);
  const std::vector<double> v = values_of(*t);
  DSK_CHECK_ARG(static_cast<int64_t>(v.size()) == rows, kFn, "ends/starts/offsets",
                "one value per row", v.size());
  return std::vector<int64_t>(v.begin(), v.end());
}

// a ranks before b: larger first, NaN first of all.
bool ranks_before(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && !std::isnan(b);
  return a > b;
}

// The selected positions of every row (fewer than k when the row is short), in rank order.
std::vector<std::vector<int64_t>> select_rows(const Tensor& x, int64_t k,
                                              const std::optional<Tensor>& ends,
                                              const std::optional<Tensor>& starts,
                                              std::vector<double>& all_values) {
  check::dim(kFn, "x", x, 2);
  const int64_t rows = x.size(0), cols = x.size(1);
  all_values = values_of(x);
  const std::vector<int64_t> e = row_bounds(ends, rows, cols), s = row_bounds(starts, rows, 0);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* v = all_values.data() + r * cols;
    std::vector<int64_t>& pos = out[static_cast<size_t>(r)];
    pos.resize(static_cast<size_t>(e[r] - s[r]));
    std::iota(pos.begin(), pos.end(), s[r]);
    std::stable_sort(pos.begin(), pos.end(),
                     [&](int64_t a, int64_t b) { return ranks_before(v[a], v[b]); });
    if (static_cast<int64_t>(pos.size()) > k) pos.resize(static_cast<size_t>(k));
  }
  return out;
}

}  // namespace

TopkResult topk(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                const std::optional<Tensor>& starts, const std::optional<Tensor>& output_idx_offset,
                int32_t idx_oob_fill_value) {
  std::vector<double> v;
  const auto selected = select_rows(x, k, ends, starts, v);
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<int64_t> offsets = row_bounds(output_idx_offset, rows, 0);
  TopkResult result{Tensor::empty({rows, k}, DType::i32), Tensor::empty({rows, k}, DType::f64)};
  for (int64_t r = 0; r < rows; ++r) {
    const auto& pos = selected[static_cast<size_t>(r)];
    for (int64_t i = 0; i < k; ++i) {
      const bool taken = i < static_cast<int64_t>(pos.size());
      result.indices.data<int32_t>()[r * k + i] =
          taken ? static_cast<int32_t>(pos[static_cast<size_t>(i)] + offsets[r])
                : idx_oob_fill_value;
      result.values.data<double>()[r * k + i] = taken ? v[r * cols + pos[static_cast<size_t>(i)]]
                                                      : -std::numeric_limits<double>::infinity();
    }
  }
  return result;
}

Tensor topk_page_table_transform(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                                 const Tensor& page_table, int64_t page_block_size,
                                 const std::optional<Tensor>& starts) {
  std::vector<double> v;
  const auto selected = select_rows(x, k, ends, starts, v);
  const int64_t rows = x.size(0);
  const std::vector<double> table = values_of(page_table);
  const int64_t max_blocks = page_table.size(1);
  Tensor out = Tensor::empty({rows, k}, DType::i32);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& pos = selected[static_cast<size_t>(r)];
    for (int64_t i = 0; i < k; ++i) {
      int64_t slot = -1;
      if (i < static_cast<int64_t>(pos.size())) {
        const int64_t j = pos[static_cast<size_t>(i)];
        const auto block = static_cast<int64_t>(table[r * max_blocks + j / page_block_size]);
        slot = block * page_block_size + j % page_block_size;
      }
      out.data<int32_t>()[r * k + i] = static_cast<int32_t>(slot);
    }
  }
  return out;
}

}  // namespace dsk::ref::select
