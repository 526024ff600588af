// The integer e4m3 paths of the per-token cast (power-of-two scales) against the f32 path they
// replace: tile::bf16x32_to_e4m3_pow2 on every bf16 bit pattern and every scale exponent (range
// test and codes), the Simd stores with their fallback on both backends, the f32 variant on random
// and boundary values and four vectors at once (also of bf16 products loaded in pairs), the 16-bit
// amax (one block and 16 at once), the e2m1 constants of 16 blocks at once, the bf16 pair loads
// and stores of reduce_fused, and the round-to-odd bf16 store of RMSNorm + cast. Built with the
// AVX-512 flags; skipped on CPUs without the avx512 backend.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <dsk/kernels/tk/quant.hpp>

#include "common/isa_test.hpp"
#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

using Avx = kernels::Simd<tile::avx512_t>;
using Generic = kernels::Simd<tile::generic_t>;

// All 65536 bf16 patterns in order.
std::vector<bf16> every_bf16() {
  std::vector<bf16> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = bf16{static_cast<uint16_t>(i)};
  return v;
}

// What the f32 path makes of x * 2^k: the rule of dsk/kernels/numeric.hpp.
uint8_t f32_path(bf16 x, int k) {
  return numeric::f32_to_e4m3(numeric::bf16_to_f32(x) * std::ldexp(1.0f, k)).bits;
}

void range_and_codes_of_the_integer_path_for_every_bf16_and_exponent() {
  const std::vector<bf16> x = every_bf16();
  int64_t in_range = 0;
  for (int k = -126; k <= 120; ++k) {
    const tile::Bf16ToE4m3Pow2 c = tile::bf16_to_e4m3_pow2(k);
    for (size_t i = 0; i < x.size(); i += 32) {
      __mmask32 other = 0;
      const __m256i codes = tile::bf16x32_to_e4m3_pow2(_mm512_loadu_si512(x.data() + i), c, &other);
      uint8_t got[32];
      std::memcpy(got, &codes, sizeof got);
      for (int j = 0; j < 32; ++j) {
        const float y = std::fabs(numeric::bf16_to_f32(x[i + j]) * std::ldexp(1.0f, k));
        const bool expected_in = y >= 0x1p-6f && y <= 464.0f;  // false for NaN
        const bool in = ((other >> j) & 1u) == 0;
        ASSERT_EQ(in, expected_in) << "bf16 " << i + j << " k " << k;
        if (!in) continue;
        ++in_range;
        ASSERT_EQ(got[j], f32_path(x[i + j], k)) << "bf16 " << i + j << " k " << k;
      }
    }
  }
  EXPECT_GT(in_range, 247 * 1000);
}

void store_is_the_f32_path_on_both_backends_with_fallback() {
  const std::vector<bf16> x = every_bf16();  // vectors with zeros, subnormals, inf, NaN too
  std::vector<uint8_t> avx(x.size()), generic(x.size());
  for (int k : {-126, -119, -60, -7, 0, 3, 22, 119, 120}) {
    const auto sa = Avx::e4m3_pow2(k);
    const auto sg = Generic::e4m3_pow2(k);
    std::memset(avx.data(), 0xAB, avx.size());
    std::memset(generic.data(), 0xCD, generic.size());
    for (size_t i = 0; i < x.size(); i += 32) {
      Avx::store_e4m3_bf16x32_pow2(reinterpret_cast<e4m3*>(avx.data() + i), x.data() + i, sa);
      Generic::store_e4m3_bf16x32_pow2(reinterpret_cast<e4m3*>(generic.data() + i), x.data() + i,
                                       sg);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(avx[i], f32_path(x[i], k)) << "bf16 " << i << " k " << k;
      ASSERT_EQ(generic[i], avx[i]) << "bf16 " << i << " k " << k;
    }
  }
}

