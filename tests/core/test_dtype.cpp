// The scalar number formats (numeric.hpp) against independent oracles written here from the format
// definitions, and the bulk conversions of dtype.hpp on every backend this CPU runs.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/isa_test.hpp"
#include "common/test_util.hpp"

namespace dsk {
namespace {

using numeric::bits_of;
using numeric::f32_to_bf16_round_odd;
using numeric::float_of;

// ---- oracles: values from the sign/exponent/mantissa fields, rounding by brute force ----

struct Format {
  int exp_bits;
  int man_bits;
  int bias;
  bool finite_only;  // e4m3 "fn": no inf, NaN only at all-ones
};

constexpr Format kE4m3{4, 3, 7, true};
constexpr Format kE5m2{5, 2, 15, false};
constexpr Format kF16{5, 10, 15, false};
constexpr Format kBf16{8, 7, 127, false};
constexpr Format kE2m1{2, 1, 1, true};

int code_bits(const Format& f) {
  return 1 + f.exp_bits + f.man_bits;
}

bool is_nan_code(const Format& f, uint32_t code) {
  const uint32_t exp_max = (1u << f.exp_bits) - 1;
  const uint32_t man_max = (1u << f.man_bits) - 1;
  const uint32_t exp = (code >> f.man_bits) & exp_max;
  const uint32_t man = code & man_max;
  if (f.exp_bits == 2) return false;  // e2m1 has no specials
  if (f.finite_only) return exp == exp_max && man == man_max;
  return exp == exp_max && man != 0;
}

// The value of a code: (-1)^s * 2^(e - bias) * (1 + m / 2^M), or 2^(1 - bias) * m / 2^M when e = 0.
double decode(const Format& f, uint32_t code) {
  const uint32_t exp_max = (1u << f.exp_bits) - 1;
  const bool negative = (code >> (f.exp_bits + f.man_bits)) & 1u;
  const uint32_t exp = (code >> f.man_bits) & exp_max;
  const uint32_t man = code & ((1u << f.man_bits) - 1);
  double magnitude;
  if (is_nan_code(f, code))
    magnitude = std::numeric_limits<double>::quiet_NaN();
  else if (!f.finite_only && exp == exp_max)
    magnitude = std::numeric_limits<double>::infinity();
  else if (exp == 0)
    magnitude = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  else
    magnitude = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits),
                           static_cast<int>(exp) - f.bias);
  return negative ? -magnitude : magnitude;
}

// Round-to-nearest-even by search: the positive finite codes are sorted by value, so the answer
// is one of the two codes around |x|. `overflow_code` is the code the value past the largest
// finite one (max + one ulp) maps to: inf for IEEE-like formats, the maximum for saturating ones.
class RneOracle {
 public:
  RneOracle(const Format& f, uint32_t max_finite_code, uint32_t overflow_code)
      : format_(f), overflow_code_(overflow_code) {
    for (uint32_t c = 0; c <= max_finite_code; ++c) values_.push_back(decode(f, c));
    const double ulp = values_.back() - values_[values_.size() - 2];
    values_.push_back(values_.back() + ulp);  // where the exponent range would continue
  }

  uint32_t operator()(float x) const {
    const uint32_t sign = std::signbit(x) ? 1u << (code_bits(format_) - 1) : 0u;
    const double a = std::fabs(static_cast<double>(x));
    const size_t last = values_.size() - 1;
    size_t hi = std::lower_bound(values_.begin(), values_.end(), a) - values_.begin();
    uint32_t code;
    if (hi > last) {
      code = overflow_code_;
    } else if (values_[hi] == a || hi == 0) {
      code = static_cast<uint32_t>(hi);
    } else {
      const size_t lo = hi - 1;
      const double below = a - values_[lo], above = values_[hi] - a;
      code = static_cast<uint32_t>(below < above || (below == above && lo % 2 == 0) ? lo : hi);
    }
    if (code == last) code = overflow_code_;
    return sign | code;
  }

