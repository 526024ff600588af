// The AVX-512 converters of dsk/kernels/tile/convert.hpp against the scalar rules, bit for bit:
// every code of each narrow format, millions of random f32 bit patterns, a hostile FP environment
// and every array length up to 130. Built with the AVX-512 flags; skipped on CPUs without them.
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <dsk/kernels/tile/convert.hpp>

#include "common/isa_test.hpp"
#include "common/test_util.hpp"

namespace dsk {
namespace {

using numeric::bits_of;
using numeric::float_of;

uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* s = std::getenv("DSK_TEST_SEED")) return std::stoull(s);
    return (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  }();
  return seed;
}

// The f32 values where rules are easy to get wrong, then random bit patterns: half uniform over all
// 2^32 (NaN payloads, inf, subnormals), half with exponents where the narrow formats round.
std::vector<float> test_floats(size_t n, uint64_t seed) {
  std::vector<float> out;
  for (uint32_t b :
       {0x00000000u, 0x00000001u, 0x00400000u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu,
        0x7F800000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FFFFFFFu, 0x3A800000u,
        0x3B000000u, 0x3C7C0000u, 0x3C800000u, 0x43E00000u, 0x43E7FFFFu, 0x43E80000u,
        0x47700000u, 0x476FFFFFu, 0x477FEFFFu, 0x477FF000u, 0x33000000u, 0x38800000u}) {
    out.push_back(float_of(b));
    out.push_back(float_of(b | 0x80000000u));
  }
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f})
    for (float v : {t, std::nextafter(t, 0.0f), std::nextafter(t, 9.0f)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> exp(127 - 30, 127 + 20);
  while (out.size() < n) {
    uint32_t b = static_cast<uint32_t>(rng());
    if (out.size() % 2) b = (b & 0x807FFFFFu) | (exp(rng) << 23);
    out.push_back(float_of(b));
  }
  out.resize(n / 16 * 16);
  return out;
}

// Compares two arrays of raw codes and reports the first few differences with the input.
template <class In, class Out>
void expect_same(const char* name, const std::vector<In>& in, const std::vector<Out>& got,
                 const std::vector<Out>& want, size_t in_per_out = 1) {
  int shown = 0;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(Out)) == 0) continue;
    ++bad;
    if (shown++ >= 5) continue;
    uint64_t input = 0, g = 0, w = 0;
    std::memcpy(&input, &in[i / in_per_out], sizeof(In));
    std::memcpy(&g, &got[i], sizeof(Out));
    std::memcpy(&w, &want[i], sizeof(Out));
    ADD_FAILURE() << name << ": element " << i << " (input 0x" << std::hex << input << "): got 0x"
                  << g << ", expected 0x" << w;
  }
  EXPECT_EQ(bad, 0u) << name << ": " << bad << " of " << want.size() << " differ";
}

void e4m3_to_bf16_and_f32_on_every_code() {
  std::vector<e4m3> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = e4m3{static_cast<uint8_t>(c)};
  std::vector<bf16> want_bf16(256), got64(256), got32(256);
  std::vector<float> want_f32(256), got16(256);
  for (int c = 0; c < 256; ++c) {
    want_f32[c] = numeric::e4m3_to_f32(codes[c]);
    want_bf16[c] = numeric::f32_to_bf16(want_f32[c]);
  }
  for (int i = 0; i < 256; i += 64) {
    const tile::Bf16x64 r = tile::e4m3x64_to_bf16(_mm512_loadu_si512(&codes[i]));
    _mm512_storeu_si512(&got64[i], r.first);
    _mm512_storeu_si512(&got64[i + 32], r.second);
  }
  for (int i = 0; i < 256; i += 32)
    _mm512_storeu_si512(
        &got32[i],
        tile::e4m3x32_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&codes[i]))));
  for (int i = 0; i < 256; i += 16)
    _mm512_storeu_ps(&got16[i], tile::e4m3x16_to_f32(
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(&codes[i]))));
  expect_same("e4m3x64_to_bf16", codes, got64, want_bf16);
  expect_same("e4m3x32_to_bf16", codes, got32, want_bf16);
  expect_same("e4m3x16_to_f32", codes, got16, want_f32);
}

