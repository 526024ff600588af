// Conversions between DSKernels' number formats for the tile layer: AVX-512 register converters
// and the array helper convert_n<Isa>(src, dst, n), all bit-identical to the scalar rules of
// dsk/kernels/numeric.hpp (which this header's tests check on every code and millions of f32s).
//
// clang-format off
//   pair          register converter (avx512)         values per call
//   e4m3 -> bf16  e4m3x64_to_bf16, e4m3x32_to_bf16    64, 32  (two VPERMI2B byte tables)
//   e4m3 -> f32   e4m3x16_to_f32                      16
//   bf16 -> f32   bf16x16_to_f32                      16
//   f32 -> bf16   f32x16_to_bf16                      16      (RNE, subnormals kept, NaN quiet)
//                 f32x32_to_bf16_round_odd            32      (round to odd)
//                 f32x32_pairs_to_bf16_round_odd      32      (the same, values in pairs)
//   f32 -> e4m3   f32x16_to_e4m3                      16      (RNE, saturating, NaN kept)
//   bf16 -> e4m3  bf16x32_to_e4m3_pow2                32      (times 2^k; normal range only)
//   f32 -> e4m3   f32x16_to_e4m3_pow2, f32x64_...     16, 64  (times 2^k; normal range only)
//                 f32x64_pairs_to_e4m3_pow2           64      (the same, values in pairs)
//   e5m2 <-> f32  e5m2x16_to_f32, f32x16_to_e5m2      16      (RNE, overflow to inf)
//   f16 <-> f32   f16x16_to_f32, f32x16_to_f16        16      (F16C)
//   e2m1 -> f32   e2m1x16_to_f32                      16      (from 8 packed fp4x2 bytes)
//   e2m1 -> bf16  e2m1x32_to_bf16                     32      (from 16 packed fp4x2 bytes)
//   f32 -> e2m1   f32x16_to_e2m1                      16      (to 8 packed fp4x2 bytes)
// clang-format on
//
// convert_n counts values, not bytes: an fp4x2 array of n values holds n/2 bytes and n must be
// even. It never reads or writes past n (tails use masked loads and stores).
//
// NOTES: the AVX-512 code computes with integers where the hardware instruction would differ from
// the scalar rule: VCVTNEPS2BF16 flushes f32 subnormals to zero, and the FP environment (MXCSR
// rounding mode, DAZ, FTZ) must not change a result. The one floating-point add below uses an
// embedded rounding mode, and DAZ cannot change what it returns (see f32x16_to_small_float).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/isa.hpp>

// The AVX-512 converters use VBMI byte permutes and F16C, part of the avx512 baseline (abi.hpp).
#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

// ---- scalar rules: one per (source, destination) pair, all from numeric.hpp ----

namespace convert_detail {

template <class T>
struct Tag {};

constexpr float scalar(bf16 x, Tag<float>) {
  return numeric::bf16_to_f32(x);
}
constexpr bf16 scalar(float x, Tag<bf16>) {
  return numeric::f32_to_bf16(x);
}
constexpr float scalar(f16 x, Tag<float>) {
  return numeric::f16_to_f32(x);
}
constexpr f16 scalar(float x, Tag<f16>) {
  return numeric::f32_to_f16(x);
}
constexpr float scalar(e4m3 x, Tag<float>) {
  return numeric::e4m3_to_f32(x);
}
// Exact: every e4m3 value is a bf16 value.
constexpr bf16 scalar(e4m3 x, Tag<bf16>) {
  return numeric::f32_to_bf16(numeric::e4m3_to_f32(x));
}
constexpr e4m3 scalar(float x, Tag<e4m3>) {
  return numeric::f32_to_e4m3(x);
}
constexpr float scalar(e5m2 x, Tag<float>) {
  return numeric::e5m2_to_f32(x);
}
constexpr e5m2 scalar(float x, Tag<e5m2>) {
  return numeric::f32_to_e5m2(x);
}

// One e2m1 code (low 4 bits) to a wider type.
template <class Dst>
constexpr Dst e2m1_scalar(uint8_t code) {
  const float v = numeric::e2m1_to_f32(code);
  if constexpr (std::is_same_v<Dst, float>)
    return v;
  else
    return numeric::f32_to_bf16(v);  // exact: every e2m1 value is a bf16 value
}

template <class>
inline constexpr bool always_false = false;

}  // namespace convert_detail

// The scalar rule for Src -> Dst (e.g. convert_scalar<bf16>(1.0f)).
template <class Dst, class Src>
constexpr Dst convert_scalar(Src x) {
  return convert_detail::scalar(x, convert_detail::Tag<Dst>{});
}

namespace convert_detail {

template <class Src, class Dst>
inline void convert_n_generic(const Src* src, Dst* dst, size_t n) {
  if constexpr (std::is_same_v<Src, fp4x2>) {
    for (size_t i = 0; i < n / 2; ++i) {
      dst[2 * i] = e2m1_scalar<Dst>(numeric::e2m1_low(src[i]));
      dst[2 * i + 1] = e2m1_scalar<Dst>(numeric::e2m1_high(src[i]));
    }
  } else if constexpr (std::is_same_v<Dst, fp4x2>) {
    static_assert(std::is_same_v<Src, float>, "fp4x2 is produced from f32 only");
    for (size_t i = 0; i < n / 2; ++i)
      dst[i] = numeric::pack_e2m1(numeric::f32_to_e2m1(src[2 * i]),
                                  numeric::f32_to_e2m1(src[2 * i + 1]));
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = convert_scalar<Dst>(src[i]);
  }
}

}  // namespace convert_detail

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp
#if DSK_TILE_HAS_AVX512

// ---- AVX-512 register converters ----

namespace convert_detail {

// The bf16 bits of every e4m3 magnitude (code & 0x7F), split into high and low bytes so that two
// VPERMI2B lookups (7-bit index over two registers) convert 64 codes at once.
struct E4m3Bf16Bytes {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
};

constexpr E4m3Bf16Bytes make_e4m3_bf16_bytes() {
  E4m3Bf16Bytes t{};
  for (int m = 0; m < 128; ++m) {
    const uint16_t b = scalar(e4m3{static_cast<uint8_t>(m)}, Tag<bf16>{}).bits;
    t.hi[m] = static_cast<uint8_t>(b >> 8);
    t.lo[m] = static_cast<uint8_t>(b & 0xFF);
  }
  return t;
}

inline constexpr E4m3Bf16Bytes kE4m3Bf16Bytes = make_e4m3_bf16_bytes();

// VPUNPCK{L,H}BW interleave within 128-bit lanes. Feeding them codes in this order makes the low
// unpack produce values 0..31 and the high unpack values 32..63, in order: byte 16k+j of lane k
// holds value 8k+j (j < 8) and byte 16k+8+j holds value 32+8k+j.
struct UnpackOrder {
  alignas(64) uint8_t index[64];
};

constexpr UnpackOrder make_unpack_order() {
  UnpackOrder o{};
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < 8; ++j) {
      o.index[16 * k + j] = static_cast<uint8_t>(8 * k + j);
      o.index[16 * k + 8 + j] = static_cast<uint8_t>(32 + 8 * k + j);
    }
  }
  return o;
}

inline constexpr UnpackOrder kUnpackOrder = make_unpack_order();

// kUnpackOrder applied to codes[source[i]]: converting with it yields the values in source order.
constexpr UnpackOrder unpack_order_of(const UnpackOrder& source) {
  UnpackOrder o{};
  for (int i = 0; i < 64; ++i) o.index[i] = source.index[kUnpackOrder.index[i]];
  return o;
}

// The 16 e2m1 values as f32, and as bf16 repeated twice (VPERMW reads 5 index bits).
struct E2m1Tables {
  alignas(64) float f32[16];
  alignas(64) uint16_t bf16[32];
};

constexpr E2m1Tables make_e2m1_tables() {
  E2m1Tables t{};
  for (int c = 0; c < 32; ++c) {
    if (c < 16) t.f32[c] = e2m1_scalar<float>(static_cast<uint8_t>(c));
    t.bf16[c] = e2m1_scalar<bf16>(static_cast<uint8_t>(c & 0xF)).bits;
  }
  return t;
}

inline constexpr E2m1Tables kE2m1Tables = make_e2m1_tables();

// The e2m1 code of bf16x32_to_e2m1_pow2 by bucket: entry b (b < 32) is the code of a magnitude
// whose scaled bits s satisfy min((s -sat 0x3E61) >> 5, 31) = b, entry 32 + b the code of the
// negative value (bit 3 set unless the code is 0). The thresholds 0x3E80 (0.25), 0x3F40, 0x3FA0,
// 0x3FE0, 0x4020, 0x4060, 0x40A0 (5) are 0x3E80 + 32 m for m in {0, 6, 9, 11, 13, 15, 17}, so
// bucket b holds the s in (0x3E80 + 32 (b - 1), 0x3E80 + 32 b] and exceeds exactly the
// thresholds with m < b.
struct E2m1CodeTable {
  alignas(64) uint16_t codes[64];
};

constexpr E2m1CodeTable make_e2m1_code_table() {
  constexpr int kThresholdSteps[7] = {0, 6, 9, 11, 13, 15, 17};
  E2m1CodeTable t{};
  for (int b = 0; b < 32; ++b) {
    uint16_t code = 0;
    for (int m : kThresholdSteps) code = static_cast<uint16_t>(code + (m < b ? 1 : 0));
    t.codes[b] = code;
    t.codes[32 + b] = code == 0 ? 0 : static_cast<uint16_t>(code | 0x8);
  }
  return t;
}

inline constexpr E2m1CodeTable kE2m1CodeTable = make_e2m1_code_table();

inline __m512i set1_u32(uint32_t v) {
  return _mm512_set1_epi32(static_cast<int>(v));
}

// v, as a value GCC cannot see through: it stays in a register (or on the stack) instead of
// being rebuilt from an immediate at each use.
inline __m512i opaque(__m512i v) {
  __asm__("" : "+v"(v));
  return v;
}

// The lanes whose f32 bits are a subnormal (exponent 0, mantissa not 0).
inline __mmask16 subnormal_lanes(__m512i bits) {
  return _mm512_testn_epi32_mask(bits, set1_u32(0x7F800000u)) &
         _mm512_test_epi32_mask(bits, set1_u32(0x007FFFFFu));
}

// Magnitude code of a small binary float format (kMan mantissa bits, smallest normal exponent
// kEmin) for every lane of |x| (given as f32 bits), before saturation and NaN handling.
//   normal range: round away the low 23-kMan bits of the f32 bits (integer RNE) and rebias;
//   below 2^kEmin the quantum is fixed at 2^(kEmin-kMan): adding 2^(kEmin-kMan+23) makes the
//   adder round |x| to that quantum (RNE by embedded rounding, whatever MXCSR says). An f32
//   subnormal rounds to code 0 whether or not DAZ treats it as zero.
template <int kMan, int kEmin>
inline __m512i f32x16_to_small_float(__m512i abs_bits) {
  constexpr int kShift = 23 - kMan;
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - 1 + kEmin) << 23;  // f32 exp -> fmt exp
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + kEmin) << 23;
  constexpr uint32_t kMagic = static_cast<uint32_t>(127 + kEmin - kMan + 23) << 23;
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs_bits, kShift), set1_u32(1));
  const __m512i bias = _mm512_add_epi32(lsb, set1_u32((1u << (kShift - 1)) - 1u - kRebias));
  const __m512i normal = _mm512_srli_epi32(_mm512_add_epi32(abs_bits, bias), kShift);
  const __m512 shifted =
      _mm512_add_round_ps(_mm512_castsi512_ps(abs_bits), _mm512_castsi512_ps(set1_u32(kMagic)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 small = _mm512_cmplt_epu32_mask(abs_bits, set1_u32(kMinNormal));
  return _mm512_mask_sub_epi32(normal, small, _mm512_castps_si512(shifted), set1_u32(kMagic));
}

// Finishes f32x16_to_e4m3 / _e5m2: clamp the magnitude to `max_code` (448 or inf), NaN lanes get
// 0x7F, the sign goes to bit 7, and each lane is narrowed to a byte.
inline __m128i finish_small_float(__m512i code, __m512i bits, __m512i abs_bits, uint32_t max_code) {
  code = _mm512_min_epu32(code, set1_u32(max_code));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs_bits, set1_u32(0x7F800000u));
  code = _mm512_mask_mov_epi32(code, nan, set1_u32(0x7F));
  // code | ((bits >> 24) & 0x80)
  code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), set1_u32(0x80), 0xF8);
  return _mm512_cvtepi32_epi8(code);
}

}  // namespace convert_detail

// 64 e4m3 codes -> 64 bf16: `first` holds values 0..31, `second` values 32..63.
struct Bf16x64 {
  __m512i first;
  __m512i second;
};

// The 64 values codes[source[i]] in order i, where order = unpack_order_of(source): the pick
// rides on the shuffle the conversion needs anyway.
inline Bf16x64 e4m3x64_to_bf16_ordered(__m512i codes, const convert_detail::UnpackOrder& order) {
  using convert_detail::kE4m3Bf16Bytes;
  const __m512i x = _mm512_permutexvar_epi8(_mm512_load_si512(order.index), codes);
  // VPERMI2B ignores index bit 7 (the sign): the tables are indexed by the magnitude.
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(kE4m3Bf16Bytes.hi), x,
                                        _mm512_load_si512(kE4m3Bf16Bytes.hi + 64));
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(kE4m3Bf16Bytes.lo), x,
                                              _mm512_load_si512(kE4m3Bf16Bytes.lo + 64));
  hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
  return {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)};
}

inline Bf16x64 e4m3x64_to_bf16(__m512i codes) {
  return e4m3x64_to_bf16_ordered(codes, convert_detail::kUnpackOrder);
}

inline __m512i e4m3x32_to_bf16(__m256i codes) {
  return e4m3x64_to_bf16(_mm512_zextsi256_si512(codes)).first;
}

inline __m512 bf16x16_to_f32(__m256i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

inline __m512 e4m3x16_to_f32(__m128i codes) {
  using convert_detail::kE4m3Bf16Bytes;
  const __m512i x = _mm512_cvtepu8_epi32(codes);
  // Bytes 1..3 of each lane are 0 and look up code 0, whose bf16 bytes are 0.
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(kE4m3Bf16Bytes.hi), x,
                                        _mm512_load_si512(kE4m3Bf16Bytes.hi + 64));
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(kE4m3Bf16Bytes.lo), x,
                                              _mm512_load_si512(kE4m3Bf16Bytes.lo + 64));
  hi = _mm512_ternarylogic_epi32(hi, x, convert_detail::set1_u32(0x80), 0xF8);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(hi, 24), _mm512_slli_epi32(lo, 16)));
}

