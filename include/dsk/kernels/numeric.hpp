// Number formats of DSKernels and their exact scalar conversions (bit-level, no FP environment
// dependence). This is the one place where each format's rounding rule is written down; the
// vectorised converters in dsk/kernels/tile/convert.hpp must agree with it bit for bit.
//
// Header-only and free of library dependencies: JIT-compiled kernels include it.
//
// clang-format off
//   format  bits  sign.exp.man, bias        specials               f32 -> format
//   bf16    16    1.8.7, 127                inf, NaN               RNE, NaN kept (quiet)
//   f16     16    1.5.10, 15                inf, NaN               RNE, overflow -> inf
//   e4m3    8     1.4.3, 7 ("fn": finite)   NaN = S.1111.111 only  RNE, saturate to +-448
//   e5m2    8     1.5.2, 15                 inf, NaN               RNE, overflow -> inf
//   e2m1    4     1.2.1, 1: {0,.5,1,1.5,2,3,4,6}  none             DeepGEMM thresholds
//   ue8m0   8     0.8.0: value 2^(e-127)    0xFF = NaN             ceil_to_ue8m0
// clang-format on
//
// Every NaN a conversion produces is quiet (what the x86 conversion instructions do), so scalar and
// vector paths agree bit for bit.
#pragma once

#include <bit>
#include <cstdint>

#include <dsk/kernels/abi.hpp>

namespace dsk {

// Storage types: a value of each format is its raw bit pattern. No arithmetic is defined on them;
// convert to float to compute.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
struct e4m3 {
  uint8_t bits;
};
struct e5m2 {
  uint8_t bits;
};
// Two e2m1 (FP4) values in one byte: the even-indexed element in the low nibble, the odd-indexed
// one in the high nibble (DeepGEMM's packing).
struct fp4x2 {
  uint8_t bits;
};
// An unsigned power-of-two scale: 2^(bits - 127).
struct ue8m0 {
  uint8_t bits;
};

// The functions live in the per-ISA ABI namespace (see dsk/kernels/abi.hpp); the types above do
// not.
namespace numeric {
inline namespace DSK_TILE_ABI {

// e4m3 ("fn") and e2m1 maxima; quantizers divide amax by these.
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE5m2Max = 57344.0f;
inline constexpr float kE2m1Max = 6.0f;

constexpr uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
constexpr float float_of(uint32_t b) {
  return std::bit_cast<float>(b);
}

// Rounds a finite, non-negative f32 (given by its bits) to a small binary format with `kMan`
// mantissa bits and minimum normal exponent `kEmin`, round-to-nearest-even. Returns the format's
// magnitude code (exponent field << kMan | mantissa), which may exceed the format's largest code;
// callers clamp. The codes of such formats are monotone in the value, which is what makes
// code = ((e - emin) << man) + rounded_significand hold across the subnormal/normal boundary.
template <int kMan, int kEmin>
constexpr uint32_t round_magnitude_rne(uint32_t abs_bits) {
  const int f32_exp = static_cast<int>(abs_bits >> 23);
  if (f32_exp == 0) return 0;  // f32 zero or subnormal: far below every small format's quantum
  const int exp = f32_exp - 127;
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;  // 24 bits, value * 2^(23-exp)
  const int target_exp = exp < kEmin ? kEmin : exp;
  const int shift = 23 - kMan + (target_exp - exp);
  if (shift >= 26) return 0;  // below a quarter of the smallest quantum
  const uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  return (static_cast<uint32_t>(target_exp - kEmin) << kMan) + rounded;
}

// ---- bf16 ----
constexpr float bf16_to_f32(bf16 x) {
  return float_of(static_cast<uint32_t>(x.bits) << 16);
}

constexpr bf16 f32_to_bf16(float x) {
  const uint32_t b = bits_of(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return bf16{static_cast<uint16_t>((b >> 16) | 0x0040u)};
  const uint32_t rounding = 0x7FFFu + ((b >> 16) & 1u);
  return bf16{static_cast<uint16_t>((b + rounding) >> 16)};
}

// Rounds an f32 to bf16 by round-to-odd: truncated, with the lowest bit set when a dropped bit
// was set (NaN stays NaN, inf and zeros stay). Rounding that bf16 to nearest-even into a format
// of at most 6 significand bits (e4m3, e2m1: bf16 keeps at least 2 more) gives what rounding the
// f32 directly gives, at every exponent down to 2^-122 (Boldo and Melquiond, "When double
// rounding is odd"); being monotone and leaving bf16 values alone, it keeps e4m3's saturation at
// 448 too. RMSNorm + cast with power-of-two scales keeps its f32 rows this way, in half the
// bytes, and takes the bf16 casts' codes path (tk quant.hpp, norm_cast_rows).
constexpr bf16 f32_to_bf16_round_odd(float x) {
  const uint32_t b = bits_of(x);
  return bf16{static_cast<uint16_t>((b >> 16) | ((b & 0xFFFFu) != 0 ? 1u : 0u))};
}

// Rounds an f32 to the nearest bf16-representable f32 (what storing to bf16 and reading back does).
constexpr float round_to_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

// ---- f16 ----
constexpr float f16_to_f32(f16 x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1Fu;
  const uint32_t man = x.bits & 0x3FFu;
  if (exp == 0x1F && man == 0) return float_of(sign | 0x7F800000u);  // inf
  // NaN: payload kept, quiet bit set (as VCVTPH2PS does for a signalling NaN)
  if (exp == 0x1F) return float_of(sign | 0x7FC00000u | (man << 13));
  if (exp != 0) return float_of(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in f32
  const float magnitude = static_cast<float>(man) * float_of(0x33800000u);  // 2^-24
  return sign ? -magnitude : magnitude;
}

constexpr f16 f32_to_f16(float x) {
  const uint32_t b = bits_of(x);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return f16{static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu))};
  if (a >= 0x477FF000u) return f16{static_cast<uint16_t>(sign | 0x7C00u)};  // >= 65520: inf
  return f16{static_cast<uint16_t>(sign | round_magnitude_rne<10, -14>(a))};
}

// ---- e4m3 (fn): finite, NaN = 0x7F / 0xFF, max 448 ----
constexpr float e4m3_to_f32(e4m3 x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x80u) << 24;
  const uint32_t exp = (x.bits >> 3) & 0xFu;
  const uint32_t man = x.bits & 0x7u;
  if (exp == 0xF && man == 0x7) return float_of(sign | 0x7FC00000u);
  if (exp != 0) return float_of(sign | ((exp + 120u) << 23) | (man << 20));
  const float magnitude = static_cast<float>(man) * float_of(0x3B000000u);  // man * 2^-9
  return sign ? -magnitude : magnitude;
}

// Saturating ("satfinite"): |x| >= 448 (including inf) gives +-448; NaN gives NaN.
constexpr e4m3 f32_to_e4m3(float x) {
  const uint32_t b = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return e4m3{static_cast<uint8_t>(sign | 0x7Fu)};
  if (a >= 0x43E00000u) return e4m3{static_cast<uint8_t>(sign | 0x7Eu)};  // >= 448
  return e4m3{static_cast<uint8_t>(sign | round_magnitude_rne<3, -6>(a))};
}

// ---- e5m2: IEEE-like, max 57344 ----
constexpr float e5m2_to_f32(e5m2 x) {
  return f16_to_f32(f16{static_cast<uint16_t>(static_cast<uint16_t>(x.bits) << 8)});
}

// Non-saturating like IEEE: values that round past 57344 become inf; NaN stays NaN (0x7F).
constexpr e5m2 f32_to_e5m2(float x) {
  const uint32_t b = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return e5m2{static_cast<uint8_t>(sign | 0x7Fu)};
  if (a >= 0x47700000u) return e5m2{static_cast<uint8_t>(sign | 0x7Cu)};  // >= 61440: inf
  return e5m2{static_cast<uint8_t>(sign | round_magnitude_rne<2, -14>(a))};
}

// ---- e2m1 (FP4): code = sign << 3 | magnitude index ----
inline constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

constexpr float e2m1_to_f32(uint8_t code) {
  const float v = kE2m1Values[code & 0x7u];
  return (code & 0x8u) ? -v : v;
}

// DeepGEMM's rule: the magnitude index is the number of thresholds {.25,.75,1.25,1.75,2.5,3.5,5}
// strictly below |x| (ties therefore round toward zero, and |x| > 6 saturates to 6); the sign bit
// is set only for a non-zero magnitude, so -0 is never produced. NaN has no threshold below it
// and gives +0.
constexpr uint8_t f32_to_e2m1(float x) {
  const float a = x < 0.0f ? -x : x;
  uint8_t index = 0;
  index += a > 0.25f;
  index += a > 0.75f;
  index += a > 1.25f;
  index += a > 1.75f;
  index += a > 2.5f;
  index += a > 3.5f;
  index += a > 5.0f;
  return static_cast<uint8_t>(index | ((x < 0.0f && index != 0) ? 0x8u : 0x0u));
}

constexpr fp4x2 pack_e2m1(uint8_t even, uint8_t odd) {
  return fp4x2{static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4))};
}
constexpr uint8_t e2m1_low(fp4x2 x) {
  return x.bits & 0xFu;
}
constexpr uint8_t e2m1_high(fp4x2 x) {
  return x.bits >> 4;
}