void e5m2_f16_and_bf16_to_f32_on_every_code() {
  std::vector<e5m2> e5(256);
  std::vector<float> want_e5(256), got_e5(256);
  for (int c = 0; c < 256; ++c) {
    e5[c] = e5m2{static_cast<uint8_t>(c)};
    want_e5[c] = numeric::e5m2_to_f32(e5[c]);
  }
  for (int i = 0; i < 256; i += 16)
    _mm512_storeu_ps(&got_e5[i], tile::e5m2x16_to_f32(
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(&e5[i]))));
  expect_same("e5m2x16_to_f32", e5, got_e5, want_e5);

  std::vector<uint16_t> words(65536);
  std::vector<float> want_h(65536), got_h(65536), want_b(65536), got_b(65536);
  for (uint32_t c = 0; c < 65536; ++c) {
    words[c] = static_cast<uint16_t>(c);
    want_h[c] = numeric::f16_to_f32(f16{words[c]});
    want_b[c] = numeric::bf16_to_f32(bf16{words[c]});
  }
  for (size_t i = 0; i < words.size(); i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&words[i]));
    _mm512_storeu_ps(&got_h[i], tile::f16x16_to_f32(x));
    _mm512_storeu_ps(&got_b[i], tile::bf16x16_to_f32(x));
  }
  expect_same("f16x16_to_f32", words, got_h, want_h);
  expect_same("bf16x16_to_f32", words, got_b, want_b);
}

void e2m1_to_f32_and_bf16_on_every_byte() {
  std::vector<uint8_t> bytes(256);
  std::vector<float> want_f(512), got_f(512);
  std::vector<bf16> want_b(512), got_b(512);
  for (int c = 0; c < 256; ++c) {
    bytes[c] = static_cast<uint8_t>(c);
    for (int half = 0; half < 2; ++half) {
      want_f[2 * c + half] = numeric::e2m1_to_f32(static_cast<uint8_t>(half ? c >> 4 : c & 0xF));
      want_b[2 * c + half] = numeric::f32_to_bf16(want_f[2 * c + half]);
    }
  }
  for (int i = 0; i < 256; i += 8)
    _mm512_storeu_ps(
        &got_f[2 * i],
        tile::e2m1x16_to_f32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&bytes[i]))));
  for (int i = 0; i < 256; i += 16)
    _mm512_storeu_si512(
        &got_b[2 * i],
        tile::e2m1x32_to_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&bytes[i]))));
  expect_same("e2m1x16_to_f32", bytes, got_f, want_f, 2);
  expect_same("e2m1x32_to_bf16", bytes, got_b, want_b, 2);
}

