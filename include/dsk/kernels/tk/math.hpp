// Elementary functions on Simd vectors for the tk kernels: exp, log, and the activations built on
// them (sigmoid, silu, softplus). Written once in Simd operations, so both implementations give
// the same bits; accuracy is within 2 ulp of the correctly rounded result over the f32 range
// (checked against fp64 in tests/tk/test_tk_math.cpp), with inf and NaN handled as IEEE does.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {
inline namespace DSK_TILE_ABI {

// 2^(j / 32), j = 0..31, each rounded to the nearest float: the table of exp.
alignas(64) inline constexpr float kExp2Fractions[32] = {
    0x1.000000p+0f, 0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, 0x1.1d4874p+0f,
    0x1.2387a6p+0f, 0x1.29e9e0p+0f, 0x1.306fe0p+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f, 0x1.44e086p+0f,
    0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f, 0x1.6247ecp+0f, 0x1.6a09e6p+0f, 0x1.71f75ep+0f,
    0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f, 0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f,
    0x1.ae89fap+0f, 0x1.b7f770p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, 0x1.dfc974p+0f,
    0x1.ea4afap+0f, 0x1.f50766p+0f};

// e^(kSign x), kSign = +1 or -1. Reduction x = (32 q + j) ln2 / 32 + r with |r| <= ln2 / 64
// (ln2 split so that (n / 32) ln2_hi is exact for |n| <= 4801), e^r - 1 by its degree-3
// Taylor polynomial (truncation below 6e-10), times 2^(j / 32) from a 32-entry table (one
// permute of two registers) by one FMA, then one scaling by 2^q (scalef: a single rounding, so
// results in the subnormal range are rounded once more from that product; q = 150 gives inf).
// Largest error 1.01 ulp in the normal range, 1.0 in the subnormal (3.9e9 inputs over the float
// range against the double exp). Against the degree-7 polynomial on |r| <= ln2 / 2 (0.73 ulp) it
// took 12 micro-ops instead of 15 (SwiGLU + cast 1.05x hot, 1.04-1.05x cold, in one process on
// the Xeon), and 11 since the shifter gives n / 32 itself (the same bits, see below). The
// clamp keeps |x| <= 104 in one operation (Simd::clamp_abs, VRANGEPS): e^-104 is below half the
// smallest subnormal and e^104 above the largest float, so the clamped inputs still give 0 and inf;
// it turns a quiet NaN into +-104.
//
// kSign = -1 computes e^-x without the negation: n, r and the coefficients change sign (r^k's
// coefficient times (-1)^k), and every rounding is sign-symmetric, so the bits are those of
// e^(-x). With kKeepNan a NaN x is returned; without, a NaN x gives a number (0 or inf) or a NaN,
// for callers whose result is NaN anyway (silu: x / (1 + e^-x)).
template <class S, bool kKeepNan = true, int kSign = 1>
DSK_TK_INLINE typename S::F exp_body(typename S::F x) {
  static_assert(kSign == 1 || kSign == -1);
  using F = typename S::F;
  constexpr float s = kSign;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  const F xc = S::clamp_abs(x, S::set1(104.0f));
  // m = n / 32 with n = round(32 xc log2 e), by the shifter: adding 1.5 * 2^18 (whose last bit is
  // worth 1/32) leaves xc log2 e rounded to the nearest 1/32 (ties to even) in the sum, and
  // subtracting it again is exact. The sum's low five bits are j = n mod 32, the table's index,
  // and m is the exponent scalef takes. Two operations where VRNDSCALEPS after a product took
  // three micro-ops (SwiGLU + cast 1.03x); a shifter of 1.5 * 2^23 giving n itself needed one more
  // product for n / 32. Both give the same m: scaling the rounding by 32 changes no decision.
  constexpr float kShifter = 393216.0f;  // 1.5 * 2^18
  const F shifted = S::fma(xc, S::set1(s * kLog2e), S::set1(kShifter));
  const F m = S::sub(shifted, S::set1(kShifter));
  // m ln2_hi is exact (n has at most 13 bits, ln2_hi 9).
  const F r = S::fma(m, S::set1(-s * kLn2Lo), S::fma(m, S::set1(-s * kLn2Hi), xc));
  // e^r - 1 = r (s + r (1/2 + r s / 6)), in r = s * the reduced argument.
  F p = S::fma(r, S::set1(s / 6), S::set1(0.5f));
  p = S::fma(p, r, S::set1(s));
  p = S::mul(p, r);
  const F t = S::lookup32(kExp2Fractions, S::bits(shifted));
  // 2^q with q = floor(m): scalef takes the floor of its exponent.
  const F y = S::scalef(S::fma(t, p, t), m);
  if constexpr (kKeepNan)
    return S::select(S::isnan(x), x, y);
  else
    return y;
}

// ln(x) for x > 0 (0 -> -inf, negative -> NaN, inf -> inf). x = 2^e * m with m in
// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with s = (m - 1) / (m + 1), |s| <= 0.172, summed to s^11.
template <class S>
DSK_TK_INLINE typename S::F log_body(typename S::F x) {
  using F = typename S::F;
  // Subnormal inputs are scaled into the normal range first.
  const auto tiny = S::lt(x, S::set1(0x1p-126f));
  const F xs = S::select(tiny, S::mul(x, S::set1(0x1p32f)), x);
  const auto b = S::bits(xs);
  // Exponent relative to sqrt(1/2): e = floor(log2(x / sqrt(1/2))).
  const auto shifted = S::isub(b, S::iset1(0x3F3504F3));  // bits of sqrt(1/2)
  const auto e = S::template sra<23>(shifted);
  const F m = S::from_bits(S::isub(b, S::template shl<23>(e)));  // in [sqrt(1/2), sqrt(2))
  F ef = S::to_float(e);
  ef = S::select(tiny, S::sub(ef, S::set1(32.0f)), ef);
  const F s = S::div(S::sub(m, S::set1(1.0f)), S::add(m, S::set1(1.0f)));
  const F s2 = S::mul(s, s);
  F p = S::set1(2.0f / 11);
  for (float c : {2.0f / 9, 2.0f / 7, 2.0f / 5, 2.0f / 3}) p = S::add(S::mul(p, s2), S::set1(c));
  const F ln_m = S::add(S::mul(S::mul(p, s2), s), S::add(s, s));
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  F y = S::add(S::add(S::mul(ef, S::set1(kLn2Lo)), ln_m), S::mul(ef, S::set1(kLn2Hi)));
  const F inf = S::set1(numeric::float_of(0x7F800000u));
  y = S::select(S::eq(x, inf), inf, y);
  y = S::select(S::eq(x, S::zero()), S::set1(numeric::float_of(0xFF800000u)), y);
  return S::select(S::lt(x, S::zero()) | S::isnan(x), S::set1(numeric::float_of(0x7FC00000u)), y);
}

// NOTES: the portable Simd is 16-lane loops over arrays of 16 floats, and every inlined copy of
// exp or log written in it costs the compiler far more than the AVX-512 one: under
// AddressSanitizer (the use-after-scope checks of each temporary vector) one generic exp took
// about 20 s to compile, and a test file that inlined them a dozen times took 8 minutes. The
// generic exp and log therefore run the same template body on one lane at a time, with ScalarLane
// below (scalars live in registers), in one out-of-line function each. ScalarLane's operations
// are the generic Simd's per-lane operations, so the bits are the same.
namespace math_detail {

struct ScalarLane {
  using F = float;
  using I32 = int32_t;
  static F set1(float x) { return x; }
  static F zero() { return 0.0f; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }
  static F scalef(F a, F n) { return std::ldexp(a, static_cast<int>(std::floor(n))); }
  static F clamp_abs(F a, F c) { return Simd<tile::generic_t>::clamp_abs_lane(a, c); }
  static F lookup32(const float* table, I32 i) { return table[i & 31]; }
  static Mask16 lt(F a, F b) { return a < b ? 1u : 0u; }
  static Mask16 eq(F a, F b) { return a == b ? 1u : 0u; }
  static Mask16 isnan(F a) { return a != a ? 1u : 0u; }
  static F select(Mask16 m, F a, F b) { return (m & 1u) != 0 ? a : b; }
  static I32 bits(F a) { return static_cast<I32>(numeric::bits_of(a)); }
  static F from_bits(I32 a) { return numeric::float_of(static_cast<uint32_t>(a)); }
  static I32 iset1(int32_t x) { return x; }
  static I32 isub(I32 a, I32 b) {
    return static_cast<I32>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
  }
  template <int kShift>
  static I32 shl(I32 a) {
    return static_cast<I32>(static_cast<uint32_t>(a) << kShift);
  }
  template <int kShift>
  static I32 sra(I32 a) {
    return a >> kShift;
  }
  static F to_float(I32 a) { return static_cast<F>(a); }
};

}  // namespace math_detail

template <class S, bool kKeepNan, int kSign>
__attribute__((noinline)) typename S::F exp_outlined(typename S::F x) {
  typename S::F r;
  for (int i = 0; i < 16; ++i) r.v[i] = exp_body<math_detail::ScalarLane, kKeepNan, kSign>(x.v[i]);
  return r;
}
template <class S>
__attribute__((noinline)) typename S::F log_outlined(typename S::F x) {
  typename S::F r;
  for (int i = 0; i < 16; ++i) r.v[i] = log_body<math_detail::ScalarLane>(x.v[i]);
  return r;
}

template <class S, bool kKeepNan = true, int kSign = 1>
DSK_TK_INLINE typename S::F exp(typename S::F x) {
  if constexpr (std::is_same_v<S, Simd<tile::generic_t>>)
    return exp_outlined<S, kKeepNan, kSign>(x);
  else
    return exp_body<S, kKeepNan, kSign>(x);
}

template <class S>
DSK_TK_INLINE typename S::F log(typename S::F x) {
  if constexpr (std::is_same_v<S, Simd<tile::generic_t>>)
    return log_outlined<S>(x);
  else
    return log_body<S>(x);
}

// 1 / (1 + e^-x).
template <class S>
DSK_TK_INLINE typename S::F sigmoid(typename S::F x) {
  const auto one = S::set1(1.0f);
  return S::div(one, S::add(one, exp<S>(S::sub(S::zero(), x))));
}

// x * sigmoid(x), computed as x / (1 + e^-x). A NaN x gives NaN through the division.
template <class S>
DSK_TK_INLINE typename S::F silu(typename S::F x) {
  return S::div(x, S::add(S::set1(1.0f), exp<S, false, -1>(x)));
}

// ln(1 + e^x), and x itself above 20 (torch's threshold). ln(1 + y) is evaluated as
// ln(u) * y / (u - 1) with u = 1 + y (exact in the rounding of u; y itself when u == 1).
template <class S>
DSK_TK_INLINE typename S::F softplus(typename S::F x) {
  const auto one = S::set1(1.0f);
  const auto y = exp<S>(x);
  const auto u = S::add(one, y);
  const auto d = S::sub(u, one);
  const auto corrected = S::div(S::mul(log<S>(u), y), d);
  auto r = S::select(S::eq(d, S::zero()), y, corrected);
  return S::select(S::gt(x, S::set1(20.0f)), x, r);
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels
