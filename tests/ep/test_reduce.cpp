// The combines' row reductions (dsk/kernels/ep/reduce.hpp) against a scalar f32 sum in the same
// order, on every instance: random rows of widths that leave every kind of tail, signed zeros
// (a sum from 0 turns -0 into +0, a sum from the first row keeps it), infinities and NaN, and for
// the weighted sum random weights with zeros and negative ones, and no rows at all. This file
// is built for the baseline ISA, so the generic test runs on every CPU; the AVX-512 instance comes
// from test_reduce_avx512.cpp and is skipped on CPUs without the avx512 backend.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <dsk/core.hpp>
#include <dsk/kernels/ep/reduce.hpp>

#include "common/test_util.hpp"

namespace dsk::ep::kernels {
RowSums avx512_row_sums_for_test();  // test_reduce_avx512.cpp
RowSums avx2_row_sums_for_test();    // test_reduce_avx2.cpp: the generic code built for AVX2

namespace {

std::vector<bf16> expected_sum(const std::vector<std::vector<bf16>>& rows, bool from_zero,
                               int64_t cols) {
  std::vector<bf16> out(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    float acc = bf16_to_f32(rows[0][c]);
    if (from_zero) acc = 0.0f + acc;
    for (size_t i = 1; i < rows.size(); ++i) acc = acc + bf16_to_f32(rows[i][c]);
    out[c] = f32_to_bf16(acc);
  }
  return out;
}

// Rows with every kind of value: mostly normal(0, 3), one in 16 a special value.
std::vector<std::vector<bf16>> random_rows(std::mt19937_64& rng, int n, int64_t cols) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, NAN, 1e-40f, 3e38f};
  std::vector<std::vector<bf16>> rows(static_cast<size_t>(n));
  for (auto& row : rows) {
    row.resize(static_cast<size_t>(cols));
    for (bf16& v : row) {
      const bool special = rng() % 16 == 0;
      v = f32_to_bf16(special ? specials[rng() % 7] : normal(rng));
    }
  }
  if (cols > 3) {  // columns of only negative zeros
    for (auto& row : rows) row[3] = f32_to_bf16(-0.0f);
  }
  return rows;
}

std::vector<bf16> expected_weighted_sum(const std::vector<std::vector<bf16>>& rows,
                                        const std::vector<float>& weights, int64_t cols) {
  std::vector<bf16> out(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    float acc = 0.0f;
    for (size_t i = 0; i < rows.size(); ++i) {
      const float product = weights[i] * bf16_to_f32(rows[i][c]);
      acc = acc + product;
    }
    out[c] = f32_to_bf16(acc);
  }
  return out;
}

// Runs fn (which writes cols values to its argument) into a NaN-poisoned row with a guard after
// it, and compares with want bitwise (any NaN matches any NaN).
template <class Fn>
void expect_row(Fn fn, const std::vector<bf16>& want, const std::string& what) {
  const size_t cols = want.size();
  std::vector<bf16> out(cols + 1, f32_to_bf16(NAN));
  out.back() = f32_to_bf16(1.25f);  // a guard: nothing is written past the row
  fn(out.data());
  for (size_t c = 0; c < cols; ++c) {
    const bool both_nan = std::isnan(bf16_to_f32(out[c])) && std::isnan(bf16_to_f32(want[c]));
    ASSERT_TRUE(both_nan || out[c].bits == want[c].bits)
        << what << " column " << c << ": " << bf16_to_f32(out[c]) << " vs " << bf16_to_f32(want[c]);
  }
  ASSERT_EQ(out.back().bits, f32_to_bf16(1.25f).bits) << what << " wrote past the row";
}

void check_instance(const RowSums& fns, const char* name) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> weight(-1.5f, 1.5f);
  for (int64_t cols : {1, 15, 16, 17, 63, 64, 65, 200, 7168}) {
    for (int n : {0, 1, 2, 3, 9}) {
      const std::vector<std::vector<bf16>> rows = random_rows(rng, n, cols);
      std::vector<const bf16*> ptrs;
      for (const auto& row : rows) ptrs.push_back(row.data());
      const std::string what =
          std::string(name) + " cols " + std::to_string(cols) + " rows " + std::to_string(n);
      for (bool from_zero : {false, true}) {
        if (n == 0) continue;  // the plain sum starts from a row
        expect_row([&](bf16* out) { fns.sum(ptrs.data(), n, from_zero, cols, out); },
                   expected_sum(rows, from_zero, cols),
                   what + " from_zero " + std::to_string(from_zero));
      }
      std::vector<float> weights(static_cast<size_t>(n));
      for (float& w : weights) w = rng() % 8 == 0 ? 0.0f : weight(rng);
      expect_row([&](bf16* out) { fns.weighted(ptrs.data(), weights.data(), n, cols, out); },
                 expected_weighted_sum(rows, weights, cols), what + " weighted");
    }
  }
}

TEST(EpReduce, GenericSumsInOrderWithOneRounding) {
  check_instance(row_sums<tile::generic_t>(), "generic");
}

// The generic backend runs this build on AVX2 CPUs (src/ep/reduce_avx2.cpp).
TEST(EpReduce, GenericBuiltForAvx2SumsInOrderWithOneRounding) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c))
    GTEST_SKIP() << "no AVX2 on this CPU";
  check_instance(avx2_row_sums_for_test(), "generic built for AVX2");
}

TEST(EpReduce, Avx512SumsInOrderWithOneRounding) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  check_instance(avx512_row_sums_for_test(), "avx512");
}

}  // namespace
}  // namespace dsk::ep::kernels