// Runs every f32 -> narrow converter over `in` and compares with the scalar rules.
void check_f32_encoders(const std::vector<float>& in) {
  const size_t n = in.size();
  std::vector<bf16> b(n), b32(n), want_b(n), odd(n), odd_pairs(n), want_odd(n);
  std::vector<f16> h(n), want_h(n);
  std::vector<e4m3> q(n), want_q(n);
  std::vector<e5m2> r(n), want_r(n);
  std::vector<fp4x2> p(n / 2), want_p(n / 2);
  for (size_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_loadu_ps(&in[i]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&b[i]), tile::f32x16_to_bf16(x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&h[i]), tile::f32x16_to_f16(x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&q[i]), tile::f32x16_to_e4m3(x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&r[i]), tile::f32x16_to_e5m2(x));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(&p[i / 2]), tile::f32x16_to_e2m1(x));
  }
  for (size_t i = 0; i + 32 <= n; i += 32)
    _mm512_storeu_si512(
        &b32[i], tile::f32x32_to_bf16(_mm512_loadu_ps(&in[i]), _mm512_loadu_ps(&in[i + 16])));
  for (size_t i = 0; i + 32 <= n; i += 32)
    _mm512_storeu_si512(&odd[i], tile::f32x32_to_bf16_round_odd(_mm512_loadu_ps(&in[i]),
                                                                _mm512_loadu_ps(&in[i + 16])));
  // The same 32 values split into pairs (even and odd positions) first.
  const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
  for (size_t i = 0; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(&in[i]), hi = _mm512_loadu_ps(&in[i + 16]);
    _mm512_storeu_si512(&odd_pairs[i],
                        tile::f32x32_pairs_to_bf16_round_odd(_mm512_permutex2var_ps(lo, evens, hi),
                                                             _mm512_permutex2var_ps(lo, odds, hi)));
  }
  for (size_t i = 0; i < n; ++i) {
    want_b[i] = numeric::f32_to_bf16(in[i]);
    want_odd[i] = numeric::f32_to_bf16_round_odd(in[i]);
    want_h[i] = numeric::f32_to_f16(in[i]);
    want_q[i] = numeric::f32_to_e4m3(in[i]);
    want_r[i] = numeric::f32_to_e5m2(in[i]);
    if (i % 2)
      want_p[i / 2] =
          numeric::pack_e2m1(numeric::f32_to_e2m1(in[i - 1]), numeric::f32_to_e2m1(in[i]));
  }
  expect_same("f32x16_to_bf16", in, b, want_b);
  ASSERT_EQ(n % 32, 0u);
  expect_same("f32x32_to_bf16", in, b32, want_b);
  expect_same("f32x32_to_bf16_round_odd", in, odd, want_odd);
  expect_same("f32x32_pairs_to_bf16_round_odd", in, odd_pairs, want_odd);
  expect_same("f32x16_to_f16", in, h, want_h);
  expect_same("f32x16_to_e4m3", in, q, want_q);
  expect_same("f32x16_to_e5m2", in, r, want_r);
  std::vector<uint64_t> pairs(n / 2);
  std::memcpy(pairs.data(), in.data(), n * sizeof(float));
  expect_same("f32x16_to_e2m1", pairs, p, want_p);
}

void f32_to_narrow_formats_on_millions_of_bit_patterns() {
  SCOPED_TRACE("random seed " + std::to_string(test_seed()) + " (DSK_TEST_SEED)");
  check_f32_encoders(test_floats(size_t{1} << 21, test_seed()));  // 2M patterns
}

// MXCSR with DAZ, FTZ and round-up must not change any result: the converters are bit-level.
void results_do_not_depend_on_the_fp_environment() {
  SCOPED_TRACE("random seed " + std::to_string(test_seed()) + " (DSK_TEST_SEED)");
  std::vector<float> in = test_floats(size_t{1} << 16, test_seed() + 1);
  for (uint32_t m = 1; m < (1u << 23); m = m * 3 + 1) in.push_back(float_of(m));  // subnormals
  in.resize(in.size() / 16 * 16);
  const unsigned saved = _mm_getcsr();
  constexpr unsigned kDazFtz = 0x8040u;
  for (unsigned mode :
       {kDazFtz | _MM_ROUND_UP, kDazFtz | _MM_ROUND_TOWARD_ZERO, 0u | _MM_ROUND_DOWN}) {
    _mm_setcsr((saved & ~0xE040u) | mode);
    check_f32_encoders(in);
    _mm_setcsr(saved);
  }
}