  // Every value where the answer changes, and the codes themselves: each finite code value, each
  // midpoint between neighbours, and the f32 neighbours of both, for both signs.
  std::vector<float> boundary_inputs() const {
    std::vector<float> out;
    auto add = [&out](double v) {
      // Past the f32 range (bf16's virtual 2^128 and the midpoint below it) only inf is left.
      const float f = v <= std::numeric_limits<float>::max()
                          ? static_cast<float>(v)
                          : std::numeric_limits<float>::infinity();
      for (float g : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e30f)}) {
        out.push_back(g);
        out.push_back(-g);
      }
    };
    for (size_t i = 0; i + 1 < values_.size(); ++i) {
      add(values_[i]);
      add((values_[i] + values_[i + 1]) / 2);
    }
    add(values_.back());
    return out;
  }

 private:
  Format format_;
  uint32_t overflow_code_;
  std::vector<double> values_;
};

uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* s = std::getenv("DSK_TEST_SEED")) return std::stoull(s);
    return (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  }();
  return seed;
}

#define DSK_TRACE_SEED() \
  SCOPED_TRACE("random seed " + std::to_string(test_seed()) + " (DSK_TEST_SEED)")

// f32 bit patterns: uniform over all 2^32 (NaN, inf, subnormals included) mixed with values whose
// exponent lies in [lo_exp, hi_exp], where the small formats round.
std::vector<float> random_floats(size_t n, uint64_t seed, int lo_exp = -30, int hi_exp = 20) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exp(lo_exp + 127, hi_exp + 127);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = static_cast<uint32_t>(rng());
    if (i % 2 == 1) b = (b & 0x807FFFFFu) | (static_cast<uint32_t>(exp(rng)) << 23);
    out[i] = float_of(b);
  }
  return out;
}

bool same_bits(float a, float b) {
  return bits_of(a) == bits_of(b);
}

// ---- decoding every code ----

TEST(Numeric, EveryE4m3CodeDecodesToItsFieldValue) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(e4m3{static_cast<uint8_t>(c)});
    const double want = decode(kE4m3, c);
    if (std::isnan(want)) {
      EXPECT_EQ(bits_of(v), (c & 0x80 ? 0xFFC00000u : 0x7FC00000u)) << "code " << c;
    } else {
      EXPECT_TRUE(same_bits(v, static_cast<float>(want))) << "code " << c << ": " << v;
    }
  }
  EXPECT_EQ(e4m3_to_f32(e4m3{0x7E}), 448.0f);
  EXPECT_EQ(e4m3_to_f32(e4m3{0x01}), std::ldexp(1.0f, -9));
}

TEST(Numeric, EveryE5m2CodeDecodesToItsFieldValue) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = e5m2_to_f32(e5m2{static_cast<uint8_t>(c)});
    const double want = decode(kE5m2, c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << "code " << c;
      EXPECT_NE(bits_of(v) & 0x00400000u, 0u) << "NaN must be quiet, code " << c;
    } else {
      EXPECT_TRUE(same_bits(v, static_cast<float>(want))) << "code " << c << ": " << v;
    }
  }
  EXPECT_EQ(e5m2_to_f32(e5m2{0x7B}), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(e5m2{0x7C}), std::numeric_limits<float>::infinity());
}

TEST(Numeric, EveryF16AndBf16CodeDecodesToItsFieldValue) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float h = f16_to_f32(f16{static_cast<uint16_t>(c)});
    const double want_h = decode(kF16, c);
    if (std::isnan(want_h)) {
      ASSERT_EQ(bits_of(h), ((c & 0x8000u) << 16) | 0x7FC00000u | ((c & 0x3FFu) << 13)) << c;
    } else {
      ASSERT_TRUE(same_bits(h, static_cast<float>(want_h))) << "f16 code " << c;
    }
    const float b = bf16_to_f32(bf16{static_cast<uint16_t>(c)});
    const double want_b = decode(kBf16, c);
    if (std::isnan(want_b)) {
      ASSERT_TRUE(std::isnan(b)) << c;
    } else {
      ASSERT_TRUE(same_bits(b, static_cast<float>(want_b))) << "bf16 code " << c;
    }
  }
}

TEST(Numeric, EveryE2m1CodeDecodesToItsFieldValue) {
  for (uint32_t c = 0; c < 16; ++c)
    EXPECT_TRUE(
        same_bits(e2m1_to_f32(static_cast<uint8_t>(c)), static_cast<float>(decode(kE2m1, c))))
        << "code " << c;
  const fp4x2 packed = numeric::pack_e2m1(0x3, 0xC);
  EXPECT_EQ(packed.bits, 0xC3);
  EXPECT_EQ(numeric::e2m1_low(packed), 0x3);
  EXPECT_EQ(numeric::e2m1_high(packed), 0xC);
}

