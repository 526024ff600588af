// dsk::ref: the oracle every optimized kernel is tested against (DESIGN §6), and the harness that
// compares against it: the upstream metrics (calc_diff, FlashMLA's allclose rule, top-k set
// comparison), seeded counter-based random tensors, and NaN poisoning of outputs.
//
// Every function reads any float dtype (f64, f32, f16, bf16, e4m3, e5m2, ue8m0, fp4x2 as its two
// e2m1 values per byte) and integer dtype as values, walks any strides, and accumulates in fp64.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include <dsk/core/tensor.hpp>

namespace dsk::ref {

// ---- metrics ----

// Upstream's calc_diff: 1 - 2*sum(x*y) / sum(x*x + y*y) in fp64; 0 when both are all zero. 0 means
// identical, 1 unrelated; NaN or inf anywhere gives NaN. Shapes must match (dtypes may differ).
double calc_diff(const Tensor& x, const Tensor& y);

struct AllcloseOptions {
  double abs_tol = 1e-5;  // an element passes when |a - e| < abs_tol ...
  double rel_tol = 1e-2;  // ... or |a - e| / (|e| + 1e-6) < rel_tol, or a == e
  double cos_tol = 1e-7;  // and calc_diff over the finite elements must be <= cos_tol
};

struct AllcloseResult {
  bool passed = true;
  int64_t num_elements = 0;
  int64_t num_bad = 0;           // elements failing the special-value or tolerance rule
  int64_t first_bad_index = -1;  // row-major position of the first, -1 if none
  Shape first_bad_coords;        // its coordinates
  double first_bad_actual = 0;   // and its two values
  double first_bad_expected = 0;
  double max_abs_err = 0;  // over finite pairs
  double max_rel_err = 0;  // |a - e| / (|e| + 1e-6), over finite pairs
  double cos_diff = 0;     // calc_diff with non-finite pairs counted as 0
  std::string message;     // one line: the verdict and the numbers above

  explicit operator bool() const { return passed; }
};

// FlashMLA's check_is_allclose rule (spec/attention.md §4.4): (1) NaN, +inf and -inf at exactly
// the same positions; (2) every finite element within abs_tol or rel_tol; (3) cos_diff <= cos_tol.
// Shapes must match (dsk::Error otherwise); dtypes may differ.
AllcloseResult allclose(const Tensor& actual, const Tensor& expected,
                        const AllcloseOptions& options = {});

std::ostream& operator<<(std::ostream& os, const AllcloseResult& r);

// ---- top-k selections compared as sets ----

struct TopkCompareOptions {
  int64_t pad = -1;  // the index that fills rows with fewer than k selections
  // Per-row candidate range [start, end) of `values` (i32/i64 [b]); default the whole row.
  std::optional<Tensor> row_starts;
  std::optional<Tensor> row_ends;
};

struct TopkCompareResult {
  bool passed = true;
  int64_t num_rows = 0;
  int64_t num_bad_rows = 0;
  int64_t first_bad_row = -1;
  std::string message;  // one line: the first bad row and what is wrong with it

  explicit operator bool() const { return passed; }
};

// Compares two top-k selections row by row, ignoring order. indices_*: i32/i64 [b, k] of column
// indices, `pad` where a row selects fewer than k. A row of `indices_actual` passes when its
// entries are distinct, its number of selections equals the expected one, and:
//   - without `values`: it selects the same set as `indices_expected`;
//   - with `values` ([b, n], any float dtype, the scores the selection was made from): its indices
//     lie in the candidate range, every selected value is >= every unselected candidate value, and
//     it differs from the expected set only by swapping equal values (ties are arbitrary).
TopkCompareResult compare_topk_sets(const Tensor& indices_actual, const Tensor& indices_expected,
                                    const std::optional<Tensor>& values = std::nullopt,
                                    const TopkCompareOptions& options = {});

std::ostream& operator<<(std::ostream& os, const TopkCompareResult& r);

// ---- seeded random tensors ----
//
// Element i (row-major; fp4x2: value 2i and 2i+1 of byte i) depends only on (seed, i): the same
// seed gives the same tensor on every run and with any thread count, and generation is parallel.
// Float data is rounded to bf16 (then stored in the dtype), so references computed from it in
// f32 or f64 see exactly the values the kernels see.

// 64 random bits for (seed, counter): a splitmix64 stream keyed by the seed.
uint64_t random_u64(uint64_t seed, uint64_t counter);

// Normal(mean, std) for float dtypes (f64, f32, f16, bf16, e4m3, e5m2, fp4x2).
Tensor randn(const Shape& shape, DType dtype, uint64_t seed, float mean = 0.0f, float std = 1.0f);
// Uniform in [lo, hi) for the same dtypes (hi itself can appear after the bf16 rounding).
Tensor rand_uniform(const Shape& shape, DType dtype, uint64_t seed, float lo = 0.0f,
                    float hi = 1.0f);
// Uniform integers in [lo, hi) for integer dtypes (i8, u8, i16, i32, i64, bool) and f32/f64.
Tensor randint(const Shape& shape, DType dtype, uint64_t seed, int64_t lo, int64_t hi);

// ---- poisoning outputs ----
//
// poison() sets every element of a tensor (or strided view) to a pattern no correct kernel
// writes, so a test can prove that every element was written:
//   f64, f32, f16, bf16, e4m3, e5m2, ue8m0: all bytes 0xFF (a NaN in each format; for the wide
//     formats one no arithmetic produces, for e4m3/e5m2 the -NaN a NaN result converts to)
//   fp4x2: 0x88 (two -0 values: the e2m1 quantizer never produces -0)
//   integers and bool: all bytes 0x7F (i32 0x7F7F7F7F; not -1, which index outputs use as padding)

uint8_t poison_byte(DType dtype);
void poison(const Tensor& t);
// Elements whose bytes all equal poison_byte(dtype).
int64_t count_poisoned(const Tensor& t);
inline bool all_written(const Tensor& t) {
  return count_poisoned(t) == 0;
}

}  // namespace dsk::ref

// GoogleTest helpers: fail with the one-line description of the first difference.
//   DSK_EXPECT_ALLCLOSE(out, ref_out, {.abs_tol = 8e-4, .rel_tol = 2.01 / 128, .cos_tol = 5e-6});
#define DSK_EXPECT_ALLCLOSE(actual, expected, ...)                                               \
  do {                                                                                           \
    const ::dsk::ref::AllcloseResult dsk_allclose_ = ::dsk::ref::allclose(                       \
        (actual), (expected)__VA_OPT__(, ::dsk::ref::AllcloseOptions __VA_ARGS__));              \
    EXPECT_TRUE(dsk_allclose_.passed) << #actual " vs " #expected ": " << dsk_allclose_.message; \
  } while (0)

#define DSK_EXPECT_TOPK_SETS(actual, expected, ...)                                      \
  do {                                                                                   \
    const ::dsk::ref::TopkCompareResult dsk_topk_ =                                      \
        ::dsk::ref::compare_topk_sets((actual), (expected)__VA_OPT__(, ) __VA_ARGS__);   \
    EXPECT_TRUE(dsk_topk_.passed) << #actual " vs " #expected ": " << dsk_topk_.message; \
  } while (0)