// The e2m1 integer path (thresholds scaled by 2^-k on the bf16 bits) on every bf16 pattern
// (zeros, subnormals, inf, NaN of both signs included) and every exponent it takes, against the
// f32 path and the generic Simd store, byte for byte.
void integer_path_is_the_f32_path_for_every_bf16_and_exponent() {
  const std::vector<bf16> x = every_bf16();
  std::vector<uint8_t> avx(x.size() / 2), generic(x.size() / 2);
  for (int k = -125; k <= 124; ++k) {
    const auto sa = Avx::e2m1_pow2(k);
    const auto sg = Generic::e2m1_pow2(k);
    std::memset(avx.data(), 0xAB, avx.size());
    std::memset(generic.data(), 0xCD, generic.size());
    for (size_t i = 0; i < x.size(); i += 32) {
      Avx::store_e2m1_bf16x32_pow2(reinterpret_cast<fp4x2*>(avx.data() + i / 2), x.data() + i, sa);
      Generic::store_e2m1_bf16x32_pow2(reinterpret_cast<fp4x2*>(generic.data() + i / 2),
                                       x.data() + i, sg);
    }
    const float scale = std::ldexp(1.0f, k);
    for (size_t i = 0; i < x.size(); i += 2) {
      const uint8_t want =
          numeric::pack_e2m1(numeric::f32_to_e2m1(numeric::bf16_to_f32(x[i]) * scale),
                             numeric::f32_to_e2m1(numeric::bf16_to_f32(x[i + 1]) * scale))
              .bits;
      ASSERT_EQ(avx[i / 2], want) << "bf16 " << i << " k " << k;
      ASSERT_EQ(generic[i / 2], want) << "bf16 " << i << " k " << k;
    }
  }
}

// The f32 variant: random bit patterns, and values drawn near the two ends of the range (the
// exponents around 2^(-6-k), mantissas around 464 * 2^-k), every scale exponent.
void f32_integer_path_is_the_f32_path() {
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  alignas(64) uint32_t bits[16];
  for (int k = -126; k <= 120; ++k) {
    const auto sa = Avx::e4m3_pow2(k);
    const auto sg = Generic::e4m3_pow2(k);
    for (int it = 0; it < 400; ++it) {
      for (int i = 0; i < 16; ++i) {
        uint32_t b = static_cast<uint32_t>(rng());
        const int e = i % 4 == 1 ? 121 - k + static_cast<int>(rng() % 8) - 2
                                 : 135 - k + static_cast<int>(rng() % 3) - 1;
        if (i % 2 == 1 && e >= 0 && e <= 255)
          b = (b & 0x807FFFFFu) | static_cast<uint32_t>(e) << 23;
        if (i % 4 == 3) b = (b & 0xFFF00000u) | (0x80000u + rng() % 5 - 2);  // ties and near ties
        bits[i] = b;
      }
      const auto x = Avx::from_bits(Avx::iload(reinterpret_cast<const int32_t*>(bits)));
      typename Generic::F xg;
      std::memcpy(xg.v, bits, sizeof bits);
      uint8_t got[16], want[16];
      Avx::store_e4m3_pow2(reinterpret_cast<e4m3*>(got), x, sa);
      Generic::store_e4m3_pow2(reinterpret_cast<e4m3*>(want), xg, sg);
      for (int i = 0; i < 16; ++i) {
        const float v = numeric::float_of(bits[i]) * std::ldexp(1.0f, k);
        ASSERT_EQ(want[i], numeric::f32_to_e4m3(v).bits) << bits[i] << " k " << k;
        ASSERT_EQ(got[i], want[i]) << "f32 bits " << bits[i] << " k " << k;
      }
    }
  }
}