TEST(Numeric, EveryUe8m0CodeIsAPowerOfTwo) {
  for (int c = 0; c < 255; ++c)
    EXPECT_EQ(ue8m0_to_f32(ue8m0{static_cast<uint8_t>(c)}), std::ldexp(1.0f, c - 127)) << c;
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(ue8m0{0xFF})));
  EXPECT_EQ(numeric::f32_to_ue8m0_exact(0.25f).bits, 125);
}

// ---- every code round-trips ----

TEST(Numeric, EveryNonNanCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    if (!is_nan_code(kE4m3, c)) {
      EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(e4m3{b})).bits, b) << c;
    }
    if (!is_nan_code(kE5m2, c)) {
      EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(e5m2{b})).bits, b) << c;
    }
  }
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    if (!is_nan_code(kF16, c)) {
      ASSERT_EQ(f32_to_f16(f16_to_f32(f16{h})).bits, h) << c;
    }
    if (!is_nan_code(kBf16, c)) {
      ASSERT_EQ(f32_to_bf16(bf16_to_f32(bf16{h})).bits, h) << c;
    }
  }
  for (uint8_t c = 0; c < 16; ++c)  // -0 (0x8) is never produced: it comes back as +0
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(c)), c == 0x8 ? 0 : c) << int{c};
}

// ---- rounding ----

void expect_rounding(const char* name, const RneOracle& oracle,
                     const std::function<uint32_t(float)>& convert,
                     const std::vector<float>& inputs) {
  int failures = 0;
  for (float x : inputs) {
    if (std::isnan(x)) continue;
    const uint32_t want = oracle(x), got = convert(x);
    if (want != got && ++failures <= 5)
      ADD_FAILURE() << name << "(" << x << " = 0x" << std::hex << bits_of(x) << "): got 0x" << got
                    << ", expected 0x" << want;
  }
  EXPECT_EQ(failures, 0) << name;
}

TEST(Numeric, E4m3RoundsToNearestEvenAndSaturates) {
  DSK_TRACE_SEED();
  const RneOracle oracle(kE4m3, 0x7E, 0x7E);  // past 448: saturate
  auto convert = [](float x) -> uint32_t { return f32_to_e4m3(x).bits; };
  expect_rounding("f32_to_e4m3", oracle, convert, oracle.boundary_inputs());
  expect_rounding("f32_to_e4m3", oracle, convert, random_floats(1 << 18, test_seed(), -14, 10));
  // The boundaries by name.
  EXPECT_EQ(f32_to_e4m3(448.0f).bits, 0x7E);
  EXPECT_EQ(f32_to_e4m3(463.99f).bits, 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f).bits, 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e30f).bits, 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()).bits, 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()).bits, 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()).bits, 0xFF);
  EXPECT_EQ(f32_to_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)).bits, 0x00);  // tie to even 0
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)).bits, 0x01);
  EXPECT_EQ(f32_to_e4m3(3 * std::ldexp(1.0f, -10)).bits, 0x02);  // tie to even 2
  EXPECT_EQ(f32_to_e4m3(std::ldexp(15.5f, -10)).bits, 0x08);     // into the normals
  EXPECT_EQ(f32_to_e4m3(float_of(0x00000001u)).bits, 0x00);      // f32 subnormal
}

TEST(Numeric, E5m2RoundsToNearestEvenAndOverflowsToInf) {
  DSK_TRACE_SEED();
  const RneOracle oracle(kE5m2, 0x7B, 0x7C);  // past 57344: inf
  auto convert = [](float x) -> uint32_t { return f32_to_e5m2(x).bits; };
  expect_rounding("f32_to_e5m2", oracle, convert, oracle.boundary_inputs());
  expect_rounding("f32_to_e5m2", oracle, convert, random_floats(1 << 18, test_seed(), -20, 17));
  EXPECT_EQ(f32_to_e5m2(61439.99f).bits, 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f).bits, 0x7C);
  EXPECT_EQ(f32_to_e5m2(-std::numeric_limits<float>::infinity()).bits, 0xFC);
  EXPECT_EQ(f32_to_e5m2(std::numeric_limits<float>::quiet_NaN()).bits, 0x7F);
  EXPECT_EQ(f32_to_e5m2(-0.0f).bits, 0x80);
}