// convert_n<avx512_t> against convert_n<generic_t> on every length 0..130: outputs equal, and
// nothing written past n.
template <class Src, class Dst>
void check_convert_n(const char* name, const std::vector<Src>& input, size_t values_per_src = 1,
                     size_t values_per_dst = 1) {
  const size_t step = std::max(values_per_src, values_per_dst);
  for (size_t n = 0; n <= 130; n += step) {
    // Two fill patterns: an element left unwritten cannot match under both.
    for (int fill : {0x5A, 0xA5}) {
      const size_t dst_count = n / values_per_dst;
      std::vector<Dst> got(dst_count + 64), want(dst_count + 64);
      std::memset(got.data(), fill, got.size() * sizeof(Dst));
      std::memset(want.data(), fill, want.size() * sizeof(Dst));
      tile::convert_n<tile::avx512_t>(input.data(), got.data(), n);
      tile::convert_n<tile::generic_t>(input.data(), want.data(), n);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(Dst)), 0)
          << name << " differs (or wrote past the end) at n = " << n;
    }
  }
}

void convert_n_matches_generic_on_every_length() {
  SCOPED_TRACE("random seed " + std::to_string(test_seed()) + " (DSK_TEST_SEED)");
  const std::vector<float> floats = test_floats(256, test_seed() + 2);
  std::vector<bf16> bf16s(256);
  std::vector<f16> f16s(256);
  std::vector<e4m3> e4m3s(256);
  std::vector<e5m2> e5m2s(256);
  std::vector<fp4x2> fp4s(256);
  for (size_t i = 0; i < 256; ++i) {
    const uint32_t b = bits_of(floats[i]);
    bf16s[i] = bf16{static_cast<uint16_t>(b >> 16)};
    f16s[i] = f16{static_cast<uint16_t>(b >> 8)};
    e4m3s[i] = e4m3{static_cast<uint8_t>(i * 73)};
    e5m2s[i] = e5m2{static_cast<uint8_t>(i * 73)};
    fp4s[i] = fp4x2{static_cast<uint8_t>(i * 73)};
  }
  check_convert_n<float, bf16>("f32 -> bf16", floats);
  check_convert_n<bf16, float>("bf16 -> f32", bf16s);
  check_convert_n<float, f16>("f32 -> f16", floats);
  check_convert_n<f16, float>("f16 -> f32", f16s);
  check_convert_n<float, e4m3>("f32 -> e4m3", floats);
  check_convert_n<e4m3, float>("e4m3 -> f32", e4m3s);
  check_convert_n<e4m3, bf16>("e4m3 -> bf16", e4m3s);
  check_convert_n<float, e5m2>("f32 -> e5m2", floats);
  check_convert_n<e5m2, float>("e5m2 -> f32", e5m2s);
  check_convert_n<float, fp4x2>("f32 -> fp4x2", floats, 1, 2);
  check_convert_n<fp4x2, float>("fp4x2 -> f32", fp4s, 2, 1);
  check_convert_n<fp4x2, bf16>("fp4x2 -> bf16", fp4s, 2, 1);
}

}  // namespace
}  // namespace dsk

// Registered by a baseline file (common/isa_test.hpp).
namespace dsk::test {
DSK_ISA_TESTS(convert_avx512_tests,
              {"ConvertAvx512", "E4m3ToBf16AndF32OnEveryCode", Backend::avx512,
               &e4m3_to_bf16_and_f32_on_every_code},
              {"ConvertAvx512", "E5m2F16AndBf16ToF32OnEveryCode", Backend::avx512,
               &e5m2_f16_and_bf16_to_f32_on_every_code},
              {"ConvertAvx512", "E2m1ToF32AndBf16OnEveryByte", Backend::avx512,
               &e2m1_to_f32_and_bf16_on_every_byte},
              {"ConvertAvx512", "F32ToNarrowFormatsOnMillionsOfBitPatterns", Backend::avx512,
               &f32_to_narrow_formats_on_millions_of_bit_patterns},
              {"ConvertAvx512", "ResultsDoNotDependOnTheFpEnvironment", Backend::avx512,
               &results_do_not_depend_on_the_fp_environment},
              {"ConvertAvx512", "ConvertNMatchesGenericOnEveryLength", Backend::avx512,
               &convert_n_matches_generic_on_every_length});
}  // namespace dsk::test
