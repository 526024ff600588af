// Top-k selections compared as sets, with ties allowed to go either way (DeepSelect's tests check
// set properties only; ggml's test_top_k compares index sets).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <ostream>

#include <fmt/format.h>

#include <dsk/core/check.hpp>
#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref {
namespace {

constexpr const char* kFn = "dsk::ref::compare_topk_sets";

// The `rows` rows of a 2-D tensor (a 1-D tensor is one row) as fp64 values.
std::vector<std::vector<double>> read_rows(const Tensor& t, int64_t rows) {
  std::vector<std::vector<double>> out;
  detail::for_each_raw_row(t, [&](const detail::RawRow& row) {
    out.emplace_back();
    detail::read_row(t.dtype(), row, out.back());
  });
  out.resize(rows);  // rows of length 0 have no elements to visit
  return out;
}

std::vector<int64_t> read_row_bounds(const std::optional<Tensor>& t, const char* arg, int64_t rows,
                                     int64_t fallback) {
  if (!t) return std::vector<int64_t>(rows, fallback);
  check::dtype_in(kFn, arg, *t, {DType::i32, DType::i64});
  check::shape(kFn, arg, *t, {rows});
  std::vector<int64_t> out;
  const auto rows_read = read_rows(*t, 1);  // a 1-D tensor is one row
  for (double v : rows_read[0]) out.push_back(static_cast<int64_t>(v));
  return out;
}

// The non-pad entries of one index row, sorted.
std::vector<int64_t> selections(const std::vector<double>& row, int64_t pad) {
  std::vector<int64_t> out;
  for (double v : row)
    if (static_cast<int64_t>(v) != pad) out.push_back(static_cast<int64_t>(v));
  std::sort(out.begin(), out.end());
  return out;
}

struct RowContext {
  const std::vector<double>* values = nullptr;  // null without values
  int64_t start = 0, end = 0;                   // candidate range
};

bool same_value(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// The top-k order: NaN ranks above every number (torch.topk's order, and dsk::select's).
bool ranks_below(double a, double b) {
  return (!std::isnan(a) && std::isnan(b)) || a < b;
}

// What is wrong with one row ("" when it passes).
std::string check_row(const std::vector<int64_t>& act, const std::vector<int64_t>& exp,
                      const RowContext& ctx) {
  for (const auto* set : {&act, &exp}) {
    const char* which = set == &act ? "actual" : "expected";
    for (int64_t i : *set)
      if (i < ctx.start || i >= ctx.end)
        return fmt::format("{} index {} outside the candidate range [{}, {})", which, i, ctx.start,
                           ctx.end);
    const auto dup = std::adjacent_find(set->begin(), set->end());
    if (dup != set->end()) return fmt::format("{} index {} selected twice", which, *dup);
  }
  if (act.size() != exp.size())
    return fmt::format("{} selections, expected {}", act.size(), exp.size());
  std::vector<int64_t> extra, missing;  // in actual only, in expected only
  std::set_difference(act.begin(), act.end(), exp.begin(), exp.end(), std::back_inserter(extra));
  std::set_difference(exp.begin(), exp.end(), act.begin(), act.end(), std::back_inserter(missing));
  if (!ctx.values) {
    if (extra.empty()) return "";
    return fmt::format("index {} selected instead of index {}", extra[0], missing[0]);
  }
  const std::vector<double>& v = *ctx.values;
  // Every selected value >= every unselected candidate value.
  std::vector<bool> selected(v.size(), false);
  for (int64_t i : act) selected[i] = true;
  int64_t lowest = -1, highest = -1;
  for (int64_t i : act)
    if (lowest < 0 || ranks_below(v[i], v[lowest])) lowest = i;
  for (int64_t i = ctx.start; i < ctx.end; ++i)
    if (!selected[i] && (highest < 0 || ranks_below(v[highest], v[i]))) highest = i;
  if (lowest >= 0 && highest >= 0 && ranks_below(v[lowest], v[highest]))
    return fmt::format(
        "selected index {} (value {:.7g}) is below unselected index {} (value {:.7g})", lowest,
        v[lowest], highest, v[highest]);
  // Swaps only between equal values: the two differences hold the same values.
  std::vector<double> extra_values, missing_values;
  for (int64_t i : extra) extra_values.push_back(v[i]);
  for (int64_t i : missing) missing_values.push_back(v[i]);
  std::sort(extra_values.begin(), extra_values.end());
  std::sort(missing_values.begin(), missing_values.end());
  for (size_t j = 0; j < extra.size(); ++j)
    if (!same_value(extra_values[j], missing_values[j]))
      return fmt::format("index {} (value {:.7g}) selected instead of index {} (value {:.7g})",
                         extra[0], v[extra[0]], missing[0], v[missing[0]]);
  return "";
}

}  // namespace

TopkCompareResult compare_topk_sets(const Tensor& indices_actual, const Tensor& indices_expected,
                                    const std::optional<Tensor>& values,
                                    const TopkCompareOptions& options) {
  check::dtype_in(kFn, "indices_actual", indices_actual, {DType::i32, DType::i64});
  check::dtype_in(kFn, "indices_expected", indices_expected, {DType::i32, DType::i64});
  check::dim(kFn, "indices_actual", indices_actual, 2);
  check::shape(kFn, "indices_expected", indices_expected, indices_actual.sizes());
  const int64_t rows = indices_actual.size(0);
  std::vector<std::vector<double>> value_rows;
  int64_t n = std::numeric_limits<int64_t>::max();
  if (values) {
    check::dtype_in(kFn, "values", *values,
                    {DType::f64, DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2});
    check::dim(kFn, "values", *values, 2);
    check::size(kFn, "values", *values, 0, rows);
    n = values->size(1);
    value_rows = read_rows(*values, rows);
  }
  const std::vector<int64_t> starts = read_row_bounds(options.row_starts, "row_starts", rows, 0);
  const std::vector<int64_t> ends = read_row_bounds(options.row_ends, "row_ends", rows, n);
  const auto actual_rows = read_rows(indices_actual, rows);
  const auto expected_rows = read_rows(indices_expected, rows);

  TopkCompareResult result;
  result.num_rows = rows;
  std::string first_problem;
  for (int64_t r = 0; r < rows; ++r) {
    const RowContext ctx{values ? &value_rows[r] : nullptr, starts[r], ends[r]};
    DSK_CHECK_ARG(ctx.start >= 0 && ctx.start <= ctx.end && ctx.end <= n, kFn, "options",
                  fmt::format("row {}: a candidate range inside [0, {}]", r, n),
                  fmt::format("[{}, {})", ctx.start, ctx.end));
    const std::string problem = check_row(selections(actual_rows[r], options.pad),
                                          selections(expected_rows[r], options.pad), ctx);
    if (problem.empty()) continue;
    if (result.num_bad_rows++ == 0) {
      result.first_bad_row = r;
      first_problem = problem;
    }
  }
  result.passed = result.num_bad_rows == 0;
  result.message =
      result.passed
          ? fmt::format("compare_topk_sets passed: {} rows", rows)
          : fmt::format("compare_topk_sets failed: {} of {} rows differ; first: row {}: {}",
                        result.num_bad_rows, rows, result.first_bad_row, first_problem);
  return result;
}

std::ostream& operator<<(std::ostream& os, const TopkCompareResult& r) {
  return os << r.message;
}

}  // namespace dsk::ref