// The 64-code store (four vectors narrowed together): mostly in-range values, so that both its
// integer path and, when one lane of the 64 is out of range (about one draw in three), its
// fallback run; every scale exponent, both backends, against the rule.
void f32_store_of_64_is_four_stores_of_16() {
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  alignas(64) uint32_t bits[64];
  int fast = 0, fallback = 0;
  for (int k = -126; k <= 120; ++k) {
    const auto sa = Avx::e4m3_pow2(k);
    const auto sg = Generic::e4m3_pow2(k);
    for (int it = 0; it < 60; ++it) {
      bool in_range = true;
      for (int i = 0; i < 64; ++i) {
        const int e = std::clamp(121 - k + static_cast<int>(rng() % 15), 1, 254);
        uint32_t b = (static_cast<uint32_t>(rng()) & 0x807FFFFFu) | static_cast<uint32_t>(e) << 23;
        if (i % 8 == 5) b = (b & 0xFFF00000u) | (0x80000u + rng() % 5 - 2);  // ties, near ties
        if (rng() % 200 == 0) b = static_cast<uint32_t>(rng());              // anything
        const float v = std::fabs(numeric::float_of(b)) * std::ldexp(1.0f, k);
        in_range = in_range && v >= std::ldexp(1.0f, -6) && v <= 464.0f;
        bits[i] = b;
      }
      (in_range ? fast : fallback)++;
      Avx::F x[4];
      Generic::F xg[4];
      for (int v = 0; v < 4; ++v) {
        x[v] = Avx::from_bits(Avx::iload(reinterpret_cast<const int32_t*>(bits + 16 * v)));
        std::memcpy(xg[v].v, bits + 16 * v, sizeof xg[v].v);
      }
      uint8_t got[64], generic[64];
      Avx::store_e4m3_pow2_x64(reinterpret_cast<e4m3*>(got), x[0], x[1], x[2], x[3], sa);
      Generic::store_e4m3_pow2_x64(reinterpret_cast<e4m3*>(generic), xg[0], xg[1], xg[2], xg[3],
                                   sg);
      for (int i = 0; i < 64; ++i) {
        const float v = numeric::float_of(bits[i]) * std::ldexp(1.0f, k);
        ASSERT_EQ(generic[i], numeric::f32_to_e4m3(v).bits) << bits[i] << " k " << k;
        ASSERT_EQ(got[i], generic[i]) << "f32 bits " << bits[i] << " lane " << i << " k " << k;
      }
    }
  }
  EXPECT_GT(fast, 1000);  // both paths taken
  EXPECT_GT(fallback, 1000);
}

// The 64 codes of bf16 values times an f32 factor, loaded in pairs and interleaved back
// (per_block_cast's bf16 codes): mostly products in range, so that the integer path and, when a
// lane of the 64 is out of range, the fallback both run; every scale exponent, plain and
// non-temporal stores (aligned and not), both backends, against the rule.
void bf16_store_of_64_products_is_four_stores_of_16() {
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  int fast = 0, fallback = 0;
  for (int k = -126; k <= 120; ++k) {
    const auto sa = Avx::e4m3_pow2(k);
    const auto sg = Generic::e4m3_pow2(k);
    for (int it = 0; it < 24; ++it) {
      const float f = 1.0f + static_cast<float>(rng() % 4096) / 4096.0f;  // not a power of two
      bf16 x[64];
      bool in_range = true;
      for (int i = 0; i < 64; ++i) {
        const int e = std::clamp(121 - k + static_cast<int>(rng() % 13), 1, 254);
        x[i] = bf16{static_cast<uint16_t>((rng() & 0x807Fu) | static_cast<uint32_t>(e) << 7)};
        if (rng() % 200 == 0) x[i] = bf16{static_cast<uint16_t>(rng())};  // anything
        const float v = std::fabs(numeric::bf16_to_f32(x[i]) * f * std::ldexp(1.0f, k));
        in_range = in_range && v >= std::ldexp(1.0f, -6) && v <= 464.0f;
      }
      (in_range ? fast : fallback)++;
      alignas(64) uint8_t got[65], streamed[64], generic[64];
      Avx::store_e4m3_pow2_bf16x64_times(reinterpret_cast<e4m3*>(got + it % 2), x, Avx::set1(f), sa,
                                         it % 4 < 2);
      Avx::store_e4m3_pow2_bf16x64_times(reinterpret_cast<e4m3*>(streamed), x, Avx::set1(f), sa,
                                         true);
      Avx::stream_fence();
      Generic::store_e4m3_pow2_bf16x64_times(reinterpret_cast<e4m3*>(generic), x, Generic::set1(f),
                                             sg, true);
      for (int i = 0; i < 64; ++i) {
        const float v = numeric::bf16_to_f32(x[i]) * f * std::ldexp(1.0f, k);
        ASSERT_EQ(generic[i], numeric::f32_to_e4m3(v).bits) << x[i].bits << " k " << k;
        ASSERT_EQ(got[i + it % 2], generic[i])
            << "bf16 " << x[i].bits << " lane " << i << " k " << k;
        ASSERT_EQ(streamed[i], generic[i]) << "bf16 " << x[i].bits << " lane " << i << " k " << k;
      }
    }
  }
  EXPECT_GT(fast, 1000);  // both paths taken
  EXPECT_GT(fallback, 1000);
}

