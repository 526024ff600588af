// The combine's row reduction (dsk/kernels/ep/reduce.hpp) against a scalar f32 sum in the same
// order, on both instances: random rows of widths that leave every kind of tail, signed zeros
// (a sum from 0 turns -0 into +0, a sum from the first row keeps it), infinities and NaN. This file
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
namespace {

using RowsFn = void (*)(const bf16* const*, int, bool, int64_t, bf16*);
}  // namespace

RowsFn avx512_sum_rows_for_test();  // test_reduce_avx512.cpp
RowsFn avx2_sum_rows_for_test();    // test_reduce_avx2.cpp: the generic code built for AVX2

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

void check_instance(RowsFn fn, const char* name) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, NAN, 1e-40f, 3e38f};
  for (int64_t cols : {1, 15, 16, 17, 63, 64, 65, 200, 7168}) {
    for (int n : {1, 2, 3, 9}) {
      for (bool from_zero : {false, true}) {
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
        std::vector<const bf16*> ptrs;
        for (const auto& row : rows) ptrs.push_back(row.data());
        std::vector<bf16> out(static_cast<size_t>(cols) + 1, f32_to_bf16(NAN));
        out.back() = f32_to_bf16(1.25f);  // a guard: nothing is written past the row
        fn(ptrs.data(), n, from_zero, cols, out.data());
        const std::vector<bf16> want = expected_sum(rows, from_zero, cols);
        for (int64_t c = 0; c < cols; ++c) {
          const bool both_nan = std::isnan(bf16_to_f32(out[c])) && std::isnan(bf16_to_f32(want[c]));
          ASSERT_TRUE(both_nan || out[c].bits == want[c].bits)
              << name << " cols " << cols << " rows " << n << " from_zero " << from_zero
              << " column " << c << ": " << bf16_to_f32(out[c]) << " vs " << bf16_to_f32(want[c]);
        }
        ASSERT_EQ(out.back().bits, f32_to_bf16(1.25f).bits) << name << " wrote past the row";
      }
    }
  }
}

TEST(EpReduce, GenericSumsInOrderWithOneRounding) {
  check_instance(&sum_bf16_rows<tile::generic_t>, "generic");
}

// The generic backend runs this build on AVX2 CPUs (src/ep/reduce_avx2.cpp).
TEST(EpReduce, GenericBuiltForAvx2SumsInOrderWithOneRounding) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c))
    GTEST_SKIP() << "no AVX2 on this CPU";
  check_instance(avx2_sum_rows_for_test(), "generic built for AVX2");
}

TEST(EpReduce, Avx512SumsInOrderWithOneRounding) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  check_instance(avx512_sum_rows_for_test(), "avx512");
}

}  // namespace
}  // namespace dsk::ep::kernels