// RNE on the bits (x + 0x7FFF + lsb) >> 16; NaN becomes (x >> 16) | 0x40.
// VCVTNEPS2BF16 implements exactly this rule (Intel's pseudo-code; checked on millions of bit
// patterns in tests/core) except that it reads subnormal inputs as zero, so only vectors holding
// a subnormal take the integer path. The check is on the result first: the instruction turns a
// subnormal into ±0 and a normal input never into ±0, so a result without a ±0 word is exact
// after one conversion and one test of 16 or 32 words (instead of nine instructions, which
// bf16-writing kernels such as norms, Hadamard and RoPE feel). Only a vector with a ±0 result (a
// zero or a subnormal input) tests its inputs' bits, on the integers because VFPCLASSPS follows
// MXCSR.DAZ.
inline __m256i f32x16_to_bf16(__m512 x) {
  const __m256i fast = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  if (_mm256_testn_epi16_mask(fast, _mm256_set1_epi16(0x7FFF)) == 0) [[likely]]
    return fast;
  const __m512i bits = _mm512_castps_si512(x);
  if (convert_detail::subnormal_lanes(bits) == 0) return fast;
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(high, convert_detail::set1_u32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, convert_detail::set1_u32(0x7FFF))), 16);
  const __m512i abs_bits = _mm512_and_si512(bits, convert_detail::set1_u32(0x7FFFFFFFu));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs_bits, convert_detail::set1_u32(0x7F800000u));
  const __m512i quiet = _mm512_or_si512(high, convert_detail::set1_u32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

// f32x16_to_bf16 of 32 values (lo: 0..15, hi: 16..31) in one 512-bit vector: one conversion
// instruction and one branch for both (a vector pair holding a subnormal takes the integer path).
inline __m512i f32x32_to_bf16(__m512 lo, __m512 hi) {
  const __m512i fast = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  if (_mm512_testn_epi16_mask(fast, _mm512_set1_epi16(0x7FFF)) == 0) [[likely]]
    return fast;
  if ((convert_detail::subnormal_lanes(_mm512_castps_si512(lo)) |
       convert_detail::subnormal_lanes(_mm512_castps_si512(hi))) == 0)
    return fast;
  return _mm512_inserti64x4(_mm512_castsi256_si512(f32x16_to_bf16(lo)), f32x16_to_bf16(hi), 1);
}

// numeric::f32_to_bf16_round_odd of 32 values (lo: 0..15, hi: 16..31): the high and the low
// words of the f32s gathered by two word permutes, and the low word's "nonzero" (an unsigned min
// with 1) ORed into the high one's lowest bit. Four operations for 32 values.
inline __m512i f32x32_to_bf16_round_odd(__m512 lo, __m512 hi) {
  const __m512i high_words =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                       25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i a = _mm512_castps_si512(lo), b = _mm512_castps_si512(hi);
  const __m512i high = _mm512_permutex2var_epi16(a, high_words, b);
  const __m512i low =
      _mm512_permutex2var_epi16(a, _mm512_sub_epi16(high_words, _mm512_set1_epi16(1)), b);
  return _mm512_or_si512(high, _mm512_min_epu16(low, _mm512_set1_epi16(1)));
}

// f32x32_to_bf16_round_odd of 32 values given in pairs (even: values 0, 2, .., 30; odd: 1, 3, ..,
// 31), as Simd::load_bf16_pairs splits bf16 rows: a pair is one dword of the result, the high
// words of the two lanes blended, each ORed with its low word's sticky bit. Six operations and no
// permutes, where the in-order form's two word permutes cost more.
inline __m512i f32x32_pairs_to_bf16_round_odd(__m512 even, __m512 odd) {
  const __m512i e = _mm512_castps_si512(even), o = _mm512_castps_si512(odd);
  constexpr __mmask32 kLowWords = 0x55555555u;
  const __m512i high = _mm512_mask_blend_epi16(kLowWords, o, _mm512_srli_epi32(e, 16));
  const __m512i low = _mm512_mask_blend_epi16(kLowWords, _mm512_slli_epi32(o, 16), e);
  return _mm512_or_si512(high, _mm512_min_epu16(low, _mm512_set1_epi16(1)));
}

inline __m128i f32x16_to_e4m3(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs_bits = _mm512_and_si512(bits, convert_detail::set1_u32(0x7FFFFFFFu));
  const __m512i code = convert_detail::f32x16_to_small_float<3, -6>(abs_bits);
  return convert_detail::finish_small_float(code, bits, abs_bits, 0x7E);  // saturate at 448
}

// ---- bf16 -> e4m3 with a power-of-two scale, on 32 16-bit lanes ----
//
// f32x16_to_e4m3(bf16 value * 2^k) is plain integer arithmetic on the bf16 bits wherever the
// scaled magnitude is an e4m3 normal that does not saturate: the product is exact in f32, so only
// the e4m3 rounding remains, and the 7-bit bf16 mantissa rounds to 3 bits by the same integer RNE
// (add 7 + the kept lsb, shift by 4) once the exponent field is rebiased by k - 120 (bf16 bias 127,
// e4m3 bias 7). That range is |x| * 2^k in [2^-6, 464] (464 rounds to 448, the largest code);
// zeros, e4m3 subnormals, values that saturate, inf and NaN are the caller's to convert otherwise.
struct Bf16ToE4m3Pow2 {
  __m512i round_bias;  // (k - 120) * 128 + 7: rebias and the round-half-down constant
  __m512i low;         // bits of 2^(-6-k), the smallest magnitude in range
  __m512i span;        // (bits of the largest magnitude in range) + 1 - low
  // The conversion's other constants, made here once per scale: GCC otherwise rebuilt each one
  // (a move and a broadcast) at every use inside a caller's loop (hot e4m3 cast 1.17x).
  __m512i abs_mask = convert_detail::opaque(_mm512_set1_epi16(0x7FFF));
  __m512i one = convert_detail::opaque(_mm512_set1_epi16(1));
  __m512i sign_bit = convert_detail::opaque(_mm512_set1_epi16(0x80));
};

// k in [-126, 120]: 2^k is an f32 normal and 2^(-6-k) a bf16 normal.
inline Bf16ToE4m3Pow2 bf16_to_e4m3_pow2(int k) {
  const int low = (121 - k) * 128;
  const int high = 0x43E9 - k * 128;  // bf16 464 is 0x43E8
  const int end = high < 0x7F80 ? high : 0x7F80;
  Bf16ToE4m3Pow2 c;
  c.round_bias = _mm512_set1_epi16(static_cast<int16_t>((k - 120) * 128 + 7));
  c.low = _mm512_set1_epi16(static_cast<int16_t>(low));
  c.span = _mm512_set1_epi16(static_cast<int16_t>(end - low));
  return c;
}

// The same for 16 f32 (x * 2^k, rounded from 23 mantissa bits to 3): the lanes with |x| * 2^k in
// [2^-6, 464] are rebiased and rounded on the integer bits.
struct F32ToE4m3Pow2 {
  __m512i round_bias;  // (k - 120) * 2^23 + 2^19 - 1
  __m512i low;         // bits of 2^(-6-k)
  __m512i span;        // (bits of 464 * 2^-k) + 1 - low, at most up to inf
  // As in Bf16ToE4m3Pow2: the other constants, made once per scale.
  __m512i abs_mask = convert_detail::opaque(convert_detail::set1_u32(0x7FFFFFFFu));
  __m512i one = convert_detail::opaque(convert_detail::set1_u32(1));
  __m512i sign_bit = convert_detail::opaque(convert_detail::set1_u32(0x80));
};

inline F32ToE4m3Pow2 f32_to_e4m3_pow2(int k) {
  const uint32_t low = static_cast<uint32_t>(121 - k) << 23;
  const int64_t high =
      int64_t{0x43E80001} - int64_t{k} * (int64_t{1} << 23);  // f32 464: 0x43E80000
  const uint32_t end = static_cast<uint32_t>(high < 0x7F800000 ? high : 0x7F800000);
  F32ToE4m3Pow2 c;
  c.round_bias =
      convert_detail::set1_u32(static_cast<uint32_t>((k - 120) * (1 << 23) + (1 << 19) - 1));
  c.low = convert_detail::set1_u32(low);
  c.span = convert_detail::set1_u32(end - low);
  return c;
}

namespace convert_detail {

// The e4m3 codes of x * 2^k in the low byte of each 32-bit lane, the other bytes zero, for the
// lanes in range (see F32ToE4m3Pow2); `offset` gets |x|'s bits minus those of the range's low
// end, which are at least c.span (unsigned) exactly where a lane is out of range.
inline __m512i f32x16_to_e4m3_pow2_words(__m512 x, const F32ToE4m3Pow2& c, __m512i* offset) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs_bits = _mm512_and_si512(bits, c.abs_mask);
  *offset = _mm512_sub_epi32(abs_bits, c.low);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs_bits, 20), c.one);
  const __m512i code =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(abs_bits, lsb), c.round_bias), 20);
  const __m512i sign = _mm512_srli_epi32(bits, 24);
  return _mm512_ternarylogic_epi32(code, sign, c.sign_bit, 0xF8);
}

