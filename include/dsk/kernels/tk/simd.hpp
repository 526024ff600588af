// Simd<Isa>: 16-lane f32 / int32 vectors that the tk kernels are written in once, with two
// implementations that give bitwise identical results: portable C++ (generic_t, one loop per
// operation) and AVX-512 (avx512_t; amx_t uses it too, see tile::vector_isa_t).
//
// Every operation is one IEEE operation per lane, rounded to nearest even (fma is explicit, never
// contracted; no approximate reciprocals), and the operations whose x86 semantics are not symmetric
// are defined by them on both implementations:
//   max(a, b) = a > b ? a : b      (VMAXPS: b when either is NaN, and b for +-0 pairs)
//   min(a, b) = a < b ? a : b      (VMINPS)
//   reduce_add / reduce_max combine lanes in one fixed tree: i with i+8, then i+4, i+2, i+1.
// Narrowing stores use the rules of dsk/kernels/numeric.hpp (through tile/convert.hpp).
//
// Header-only; the AVX-512 implementation needs the avx512 baseline of dsk/kernels/abi.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/isa.hpp>

#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

// The hot helpers of the tk kernels are always inlined on AVX-512, so that the compile-time shapes
// of AOT instances reach their loops and no call goes through the shared library's PLT. The
// generic backend leaves the choice to the compiler: forced inlining of its emulated vectors made
// src/tk/kernels_generic.cpp take 260 s to compile (470 s under the sanitizers), every row kernel
// one huge function, and `dsk bench tk` on an AMD Zen 3 ran the same within its noise.
#if DSK_TILE_HAS_AVX512
#define DSK_TK_INLINE __attribute__((always_inline)) inline
#else
#define DSK_TK_INLINE inline
#endif

namespace dsk::tk::kernels {
inline namespace DSK_TILE_ABI {

// Lane masks: bit i is lane i.
using Mask16 = uint32_t;

inline constexpr Mask16 first_lanes(int n) {
  return n >= 16 ? 0xFFFFu : ((1u << n) - 1u);
}

// Prefetches p + ahead (elements; the same columns of the next row, say) into L1 (kLocality 3)
// or L2 (2). The rows' math is slower than the memory, and without it the row's loads miss and
// the core waits, a demand miss at a time. (Integer addresses: after the last row the address is
// past the tensor, harmless for a prefetch but not a valid pointer.)
template <int kLocality = 3, class T>
DSK_TK_INLINE void prefetch_ahead(const T* p, int64_t ahead) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) +
                                                   static_cast<uintptr_t>(ahead) * sizeof(T)),
                     0, kLocality);
}

// The exponent k of inv when inv = 2^k with k in [kMinPow2, 120] (what Simd::e4m3_pow2 takes
// with the default -126; e2m1's thresholds need -125), else kNotPow2. With UE8M0 scales every
// finite block has such an inverse scale. pow2_lanes is the same test on 16 lanes.
inline constexpr int kNotPow2 = 1 << 30;
template <int kMinPow2 = -126>
DSK_TK_INLINE int pow2_exponent(float inv) {
  const uint32_t b = numeric::bits_of(inv);
  const int e = static_cast<int>(b >> 23);
  return (b & 0x807FFFFFu) == 0 && e >= kMinPow2 + 127 && e <= 247 ? e - 127 : kNotPow2;
}

template <class I>
struct Simd;

// ---------------------------------------------------------------------------------------------
// Portable C++.
template <>
struct Simd<tile::generic_t> {
  struct F {
    float v[16];
  };
  struct I32 {
    int32_t v[16];
  };

