// The AVX-512 elementary functions of dsk/kernels/tk/math.hpp against the generic ones, bit for
// bit: exp (VRANGEPS, the VPERMT2PS table, FMA and VSCALEFPS against their scalar forms), its
// e^-x form, sigmoid, silu and softplus, over the whole exponent range (overflow, the subnormal
// results, underflow) and IEEE special values. A NaN result matches any NaN: which operand's
// payload an IEEE operation passes on is not part of the rule. Built with the AVX-512 flags;
// skipped on CPUs without the avx512 backend. The inputs, and the generic-only checks, are in
// test_tk_math.cpp (baseline ISA).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <dsk/kernels/tk/math.hpp>

#include "common/isa_test.hpp"
#include "tk/tk_test.hpp"

namespace dsk::tk::kernels {

std::vector<float> math_inputs();  // test_tk_math.cpp

namespace {

using Avx = Simd<tile::avx512_t>;
using Generic = Simd<tile::generic_t>;

template <class Fn>
void expect_same_bits(const char* name, Fn fn) {
  const std::vector<float> x = math_inputs();
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

void every_function_gives_the_generic_bits() {
  expect_same_bits("exp", []<class S>(S, typename S::F v) { return exp<S>(v); });
  expect_same_bits("exp(-x)", []<class S>(S, typename S::F v) { return exp<S, true, -1>(v); });
  expect_same_bits("sigmoid", []<class S>(S, typename S::F v) { return sigmoid<S>(v); });
  expect_same_bits("silu", []<class S>(S, typename S::F v) { return silu<S>(v); });
  expect_same_bits("softplus", []<class S>(S, typename S::F v) { return softplus<S>(v); });
}

// exp's own operations, bit for bit, NaNs included: clamp_abs (VRANGEPS: a quiet NaN becomes the
// bound with its sign, a signaling one quiet) on the special values and around the bound, and
// lookup32 (VPERMT2PS: the low five bits of any index, negative ones too).
void clamp_and_table_give_the_generic_bits() {
  std::vector<uint32_t> bits = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u, 0x7FC01234u,
                                0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x00000001u};
  for (float v : {103.99999f, 104.0f, 104.00001f, 1e30f, 1.0f, 0.5f})
    for (float sign : {1.0f, -1.0f}) bits.push_back(numeric::bits_of(sign * v));
  while (bits.size() % 16 != 0) bits.push_back(numeric::bits_of(-3.0f));
  int64_t mismatches = 0;
  for (size_t i = 0; i < bits.size(); i += 16) {
    alignas(64) float x[16], a[16], g[16];
    for (int j = 0; j < 16; ++j) x[j] = numeric::float_of(bits[i + j]);
    Avx::store(a, Avx::clamp_abs(Avx::load(x), Avx::set1(104.0f)));
    Generic::store(g, Generic::clamp_abs(Generic::load(x), Generic::set1(104.0f)));
    for (int j = 0; j < 16; ++j)
      if (numeric::bits_of(a[j]) != numeric::bits_of(g[j]) && ++mismatches <= 5)
        ADD_FAILURE() << "clamp_abs(0x" << std::hex << bits[i + j] << "): avx512 0x"
                      << numeric::bits_of(a[j]) << ", generic 0x" << numeric::bits_of(g[j]);
  }
  EXPECT_EQ(mismatches, 0);
  alignas(64) int32_t index[16];
  for (int j = 0; j < 16; ++j) index[j] = j * 7919 - 60000;
  alignas(64) float a[16], g[16];
  Avx::store(a, Avx::lookup32(kExp2Fractions, _mm512_load_si512(index)));
  Generic::I32 gi;
  for (int j = 0; j < 16; ++j) gi.v[j] = index[j];
  Generic::store(g, Generic::lookup32(kExp2Fractions, gi));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(a[j], kExp2Fractions[index[j] & 31]) << index[j];
    EXPECT_EQ(g[j], kExp2Fractions[index[j] & 31]) << index[j];
  }
}

}  // namespace
}  // namespace dsk::tk::kernels

// Registered by a baseline file (common/isa_test.hpp).
namespace dsk::test {
DSK_ISA_TESTS(tk_math_avx512_tests,
              {"TkMathAvx512", "EveryFunctionGivesTheGenericBits", Backend::avx512,
               &tk::kernels::every_function_gives_the_generic_bits},
              {"TkMathAvx512", "ClampAndTableGiveTheGenericBits", Backend::avx512,
               &tk::kernels::clamp_and_table_give_the_generic_bits});
}  // namespace dsk::test
