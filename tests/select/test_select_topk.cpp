// dsk::select::topk and its transforms against dsk::ref::select, compared as sets (ties may go
// either way), on every backend: row lengths around k and up to 262144, f32 and bf16, ties, -inf
// and NaN, [start, end) ranges, offsets, page tables, repeatability, bad inputs; and rows built
// against the kernel's sampled starting threshold (a sample holding the largest values, values
// equal to the threshold, sorted and clustered rows, specials in the sample).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/kernels/select/topk.hpp>
#include <dsk/ref.hpp>
#include <dsk/select.hpp>

#include "common/test_util.hpp"

namespace dsk::select {
namespace {

uint64_t fresh_seed() {
  static std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

class SelectTopk : public dsk::test::PerBackend {};

// How row values are drawn.
enum class Fill { distinct, few_values, all_equal, ascending, with_specials };

// x [rows, cols] of dtype (f32 or bf16).
Tensor make_scores(int64_t rows, int64_t cols, DType dtype, Fill fill, uint64_t seed) {
  Tensor f = Tensor::empty({rows, cols}, DType::f32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(0, 7);
  float* p = f.data<float>();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < rows * cols; ++i) {
    switch (fill) {
      case Fill::distinct:
        p[i] = normal(rng);
        break;
      case Fill::few_values:
        p[i] = static_cast<float>(small(rng));
        break;
      case Fill::all_equal:
        p[i] = 1.5f;
        break;
      case Fill::ascending:
        p[i] = static_cast<float>(i % cols) * 0.25f;
        break;
      case Fill::with_specials: {
        const int r = small(rng);
        p[i] = r == 0   ? -inf
               : r == 1 ? std::numeric_limits<float>::quiet_NaN()
               : r == 2 ? inf
                        : normal(rng);
        if (r == 3) p[i] = -0.0f;
        break;
      }
    }
  }
  if (dtype == DType::f32) return f;
  Tensor b = Tensor::empty({rows, cols}, DType::bf16);
  for (int64_t i = 0; i < rows * cols; ++i) b.data<bf16>()[i] = numeric::f32_to_bf16(p[i]);
  return b;
}

// x [rows, cols] of dtype holding `values` (row-major f32).
Tensor from_values(const std::vector<float>& values, int64_t rows, int64_t cols, DType dtype) {
  Tensor x = Tensor::empty({rows, cols}, dtype);
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (dtype == DType::f32)
      x.data<float>()[i] = values[static_cast<size_t>(i)];
    else
      x.data<bf16>()[i] = numeric::f32_to_bf16(values[static_cast<size_t>(i)]);
  }
  return x;
}

// Calls f(j) for every position j of [begin, end) the kernel samples for its starting threshold.
template <class F>
void for_each_sampled(int64_t begin, int64_t end, F f) {
  for (int64_t p = 0; p < kernels::kSamplePieces; ++p)
    for (int64_t j = kernels::sample_piece(begin, end, p);
         j < kernels::sample_piece(begin, end, p) + 16; ++j)
      f(j);
}

// Whether the kernel's sampled threshold admits fewer than k values of row 0 (the segment
// [0, cols)), so that the kernel has to scan the row again: proves a case meant to defeat the
// sample does.
template <class T>
bool sample_falls_short(const Tensor& x, int64_t k) {
  using namespace kernels;
  using I = tile::generic_t;
  const int64_t cap = buffer_capacity(k);
  std::vector<uint32_t> bits(static_cast<size_t>(cap)), keys(2 * static_cast<size_t>(cap));
  std::vector<int32_t> pos(static_cast<size_t>(cap));
  Buffer b{bits.data(), pos.data(), keys.data()};
  const T* row = x.data<T>();
  const Threshold t = sampled_threshold<I>(row, 0, x.size(1), k, b);
  return t.admit == Admit::at_or_above && !scan_segment<I>(row, 0, x.size(1), k, t, b);
}

bool sample_falls_short(const Tensor& x, int64_t k) {
  return x.dtype() == DType::f32 ? sample_falls_short<float>(x, k) : sample_falls_short<bf16>(x, k);
}

Tensor int_rows(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

float value_at(const Tensor& x, int64_t r, int64_t c) {
  return x.dtype() == DType::f32 ? x.data<float>()[r * x.stride(0) + c]
                                 : numeric::bf16_to_f32(x.data<bf16>()[r * x.stride(0) + c]);
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

// The full check of one call: sets against the reference, values = x[idx], padding.
void expect_topk(const Tensor& x, int64_t k, const std::optional<Tensor>& ends = std::nullopt,
                 const std::optional<Tensor>& starts = std::nullopt, bool sorted = false) {
  const TopkResult got = topk(x, k, ends, starts, std::nullopt, -1, sorted, true);
  const TopkResult want = ref::select::topk(x, k, ends, starts);
  ref::TopkCompareOptions options{.pad = -1, .row_starts = starts, .row_ends = ends};
  DSK_EXPECT_TOPK_SETS(got.indices, want.indices, x, options);
  for (int64_t r = 0; r < x.size(0); ++r) {
    int64_t previous = -1;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t idx = got.indices.data<int32_t>()[r * k + i];
      const float v = x.dtype() == DType::f32
                          ? got.values.data<float>()[r * k + i]
                          : numeric::bf16_to_f32(got.values.data<bf16>()[r * k + i]);
      if (idx == -1) {
        ASSERT_EQ(v, -std::numeric_limits<float>::infinity()) << "row " << r << " slot " << i;
        continue;
      }
      ASSERT_TRUE(same_bits(v, value_at(x, r, idx))) << "row " << r << " slot " << i;
      if (sorted) {
        ASSERT_GT(idx, previous) << "sorted_index: row " << r << " slot " << i;
        previous = idx;
      }
    }
  }
}

TEST_P(SelectTopk, RowLengthsAroundKAndLong) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int64_t k : {1, 64, 2048}) {
    for (int64_t cols : {int64_t{1}, k - 1, k, k + 1, int64_t{4096}, int64_t{65536}}) {
      if (cols < 1) continue;
      SCOPED_TRACE("k " + std::to_string(k) + " cols " + std::to_string(cols));
      expect_topk(make_scores(3, cols, DType::f32, Fill::distinct, seed + cols), k);
    }
  }
}

TEST_P(SelectTopk, LongRowsAreCutIntoSegmentsAndMerged) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  expect_topk(make_scores(1, 262144, DType::f32, Fill::distinct, seed), 2048);
  expect_topk(make_scores(2, 131072, DType::bf16, Fill::distinct, seed + 1), 4096);
  expect_topk(make_scores(1, 100000, DType::f32, Fill::ascending, seed + 2), 512);
}