  // ---- f32: construction, loads and stores (T is float, bf16 or f16) ----
  static F set1(float x) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = x;
    return r;
  }
  static F zero() { return set1(0.0f); }

  template <class T>
  static float widen(T x) {
    if constexpr (std::is_same_v<T, float>)
      return x;
    else
      return tile::convert_scalar<float>(x);
  }
  template <class T>
  static T narrow(float x) {
    if constexpr (std::is_same_v<T, float>)
      return x;
    else
      return tile::convert_scalar<T>(x);
  }

  template <class T>
  static F load(const T* p) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = widen(p[i]);
    return r;
  }
  // The first n (0..16) values; the other lanes read 0.
  template <class T>
  static F load_n(const T* p, int n) {
    F r = zero();
    for (int i = 0; i < n; ++i) r.v[i] = widen(p[i]);
    return r;
  }
  template <class T>
  static void store(T* p, F x) {
    for (int i = 0; i < 16; ++i) p[i] = narrow<T>(x.v[i]);
  }
  template <class T>
  static void store_n(T* p, F x, int n) {
    for (int i = 0; i < n; ++i) p[i] = narrow<T>(x.v[i]);
  }
  // 32 values: store(p, lo), store(p + 16, hi).
  template <class T>
  static void store2(T* p, F lo, F hi) {
    store(p, lo);
    store(p + 16, hi);
  }
  // 32 values rounded to odd (numeric::f32_to_bf16_round_odd): lo to p, hi to p + 16.
  static void store_bf16_round_odd(bf16* p, F lo, F hi) {
    for (int i = 0; i < 16; ++i) {
      p[i] = numeric::f32_to_bf16_round_odd(lo.v[i]);
      p[16 + i] = numeric::f32_to_bf16_round_odd(hi.v[i]);
    }
  }
  // 32 values in load_bf16_pairs' split (even.v[i] is value 2i, odd.v[i] value 2i + 1) rounded
  // to odd, in order.
  static void store_bf16_pairs_round_odd(bf16* p, F even, F odd) {
    for (int i = 0; i < 16; ++i) {
      p[2 * i] = numeric::f32_to_bf16_round_odd(even.v[i]);
      p[2 * i + 1] = numeric::f32_to_bf16_round_odd(odd.v[i]);
    }
  }
  // 32 bf16 split by position: even gets values 0, 2, .., 30 and odd 1, 3, .., 31. For
  // element-wise math whose lane order does not matter: a bf16 pair is one 32-bit word, so the
  // split costs one operation per 16 values where load() widens with two.
  static void load_bf16_pairs(const bf16* p, F* even, F* odd) {
    for (int i = 0; i < 16; ++i) {
      even->v[i] = widen(p[2 * i]);
      odd->v[i] = widen(p[2 * i + 1]);
    }
  }
  // The same split of 32 f32 values.
  static void load_f32_pairs(const float* p, F* even, F* odd) {
    for (int i = 0; i < 16; ++i) {
      even->v[i] = p[2 * i];
      odd->v[i] = p[2 * i + 1];
    }
  }
  // The inverse for any T: p[2i] = even[i], p[2i + 1] = odd[i] (e4m3 saturating, RNE).
  template <class T>
  static void store_pairs(T* p, F even, F odd) {
    for (int i = 0; i < 16; ++i) {
      if constexpr (std::is_same_v<T, e4m3>) {
        p[2 * i] = numeric::f32_to_e4m3(even.v[i]);
        p[2 * i + 1] = numeric::f32_to_e4m3(odd.v[i]);
      } else {
        p[2 * i] = narrow<T>(even.v[i]);
        p[2 * i + 1] = narrow<T>(odd.v[i]);
      }
    }
  }
  // 16 e4m3 codes (saturating, RNE).
  static void store_e4m3(e4m3* p, F x) { store_e4m3_n(p, x, 16); }
  static void store_e4m3_n(e4m3* p, F x, int n) {
    for (int i = 0; i < n; ++i) p[i] = numeric::f32_to_e4m3(x.v[i]);
  }
  // 16 e2m1 codes packed into 8 bytes; n (even) values, n / 2 bytes.
  static void store_e2m1(fp4x2* p, F x) { store_e2m1_n(p, x, 16); }
  static void store_e2m1_n(fp4x2* p, F x, int n) {
    for (int i = 0; i < n / 2; ++i)
      p[i] = numeric::pack_e2m1(numeric::f32_to_e2m1(x.v[2 * i]),
                                numeric::f32_to_e2m1(x.v[2 * i + 1]));
  }
  // 16 e4m3 codes (n of them) widened to f32.
  static F load_e4m3_n(const e4m3* p, int n) {
    F r = zero();
    for (int i = 0; i < n; ++i) r.v[i] = numeric::e4m3_to_f32(p[i]);
    return r;
  }
  // ---- bf16 rows to e4m3, 32 values at a time (quant.hpp) ----
  // A running max of |x| over bf16 values, as their abs bits (NaN above inf, as Amax).
  struct Bf16AbsMax {
    uint16_t bits = 0;
  };
  static Bf16AbsMax bf16_absmax_zero() { return {}; }
  static Bf16AbsMax bf16_absmax_add(Bf16AbsMax m, const bf16* p) {
    for (int i = 0; i < 32; ++i) {
      const uint16_t a = p[i].bits & 0x7FFFu;
      m.bits = a > m.bits ? a : m.bits;
    }
    return m;
  }
  // The f32 bits of the maximum (a bf16 is the high half of its f32).
  static int32_t bf16_absmax_f32_bits(Bf16AbsMax m) { return static_cast<int32_t>(m.bits) << 16; }
  // bf16_absmax_f32_bits of m[0..15] into out[0..15].
  static void bf16_absmax16_f32_bits(const Bf16AbsMax* m, int32_t* out) {
    for (int i = 0; i < 16; ++i) out[i] = bf16_absmax_f32_bits(m[i]);
  }
  // 32 e4m3 codes of x * scale, scale = 2^k with k in [-126, 120]: store_e4m3(mul(load(x), scale))
  // for both halves.
  struct E4m3Pow2 {
    float scale;
  };
  static E4m3Pow2 e4m3_pow2(int k) {
    return {numeric::float_of(static_cast<uint32_t>(k + 127) << 23)};
  }
  static void store_e4m3_bf16x32_pow2(e4m3* p, const bf16* x, const E4m3Pow2& s) {
    for (int i = 0; i < 32; ++i) p[i] = numeric::f32_to_e4m3(numeric::bf16_to_f32(x[i]) * s.scale);
  }
  // 16 e4m3 codes of x * scale: store_e4m3(p, mul(x, scale)).
  static void store_e4m3_pow2(e4m3* p, F x, const E4m3Pow2& s) {
    for (int i = 0; i < 16; ++i) p[i] = numeric::f32_to_e4m3(x.v[i] * s.scale);
  }
  // 64 e4m3 codes: store_e4m3_pow2 of x0, x1, x2, x3 to p, p + 16, p + 32, p + 48.
  static void store_e4m3_pow2_x64(e4m3* p, F x0, F x1, F x2, F x3, const E4m3Pow2& s) {
    store_e4m3_pow2(p, x0, s);
    store_e4m3_pow2(p + 16, x1, s);
    store_e4m3_pow2(p + 32, x2, s);
    store_e4m3_pow2(p + 48, x3, s);
  }
  // 64 e4m3 codes of the products of 64 bf16 and f: store_e4m3_pow2_x64 of mul(load(x + 16i), f).
  // `stream`: the AVX-512 backend may write them around the caches (then stream_fence).
  static void store_e4m3_pow2_bf16x64_times(e4m3* p, const bf16* x, F f, const E4m3Pow2& s,
                                            bool /*stream*/) {
    for (int i = 0; i < 4; ++i) store_e4m3_pow2(p + 16 * i, mul(load(x + 16 * i), f), s);
  }
  static void stream_fence() {}
  // 32 e2m1 codes (16 bytes) of x * scale, scale = 2^k with k in [-125, 124]:
  // store_e2m1(mul(load(x), scale)) for both halves.
  struct E2m1Pow2 {
    float scale;
  };
  static E2m1Pow2 e2m1_pow2(int k) {
    return {numeric::float_of(static_cast<uint32_t>(k + 127) << 23)};
  }
  static void store_e2m1_bf16x32_pow2(fp4x2* p, const bf16* x, const E2m1Pow2& s) {
    for (int i = 0; i < 16; ++i)
      p[i] = numeric::pack_e2m1(numeric::f32_to_e2m1(numeric::bf16_to_f32(x[2 * i]) * s.scale),
                                numeric::f32_to_e2m1(numeric::bf16_to_f32(x[2 * i + 1]) * s.scale));
  }
  // e2m1_pow2 of 16 blocks at once, from their inverse scales: false, with nothing usable, unless
  // every inv[b] is 2^k with k in [-125, 120] (the range the row quantizers give this path).
  struct E2m1Pow2x16 {
    E2m1Pow2 block[16];
  };
  static bool e2m1_pow2_x16(const float* inv, E2m1Pow2x16* s) {
    for (int b = 0; b < 16; ++b) {
      const int k = pow2_exponent<-125>(inv[b]);
      if (k == kNotPow2) return false;
      s->block[b] = e2m1_pow2(k);
    }
    return true;
  }
  // Blocks b .. b + 3 (b a multiple of 4) of 32 values at x, x + 32, ..., to p, p + 16, ....
  static void store_e2m1_bf16x32_pow2_of_x4(fp4x2* p, const bf16* x, const E2m1Pow2x16& s, int b) {
    for (int i = 0; i < 4; ++i) store_e2m1_bf16x32_pow2(p + 16 * i, x + 32 * i, s.block[b + i]);
  }
  // e4m3_pow2 of 16 blocks at once, from their inverse scales: false, with nothing usable, unless
  // every inv[b] is 2^k with k in [-126, 120] (what e4m3_pow2 takes).
  struct E4m3Pow2x16 {
    E4m3Pow2 block[16];
  };
  static bool e4m3_pow2_x16(const float* inv, E4m3Pow2x16* s) {
    for (int b = 0; b < 16; ++b) {
      const int k = pow2_exponent(inv[b]);
      if (k == kNotPow2) return false;
      s->block[b] = e4m3_pow2(k);
    }
    return true;
  }
  // Block b's e4m3_pow2.
  static const E4m3Pow2& e4m3_pow2_of(const E4m3Pow2x16& s, int b) { return s.block[b]; }

  // n (even) e2m1 values from n / 2 bytes.
  static F load_e2m1_n(const fp4x2* p, int n) {
    F r = zero();
    for (int i = 0; i < n / 2; ++i) {
      r.v[2 * i] = numeric::e2m1_to_f32(numeric::e2m1_low(p[i]));
      r.v[2 * i + 1] = numeric::e2m1_to_f32(numeric::e2m1_high(p[i]));
    }
    return r;
  }

  // ---- f32 arithmetic ----
  template <class Op>
  static F map(F a, F b, Op op) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = op(a.v[i], b.v[i]);
    return r;
  }
  static F add(F a, F b) {
    return map(a, b, [](float x, float y) { return x + y; });
  }
  static F sub(F a, F b) {
    return map(a, b, [](float x, float y) { return x - y; });
  }
  static F mul(F a, F b) {
    return map(a, b, [](float x, float y) { return x * y; });
  }
  // a + x * sign for lanes of sign in {+1, -1} (the product is exact).
  static F add_signed(F a, F x, F sign) { return add(a, mul(x, sign)); }
  static F div(F a, F b) {
    return map(a, b, [](float x, float y) { return x / y; });
  }
  // a * b + c rounded once (VFMADD; std::fma is the same single rounding).
  static F fma(F a, F b, F c) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  // a * 2^floor(n) for n within int range (exp passes [-150, 150]), rounded once (VSCALEFPS;
  // ldexp is exact or, for a subnormal result, one rounding).
  static F scalef(F a, F n) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::ldexp(a.v[i], static_cast<int>(std::floor(n.v[i])));
    return r;
  }
  // a with its magnitude clamped to c (not NaN), its sign kept, as VRANGEPS's smaller magnitude
  // does: a quiet NaN a gives c with a's sign, a signaling one a quiet NaN.
  static float clamp_abs_lane(float a, float c) {
    if (a == a) return std::copysign(std::fmin(std::fabs(a), c), a);
    const uint32_t bits = numeric::bits_of(a);
    return (bits & 0x00400000u) != 0 ? std::copysign(c, a) : numeric::float_of(bits | 0x00400000u);
  }
  static F clamp_abs(F a, F c) { return map(a, c, clamp_abs_lane); }
  // table[i mod 32] in each lane (VPERMT2PS of the table's two vectors).
  static F lookup32(const float* table, I32 i) {
    F r;
    for (int k = 0; k < 16; ++k) r.v[k] = table[i.v[k] & 31];
    return r;
  }
  // With a NaN operand, max and min return the second one, as MAXPS / MINPS do.
  static F max(F a, F b) {
    return map(a, b, [](float x, float y) { return x > y ? x : y; });
  }
  static F min(F a, F b) {
    return map(a, b, [](float x, float y) { return x < y ? x : y; });
  }
  static F abs(F a) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = numeric::float_of(numeric::bits_of(a.v[i]) & 0x7FFFFFFFu);
    return r;
  }
  static F sqrt(F a) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::sqrt(a.v[i]);
    return r;
  }
  // Round to the nearest integer, ties to even (the default rounding mode).
  static F round(F a) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::nearbyint(a.v[i]);
    return r;
  }

  // ---- f32 comparisons (ordered: false when either lane is NaN) and selection ----
  template <class Op>
  static Mask16 compare(F a, F b, Op op) {
    Mask16 m = 0;
    for (int i = 0; i < 16; ++i) m |= op(a.v[i], b.v[i]) ? (1u << i) : 0u;
    return m;
  }
  static Mask16 lt(F a, F b) {
    return compare(a, b, [](float x, float y) { return x < y; });
  }
  static Mask16 gt(F a, F b) {
    return compare(a, b, [](float x, float y) { return x > y; });
  }
  static Mask16 eq(F a, F b) {
    return compare(a, b, [](float x, float y) { return x == y; });
  }
  static Mask16 isnan(F a) {
    return compare(a, a, [](float x, float y) { return x != y; });
  }
  // m ? a : b per lane.
  static F select(Mask16 m, F a, F b) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = (m >> i) & 1u ? a.v[i] : b.v[i];
    return r;
  }

  // ---- horizontal reductions in the fixed tree ----
  template <class Op>
  static float reduce(F a, Op op) {
    for (int width = 8; width >= 1; width /= 2)
      for (int i = 0; i < width; ++i) a.v[i] = op(a.v[i], a.v[i + width]);
    return a.v[0];
  }
  static float reduce_add(F a) {
    return reduce(a, [](float x, float y) { return x + y; });
  }
  static float reduce_max(F a) {
    return reduce(a, [](float x, float y) { return x > y ? x : y; });
  }
  static float lane(F a, int i) { return a.v[i]; }

  // ---- int32 ----
  static I32 bits(F a) {
    I32 r;
    std::memcpy(r.v, a.v, sizeof r.v);
    return r;
  }
  static F from_bits(I32 a) {
    F r;
    std::memcpy(r.v, a.v, sizeof r.v);
    return r;
  }
  static I32 iset1(int32_t x) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = x;
    return r;
  }
  static I32 iload(const int32_t* p) {
    I32 r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void istore(int32_t* p, I32 a) { std::memcpy(p, a.v, sizeof a.v); }
  // Arithmetic wraps around (done in uint32, where wrapping is defined).
  static I32 iadd(I32 a, I32 b) {
    I32 r;
    for (int i = 0; i < 16; ++i)
      r.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) + static_cast<uint32_t>(b.v[i]));
    return r;
  }
  static I32 isub(I32 a, I32 b) {
    I32 r;
    for (int i = 0; i < 16; ++i)
      r.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) - static_cast<uint32_t>(b.v[i]));
    return r;
  }
  static I32 ixor(I32 a, I32 b) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] ^ b.v[i];
    return r;
  }
  static I32 iand(I32 a, I32 b) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] & b.v[i];
    return r;
  }
  static I32 imax(I32 a, I32 b) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return r;
  }
  // Shifts of the raw bits: left, and arithmetic right.
  template <int kShift>
  static I32 shl(I32 a) {
    I32 r;
    for (int i = 0; i < 16; ++i)
      r.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) << kShift);
    return r;
  }
  template <int kShift>
  static I32 sra(I32 a) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] >> kShift;
    return r;
  }
  static Mask16 ieq(I32 a, I32 b) {
    Mask16 m = 0;
    for (int i = 0; i < 16; ++i) m |= a.v[i] == b.v[i] ? (1u << i) : 0u;
    return m;
  }
  static Mask16 ilt(I32 a, I32 b) {
    Mask16 m = 0;
    for (int i = 0; i < 16; ++i) m |= a.v[i] < b.v[i] ? (1u << i) : 0u;
    return m;
  }
  static I32 iselect(Mask16 m, I32 a, I32 b) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = (m >> i) & 1u ? a.v[i] : b.v[i];
    return r;
  }
  static int32_t ireduce_max(I32 a) {
    for (int width = 8; width >= 1; width /= 2)
      for (int i = 0; i < width; ++i) a.v[i] = a.v[i] > a.v[i + width] ? a.v[i] : a.v[i + width];
    return a.v[0];
  }
  // f32 lanes that hold integers in int32 range -> int32, and back.
  static I32 to_int(F a) {
    I32 r;
    for (int i = 0; i < 16; ++i) r.v[i] = static_cast<int32_t>(a.v[i]);
    return r;
  }
  static F to_float(I32 a) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = static_cast<float>(a.v[i]);
    return r;
  }

  // Lane i of the result is lane (i ^ kStride) of a: the partner of a butterfly.
  template <int kStride>
  static F swap_lanes(F a) {
    F r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i ^ kStride];
    return r;
  }
};

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp
#if DSK_TILE_HAS_AVX512