TEST(Numeric, F16RoundsToNearestEvenAndOverflowsToInf) {
  DSK_TRACE_SEED();
  const RneOracle oracle(kF16, 0x7BFF, 0x7C00);
  auto convert = [](float x) -> uint32_t { return f32_to_f16(x).bits; };
  expect_rounding("f32_to_f16", oracle, convert, oracle.boundary_inputs());
  expect_rounding("f32_to_f16", oracle, convert, random_floats(1 << 18, test_seed(), -28, 17));
  EXPECT_EQ(f32_to_f16(65519.99f).bits, 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7C00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even 0
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)).bits, 0x0002);  // tie to even 2
  EXPECT_EQ(f32_to_f16(float_of(0x7F800001u)).bits, 0x7E00);  // signalling NaN made quiet
}

TEST(Numeric, Bf16RoundsToNearestEvenOnRandomBitPatterns) {
  DSK_TRACE_SEED();
  const RneOracle oracle(kBf16, 0x7F7F, 0x7F80);
  auto convert = [](float x) -> uint32_t { return f32_to_bf16(x).bits; };
  expect_rounding("f32_to_bf16", oracle, convert, oracle.boundary_inputs());
  expect_rounding("f32_to_bf16", oracle, convert, random_floats(1 << 20, test_seed(), -140, 127));
  // Subnormals are rounded, not flushed (unlike VCVTNEPS2BF16); NaN keeps its payload, made quiet.
  EXPECT_EQ(f32_to_bf16(float_of(0x00018000u)).bits, 0x0002);
  EXPECT_EQ(f32_to_bf16(float_of(0x80008000u)).bits, 0x8000);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F800001u)).bits, 0x7FC0);
  EXPECT_EQ(f32_to_bf16(float_of(0xFFA12345u)).bits, 0xFFE1);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F7FFFFFu)).bits, 0x7F80);  // rounds up to inf
}

TEST(Numeric, Bf16RoundToOddIsTruncationWithAStickyBit) {
  EXPECT_EQ(f32_to_bf16_round_odd(1.0f).bits, 0x3F80);                   // exact: unchanged
  EXPECT_EQ(f32_to_bf16_round_odd(float_of(0x3F800001u)).bits, 0x3F81);  // a dropped bit: odd
  EXPECT_EQ(f32_to_bf16_round_odd(float_of(0x3F81FFFFu)).bits, 0x3F81);  // already odd
  EXPECT_EQ(f32_to_bf16_round_odd(float_of(0xBF80FFFFu)).bits, 0xBF81);  // magnitude, not value
  EXPECT_EQ(f32_to_bf16_round_odd(float_of(0x7F7FFFFFu)).bits, 0x7F7F);  // never up to inf
  EXPECT_EQ(f32_to_bf16_round_odd(float_of(0x7F800001u)).bits, 0x7F81);  // NaN stays NaN
  EXPECT_EQ(f32_to_bf16_round_odd(float_of(0x00000001u)).bits, 0x0001);  // subnormal: not zero
  EXPECT_EQ(f32_to_bf16_round_odd(-0.0f).bits, 0x8000);
}