// bf16 rows split into even and odd positions and stored back interleaved, as bf16, f32 and e4m3,
// on both backends (reduce_fused's bf16 path); f32 values split the same way (load_f32_pairs).
void bf16_pairs_load_and_store_in_order() {
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  for (int it = 0; it < 2000; ++it) {
    bf16 x[32];
    for (auto& v : x) v = bf16{static_cast<uint16_t>(rng())};
    if (it % 2 == 0)  // finite values as well as every pattern (NaN, inf, subnormals)
      for (auto& v : x) v = numeric::f32_to_bf16(std::ldexp(float(rng() % 2000) - 1000.0f, -4));
    Avx::F even, odd;
    Generic::F even_g, odd_g;
    Avx::load_bf16_pairs(x, &even, &odd);
    Generic::load_bf16_pairs(x, &even_g, &odd_g);
    bf16 back[32], back_g[32];
    float f[32], f_g[32];
    e4m3 q[32], q_g[32];
    Avx::store_pairs(back, even, odd);
    Generic::store_pairs(back_g, even_g, odd_g);
    Avx::store_pairs(f, even, odd);
    Generic::store_pairs(f_g, even_g, odd_g);
    Avx::store_pairs(q, even, odd);
    Generic::store_pairs(q_g, even_g, odd_g);
    for (int i = 0; i < 32; ++i) {
      const float want = numeric::bf16_to_f32(x[i]);
      ASSERT_EQ(numeric::bits_of(f[i]), numeric::bits_of(want)) << i;
      ASSERT_EQ(numeric::bits_of(f_g[i]), numeric::bits_of(want)) << i;
      ASSERT_EQ(back[i].bits, numeric::f32_to_bf16(want).bits) << i;
      ASSERT_EQ(back_g[i].bits, back[i].bits) << i;
      ASSERT_EQ(q[i].bits, numeric::f32_to_e4m3(want).bits) << i;
      ASSERT_EQ(q_g[i].bits, q[i].bits) << i;
    }
    // The same split of f32 values (rms_norm's weights), every bit pattern kept.
    uint32_t raw[32];
    for (auto& v : raw) v = static_cast<uint32_t>(rng());
    float w[32], w_back[32], w_back_g[32];
    std::memcpy(w, raw, sizeof w);
    Avx::load_f32_pairs(w, &even, &odd);
    Generic::load_f32_pairs(w, &even_g, &odd_g);
    Avx::store_pairs(w_back, even, odd);
    Generic::store_pairs(w_back_g, even_g, odd_g);
    ASSERT_EQ(std::memcmp(w_back, raw, sizeof raw), 0);
    ASSERT_EQ(std::memcmp(w_back_g, raw, sizeof raw), 0);
    float lanes[16];
    std::memcpy(lanes, &even, sizeof lanes);
    for (int i = 0; i < 16; ++i) ASSERT_EQ(numeric::bits_of(lanes[i]), raw[2 * i]) << i;
  }
}

// Simd::store_bf16_round_odd on both backends: the rule of numeric::f32_to_bf16_round_odd, lo to
// the first 16 values and hi to the next (RMSNorm + cast's rows before their codes).
void bf16_round_odd_store_in_order() {
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  for (int it = 0; it < 2000; ++it) {
    uint32_t raw[32];
    for (auto& v : raw) v = static_cast<uint32_t>(rng());
    if (it % 2 == 0)  // exact bf16 values (no dropped bit) as well as every pattern
      for (auto& v : raw) v &= 0xFFFF0000u;
    float f[32];
    std::memcpy(f, raw, sizeof f);
    bf16 got[32], got_g[32];
    Avx::store_bf16_round_odd(got, Avx::load(f), Avx::load(f + 16));
    Generic::store_bf16_round_odd(got_g, Generic::load(f), Generic::load(f + 16));
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(got[i].bits, numeric::f32_to_bf16_round_odd(f[i]).bits) << i;
      ASSERT_EQ(got_g[i].bits, got[i].bits) << i;
    }
  }
}

