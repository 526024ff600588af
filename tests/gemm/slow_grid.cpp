// The upstream normal grid at full size (label "slow"): every (N, K) pair of tests/generators.py
// with M in {1, 16, 128, 513} ({1, 16, 129} on the generic backend), for BF16 and for FP8
// (per-token A, per-block B, FP32 scales), B pre-packed once per pair and raw. The full products
// are computed by the kernels; a sample of rows (the first, the last and random ones) is checked
// against dsk::ref, and every element of D against the NaN poison. (The fast suite runs the same
// grid with N and K divided by 16.)
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

class SlowGrid : public NoJit {};  // built-in kernels: the JIT would compile one per pair

struct NK {
  int64_t n, k;
};
// tests/generators.py enumerate_normal: DeepSeek-V3's layers, plus the BF16-only (256, 7168).
// (129280, 7168), the BF16 vocabulary projection, is left to the fast suite's scaled copy: its
// B alone is 1.8 GB.
constexpr NK kFp8Pairs[] = {{2112, 7168},  {576, 7168},  {24576, 1536}, {32768, 512},
                            {7168, 16384}, {4096, 7168}, {7168, 2048}};
constexpr int64_t kMaxM = 513;

// The generic backend's portable kernels ran this grid at about 0.5 GFLOPS per core (22 CPU
// minutes on an AMD Zen 3, most of the suite's time): there M stops at 129, which still crosses a
// block of 128 rows, at a quarter of the work. Every (N, K) pair is still run.
std::vector<int64_t> grid_m() {
  if (backend() == Backend::generic) return {1, 16, 129};
  return {1, 16, 128, kMaxM};
}

// The rows checked for an M: the first, the last, and up to six random ones.
std::vector<int64_t> sample_rows(int64_t m) {
  std::set<int64_t> rows = {0, m - 1};
  std::mt19937_64 rng(fresh_seed());
  while (static_cast<int64_t>(rows.size()) < std::min<int64_t>(m, 8))
    rows.insert(static_cast<int64_t>(rng() % static_cast<uint64_t>(m)));
  return {rows.begin(), rows.end()};
}

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), x.size(1)}, x.dtype());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<int64_t>(i);
    out.slice(0, r, r + 1).copy_(x.slice(0, rows[i], rows[i] + 1));
  }
  return out;
}

// The sampled rows of d against the references of the same rows, and no poison anywhere.
void expect_rows_close(const Tensor& d, const std::vector<int64_t>& rows, const Tensor& bf16_ref,
                       double tolerance, const Tensor& dequant_ref, const std::string& what) {
  EXPECT_EQ(ref::count_poisoned(d), 0) << what << ": elements never written";
  const Tensor got = gather_rows(d, rows);
  EXPECT_LT(ref::calc_diff(got, bf16_ref), tolerance) << what << ": vs the BF16 reference";
  EXPECT_LT(ref::calc_diff(got, dequant_ref), dequantized_tolerance(DType::bf16))
      << what << ": vs the dequantized reference";
}

TEST_F(SlowGrid, Bf16EveryUpstreamPair) {
  SCOPED_TRACE(seed_note());
  std::vector<NK> pairs(std::begin(kFp8Pairs), std::end(kFp8Pairs));
  pairs.push_back({256, 7168});
  for (const NK& nk : pairs) {
    const Tensor a = randn_bf16({kMaxM, nk.k}), b = randn_bf16({nk.n, nk.k});
    const gemm::PackedWeight packed = gemm::pack_weight(b);
    for (int64_t m : grid_m()) {
      const std::string what = fmt::format("bf16 m={} n={} k={}", m, nk.n, nk.k);
      const std::vector<int64_t> rows = sample_rows(m);
      const Tensor want = ref::gemm_nt(gather_rows(a, rows), b);
      Tensor d = poisoned({m, nk.n}, DType::bf16);
      gemm::bf16_gemm_nt(a.slice(0, 0, m), packed, d);
      expect_rows_close(d, rows, want, 1e-5, want, what);
      if (m == 16) {  // a raw B as well: packed on the fly, the same bits
        Tensor raw = poisoned({m, nk.n}, DType::bf16);
        gemm::bf16_gemm_nt(a.slice(0, 0, m), b, raw);
        EXPECT_TRUE(bitwise_equal(raw, d)) << what << ": raw and packed B differ";
      }
    }
  }
}

TEST_F(SlowGrid, Fp8EveryUpstreamPair) {
  SCOPED_TRACE(seed_note());
  for (const NK& nk : kFp8Pairs) {
    const Tensor a = randn_bf16({kMaxM, nk.k}), b = randn_bf16({nk.n, nk.k});
    const QuantOperand qa = quantize(a, Quant::token_f32), qb = quantize(b, Quant::block_f32);
    const gemm::PackedWeight packed = gemm::pack_weight(qb.x, qb.recipe);
    for (int64_t m : grid_m()) {
      const std::string what = fmt::format("fp8 1d2d m={} n={} k={}", m, nk.n, nk.k);
      const std::vector<int64_t> rows = sample_rows(m);
      const Fp8Tensor a_m{qa.x.data.slice(0, 0, m), qa.x.sf.slice(0, 0, m)};
      Tensor d = poisoned({m, nk.n}, DType::bf16);
      gemm::fp8_fp4_gemm_nt(a_m, packed, d);
      expect_rows_close(d, rows, ref::gemm_nt(gather_rows(a, rows), b), 1e-3,
                        ref::gemm_nt(gather_rows(qa.values, rows), qb.values), what);
      if (m == 16) {
        Tensor raw = poisoned({m, nk.n}, DType::bf16);
        gemm::fp8_fp4_gemm_nt(a_m, qb.x, raw);
        EXPECT_TRUE(bitwise_equal(raw, d)) << what << ": raw and packed B differ";
      }
    }
  }
}

}  // namespace
}  // namespace dsk::gemm_test