// The fused casts with power-of-two scales round their f32 rows to odd in bf16 and take the codes
// from those (tk quant.hpp): e4m3 and e2m1 of the bf16 times 2^k must be those of the f32 times
// 2^k, for every k an inverse UE8M0 scale can take, at every tie and threshold of both formats.
TEST(Numeric, RoundingToOddInBf16FirstChangesNoE4m3OrE2m1Code) {
  DSK_TRACE_SEED();
  std::mt19937 rng(static_cast<uint32_t>(test_seed()));
  std::uniform_int_distribution<int> exponent(-126, 120);
  const auto expect_same_codes = [](float x, float scale) {
    const float odd = bf16_to_f32(f32_to_bf16_round_odd(x));
    ASSERT_EQ(f32_to_e4m3(odd * scale).bits, f32_to_e4m3(x * scale).bits) << x << " " << scale;
    ASSERT_EQ(f32_to_e2m1(odd * scale), f32_to_e2m1(x * scale)) << x << " " << scale;
  };
  // Every e4m3 and e2m1 value, tie and threshold, and their f32 neighbours, at 2^0 and at a
  // random 2^k with the value divided by it.
  for (int e = -12; e <= 9; ++e)
    for (uint32_t m = 0; m < 16; ++m) {
      const float at = std::ldexp(1.0f + static_cast<float>(m) / 16.0f, e);
      for (float x : {std::nextafter(at, 0.0f), at, std::nextafter(at, 1e30f)})
        for (float signed_x : {x, -x}) {
          expect_same_codes(signed_x, 1.0f);
          const int k = exponent(rng);
          const float unscaled = std::ldexp(signed_x, -k);
          if (unscaled * std::ldexp(1.0f, k) == signed_x)
            expect_same_codes(unscaled, std::ldexp(1.0f, k));
        }
    }
  for (float x : random_floats(1 << 20, test_seed(), -126, 127))
    expect_same_codes(x, std::ldexp(1.0f, exponent(rng)));
}

// e2m1 is DeepGEMM's threshold rule: nearest value, ties toward zero, saturating at 6.
uint8_t e2m1_oracle(float x) {
  if (std::isnan(x)) return 0;
  const double a = std::min(std::fabs(static_cast<double>(x)), 6.0);
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c)
    if (std::fabs(decode(kE2m1, c) - a) < std::fabs(decode(kE2m1, best) - a)) best = c;
  return static_cast<uint8_t>(best | (x < 0 && best != 0 ? 0x8 : 0));
}

TEST(Numeric, E2m1FollowsDeepGemmThresholds) {
  DSK_TRACE_SEED();
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
    const uint8_t at = f32_to_e2m1(t);
    EXPECT_EQ(f32_to_e2m1(std::nextafter(t, 10.0f)), at + 1) << t;  // just above: up
    EXPECT_EQ(f32_to_e2m1(-t), at == 0 ? 0 : (at | 0x8)) << t;
  }
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);  // ties toward zero
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(1e9f), 7);
  EXPECT_EQ(f32_to_e2m1(-std::numeric_limits<float>::infinity()), 0xF);
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0);  // no -0
  for (float x : random_floats(1 << 16, test_seed(), -4, 4))
    ASSERT_EQ(f32_to_e2m1(x), e2m1_oracle(x)) << x;
}

// ceil_to_ue8m0 against 2^ceil(log2|x|) computed with frexp, clamped to [2^-126, 2^127].
float ceil_pow2_oracle(float x) {
  const double a = std::fabs(static_cast<double>(x));
  if (!(a >= std::ldexp(1.0, -126))) return std::ldexp(1.0f, -126);  // zero, subnormal
  if (std::isinf(a)) return std::ldexp(1.0f, 127);
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int p = f == 0.5 ? e - 1 : e;
  return std::ldexp(1.0f, std::min(p, 127));
}

TEST(Numeric, CeilToUe8m0MatchesTheSpecFormula) {
  DSK_TRACE_SEED();
  EXPECT_EQ(ceil_to_ue8m0(0.0f), std::ldexp(1.0f, -126));
  EXPECT_EQ(ceil_to_ue8m0(-0.0f), std::ldexp(1.0f, -126));
  EXPECT_EQ(ceil_to_ue8m0(float_of(1)), std::ldexp(1.0f, -126));            // smallest subnormal
  EXPECT_EQ(ceil_to_ue8m0(float_of(0x007FFFFFu)), std::ldexp(1.0f, -126));  // largest subnormal
  EXPECT_EQ(ceil_to_ue8m0(std::numeric_limits<float>::max()), std::ldexp(1.0f, 127));
  EXPECT_EQ(ceil_to_ue8m0(std::numeric_limits<float>::infinity()), std::ldexp(1.0f, 127));
  EXPECT_EQ(ceil_to_ue8m0(448.0f / 448.0f), 1.0f);
  EXPECT_EQ(ceil_to_ue8m0(-3.0f), 4.0f);
  for (int e = -126; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    ASSERT_EQ(ceil_to_ue8m0(p), p) << e;                        // exact powers stay
    ASSERT_EQ(ceil_to_ue8m0(std::nextafter(p, 0.0f)), p) << e;  // just below (or subnormal)
    ASSERT_EQ(ceil_to_ue8m0(std::nextafter(p, 1e38f)), ceil_pow2_oracle(std::nextafter(p, 1e38f)));
  }
  for (float x : random_floats(1 << 18, test_seed(), -140, 127)) {
    if (std::isnan(x)) continue;
    ASSERT_EQ(bits_of(ceil_to_ue8m0(x)), bits_of(ceil_pow2_oracle(x))) << x;
  }
}