// f32x16_to_e4m3_pow2_words of four vectors into words[0..3]; nonzero if a lane of any of them is
// out of range.
// NOTES: one compare of the offsets' unsigned maximum (three VPMAXUD) instead of four compares
// measured the same (per_block_cast and RMSNorm + cast, hot, one thread): GCC ORs the four masks
// in general registers, likely off the vector ports that bound these loops.
inline __mmask16 f32x64_to_e4m3_pow2_words(__m512 x0, __m512 x1, __m512 x2, __m512 x3,
                                           const F32ToE4m3Pow2& c, __m512i words[4]) {
  __m512i o0, o1, o2, o3;
  words[0] = f32x16_to_e4m3_pow2_words(x0, c, &o0);
  words[1] = f32x16_to_e4m3_pow2_words(x1, c, &o1);
  words[2] = f32x16_to_e4m3_pow2_words(x2, c, &o2);
  words[3] = f32x16_to_e4m3_pow2_words(x3, c, &o3);
  return static_cast<__mmask16>(
      _mm512_cmpge_epu32_mask(o0, c.span) | _mm512_cmpge_epu32_mask(o1, c.span) |
      _mm512_cmpge_epu32_mask(o2, c.span) | _mm512_cmpge_epu32_mask(o3, c.span));
}

// 64 bytes picked by one VPERMT2B index from two pairs of sources: bytes 0..31 from (a, b), bytes
// 32..63 from (c, d), each the low 32 bytes of _mm512_permutex2var_epi8(first, index, second).
inline __m512i bytes_of_two_pairs(__m512i index, __m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i low = _mm512_permutex2var_epi8(a, index, b);
  const __m512i high = _mm512_permutex2var_epi8(c, index, d);
  return _mm512_inserti64x4(low, _mm512_castsi512_si256(high), 1);
}

}  // namespace convert_detail

inline __m128i f32x16_to_e4m3_pow2(__m512 x, const F32ToE4m3Pow2& c, __mmask16* out_of_range) {
  __m512i offset;
  const __m512i words = convert_detail::f32x16_to_e4m3_pow2_words(x, c, &offset);
  *out_of_range = _mm512_cmpge_epu32_mask(offset, c.span);
  return _mm512_cvtepi32_epi8(words);
}

// f32x16_to_e4m3_pow2 of 64 values (x0: values 0..15, x1: 16..31, ...), the 64 codes in order.
// The code words are narrowed by two rounds of unsigned saturating packs (codes are at most 0xFF)
// and one dword permute that undoes the packs' interleaving of 128-bit lanes: three operations
// for 64 values where VPMOVDB, two micro-ops, narrows 16 (12% faster from L1 on Zen 5).
// `out_of_range` is nonzero if a lane of any of the four is out of range.
inline __m512i f32x64_to_e4m3_pow2(__m512 x0, __m512 x1, __m512 x2, __m512 x3,
                                   const F32ToE4m3Pow2& c, __mmask16* out_of_range) {
  __m512i w[4];
  *out_of_range = convert_detail::f32x64_to_e4m3_pow2_words(x0, x1, x2, x3, c, w);
  // Each 128-bit lane j of the packed bytes holds dwords j of w[0], w[1], w[2], w[3] in order.
  const __m512i packed =
      _mm512_packus_epi16(_mm512_packus_epi32(w[0], w[1]), _mm512_packus_epi32(w[2], w[3]));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, packed);
}

