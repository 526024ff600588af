// The elementary functions of the tk kernels (dsk/kernels/tk/math.hpp) against fp64: error in
// units in the last place over the f32 range, and IEEE special values. The generic Simd is
// checked here; the AVX-512 one gives the same bits (the per-op backend tests compare them).
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <dsk/kernels/tk/math.hpp>

#include "common/isa_test.hpp"
#include "tk/tk_test.hpp"

namespace dsk::tk::kernels {

// Inputs: an even sweep of [-110, 100] (exp overflows above 88.72 and is subnormal below -87.3),
// random bit patterns of that range, and the special values.
std::vector<float> math_inputs() {
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

namespace {

using S = Simd<tile::generic_t>;

// Distance in representable f32 values between a result and the correctly rounded fp64 value.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  if (got == w) return 0;
  if (std::isinf(w)) return std::isinf(got) && (got > 0) == (w > 0) ? 0 : 1e9;
  const float step = std::fabs(std::nextafter(w, std::numeric_limits<float>::infinity()) - w);
  return std::fabs(static_cast<double>(got) - want) / step;
}

// Each function under test is instantiated once, out of line: the portable Simd is heavy for
// the compiler under the sanitizers, and inlining every function into every check multiplied the
// compile time of this file (minutes under ASan + UBSan).
using VectorFn = S::F (*)(S::F);
using RefFn = double (*)(double);

__attribute__((noinline)) S::F exp_of(S::F x) {
  return exp<S>(x);
}
__attribute__((noinline)) S::F log_of(S::F x) {
  return log<S>(x);
}
__attribute__((noinline)) S::F sigmoid_of(S::F x) {
  return sigmoid<S>(x);
}
__attribute__((noinline)) S::F silu_of(S::F x) {
  return silu<S>(x);
}
__attribute__((noinline)) S::F softplus_of(S::F x) {
  return softplus<S>(x);
}

double max_ulps(VectorFn fn, RefFn ref, float lo, float hi, int count) {
  double worst = 0;
  for (int i = 0; i < count; i += 16) {
    alignas(64) float in[16], out[16];
    for (int j = 0; j < 16; ++j) in[j] = lo + (hi - lo) * static_cast<float>(i + j) / count;
    S::store(out, fn(S::load(in)));
    for (int j = 0; j < 16; ++j) worst = std::max(worst, ulps(out[j], ref(in[j])));
  }
  return worst;
}

double exp_ref(double x) {
  return std::exp(x);
}
double log_ref(double x) {
  return std::log(x);
}

TEST(TkMath, ExpIsWithinTwoUlps) {
  EXPECT_LE(max_ulps(exp_of, exp_ref, -87.0f, 88.7f, 1 << 18), 2.0);
  EXPECT_LE(max_ulps(exp_of, exp_ref, -1.0f, 1.0f, 1 << 16), 2.0);
}

// exp's table: 2^(j / 32) rounded to the nearest float, from the long double power.
TEST(TkMath, ExpTableHoldsTheRoundedPowersOfTwo) {
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(kExp2Fractions[j], static_cast<float>(std::exp2(static_cast<long double>(j) / 32)))
        << "j = " << j;
}

TEST(TkMath, LogIsWithinTwoUlps) {
  EXPECT_LE(max_ulps(log_of, log_ref, 1e-30f, 10.0f, 1 << 18), 2.0);
  EXPECT_LE(max_ulps(log_of, log_ref, 0.5f, 2.0f, 1 << 16), 2.0);
  EXPECT_LE(max_ulps(log_of, log_ref, 1e30f, 3e38f, 1 << 14), 2.0);
}

TEST(TkMath, ActivationsAreAccurate) {
  const RefFn sigmoid_ref = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  EXPECT_LE(max_ulps(sigmoid_of, sigmoid_ref, -80.0f, 80.0f, 1 << 17), 3.0);
  const RefFn silu_ref = [](double x) { return x / (1.0 + std::exp(-x)); };
  EXPECT_LE(max_ulps(silu_of, silu_ref, -80.0f, 80.0f, 1 << 17), 3.0);
  const RefFn softplus_ref = [](double x) { return x > 20 ? x : std::log1p(std::exp(x)); };
  EXPECT_LE(max_ulps(softplus_of, softplus_ref, -80.0f, 40.0f, 1 << 17), 4.0);
}

TEST(TkMath, SpecialValues) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  alignas(64) float in[16] = {0.0f,   -0.0f,   inf,  -inf,  NAN,    100.0f, -200.0f, 88.8f,
                              1e-45f, -1e-45f, 1.0f, -1.0f, 1e-38f, 0.5f,   2.0f,    3.0f};
  alignas(64) float e[16], l[16], s[16];
  S::store(e, exp_of(S::load(in)));
  S::store(l, log_of(S::load(in)));
  S::store(s, sigmoid_of(S::load(in)));
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[2], inf);
  EXPECT_EQ(e[3], 0.0f);
  EXPECT_TRUE(std::isnan(e[4]));
  EXPECT_EQ(e[5], inf);
  EXPECT_EQ(e[6], 0.0f);
  EXPECT_EQ(e[7], inf);
  EXPECT_EQ(l[0], -inf);
  EXPECT_EQ(l[2], inf);
  EXPECT_TRUE(std::isnan(l[3]));
  EXPECT_TRUE(std::isnan(l[4]));
  EXPECT_NEAR(l[8], std::log(static_cast<double>(1e-45f)), 1e-5);  // subnormal input
  EXPECT_TRUE(std::isnan(l[9]));
  EXPECT_EQ(l[10], 0.0f);
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_EQ(s[3], 0.0f);
  EXPECT_EQ(s[0], 0.5f);
}

// The e^-x form negates n, r and the odd coefficients instead of x: the same bits as exp(-x).
TEST(TkMath, NegatedExpIsExpOfTheNegation) {
  const std::vector<float> x = math_inputs();
  for (size_t i = 0; i < x.size(); i += 16) {
    alignas(64) float neg[16], direct[16];
    const auto v = S::load(x.data() + i);
    S::store(neg, exp<S, true, -1>(v));
    S::store(direct, exp<S>(S::sub(S::zero(), v)));
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

// The AVX-512 elementary functions (test_tk_math_avx512.cpp).
namespace dsk::test {
DSK_REGISTER_ISA_TESTS(tk_math_avx512_tests);
}  // namespace dsk::test