// ---- bulk conversions (dtype.hpp) on every backend ----

// Memory filled with a byte pattern whose first byte after `size` bytes is an inaccessible page: an
// access past the end of an array placed with end_aligned() faults instead of passing unnoticed.
class FencedBuffer {
 public:
  static constexpr size_t kGuard = 64;

  FencedBuffer(size_t size, uint8_t fill) : size_(size), fill_(fill) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    data_bytes_ = (size + kGuard + page_ - 1) / page_ * page_;
    base_ = static_cast<uint8_t*>(mmap(nullptr, data_bytes_ + page_, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    mprotect(base_ + data_bytes_, page_, PROT_NONE);
    std::memset(base_, fill, data_bytes_);
  }
  ~FencedBuffer() { munmap(base_, data_bytes_ + page_); }
  FencedBuffer(const FencedBuffer&) = delete;
  FencedBuffer& operator=(const FencedBuffer&) = delete;

  // The array of `size` bytes that ends at the fence.
  template <class T>
  T* end_aligned() const {
    return reinterpret_cast<T*>(base_ + data_bytes_ - size_);
  }
  // True when the kGuard bytes before the array still hold the fill pattern.
  bool guard_intact() const {
    const uint8_t* p = base_ + data_bytes_ - size_;
    return std::all_of(p - kGuard, p, [this](uint8_t b) { return b == fill_; });
  }

 private:
  size_t size_;
  uint8_t fill_;
  size_t page_;
  size_t data_bytes_;
  uint8_t* base_;
};

template <class T>
uint32_t raw(T v) {
  if constexpr (std::is_same_v<T, float>)
    return bits_of(v);
  else
    return v.bits;
}

// Runs bulk(src, dst, n) on fenced arrays of every length 0..130 (and the full input) and compares
// each output with scalar(src[i]); fp4x2 sides hold n/2 bytes.
template <class Src, class Dst>
void check_bulk(const char* name, void (*bulk)(const Src*, Dst*, size_t),
                const std::vector<Src>& input, const std::function<Dst(const Src*, size_t)>& scalar,
                size_t values_per_src = 1, size_t values_per_dst = 1) {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 130; n += std::max(values_per_src, values_per_dst)) lengths.push_back(n);
  lengths.push_back(input.size() * values_per_src / values_per_dst * values_per_dst);
  // Two output fill patterns: an element the conversion skips cannot match the expected value
  // under both.
  for (size_t n : lengths) {
    for (uint8_t fill : {uint8_t{0xA5}, uint8_t{0x5A}}) {
      const size_t src_count = n / values_per_src, dst_count = n / values_per_dst;
      FencedBuffer src_buf(src_count * sizeof(Src), 0), dst_buf(dst_count * sizeof(Dst), fill);
      Src* src = src_buf.end_aligned<Src>();
      std::copy(input.begin(), input.begin() + static_cast<ptrdiff_t>(src_count), src);
      Dst* dst = dst_buf.end_aligned<Dst>();
      bulk(src, dst, n);
      ASSERT_TRUE(dst_buf.guard_intact()) << name << ": wrote before the output, n = " << n;
      for (size_t i = 0; i < dst_count; ++i) {
        const Dst want = scalar(src, i);
        ASSERT_EQ(raw(dst[i]), raw(want)) << name << ": element " << i << " of " << n;
      }
    }
  }
}

template <class T>
std::vector<T> every_code_repeated(size_t n) {
  std::vector<T> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = T{static_cast<uint8_t>(i * 37 + i / 256)};
  return out;
}

class BulkConvert : public ::testing::TestWithParam<Backend> {};