// ---- ue8m0 ----
// 2^(bits-127); 0x00 is 2^-127 (an f32 subnormal) and 0xFF is NaN.
constexpr float ue8m0_to_f32(ue8m0 x) {
  if (x.bits == 0xFF) return float_of(0x7FC00000u);
  if (x.bits == 0) return float_of(0x00400000u);
  return float_of(static_cast<uint32_t>(x.bits) << 23);
}

// 2^ceil(log2|x|), clamped to [2^-126, 2^127] (DeepGEMM's ceil_to_ue8m0, bit for bit):
// e = exponent(|x|) + (mantissa(|x|) != 0), clamped to [1, 254].
constexpr float ceil_to_ue8m0(float x) {
  const uint32_t b = bits_of(x) & 0x7FFFFFFFu;
  int e = static_cast<int>(b >> 23) + ((b & 0x7FFFFFu) != 0 ? 1 : 0);
  e = e < 1 ? 1 : (e > 254 ? 254 : e);
  return float_of(static_cast<uint32_t>(e) << 23);
}

// The exponent byte of a power of two (what pack_ue8m0_to_int stores); callers check that x is an
// exact power of two first.
constexpr ue8m0 f32_to_ue8m0_exact(float x) {
  return ue8m0{static_cast<uint8_t>(bits_of(x) >> 23)};
}

}  // namespace DSK_TILE_ABI
}  // namespace numeric
}  // namespace dsk