// f32x64_to_e4m3_pow2 of 64 values given in pairs, as Simd::load_bf16_pairs splits bf16 rows:
// e0 holds values 0, 2, .., 30, o0 values 1, 3, .., 31, and e1, o1 the same of values 32 .. 63.
// Two VPERMT2B interleave the code bytes and one insert joins the halves, so the pairs cost no
// more to narrow than f32x64_to_e4m3_pow2's packs; loading a bf16 row in pairs takes one load
// and two operations per 32 values where widening takes two loads and four operations.
inline __m512i f32x64_pairs_to_e4m3_pow2(__m512 e0, __m512 o0, __m512 e1, __m512 o1,
                                         const F32ToE4m3Pow2& c, __mmask16* out_of_range) {
  __m512i w[4];  // even, odd, even, odd
  *out_of_range = convert_detail::f32x64_to_e4m3_pow2_words(e0, o0, e1, o1, c, w);
  // Byte 2i: byte 4i of the even codes; byte 2i + 1: byte 4i of the odd ones (index 64 + 4i).
  const __m512i index = _mm512_set_epi8(
      124, 60, 120, 56, 116, 52, 112, 48, 108, 44, 104, 40, 100, 36, 96, 32, 92, 28, 88, 24, 84, 20,
      80, 16, 76, 12, 72, 8, 68, 4, 64, 0, 124, 60, 120, 56, 116, 52, 112, 48, 108, 44, 104, 40,
      100, 36, 96, 32, 92, 28, 88, 24, 84, 20, 80, 16, 76, 12, 72, 8, 68, 4, 64, 0);
  return convert_detail::bytes_of_two_pairs(index, w[0], w[1], w[2], w[3]);
}

// 32 bf16 (the words of x) -> 32 e4m3 codes of x * 2^k; `out_of_range` gets the lanes outside
// the range above, whose codes are not meaningful.
inline __m256i bf16x32_to_e4m3_pow2(__m512i x, const Bf16ToE4m3Pow2& c, __mmask32* out_of_range) {
  const __m512i abs_bits = _mm512_and_si512(x, c.abs_mask);
  *out_of_range = _mm512_cmpge_epu16_mask(_mm512_sub_epi16(abs_bits, c.low), c.span);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(x, 4), c.one);
  // In range the sum stays below 2^15, so the sign bit of x passes through to bit 11 of the code
  // word, which the truncating narrowing drops; bit 7 gets the sign.
  const __m512i code =
      _mm512_srli_epi16(_mm512_add_epi16(_mm512_add_epi16(x, lsb), c.round_bias), 4);
  const __m512i sign = _mm512_srli_epi16(x, 8);
  return _mm512_cvtepi16_epi8(_mm512_ternarylogic_epi32(code, sign, c.sign_bit, 0xF8));
}

// ---- bf16 -> e2m1 with a power-of-two scale, on 32 16-bit lanes ----
//
// f32x16_to_e2m1(x * 2^k) counts the thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 that
// |x| * 2^k exceeds. For k in [-125, 124] that count is read off the bf16 bits of |x| with k
// added to the exponent field by unsigned saturating arithmetic: where the sum is a normal it is
// |x| * 2^k exactly (an exact product in f32); where it saturates at 0 or 0xFFFF the product is
// below 0.25 or above 5 (or inf) anyway; and a bf16 subnormal x gives a sum below 0x3E80 (0.25),
// as its product is. For non-negative bf16 integer order is value order, so the thresholds are
// compared as integers. As in the rule, NaN codes 0 and a negative value its magnitude's code
// with bit 3 set unless that code is 0.
// The exponent field moves up by `up` and down by `down` words, one of them 0: both are applied,
// with no branch on the sign of k.
struct Bf16ToE2m1Pow2 {
  __m512i up;    // max(k, 0) * 128 in every word
  __m512i down;  // max(-k, 0) * 128 in every word
};

inline Bf16ToE2m1Pow2 bf16_to_e2m1_pow2(int k) {
  return {_mm512_set1_epi16(static_cast<int16_t>((k > 0 ? k : 0) * 128)),
          _mm512_set1_epi16(static_cast<int16_t>((k < 0 ? -k : 0) * 128))};
}

// 32 bf16 (the words of x) -> 16 dwords whose low byte is the e2m1 codes of a pair of x * 2^k
// (even value in the low nibble; the other bytes are not zero). The threshold count is one
// VPERMI2W lookup of the scaled bits' bucket, the sign selecting the table's upper half
// (convert_detail::kE2m1CodeTable); it replaced seven compares and masked adds.
inline __m512i bf16x32_to_e2m1_pow2_dwords(__m512i x, const Bf16ToE2m1Pow2& c) {
  const __m512i abs_bits = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
  const __m512i scaled = _mm512_subs_epu16(_mm512_adds_epu16(abs_bits, c.up), c.down);
  const __m512i bucket =
      _mm512_min_epu16(_mm512_srli_epi16(_mm512_subs_epu16(scaled, _mm512_set1_epi16(0x3E61)), 5),
                       _mm512_set1_epi16(31));
  // bucket | (sign bit of x moved to bit 5)
  const __m512i index =
      _mm512_ternarylogic_epi32(bucket, _mm512_srli_epi16(x, 10), _mm512_set1_epi16(0x20), 0xF8);
  const __m512i* table = reinterpret_cast<const __m512i*>(convert_detail::kE2m1CodeTable.codes);
  __m512i code =
      _mm512_permutex2var_epi16(_mm512_load_si512(table), index, _mm512_load_si512(table + 1));
  const __mmask32 number = _mm512_cmple_epu16_mask(abs_bits, _mm512_set1_epi16(0x7F80));
  code = _mm512_maskz_mov_epi16(number, code);
  // Words (even, odd) of each 32-bit lane -> even | odd << 4 in its low byte.
  return _mm512_or_si512(code, _mm512_srli_epi32(code, 12));
}