TEST_P(BulkConvert, MatchesScalarRulesOnEveryLength) {
  DSK_TRACE_SEED();
  test::ScopedBackend scoped(GetParam());
  // More than two 256 Ki-value chunks, so the full-length run takes the multi-threaded path.
  constexpr size_t kValues = 600'002;
  const std::vector<float> floats = random_floats(kValues, test_seed());
  std::vector<bf16> bf16s(kValues);
  std::vector<f16> f16s(kValues);
  for (size_t i = 0; i < bf16s.size(); ++i) {
    bf16s[i] = bf16{static_cast<uint16_t>(bits_of(floats[i]) >> 16)};
    f16s[i] = f16{static_cast<uint16_t>(bits_of(floats[i]) >> 8)};
  }
  const auto e4m3s = every_code_repeated<e4m3>(kValues);
  const auto e5m2s = every_code_repeated<e5m2>(kValues);
  const auto fp4s = every_code_repeated<fp4x2>(kValues / 2);

  check_bulk<float, bf16>("convert_f32_to_bf16", convert_f32_to_bf16, floats,
                          [](const float* s, size_t i) { return f32_to_bf16(s[i]); });
  check_bulk<bf16, float>("convert_bf16_to_f32", convert_bf16_to_f32, bf16s,
                          [](const bf16* s, size_t i) { return bf16_to_f32(s[i]); });
  check_bulk<float, f16>("convert_f32_to_f16", convert_f32_to_f16, floats,
                         [](const float* s, size_t i) { return f32_to_f16(s[i]); });
  check_bulk<f16, float>("convert_f16_to_f32", convert_f16_to_f32, f16s,
                         [](const f16* s, size_t i) { return f16_to_f32(s[i]); });
  check_bulk<float, e4m3>("convert_f32_to_e4m3", convert_f32_to_e4m3, floats,
                          [](const float* s, size_t i) { return f32_to_e4m3(s[i]); });
  check_bulk<e4m3, float>("convert_e4m3_to_f32", convert_e4m3_to_f32, e4m3s,
                          [](const e4m3* s, size_t i) { return e4m3_to_f32(s[i]); });
  check_bulk<e4m3, bf16>("convert_e4m3_to_bf16", convert_e4m3_to_bf16, e4m3s,
                         [](const e4m3* s, size_t i) { return f32_to_bf16(e4m3_to_f32(s[i])); });
  check_bulk<float, e5m2>("convert_f32_to_e5m2", convert_f32_to_e5m2, floats,
                          [](const float* s, size_t i) { return f32_to_e5m2(s[i]); });
  check_bulk<e5m2, float>("convert_e5m2_to_f32", convert_e5m2_to_f32, e5m2s,
                          [](const e5m2* s, size_t i) { return e5m2_to_f32(s[i]); });
  check_bulk<float, fp4x2>(
      "convert_f32_to_fp4x2", convert_f32_to_fp4x2, floats,
      [](const float* s, size_t i) {
        return numeric::pack_e2m1(f32_to_e2m1(s[2 * i]), f32_to_e2m1(s[2 * i + 1]));
      },
      1, 2);
  check_bulk<fp4x2, float>(
      "convert_fp4x2_to_f32", convert_fp4x2_to_f32, fp4s,
      [](const fp4x2* s, size_t i) {
        return e2m1_to_f32(i % 2 ? numeric::e2m1_high(s[i / 2]) : numeric::e2m1_low(s[i / 2]));
      },
      2, 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, BulkConvert, ::testing::ValuesIn(test::supported_backends()),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

TEST(BulkConvertArgs, OddFp4CountsAreRejected) {
  float src[3] = {1.0f, 2.0f, 3.0f};
  fp4x2 dst[2] = {};
  EXPECT_THROW(convert_f32_to_fp4x2(src, dst, 3), Error);
  EXPECT_THROW(convert_fp4x2_to_f32(dst, src, 1), Error);
  convert_f32_to_fp4x2(nullptr, nullptr, 0);  // empty is fine
}

}  // namespace
}  // namespace dsk

// The AVX-512 converters (test_dtype_avx512.cpp).
namespace dsk::test {
DSK_REGISTER_ISA_TESTS(convert_avx512_tests);
}  // namespace dsk::test