void abs_max_is_the_f32_abs_max() {
  std::vector<bf16> x = every_bf16();
  // Windows of 32 patterns at every offset, so each position holds the maximum somewhere, NaN and
  // inf included.
  for (size_t i = 0; i + 32 <= x.size(); i += 7) {
    auto a = Avx::bf16_absmax_add(Avx::bf16_absmax_zero(), x.data() + i);
    auto g = Generic::bf16_absmax_add(Generic::bf16_absmax_zero(), x.data() + i);
    kernels::quant_detail::Amax<Avx> want;
    want.add(Avx::load(x.data() + i));
    want.add(Avx::load(x.data() + i + 16));
    const int32_t want_bits = Avx::ireduce_max(want.bits);
    ASSERT_EQ(Avx::bf16_absmax_f32_bits(a), want_bits) << i;
    ASSERT_EQ(Generic::bf16_absmax_f32_bits(g), want_bits) << i;
  }
}

// The maxima of 16 blocks by one reduction tree equal the per-block reduction, on both backends:
// windows of every bf16 pattern (NaN and inf included) in random block order.
void abs_max_of_16_blocks_is_each_blocks_abs_max() {
  const std::vector<bf16> x = every_bf16();
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  std::uniform_int_distribution<size_t> start(0, x.size() - 64);
  for (int trial = 0; trial < 2000; ++trial) {
    Avx::Bf16AbsMax a[16];
    Generic::Bf16AbsMax g[16];
    for (int b = 0; b < 16; ++b) {
      const size_t i = start(rng);
      a[b] = Avx::bf16_absmax_add(Avx::bf16_absmax_add(Avx::bf16_absmax_zero(), x.data() + i),
                                  x.data() + i + 32);
      g[b] = Generic::bf16_absmax_add(
          Generic::bf16_absmax_add(Generic::bf16_absmax_zero(), x.data() + i), x.data() + i + 32);
    }
    alignas(64) int32_t got_a[16], got_g[16];
    Avx::bf16_absmax16_f32_bits(a, got_a);
    Generic::bf16_absmax16_f32_bits(g, got_g);
    for (int b = 0; b < 16; ++b) {
      ASSERT_EQ(got_a[b], Avx::bf16_absmax_f32_bits(a[b])) << "block " << b;
      ASSERT_EQ(got_g[b], got_a[b]) << "block " << b;
    }
  }
}