// Candidate buffers are uninitialised memory reused from earlier calls (src/select/topk.cpp), so
// what one call left there must never show in the next: calls of every size in turn, NaN-filled
// rows between them, and a 17-segment merge at k = 4096.
TEST_P(SelectTopk, BuffersKeptBetweenCallsNeverLeak) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Tensor nan_rows = make_scores(2, 70000, DType::f32, Fill::with_specials, seed);
  expect_topk(make_scores(1, 1050000, DType::f32, Fill::distinct, seed + 1), 4096);
  expect_topk(nan_rows, 4096);
  expect_topk(make_scores(3, 300, DType::bf16, Fill::few_values, seed + 2), 7);
  expect_topk(make_scores(1, 262144, DType::f32, Fill::distinct, seed + 3), 2048);
  expect_topk(nan_rows, 1);
  expect_topk(make_scores(2, 140000, DType::bf16, Fill::distinct, seed + 4), 4096);
}

TEST_P(SelectTopk, Bf16AndTies) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (Fill fill : {Fill::distinct, Fill::few_values, Fill::all_equal, Fill::ascending})
    for (DType dtype : {DType::f32, DType::bf16})
      expect_topk(make_scores(4, 9000, dtype, fill, seed), 300);
}

TEST_P(SelectTopk, NanRanksFirstAndInfinitiesAreValues) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::f32, DType::bf16}) {
    expect_topk(make_scores(3, 20000, dtype, Fill::with_specials, seed), 2048);
    expect_topk(make_scores(3, 20000, dtype, Fill::with_specials, seed + 1), 100);
  }
  // A row of -inf selects k of them; a row of NaN selects k NaNs.
  Tensor x = Tensor::empty({2, 5000}, DType::f32);
  for (int64_t i = 0; i < 5000; ++i) {
    x.data<float>()[i] = -std::numeric_limits<float>::infinity();
    x.data<float>()[5000 + i] = std::numeric_limits<float>::quiet_NaN();
  }
  expect_topk(x, 64);
}