// ---------------------------------------------------------------------------------------------
// AVX-512.
template <>
struct Simd<tile::avx512_t> {
  using F = __m512;
  using I32 = __m512i;

  static F set1(float x) { return _mm512_set1_ps(x); }
  static F zero() { return _mm512_setzero_ps(); }

  template <class T>
  static F load(const T* p) {
    if constexpr (std::is_same_v<T, float>)
      return _mm512_loadu_ps(p);
    else if constexpr (std::is_same_v<T, bf16>)
      return tile::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    else
      return tile::f16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  template <class T>
  static F load_n(const T* p, int n) {
    const __mmask16 m = static_cast<__mmask16>(first_lanes(n));
    if constexpr (std::is_same_v<T, float>)
      return _mm512_maskz_loadu_ps(m, p);
    else if constexpr (std::is_same_v<T, bf16>)
      return tile::bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, p));
    else
      return tile::f16x16_to_f32(_mm256_maskz_loadu_epi16(m, p));
  }
  template <class T>
  static void store(T* p, F x) {
    if constexpr (std::is_same_v<T, float>)
      _mm512_storeu_ps(p, x);
    else if constexpr (std::is_same_v<T, bf16>)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), tile::f32x16_to_bf16(x));
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), tile::f32x16_to_f16(x));
  }
  // 32 values: store(p, lo), store(p + 16, hi); BF16 through one conversion of both.
  template <class T>
  static void store2(T* p, F lo, F hi) {
    if constexpr (std::is_same_v<T, bf16>) {
      _mm512_storeu_si512(p, tile::f32x32_to_bf16(lo, hi));
    } else {
      store(p, lo);
      store(p + 16, hi);
    }
  }
  static void store_bf16_round_odd(bf16* p, F lo, F hi) {
    _mm512_storeu_si512(p, tile::f32x32_to_bf16_round_odd(lo, hi));
  }
  static void store_bf16_pairs_round_odd(bf16* p, F even, F odd) {
    _mm512_storeu_si512(p, tile::f32x32_pairs_to_bf16_round_odd(even, odd));
  }
  // The generic backend's load_bf16_pairs: a bf16 pair's word shifted (even) and masked (odd).
  static void load_bf16_pairs(const bf16* p, F* even, F* odd) {
    const __m512i words = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32(~0xFFFF)));
  }
  // The generic backend's load_f32_pairs: two loads and two dword permutes.
  static void load_f32_pairs(const float* p, F* even, F* odd) {
    const F lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
    const __m512i evens =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *even = _mm512_permutex2var_ps(lo, evens, hi);
    *odd = _mm512_permutex2var_ps(lo, _mm512_add_epi32(evens, _mm512_set1_epi32(1)), hi);
  }
  // The generic backend's store_pairs: bf16 as one conversion of both and one word permute; f32
  // and e4m3 through two dword permutes.
  template <class T>
  static void store_pairs(T* p, F even, F odd) {
    if constexpr (std::is_same_v<T, bf16>) {
      const __m512i order =
          _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                           6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      _mm512_storeu_si512(p, _mm512_permutexvar_epi16(order, tile::f32x32_to_bf16(even, odd)));
    } else {
      const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      const __m512i hi =
          _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
      const F first = _mm512_permutex2var_ps(even, lo, odd);
      const F second = _mm512_permutex2var_ps(even, hi, odd);
      if constexpr (std::is_same_v<T, e4m3>) {
        store_e4m3(p, first);
        store_e4m3(p + 16, second);
      } else {
        store(p, first);
        store(p + 16, second);
      }
    }
  }
  template <class T>
  static void store_n(T* p, F x, int n) {
    const __mmask16 m = static_cast<__mmask16>(first_lanes(n));
    if constexpr (std::is_same_v<T, float>)
      _mm512_mask_storeu_ps(p, m, x);
    else if constexpr (std::is_same_v<T, bf16>)
      _mm256_mask_storeu_epi16(p, m, tile::f32x16_to_bf16(x));
    else
      _mm256_mask_storeu_epi16(p, m, tile::f32x16_to_f16(x));
  }
  static void store_e4m3(e4m3* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), tile::f32x16_to_e4m3(x));
  }
  static void store_e4m3_n(e4m3* p, F x, int n) {
    _mm_mask_storeu_epi8(p, static_cast<__mmask16>(first_lanes(n)), tile::f32x16_to_e4m3(x));
  }
  static void store_e2m1(fp4x2* p, F x) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), tile::f32x16_to_e2m1(x));
  }
  static void store_e2m1_n(fp4x2* p, F x, int n) {
    _mm_mask_storeu_epi8(p, static_cast<__mmask16>(first_lanes(n / 2)), tile::f32x16_to_e2m1(x));
  }
  // ---- bf16 rows to e4m3, 32 values at a time (see the generic implementation) ----
  using Bf16AbsMax = __m512i;  // 32 running maxima of the abs bits
  static Bf16AbsMax bf16_absmax_zero() { return _mm512_setzero_si512(); }
  static Bf16AbsMax bf16_absmax_add(Bf16AbsMax m, const bf16* p) {
    return _mm512_max_epu16(m, _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi16(0x7FFF)));
  }
  static int32_t bf16_absmax_f32_bits(Bf16AbsMax m) {
    const __m256i h = _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
    const __m128i q = _mm_max_epu16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    // PHMINPOSUW finds the minimum of 8 words: the maximum is the complement of the complements'.
    const __m128i low = _mm_minpos_epu16(_mm_xor_si128(q, _mm_set1_epi16(-1)));
    return static_cast<int32_t>((~static_cast<uint32_t>(_mm_cvtsi128_si32(low)) & 0xFFFFu) << 16);
  }
  // bf16_absmax_f32_bits of 16 running maxima at once, by a tree that halves the words per block
  // and the vectors at each step (256-bit, 128-bit, 64-bit and 32-bit halves, then the two words
  // of each dword): 50 instructions for 16 blocks, where the reduction above takes 9 and a store
  // per block (blocks of 32 bf16: 1.4x faster casts). The 64-bit step leaves block L + 4j in
  // dword 4L + j, which the last permute puts back in order.
  static void bf16_absmax16_f32_bits(const Bf16AbsMax* m, int32_t* out) {
    const auto fold = [](__m512i a, __m512i b) { return _mm512_max_epu16(a, b); };
    __m512i halves[8];  // 256-bit lanes: blocks 2i, 2i + 1
    for (int i = 0; i < 8; ++i)
      halves[i] = fold(_mm512_shuffle_i64x2(m[2 * i], m[2 * i + 1], 0x44),
                       _mm512_shuffle_i64x2(m[2 * i], m[2 * i + 1], 0xEE));
    __m512i quarters[4];  // 128-bit lanes: blocks 4j .. 4j + 3
    for (int j = 0; j < 4; ++j)
      quarters[j] = fold(_mm512_shuffle_i64x2(halves[2 * j], halves[2 * j + 1], 0x88),
                         _mm512_shuffle_i64x2(halves[2 * j], halves[2 * j + 1], 0xDD));
    __m512i eighths[2];  // qwords of 128-bit lane L: blocks 8k + L, 8k + 4 + L
    for (int k = 0; k < 2; ++k)
      eighths[k] = fold(_mm512_unpacklo_epi64(quarters[2 * k], quarters[2 * k + 1]),
                        _mm512_unpackhi_epi64(quarters[2 * k], quarters[2 * k + 1]));
    const __m512i pairs = fold(  // dwords of lane L: blocks L, 4 + L, 8 + L, 12 + L
        _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(eighths[0]),
                                              _mm512_castsi512_ps(eighths[1]), 0x88)),
        _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(eighths[0]),
                                              _mm512_castsi512_ps(eighths[1]), 0xDD)));
    const __m512i bits = _mm512_slli_epi32(fold(pairs, _mm512_srli_epi32(pairs, 16)), 16);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi32(order, bits));
  }
  struct E4m3Pow2 {
    tile::Bf16ToE4m3Pow2 fast;
    tile::F32ToE4m3Pow2 fast_f32;
    F scale;
  };
  static E4m3Pow2 e4m3_pow2(int k) {
    return {tile::bf16_to_e4m3_pow2(k), tile::f32_to_e4m3_pow2(k),
            _mm512_set1_ps(numeric::float_of(static_cast<uint32_t>(k + 127) << 23))};
  }
  // The 16-bit integer path; a vector with a lane outside its range (zero, e4m3 subnormal, NaN)
  // takes the f32 path instead, which is the rule itself.
  static void store_e4m3_bf16x32_pow2(e4m3* p, const bf16* x, const E4m3Pow2& s) {
    __mmask32 other;
    const __m256i codes = tile::bf16x32_to_e4m3_pow2(_mm512_loadu_si512(x), s.fast, &other);
    if (other == 0) [[likely]] {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), codes);
      return;
    }
    store_e4m3(p, mul(load(x), s.scale));
    store_e4m3(p + 16, mul(load(x + 16), s.scale));
  }
  static void store_e4m3_pow2(e4m3* p, F x, const E4m3Pow2& s) {
    __mmask16 other;
    const __m128i codes = tile::f32x16_to_e4m3_pow2(x, s.fast_f32, &other);
    if (other == 0) [[likely]] {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), codes);
      return;
    }
    store_e4m3(p, mul(x, s.scale));
  }
  // The four conversions narrowed together (tile::f32x64_to_e4m3_pow2); a lane out of range
  // sends all four vectors through store_e4m3.
  static void store_e4m3_pow2_x64(e4m3* p, F x0, F x1, F x2, F x3, const E4m3Pow2& s) {
    __mmask16 other;
    const __m512i codes = tile::f32x64_to_e4m3_pow2(x0, x1, x2, x3, s.fast_f32, &other);
    if (other == 0) [[likely]] {
      _mm512_storeu_si512(p, codes);
      return;
    }
    store_e4m3(p, mul(x0, s.scale));
    store_e4m3(p + 16, mul(x1, s.scale));
    store_e4m3(p + 32, mul(x2, s.scale));
    store_e4m3(p + 48, mul(x3, s.scale));
  }
  // The bf16 row is loaded in pairs (load_bf16_pairs) and its codes interleaved back
  // (tile::f32x64_pairs_to_e4m3_pow2); a lane out of range sends the 64 values through
  // store_e4m3 in order.
  // With `stream`, 64-byte aligned codes go by a non-temporal store (no read of the line first).
  static void store_e4m3_pow2_bf16x64_times(e4m3* p, const bf16* x, F f, const E4m3Pow2& s,
                                            bool stream) {
    F e0, o0, e1, o1;
    load_bf16_pairs(x, &e0, &o0);
    load_bf16_pairs(x + 32, &e1, &o1);
    __mmask16 other;
    const __m512i codes = tile::f32x64_pairs_to_e4m3_pow2(mul(e0, f), mul(o0, f), mul(e1, f),
                                                          mul(o1, f), s.fast_f32, &other);
    if (other == 0) [[likely]] {
      if (stream && reinterpret_cast<uintptr_t>(p) % 64 == 0)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(p), codes);
      else
        _mm512_storeu_si512(p, codes);
      return;
    }
    for (int i = 0; i < 4; ++i) store_e4m3(p + 16 * i, mul(mul(load(x + 16 * i), f), s.scale));
  }
  // Orders this thread's non-temporal stores before what it does next (the pool's join).
  static void stream_fence() { _mm_sfence(); }
  struct E2m1Pow2 {
    tile::Bf16ToE2m1Pow2 fast;
  };
  static E2m1Pow2 e2m1_pow2(int k) { return {tile::bf16_to_e2m1_pow2(k)}; }
  // Every lane is in range (see tile::bf16x32_to_e2m1_pow2): no fallback.
  static void store_e2m1_bf16x32_pow2(fp4x2* p, const bf16* x, const E2m1Pow2& s) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     tile::bf16x32_to_e2m1_pow2(_mm512_loadu_si512(x), s.fast));
  }
  // The lanes of pow2_exponent<kMinPow2>(inverse scale) != kNotPow2, from the scales' bits.
  template <int kMinPow2 = -126>
  static __mmask16 pow2_lanes(__m512i bits) {
    const __m512i e = _mm512_srli_epi32(bits, 23);
    return _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x807FFFFF)) &
           _mm512_cmple_epu32_mask(_mm512_sub_epi32(e, _mm512_set1_epi32(kMinPow2 + 127)),
                                   _mm512_set1_epi32(247 - (kMinPow2 + 127)));
  }
  // The 16 blocks' exponent shifts as words, computed in one vector from the inverse scales'
  // bits; a block's store broadcasts its two words. Per block this replaced the scalar exponent
  // test, the shifts' arithmetic and two broadcasts from general registers.
  struct E2m1Pow2x16 {
    alignas(32) uint16_t up[16];
    alignas(32) uint16_t down[16];
  };
  static bool e2m1_pow2_x16(const float* inv, E2m1Pow2x16* s) {
    const __m512i bits = _mm512_loadu_si512(inv);
    const __m512i e = _mm512_srli_epi32(bits, 23);
    if (pow2_lanes<-125>(bits) != 0xFFFF) return false;
    const __m512i k = _mm512_sub_epi32(e, _mm512_set1_epi32(127));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i up = _mm512_slli_epi32(_mm512_max_epi32(k, zero), 7);
    const __m512i down = _mm512_slli_epi32(_mm512_max_epi32(_mm512_sub_epi32(zero, k), zero), 7);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s->up), _mm512_cvtepi32_epi16(up));
    _mm256_store_si256(reinterpret_cast<__m256i*>(s->down), _mm512_cvtepi32_epi16(down));
    return true;
  }
  // Four blocks' codes narrowed together (tile::low_bytes_of_dwords_x4), one 64-byte store.
  static void store_e2m1_bf16x32_pow2_of_x4(fp4x2* p, const bf16* x, const E2m1Pow2x16& s, int b) {
    const auto dwords = [&](int i) {
      return tile::bf16x32_to_e2m1_pow2_dwords(_mm512_loadu_si512(x + 32 * i), shifts_of(s, b + i));
    };
    _mm512_storeu_si512(p,
                        tile::low_bytes_of_dwords_x4(dwords(0), dwords(1), dwords(2), dwords(3)));
  }
  static tile::Bf16ToE2m1Pow2 shifts_of(const E2m1Pow2x16& s, int b) {
    return {_mm512_set1_epi16(static_cast<int16_t>(s.up[b])),
            _mm512_set1_epi16(static_cast<int16_t>(s.down[b]))};
  }
  // The 16 blocks' scale-dependent constants of tile::Bf16ToE4m3Pow2 (words) and
  // tile::F32ToE4m3Pow2 (dwords), computed in vectors from the inverse scales' bits as
  // tile::bf16_to_e4m3_pow2 and f32_to_e4m3_pow2 do for one k; e4m3_pow2_of(s, b) broadcasts block
  // b's. Per block this replaces the scalar exponent test and the constants' arithmetic (about 30
  // instructions, a third of the codes of a block of 128 bf16).
  struct E4m3Pow2x16 {
    alignas(32) uint16_t round_bias[16];  // Bf16ToE4m3Pow2's
    alignas(32) uint16_t low[16];
    alignas(32) uint16_t span[16];
    alignas(64) uint32_t round_bias32[16];  // F32ToE4m3Pow2's
    alignas(64) uint32_t low32[16];
    alignas(64) uint32_t span32[16];
    alignas(64) float scale[16];  // 2^k
    E4m3Pow2 constants{};         // the scale-independent ones, made once per 16 blocks
  };
  static bool e4m3_pow2_x16(const float* inv, E4m3Pow2x16* s) {
    const __m512i bits = _mm512_loadu_si512(inv);
    const __m512i e = _mm512_srli_epi32(bits, 23);  // k + 127
    if (pow2_lanes(bits) != 0xFFFF) return false;
    const auto words = [](uint16_t* out, __m512i v) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(v));
    };
    const auto dwords = [](uint32_t* out, __m512i v) { _mm512_store_si512(out, v); };
    const auto set1 = [](uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); };
    // bf16: (k - 120) * 128 + 7, low (121 - k) * 128, span min(0x43E9 - 128 k, 0x7F80) - low.
    words(s->round_bias,
          _mm512_add_epi32(_mm512_slli_epi32(_mm512_sub_epi32(e, set1(247)), 7), set1(7)));
    const __m512i low = _mm512_slli_epi32(_mm512_sub_epi32(set1(248), e), 7);
    const __m512i high = _mm512_sub_epi32(set1(0x43E9 + 127 * 128), _mm512_slli_epi32(e, 7));
    words(s->low, low);
    words(s->span, _mm512_sub_epi32(_mm512_min_epi32(high, set1(0x7F80)), low));
    // f32: (k - 120) * 2^23 + 2^19 - 1, low (121 - k) << 23, span min(0x43E80001 - k * 2^23,
    // 0x7F800000) - low (unsigned).
    dwords(s->round_bias32, _mm512_add_epi32(_mm512_slli_epi32(_mm512_sub_epi32(e, set1(247)), 23),
                                             set1((1u << 19) - 1)));
    const __m512i low32 = _mm512_slli_epi32(_mm512_sub_epi32(set1(248), e), 23);
    const __m512i high32 =
        _mm512_sub_epi32(set1(0x43E80001u + (127u << 23)), _mm512_slli_epi32(e, 23));
    dwords(s->low32, low32);
    dwords(s->span32, _mm512_sub_epi32(_mm512_min_epu32(high32, set1(0x7F800000u)), low32));
    _mm512_store_ps(s->scale, _mm512_loadu_ps(inv));
    return true;
  }
  static E4m3Pow2 e4m3_pow2_of(const E4m3Pow2x16& s, int b) {
    E4m3Pow2 c = s.constants;
    c.fast.round_bias = _mm512_set1_epi16(static_cast<int16_t>(s.round_bias[b]));
    c.fast.low = _mm512_set1_epi16(static_cast<int16_t>(s.low[b]));
    c.fast.span = _mm512_set1_epi16(static_cast<int16_t>(s.span[b]));
    c.fast_f32.round_bias = _mm512_set1_epi32(static_cast<int>(s.round_bias32[b]));
    c.fast_f32.low = _mm512_set1_epi32(static_cast<int>(s.low32[b]));
    c.fast_f32.span = _mm512_set1_epi32(static_cast<int>(s.span32[b]));
    c.scale = _mm512_set1_ps(s.scale[b]);
    return c;
  }

  static F load_e4m3_n(const e4m3* p, int n) {
    return tile::e4m3x16_to_f32(_mm_maskz_loadu_epi8(static_cast<__mmask16>(first_lanes(n)), p));
  }
  static F load_e2m1_n(const fp4x2* p, int n) {
    const __m512 v =
        tile::e2m1x16_to_f32(_mm_maskz_loadu_epi8(static_cast<__mmask16>(first_lanes(n / 2)), p));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(first_lanes(n)), v);
  }

  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  // One FMA: the product by +-1 is exact, so its single rounding is add(a, mul(x, sign))'s.
  static F add_signed(F a, F x, F sign) { return _mm512_fmadd_ps(x, sign, a); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F scalef(F a, F n) { return _mm512_scalef_ps(a, n); }
  static F clamp_abs(F a, F c) { return _mm512_range_ps(a, c, 0b0010); }  // see generic
  static F lookup32(const float* table, I32 i) {
    return _mm512_permutex2var_ps(_mm512_load_ps(table), i, _mm512_load_ps(table + 16));
  }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F abs(F a) { return _mm512_abs_ps(a); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F round(F a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }

  static Mask16 lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask16 gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Mask16 eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static Mask16 isnan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static F select(Mask16 m, F a, F b) {
    return _mm512_mask_blend_ps(static_cast<__mmask16>(m), b, a);
  }

  // Lanes i and i + 8, then i + 4, i + 2, i + 1, as the generic tree does.
  template <class Op>
  static float reduce(F a, Op op) {
    __m256 h = op(_mm512_castps512_ps256(a),
                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 q = op(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = op(q, _mm_movehl_ps(q, q));
    q = op(q, _mm_shuffle_ps(q, q, 0x55));
    return _mm_cvtss_f32(q);
  }
  struct AddOp {
    __m256 operator()(__m256 a, __m256 b) const { return _mm256_add_ps(a, b); }
    __m128 operator()(__m128 a, __m128 b) const { return _mm_add_ps(a, b); }
  };
  struct MaxOp {
    __m256 operator()(__m256 a, __m256 b) const { return _mm256_max_ps(a, b); }
    __m128 operator()(__m128 a, __m128 b) const { return _mm_max_ps(a, b); }
  };
  static float reduce_add(F a) { return reduce(a, AddOp{}); }
  static float reduce_max(F a) { return reduce(a, MaxOp{}); }
  static float lane(F a, int i) {
    alignas(64) float v[16];
    _mm512_store_ps(v, a);
    return v[i];
  }

  static I32 bits(F a) { return _mm512_castps_si512(a); }
  static F from_bits(I32 a) { return _mm512_castsi512_ps(a); }
  static I32 iset1(int32_t x) { return _mm512_set1_epi32(x); }
  static I32 iload(const int32_t* p) { return _mm512_loadu_si512(p); }
  static void istore(int32_t* p, I32 a) { _mm512_storeu_si512(p, a); }
  static I32 iadd(I32 a, I32 b) { return _mm512_add_epi32(a, b); }
  static I32 isub(I32 a, I32 b) { return _mm512_sub_epi32(a, b); }
  static I32 ixor(I32 a, I32 b) { return _mm512_xor_si512(a, b); }
  static I32 iand(I32 a, I32 b) { return _mm512_and_si512(a, b); }
  static I32 imax(I32 a, I32 b) { return _mm512_max_epi32(a, b); }
  template <int kShift>
  static I32 shl(I32 a) {
    return _mm512_slli_epi32(a, kShift);
  }
  template <int kShift>
  static I32 sra(I32 a) {
    return _mm512_srai_epi32(a, kShift);
  }
  static Mask16 ieq(I32 a, I32 b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static Mask16 ilt(I32 a, I32 b) { return _mm512_cmplt_epi32_mask(a, b); }
  static I32 iselect(Mask16 m, I32 a, I32 b) {
    return _mm512_mask_blend_epi32(static_cast<__mmask16>(m), b, a);
  }
  static int32_t ireduce_max(I32 a) {
    __m256i h = _mm256_max_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m128i q = _mm_max_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    q = _mm_max_epi32(q, _mm_unpackhi_epi64(q, q));
    q = _mm_max_epi32(q, _mm_shuffle_epi32(q, 0x55));
    return _mm_cvtsi128_si32(q);
  }
  // Exact for integral lanes, so the rounding mode does not matter.
  static I32 to_int(F a) { return _mm512_cvtps_epi32(a); }
  static F to_float(I32 a) { return _mm512_cvtepi32_ps(a); }

  template <int kStride>
  static F swap_lanes(F a) {
    if constexpr (kStride == 1)
      return _mm512_permute_ps(a, 0xB1);  // (1, 0, 3, 2) in each 128-bit lane
    else if constexpr (kStride == 2)
      return _mm512_permute_ps(a, 0x4E);  // (2, 3, 0, 1)
    else if constexpr (kStride == 4)
      return _mm512_shuffle_f32x4(a, a, 0xB1);  // 128-bit lanes (1, 0, 3, 2)
    else
      return _mm512_shuffle_f32x4(a, a, 0x4E);  // 128-bit lanes (2, 3, 0, 1)
  }
};

#endif  // DSK_TILE_HAS_AVX512

// The implementation an ISA tag uses: amx kernels run their vector code on AVX-512.
template <tile::Isa I>
using SimdOf = Simd<tile::vector_isa_t<I>>;

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels

DSK_SILENCE_GCC_BUG_105593_END