// The e2m1 constants of 16 blocks at once (Simd::e2m1_pow2_x16) code every bf16 pattern as
// e2m1_pow2 of each block's exponent does, four blocks at a time (the four-block narrowing keeps
// block order), on both backends; an inverse scale outside 2^[-125, 120]
// or not a power of two makes both refuse the batch.
void e2m1_constants_of_16_blocks_are_each_blocks() {
  const std::vector<bf16> x = every_bf16();
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  std::uniform_int_distribution<int> exponent(-125, 120);
  std::vector<uint8_t> got(64), want(64);
  for (int trial = 0; trial < 40; ++trial) {
    alignas(64) float inv[16];
    int k[16];
    for (int b = 0; b < 16; ++b) inv[b] = std::ldexp(1.0f, k[b] = exponent(rng));
    if (trial < 2) inv[trial * 15] = std::ldexp(1.0f, k[trial * 15] = trial == 0 ? -125 : 120);
    Avx::E2m1Pow2x16 sa;
    Generic::E2m1Pow2x16 sg;
    ASSERT_TRUE(Avx::e2m1_pow2_x16(inv, &sa));
    ASSERT_TRUE(Generic::e2m1_pow2_x16(inv, &sg));
    // Four blocks at a time (store_e2m1_bf16x32_pow2_of_x4): block b + j's 16 bytes at 16 j. The
    // 128 values start every 32, so each block of the four sees every pattern.
    for (int b = 0; b < 16; b += 4)
      for (size_t i = 0; i + 128 <= x.size(); i += 32) {
        const auto* p = x.data() + i;
        for (int j = 0; j < 4; ++j)
          Avx::store_e2m1_bf16x32_pow2(reinterpret_cast<fp4x2*>(want.data() + 16 * j), p + 32 * j,
                                       Avx::e2m1_pow2(k[b + j]));
        Avx::store_e2m1_bf16x32_pow2_of_x4(reinterpret_cast<fp4x2*>(got.data()), p, sa, b);
        ASSERT_EQ(got, want) << "bf16 " << i << " blocks from " << b;
        Generic::store_e2m1_bf16x32_pow2_of_x4(reinterpret_cast<fp4x2*>(got.data()), p, sg, b);
        ASSERT_EQ(got, want) << "bf16 " << i << " blocks from " << b;
      }
    for (float bad :
         {1.5f, std::ldexp(1.0f, -126), std::ldexp(1.0f, 121), -8.0f, 0.0f,
          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      alignas(64) float refused[16];
      std::memcpy(refused, inv, sizeof inv);
      refused[trial % 16] = bad;
      EXPECT_FALSE(Avx::e2m1_pow2_x16(refused, &sa)) << bad;
      EXPECT_FALSE(Generic::e2m1_pow2_x16(refused, &sg)) << bad;
    }
  }
}

// The e4m3 constants of 16 blocks at once (Simd::e4m3_pow2_x16, e4m3_pow2_of) code every bf16
// pattern (zeros, subnormals, values that saturate, inf and NaN take the vector fallback) and f32
// values of every exponent with random mantissas as the f32 rule does with each block's own 2^k,
// through the bf16 store (32 values) and the f32 stores of 16 and 64 values, on both backends; an
// inverse scale outside 2^[-126, 120] or not a power of two makes both refuse the batch.
void e4m3_blocks_of_16_code_every_value(const std::vector<bf16>& x, const std::vector<float>& f,
                                        const int* k, bool generic) {
  alignas(64) float inv[16];
  for (int b = 0; b < 16; ++b) inv[b] = std::ldexp(1.0f, k[b]);
  Avx::E4m3Pow2x16 sa;
  Generic::E4m3Pow2x16 sg;
  ASSERT_TRUE(Avx::e4m3_pow2_x16(inv, &sa));
  ASSERT_TRUE(Generic::e4m3_pow2_x16(inv, &sg));
  std::vector<uint8_t> got(x.size()), got_f(f.size());
  for (int b = 0; b < 16; ++b) {
    std::memset(got.data(), 0xAB, got.size());
    std::memset(got_f.data(), 0xAB, got_f.size());
    for (size_t i = 0; i < x.size(); i += 32) {
      auto* out = reinterpret_cast<e4m3*>(got.data() + i);
      if (generic)
        Generic::store_e4m3_bf16x32_pow2(out, x.data() + i, Generic::e4m3_pow2_of(sg, b));
      else
        Avx::store_e4m3_bf16x32_pow2(out, x.data() + i, Avx::e4m3_pow2_of(sa, b));
    }
    for (size_t i = 0; i < f.size(); i += 64) {
      auto* out = reinterpret_cast<e4m3*>(got_f.data() + i);
      const float* v = f.data() + i;
      if (generic) {
        const auto s = Generic::e4m3_pow2_of(sg, b);
        Generic::store_e4m3_pow2_x64(out, Generic::load(v), Generic::load(v + 16),
                                     Generic::load(v + 32), Generic::load(v + 48), s);
      } else {
        const auto s = Avx::e4m3_pow2_of(sa, b);
        Avx::store_e4m3_pow2_x64(out, Avx::load(v), Avx::load(v + 16), Avx::load(v + 32),
                                 Avx::load(v + 48), s);
        alignas(64) uint8_t single[16];  // the single store gives the x64 store's second 16
        Avx::store_e4m3_pow2(reinterpret_cast<e4m3*>(single), Avx::load(v + 16), s);
        ASSERT_EQ(std::memcmp(single, got_f.data() + i + 16, 16), 0) << "f32 single store " << i;
      }
    }
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], f32_path(x[i], k[b]))
          << "bf16 " << i << " block " << b << " k " << k[b] << " generic " << generic;
    for (size_t i = 0; i < f.size(); ++i)
      ASSERT_EQ(got_f[i], numeric::f32_to_e4m3(f[i] * inv[b]).bits)
          << "f32 bits " << numeric::bits_of(f[i]) << " block " << b << " k " << k[b] << " generic "
          << generic;
  }
}

