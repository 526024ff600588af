// The AVX-512 elementary functions of dsk/kernels/tk/math.hpp against the generic ones, bit for
// bit: exp (FMA Horner and VSCALEFPS against std::fma and ldexp), its e^-x form, sigmoid, silu and
// softplus, over the whole exponent range (overflow, the subnormal results, underflow) and IEEE
// special values. A NaN result matches any NaN: which operand's payload an IEEE operation passes
// on is not part of the rule. Built with the AVX-512 flags; skipped on CPUs without the avx512
// backend.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <dsk/kernels/tk/math.hpp>

#include "tk/tk_test.hpp"

namespace dsk::tk::kernels {
namespace {

using Avx = Simd<tile::avx512_t>;
using Generic = Simd<tile::generic_t>;

// Inputs: an even sweep of [-110, 100] (exp overflows above 88.72 and is subnormal below -87.3),
// random bit patterns of that range, and the special values.
std::vector<float> inputs() {
  std::vector<float> x;
  for (int i = 0; i < (1 << 16); ++i)
    x.push_back(-110.0f + 210.0f * static_cast<float>(i) / (1 << 16));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-110.0f, 100.0f);
  for (int i = 0; i < (1 << 14); ++i) x.push_back(u(rng));
  constexpr float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, NAN, -NAN, 1e-45f, -1e-45f, 88.72283f, 88.72284f,
                  -87.33654f, -103.97f, -104.0f, 104.0f, -88.75f, 88.75f})
    x.push_back(v);
  while (x.size() % 16 != 0) x.push_back(1.0f);
  return x;
}

template <class Fn>
void expect_same_bits(const char* name, Fn fn) {
  const std::vector<float> x = inputs();
  int64_t mismatches = 0;
  for (size_t i = 0; i < x.size(); i += 16) {
    alignas(64) float a[16], g[16];
    Avx::store(a, fn(Avx{}, Avx::load(x.data() + i)));
    Generic::store(g, fn(Generic{}, Generic::load(x.data() + i)));
    for (int j = 0; j < 16; ++j)
      if (!(std::isnan(a[j]) && std::isnan(g[j])) &&
          numeric::bits_of(a[j]) != numeric::bits_of(g[j]) && ++mismatches <= 5)
        ADD_FAILURE() << name << "(" << x[i + j] << "): avx512 " << a[j] << ", generic " << g[j];
  }
  EXPECT_EQ(mismatches, 0) << name;
}

TEST(TkMathAvx512, EveryFunctionGivesTheGenericBits) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  expect_same_bits("exp", []<class S>(S, typename S::F v) { return exp<S>(v); });
  expect_same_bits("exp(-x)", []<class S>(S, typename S::F v) { return exp<S, true, -1>(v); });
  expect_same_bits("sigmoid", []<class S>(S, typename S::F v) { return sigmoid<S>(v); });
  expect_same_bits("silu", []<class S>(S, typename S::F v) { return silu<S>(v); });
  expect_same_bits("softplus", []<class S>(S, typename S::F v) { return softplus<S>(v); });
}

// The e^-x form negates n, r and the odd coefficients instead of x: the same bits as exp(-x).
TEST(TkMathAvx512, NegatedExpIsExpOfTheNegation) {
  const std::vector<float> x = inputs();
  for (size_t i = 0; i < x.size(); i += 16) {
    alignas(64) float neg[16], direct[16];
    const auto v = Generic::load(x.data() + i);
    Generic::store(neg, exp<Generic, true, -1>(v));
    Generic::store(direct, exp<Generic>(Generic::sub(Generic::zero(), v)));
    for (int j = 0; j < 16; ++j) {
      if (std::isnan(x[i + j])) {
        EXPECT_TRUE(std::isnan(neg[j]) && std::isnan(direct[j]));
        continue;
      }
      ASSERT_EQ(numeric::bits_of(neg[j]), numeric::bits_of(direct[j])) << "x = " << x[i + j];
    }
  }
}

}  // namespace
}  // namespace dsk::tk::kernels
