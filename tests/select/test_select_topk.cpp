// dsk::select::topk and its transforms against dsk::ref::select, compared as sets (ties may go
// either way), on every backend: row lengths around k and up to 262144, f32 and bf16, ties, -inf
// and NaN, [start, end) ranges, offsets, page tables, repeatability, bad inputs.
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

// The generic and AVX-512 scans append candidates in the same order, so the backends agree bit for
// bit, ties included.
TEST(SelectTopkBackends, AgreeBitForBit) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Tensor x = make_scores(5, 70001, DType::f32, Fill::with_specials, seed);
  TopkResult results[2];
  int i = 0;
  for (Backend b : {Backend::generic, Backend::avx512}) {
    dsk::test::ScopedBackend scoped(b);
    results[i++] = topk(x, 777, std::nullopt, std::nullopt, std::nullopt, -1, false, true);
  }
  EXPECT_EQ(std::memcmp(results[0].indices.data_ptr(), results[1].indices.data_ptr(),
                        results[0].indices.nbytes()),
            0);
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