// 32 bf16 (the words of x) -> 16 bytes of e2m1 codes of x * 2^k (even value in the low nibble).
inline __m128i bf16x32_to_e2m1_pow2(__m512i x, const Bf16ToE2m1Pow2& c) {
  return _mm512_cvtepi32_epi8(bf16x32_to_e2m1_pow2_dwords(x, c));
}

// The low bytes of the dwords of a, b, c and d, in that order: 64 bytes from two VPERMT2B and one
// lane insert, where four VPMOVDB (two micro-ops each) and four 16-byte stores narrowed them.
inline __m512i low_bytes_of_dwords_x4(__m512i a, __m512i b, __m512i c, __m512i d) {
  // Byte i < 16: byte 4i of the first source; byte 16 + i: byte 4i of the second (index 64 + 4i).
  const __m512i index = _mm512_set_epi8(
      124, 120, 116, 112, 108, 104, 100, 96, 92, 88, 84, 80, 76, 72, 68, 64, 60, 56, 52, 48, 44, 40,
      36, 32, 28, 24, 20, 16, 12, 8, 4, 0, 124, 120, 116, 112, 108, 104, 100, 96, 92, 88, 84, 80,
      76, 72, 68, 64, 60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
  return convert_detail::bytes_of_two_pairs(index, a, b, c, d);
}

inline __m128i f32x16_to_e5m2(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs_bits = _mm512_and_si512(bits, convert_detail::set1_u32(0x7FFFFFFFu));
  const __m512i code = convert_detail::f32x16_to_small_float<2, -14>(abs_bits);
  return convert_detail::finish_small_float(code, bits, abs_bits, 0x7C);  // overflow to inf
}

// An e5m2 code is the high byte of the f16 with the same value.
inline __m512 e5m2x16_to_f32(__m128i codes) {
  return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(codes), 8));
}

inline __m512 f16x16_to_f32(__m256i x) {
  return _mm512_cvtph_ps(x);
}

inline __m256i f32x16_to_f16(__m512 x) {
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// The low 8 bytes of `packed` (16 e2m1 values, low nibble first) -> 16 f32.
inline __m512 e2m1x16_to_f32(__m128i packed) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(packed, packed));
  const __m512i shift = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
  // VPERMPS reads only the low 4 bits of each index: no mask needed after the shift.
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(bytes, shift),
                               _mm512_load_ps(convert_detail::kE2m1Tables.f32));
}

// 16 packed bytes (32 e2m1 values) -> 32 bf16.
inline __m512i e2m1x32_to_bf16(__m128i packed) {
  const __m256i doubled =
      _mm256_set_m128i(_mm_unpackhi_epi8(packed, packed), _mm_unpacklo_epi8(packed, packed));
  const __m512i shift = _mm512_set1_epi32(0x00040000);  // 0 for even words, 4 for odd words
  const __m512i nibbles = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(doubled), shift);
  // VPERMW reads 5 index bits; the table repeats its 16 entries so bit 4 does not matter.
  return _mm512_permutexvar_epi16(nibbles, _mm512_load_si512(convert_detail::kE2m1Tables.bf16));
}

// 16 f32 -> 8 packed bytes (in the low half): the number of DeepGEMM thresholds below |x|, sign
// only for a non-zero magnitude, NaN -> +0.
inline __m128i f32x16_to_e2m1(__m512 x) {
  constexpr float kThresholds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const __m512 a = _mm512_abs_ps(x);
  const __m512i one = convert_detail::set1_u32(1);
  __m512i code = _mm512_setzero_si512();
  for (float t : kThresholds)
    code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(t), _CMP_GT_OQ), code,
                                 one);
  const __mmask16 negative =
      _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ) & _mm512_test_epi32_mask(code, code);
  code = _mm512_mask_or_epi32(code, negative, code, convert_detail::set1_u32(0x8));
  // Each 64-bit lane holds (even, odd): move the odd code next to the even one, keep the low byte.
  return _mm512_cvtepi64_epi8(_mm512_or_si512(code, _mm512_srli_epi64(code, 28)));
}

// ---- AVX-512 array loops (full vectors, then one masked tail) ----

namespace convert_detail {

inline __mmask16 tail_mask16(size_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);  // n < 16
}
inline __mmask32 tail_mask32(size_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << n) - 1u);
}
inline __mmask64 tail_mask64(size_t n) {
  return n >= 64 ? ~__mmask64{0} : (uint64_t{1} << n) - 1u;
}

inline void convert_n_avx512(const float* src, bf16* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        f32x16_to_bf16(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm256_mask_storeu_epi16(dst + i, m, f32x16_to_bf16(_mm512_maskz_loadu_ps(m, src + i)));
}

inline void convert_n_avx512(const bf16* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i,
                     bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm512_mask_storeu_ps(dst + i, m, bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, src + i)));
}