void e4m3_constants_of_16_blocks_are_each_blocks() {
  const std::vector<bf16> x = every_bf16();
  std::mt19937 rng(static_cast<uint32_t>(test::fresh_seed()));
  // Every f32 exponent (sign, zero, subnormal, inf and NaN included) with mantissas random, or
  // whose bits below e4m3's three are an exact tie, one below it or one above it. One exponent
  // per vector of 16, so that vectors in range take the integer path (a vector with a lane out
  // of range takes the rule itself).
  std::vector<float> f(1 << 17);
  for (size_t i = 0; i < f.size(); ++i) {
    const uint32_t top = static_cast<uint32_t>(rng() & 0x700000u), tie = top | 0x80000u;
    const uint32_t mantissa[] = {static_cast<uint32_t>(rng() & 0x7FFFFFu), tie, tie - 1, tie + 1};
    f[i] =
        numeric::float_of(static_cast<uint32_t>(i / 16 % 512) << 23 | mantissa[i / (16 * 512) % 4]);
  }
  std::uniform_int_distribution<int> exponent(-126, 120);
  for (int trial = 0; trial < 6; ++trial) {
    int k[16];
    for (int b = 0; b < 16; ++b) k[b] = exponent(rng);
    if (trial < 2) k[trial * 15] = trial == 0 ? -126 : 120;  // the edges of the range
    e4m3_blocks_of_16_code_every_value(x, f, k, false);
    if (trial == 0) e4m3_blocks_of_16_code_every_value(x, f, k, true);
    alignas(64) float refused[16];
    for (float bad :
         {1.5f, std::ldexp(1.0f, -127), std::ldexp(1.0f, 121), -8.0f, 0.0f,
          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      for (int b = 0; b < 16; ++b) refused[b] = std::ldexp(1.0f, k[b]);
      refused[(trial * 5) % 16] = bad;
      Avx::E4m3Pow2x16 sa;
      Generic::E4m3Pow2x16 sg;
      EXPECT_FALSE(Avx::e4m3_pow2_x16(refused, &sa)) << bad;
      EXPECT_FALSE(Generic::e4m3_pow2_x16(refused, &sg)) << bad;
    }
  }
}

}  // namespace
}  // namespace dsk::tk

// Registered by a baseline file (common/isa_test.hpp).
namespace dsk::test {
DSK_ISA_TESTS(
    tk_quant_avx512_tests,
    {"QuantBf16E4m3", "RangeAndCodesOfTheIntegerPathForEveryBf16AndExponent", Backend::avx512,
     &tk::range_and_codes_of_the_integer_path_for_every_bf16_and_exponent},
    {"QuantBf16E4m3", "StoreIsTheF32PathOnBothBackendsWithFallback", Backend::avx512,
     &tk::store_is_the_f32_path_on_both_backends_with_fallback},
    {"QuantBf16E2m1", "IntegerPathIsTheF32PathForEveryBf16AndExponent", Backend::avx512,
     &tk::integer_path_is_the_f32_path_for_every_bf16_and_exponent},
    {"QuantBf16E4m3", "F32IntegerPathIsTheF32Path", Backend::avx512,
     &tk::f32_integer_path_is_the_f32_path},
    {"QuantBf16E4m3", "F32StoreOf64IsFourStoresOf16", Backend::avx512,
     &tk::f32_store_of_64_is_four_stores_of_16},
    {"QuantBf16E4m3", "Bf16StoreOf64ProductsIsFourStoresOf16", Backend::avx512,
     &tk::bf16_store_of_64_products_is_four_stores_of_16},
    {"SimdPairs", "Bf16PairsLoadAndStoreInOrder", Backend::avx512,
     &tk::bf16_pairs_load_and_store_in_order},
    {"SimdPairs", "Bf16RoundOddStoreInOrder", Backend::avx512, &tk::bf16_round_odd_store_in_order},
    {"QuantBf16E4m3", "AbsMaxIsTheF32AbsMax", Backend::avx512, &tk::abs_max_is_the_f32_abs_max},
    {"QuantBf16E4m3", "AbsMaxOf16BlocksIsEachBlocksAbsMax", Backend::avx512,
     &tk::abs_max_of_16_blocks_is_each_blocks_abs_max},
    {"QuantBf16E2m1", "ConstantsOf16BlocksAreEachBlocks", Backend::avx512,
     &tk::e2m1_constants_of_16_blocks_are_each_blocks},
    {"QuantBf16E4m3", "ConstantsOf16BlocksAreEachBlocks", Backend::avx512,
     &tk::e4m3_constants_of_16_blocks_are_each_blocks});
}  // namespace dsk::test
