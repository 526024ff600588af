// A small GEMM written once against the tile layer (tile_test_body.hpp: zero-padded A, B packed
// from the [N, K] weight layout, 2 x 2 register blocking) on every backend this CPU runs: bitwise
// equal across backends, within 1e-5 of an fp64 reference for bf16, exact for int8.
#include <cmath>
#include <cstring>

#include "common/test_util.hpp"
#include "tile/tile_test.hpp"

namespace dsk::tile_test {
namespace {

constexpr int kM = 48, kN = 40, kBf16K = 100, kInt8K = 136;

class TileGemm : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { DSK_SKIP_UNLESS_BACKEND(GetParam()); }
  const Runners& backend() const { return runners_for(GetParam()); }
};

// Values in [-1, 1] rounded to bf16 (never zero): no denormals, so fp64 is the exact answer.
std::vector<bf16> random_bf16_operand(size_t n, uint32_t seed) {
  const std::vector<float> v = random_floats(n, seed, false);
  std::vector<bf16> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = numeric::f32_to_bf16(v[i]);
    if (numeric::bf16_to_f32(out[i]) == 0.0f) out[i] = numeric::f32_to_bf16(0.5f);
  }
  return out;
}

TEST_P(TileGemm, Bf16MatchesGenericBitwiseAndFp64Within1e5) {
  const std::vector<bf16> a = random_bf16_operand(kM * kBf16K, 1);
  const std::vector<bf16> b = random_bf16_operand(kN * kBf16K, 2);  // [N, K]
  std::vector<float> c(kM * kN, std::nanf("")), c_generic(kM * kN, std::nanf(""));
  backend().gemm_bf16_nt(kM, kN, kBf16K, a.data(), b.data(), c.data());
  generic_runners().gemm_bf16_nt(kM, kN, kBf16K, a.data(), b.data(), c_generic.data());

  double max_relative = 0.0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      double exact = 0.0, magnitude = 0.0;
      for (int k = 0; k < kBf16K; ++k) {
        const double term = double{numeric::bf16_to_f32(a[m * kBf16K + k])} *
                            numeric::bf16_to_f32(b[n * kBf16K + k]);
        exact += term;
        magnitude += std::fabs(term);
      }
      const float got = c[m * kN + n];
      ASSERT_EQ(numeric::bits_of(got), numeric::bits_of(c_generic[m * kN + n]))
          << "m=" << m << " n=" << n;
      // Relative to the sum of |terms|, which bounds the rounding error of any summation order.
      max_relative = std::max(max_relative, std::fabs(got - exact) / magnitude);
    }
  }
  EXPECT_LT(max_relative, 1e-5);
}

TEST_P(TileGemm, Int8IsExactForEverySignPair) {
  for (Int8Kind kind : kInt8Kinds) {
    SCOPED_TRACE(int8_kind_name(kind));
    const std::vector<uint8_t> a = random_bytes(kM * kInt8K, 10 + static_cast<uint32_t>(kind));
    const std::vector<uint8_t> b = random_bytes(kN * kInt8K, 20 + static_cast<uint32_t>(kind));
    const bool a_signed = kind == Int8Kind::s8s8 || kind == Int8Kind::s8u8;
    const bool b_signed = kind == Int8Kind::s8s8 || kind == Int8Kind::u8s8;
    const auto value = [](uint8_t x, bool is_signed) -> int64_t {
      return is_signed ? static_cast<int8_t>(x) : x;
    };
    std::vector<int32_t> c(kM * kN, INT32_MIN);
    backend().gemm_int8_nt(kind, kM, kN, kInt8K, a.data(), b.data(), c.data());
    for (int m = 0; m < kM; ++m) {
      for (int n = 0; n < kN; ++n) {
        int64_t want = 0;
        for (int k = 0; k < kInt8K; ++k)
          want += value(a[m * kInt8K + k], a_signed) * value(b[n * kInt8K + k], b_signed);
        ASSERT_EQ(c[m * kN + n], want) << "m=" << m << " n=" << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TileGemm,
                         ::testing::Values(Backend::generic, Backend::avx512, Backend::amx),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace dsk::tile_test