TEST_P(SelectTopk, StartsEndsShortRowsAndPadding) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t rows = 40, cols = 50000, k = 512;
  const Tensor x = make_scores(rows, cols, DType::f32, Fill::distinct, seed);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> s(rows), e(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = static_cast<int>(r % 4);
    s[r] = static_cast<int32_t>(rng() % cols);
    const int64_t room = cols - s[r];
    const int64_t len = kind == 0   ? 0
                        : kind == 1 ? std::min<int64_t>(room, rng() % (k + 1))
                                    : static_cast<int64_t>(rng() % (room + 1));
    e[r] = static_cast<int32_t>(s[r] + len);
  }
  expect_topk(x, k, int_rows(e), int_rows(s));
  expect_topk(x, k, int_rows(e), std::nullopt);
  expect_topk(x, k, int_rows(e), int_rows(s), /*sorted=*/true);
  // A short row lists its positions in order, then the fill.
  const TopkResult r =
      topk(x, 8, int_rows(std::vector<int32_t>(rows, 5)), std::nullopt, std::nullopt, INT32_MAX);
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(r.indices.data<int32_t>()[i], i < 5 ? i : INT32_MAX) << i;
}

TEST_P(SelectTopk, OffsetsAndTransforms) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t rows = 6, cols = 40000, k = 2048, page = 64;
  const Tensor x = make_scores(rows, cols, DType::bf16, Fill::distinct, seed);
  std::vector<int32_t> e(rows), off(rows);
  std::mt19937_64 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    e[r] = static_cast<int32_t>(r == 0 ? 1000 : rng() % (cols + 1));
    off[r] = static_cast<int32_t>(rng() % 100000);
  }
  const TopkResult plain = topk(x, k, int_rows(e));
  // Ragged: positions + offsets, exactly; the same through output_idx_offset.
  const Tensor ragged = topk_ragged_transform(x, k, int_rows(e), int_rows(off));
  const TopkResult with_offset = topk(x, k, int_rows(e), std::nullopt, int_rows(off));
  // Page table: a random permutation of blocks per row.
  const int64_t max_blocks = (cols + page - 1) / page;
  Tensor table = Tensor::empty({rows, max_blocks}, DType::i32);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> ids(static_cast<size_t>(max_blocks));
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(r * max_blocks));
    std::shuffle(ids.begin(), ids.end(), rng);
    std::copy(ids.begin(), ids.end(), table.data<int32_t>() + r * max_blocks);
  }
  const Tensor slots = topk_page_table_transform(x, k, int_rows(e), table, page);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const int32_t j = plain.indices.data<int32_t>()[r * k + i];
      const int64_t at = r * k + i;
      EXPECT_EQ(ragged.data<int32_t>()[at], j < 0 ? -1 : j + off[r]) << r << "," << i;
      EXPECT_EQ(with_offset.indices.data<int32_t>()[at], j < 0 ? -1 : j + off[r]) << r << "," << i;
      const int32_t want =
          j < 0 ? -1
                : table.data<int32_t>()[r * max_blocks + j / page] * static_cast<int32_t>(page) +
                      j % static_cast<int32_t>(page);
      ASSERT_EQ(slots.data<int32_t>()[at], want) << r << "," << i;
    }
  }
  // And the slots as sets against the reference transform.
  DSK_EXPECT_TOPK_SETS(plain.indices, ref::select::topk(x, k, int_rows(e)).indices, x,
                       {.pad = -1, .row_starts = std::nullopt, .row_ends = int_rows(e)});
  const Tensor ref_slots = ref::select::topk_page_table_transform(x, k, int_rows(e), table, page);
  int64_t selected = 0, ref_selected = 0;
  for (int64_t i = 0; i < rows * k; ++i) {
    selected += slots.data<int32_t>()[i] >= 0;
    ref_selected += ref_slots.data<int32_t>()[i] >= 0;
  }
  EXPECT_EQ(selected, ref_selected);
}