inline void convert_n_avx512(const float* src, f16* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        f32x16_to_f16(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm256_mask_storeu_epi16(dst + i, m, f32x16_to_f16(_mm512_maskz_loadu_ps(m, src + i)));
}

inline void convert_n_avx512(const f16* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i,
                     f16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm512_mask_storeu_ps(dst + i, m, f16x16_to_f32(_mm256_maskz_loadu_epi16(m, src + i)));
}

inline void convert_n_avx512(const float* src, e4m3* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), f32x16_to_e4m3(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm_mask_storeu_epi8(dst + i, m, f32x16_to_e4m3(_mm512_maskz_loadu_ps(m, src + i)));
}

inline void convert_n_avx512(const float* src, e5m2* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), f32x16_to_e5m2(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm_mask_storeu_epi8(dst + i, m, f32x16_to_e5m2(_mm512_maskz_loadu_ps(m, src + i)));
}

inline void convert_n_avx512(const e5m2* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i,
                     e5m2x16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (i == n) return;
  const __mmask16 m = tail_mask16(n - i);
  _mm512_mask_storeu_ps(dst + i, m, e5m2x16_to_f32(_mm_maskz_loadu_epi8(m, src + i)));
}

inline void convert_n_avx512(const e4m3* src, bf16* dst, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const Bf16x64 r = e4m3x64_to_bf16(_mm512_loadu_si512(src + i));
    _mm512_storeu_si512(dst + i, r.first);
    _mm512_storeu_si512(dst + i + 32, r.second);
  }
  if (i == n) return;
  const size_t rest = n - i;
  const Bf16x64 r = e4m3x64_to_bf16(_mm512_maskz_loadu_epi8(tail_mask64(rest), src + i));
  _mm512_mask_storeu_epi16(dst + i, tail_mask32(rest), r.first);
  if (rest > 32) _mm512_mask_storeu_epi16(dst + i + 32, tail_mask32(rest - 32), r.second);
}

// Widens up to 16 bf16 (the words of `half`) to f32 at dst; `count` <= 16 values are stored.
inline void store_bf16_as_f32(float* dst, __m256i half, size_t count) {
  if (count >= 16)
    _mm512_storeu_ps(dst, bf16x16_to_f32(half));
  else
    _mm512_mask_storeu_ps(dst, tail_mask16(count), bf16x16_to_f32(half));
}

// Stores the first `count` (<= 64) values of a converted 64-value block as f32.
inline void store_bf16x64_as_f32(float* dst, const Bf16x64& r, size_t count) {
  const __m256i quarters[4] = {
      _mm512_castsi512_si256(r.first), _mm512_extracti64x4_epi64(r.first, 1),
      _mm512_castsi512_si256(r.second), _mm512_extracti64x4_epi64(r.second, 1)};
  for (size_t q = 0; q < 4 && 16 * q < count; ++q)
    store_bf16_as_f32(dst + 16 * q, quarters[q], count - 16 * q);
}

// Through bf16 (exact): one table lookup serves 64 values instead of 16.
inline void convert_n_avx512(const e4m3* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    store_bf16x64_as_f32(dst + i, e4m3x64_to_bf16(_mm512_loadu_si512(src + i)), 64);
  if (i == n) return;
  const size_t rest = n - i;
  store_bf16x64_as_f32(dst + i,
                       e4m3x64_to_bf16(_mm512_maskz_loadu_epi8(tail_mask64(rest), src + i)), rest);
}

inline void convert_n_avx512(const float* src, fp4x2* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i / 2),
                     f32x16_to_e2m1(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const size_t rest = n - i;  // even
  const __m128i packed = f32x16_to_e2m1(_mm512_maskz_loadu_ps(tail_mask16(rest), src + i));
  _mm_mask_storeu_epi8(dst + i / 2, tail_mask16(rest / 2), packed);
}

inline void convert_n_avx512(const fp4x2* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(
        dst + i, e2m1x16_to_f32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i / 2))));
  if (i == n) return;
  const size_t rest = n - i;  // even
  const __m512 values = e2m1x16_to_f32(_mm_maskz_loadu_epi8(tail_mask16(rest / 2), src + i / 2));
  _mm512_mask_storeu_ps(dst + i, tail_mask16(rest), values);
}

inline void convert_n_avx512(const fp4x2* src, bf16* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(
        dst + i, e2m1x32_to_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i / 2))));
  if (i == n) return;
  const size_t rest = n - i;  // even
  const __m512i values = e2m1x32_to_bf16(_mm_maskz_loadu_epi8(tail_mask16(rest / 2), src + i / 2));
  _mm512_mask_storeu_epi16(dst + i, tail_mask32(rest), values);
}

}  // namespace convert_detail

#endif  // DSK_TILE_HAS_AVX512

// ---- arrays: n values from src to dst with the ISA's best converter ----

// Supported pairs: f32 <-> bf16, f32 <-> f16, f32 <-> e4m3, e4m3 -> bf16, f32 <-> e5m2,
// f32 <-> fp4x2 and fp4x2 -> bf16. `n` counts values; for fp4x2 it must be even (n/2 bytes).
// avx512_t and amx_t need a translation unit compiled with the AVX-512 flags.
template <Isa I, class Src, class Dst>
inline void convert_n(const Src* src, Dst* dst, size_t n) {
  if constexpr (std::is_same_v<I, generic_t>) {
    convert_detail::convert_n_generic(src, dst, n);
  } else {
#if DSK_TILE_HAS_AVX512
    convert_detail::convert_n_avx512(src, dst, n);
#else
    static_assert(
        convert_detail::always_false<I>,
        "convert_n<avx512_t|amx_t> needs AVX-512 with VBMI and F16C in this translation unit");
#endif
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile

DSK_SILENCE_GCC_BUG_105593_END