TEST_P(SelectTopk, RepeatableAndIndependentOfThreads) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Tensor x = make_scores(3, 140000, DType::bf16, Fill::few_values, seed);  // many ties
  const int threads = get_num_threads();
  const TopkResult first = topk(x, 2048, std::nullopt, std::nullopt, std::nullopt, -1, false, true);
  for (int run = 0; run < 20; ++run) {
    set_num_threads(run % 2 == 0 ? 1 : std::max(2, threads));
    const TopkResult again =
        topk(x, 2048, std::nullopt, std::nullopt, std::nullopt, -1, false, true);
    ASSERT_EQ(
        std::memcmp(first.indices.data_ptr(), again.indices.data_ptr(), first.indices.nbytes()), 0)
        << "run " << run;
  }
  set_num_threads(threads);
}

// The sample (the values the kernel reads first) holds the largest values of the row, so the
// threshold it gives admits fewer than k values: the kernel must notice and scan the row again.
TEST_P(SelectTopk, SampleHoldingTheLargestValuesFallsBackToAFullScan) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t cols = 65536, k = 2048;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE("kind " + std::to_string(kind) + " " + std::string(dtype_name(dtype)));
      std::vector<float> v(static_cast<size_t>(cols));
      for (float& e : v) e = normal(rng);
      // 0: distinct large sampled values; 1: all equal to one large value; 2: like 1, plus enough
      // values elsewhere equal to it that the threshold admits more than k, all of them ties.
      float spike = 1000.0f;
      for_each_sampled(0, cols, [&](int64_t j) {
        v[static_cast<size_t>(j)] = kind == 0 ? (spike += 1.0f) : 1000.0f;
      });
      if (kind == 2)
        for (int i = 0; i < 1500; ++i) v[rng() % cols] = 1000.0f;
      const Tensor x = from_values(v, 1, cols, dtype);
      EXPECT_EQ(sample_falls_short(x, k), kind != 2);
      expect_topk(x, k);
      expect_topk(x, 100);
    }
  }
}

// Sorted rows, and rows whose top k sits in one block (where the sample looks, or where it does
// not), in single segments and in rows cut into segments.
TEST_P(SelectTopk, SortedAndClusteredRows) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t cols : {int64_t{65536}, int64_t{150000}}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<float> v(static_cast<size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) {
        const float rising = static_cast<float>(j) * 0.5f;
        v[static_cast<size_t>(j)] = kind == 0 ? rising : kind == 1 ? -rising : normal(rng);
      }
      // 2: the top 3000 in one block from a random start; 3: in the block at the row's start.
      const int64_t start = kind == 2 ? static_cast<int64_t>(rng() % (cols - 3000)) : 0;
      if (kind >= 2)
        for (int64_t j = start; j < start + 3000; ++j)
          v[static_cast<size_t>(j)] = 10.0f + normal(rng);
      SCOPED_TRACE("cols " + std::to_string(cols) + " kind " + std::to_string(kind));
      for (DType dtype : {DType::f32, DType::bf16}) {
        const Tensor x = from_values(v, 1, cols, dtype);
        for (int64_t k : {64, 2048, 4096}) expect_topk(x, k);
      }
    }
  }
}

// Many values equal to the sampled threshold: the scan admits values equal to it (it is a value
// of the row), so none of them may be lost when they decide the k-th place.
TEST_P(SelectTopk, ManyValuesEqualToTheSampledThreshold) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t cols = 65536;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t equal : {int64_t{1000}, int64_t{2100}, int64_t{10000}}) {
    std::vector<float> v(static_cast<size_t>(cols));
    for (float& e : v) e = std::min(normal(rng), 2.5f);
    for (int64_t i = 0; i < equal; ++i) v[rng() % cols] = 3.0f;
    for (int64_t i = 0; i < 100; ++i) v[rng() % cols] = 4.0f + normal(rng) * 0.1f;
    SCOPED_TRACE("equal " + std::to_string(equal));
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Tensor x = from_values(v, 1, cols, dtype);
      for (int64_t k : {1, 512, 2048, 4096}) expect_topk(x, k);
    }
  }
  // Few distinct values (the sample's value at the threshold's rank is shared by thousands).
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t k : {1, 64, 2048, 4096})
      expect_topk(make_scores(2, cols, dtype, Fill::few_values, seed + k), k);
  expect_topk(make_scores(2, cols, DType::f32, Fill::all_equal, seed), 2048);
}

// NaN, +-inf and signed zeros where the kernel samples: a sample of NaN or +inf gives a threshold
// that admits too few values; a row of almost only -inf gives none; zeros of both signs tie.
TEST_P(SelectTopk, SpecialValuesInTheSample) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t cols = 65536;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int kind = 0; kind < 4; ++kind) {
    std::vector<float> v(static_cast<size_t>(cols));
    for (float& e : v) e = normal(rng);
    if (kind == 0) for_each_sampled(0, cols, [&](int64_t j) { v[static_cast<size_t>(j)] = nan; });
    if (kind == 1) for_each_sampled(0, cols, [&](int64_t j) { v[static_cast<size_t>(j)] = inf; });
    if (kind == 2) {  // 1000 numbers among -inf
      for (float& e : v) e = -inf;
      for (int i = 0; i < 1000; ++i) v[rng() % cols] = normal(rng);
    }
    if (kind == 3)  // zeros of both signs above negative numbers
      for (float& e : v) e = rng() % 2 ? -std::abs(e) - 1.0f : (rng() % 2 ? 0.0f : -0.0f);
    SCOPED_TRACE("kind " + std::to_string(kind));
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Tensor x = from_values(v, 1, cols, dtype);
      if (kind <= 1) {
        EXPECT_TRUE(sample_falls_short(x, 2048));
      }
      for (int64_t k : {1, 512, 2048}) expect_topk(x, k);
    }
  }
}

// Rows around the shortest length the kernel samples, and long rows whose segments sample their
// own part.
TEST_P(SelectTopk, LengthsAroundTheSamplingLimit) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t shortest = 16 * kernels::kSampleSize;
  for (int64_t cols : {shortest - 1, shortest, shortest + 1, 2 * shortest + 3}) {
    for (Fill fill : {Fill::distinct, Fill::few_values, Fill::ascending}) {
      const Tensor x = make_scores(2, cols, DType::f32, fill, seed + cols);
      for (int64_t k : {1, 1024, 2048, 4096}) {
        SCOPED_TRACE("cols " + std::to_string(cols) + " k " + std::to_string(k));
        expect_topk(x, k);
      }
    }
  }
  // Rows of 3 segments, with ranges that start and end inside them.
  const int64_t cols = 200000, rows = 3;
  const Tensor x = make_scores(rows, cols, DType::bf16, Fill::distinct, seed);
  expect_topk(x, 2048, int_rows({200000, 190001, 70000}), int_rows({0, 3, 1}));
}

// The generic and AVX-512 scans append candidates in the same order, so the backends agree bit for
// bit, ties included.
TEST(SelectTopkBackends, AgreeBitForBit) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<float> spiked(65536, 1.0f);  // a sample of equal large values: the fallback path
  for (size_t j = 0; j < spiked.size(); ++j) spiked[j] = static_cast<float>(j % 1000) * 0.01f;
  for_each_sampled(0, 65536, [&](int64_t j) { spiked[static_cast<size_t>(j)] = 50.0f; });
  const Tensor inputs[] = {make_scores(5, 70001, DType::f32, Fill::with_specials, seed),
                           make_scores(3, 65536, DType::f32, Fill::with_specials, seed + 1),
                           make_scores(3, 65536, DType::bf16, Fill::distinct, seed + 2),
                           make_scores(3, 65536, DType::bf16, Fill::with_specials, seed + 5),
                           make_scores(3, 65536, DType::f32, Fill::few_values, seed + 3),
                           make_scores(2, 140000, DType::bf16, Fill::few_values, seed + 4),
                           from_values(spiked, 1, 65536, DType::f32)};
  for (const Tensor& x : inputs) {
    for (int64_t k : {int64_t{777}, int64_t{2048}}) {
      TopkResult results[2];
      int i = 0;
      for (Backend b : {Backend::generic, Backend::avx512}) {
        dsk::test::ScopedBackend scoped(b);
        results[i++] = topk(x, k, std::nullopt, std::nullopt, std::nullopt, -1, false, true);
      }
      EXPECT_EQ(std::memcmp(results[0].indices.data_ptr(), results[1].indices.data_ptr(),
                            results[0].indices.nbytes()),
                0)
          << x.size(0) << "x" << x.size(1) << " " << dtype_name(x.dtype()) << " k " << k;
    }
  }
}

TEST(SelectTopkErrors, BadInputsRaise) {
  const Tensor x = make_scores(2, 100, DType::f32, Fill::distinct, 1);
  auto raises = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << "no dsk::Error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("select::"), std::string::npos) << e.what();
    }
  };
  raises([&] { topk(x, 0); }, "k = 0");
  raises([&] { topk(x, 4097); }, "k = 4097");
  raises([&] { topk(x.view({200}), 4); }, "1-D x");
  raises([&] { topk(Tensor::empty({2, 100}, DType::i32), 4); }, "int x");
  raises([&] { topk(x.transpose(0, 1), 4); }, "strided last dimension");
  raises([&] { topk(x, 4, int_rows({5, 101})); }, "end past N");
  raises([&] { topk(x, 4, int_rows({5, 6}), int_rows({6, 0})); }, "start after end");
  raises([&] { topk(x, 4, int_rows({5})); }, "ends of the wrong length");
  raises([&] { topk(x, 4, Tensor::empty({2}, DType::i64)); }, "int64 ends");
  raises([&] { topk(x, 4, std::nullopt, std::nullopt, int_rows({0, -3})); }, "negative offset");
  raises(
      [&] {
        topk(x, 4, std::nullopt, std::nullopt, int_rows({0, INT32_MAX - 50}));
      },
      "offset overflowing int32");
  Tensor table = Tensor::empty({2, 1}, DType::i32);
  table.data<int32_t>()[0] = 0;
  table.data<int32_t>()[1] = 1;
  raises([&] { topk_page_table_transform(x, 4, std::nullopt, table, 64); }, "too few blocks");
  raises([&] { topk_page_table_transform(x, 4, int_rows({64, 64}), table, 0); }, "page size 0");
  table.data<int32_t>()[1] = -1;
  raises(
      [&] {
        topk_page_table_transform(x, 4, int_rows({64, 64}), table, 64);
      },
      "negative block id");
  raises([&] { topk_ragged_transform(x, 4, std::nullopt, Tensor{}); }, "missing offsets");
}

TEST(SelectTopkEdges, EmptyBatch) {
  const TopkResult r = topk(Tensor::empty({0, 10}, DType::f32), 4);
  EXPECT_EQ(r.indices.size(0), 0);
  EXPECT_EQ(r.indices.size(1), 4);
}

DSK_INSTANTIATE_PER_BACKEND(SelectTopk);

}  // namespace
}  // namespace dsk::select
