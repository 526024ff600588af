// Dot tiles (dsk/kernels/tile/dot.hpp): random steps on every shape bitwise equal across the
// generic and avx512 backends and to the SDM pseudocode of VDPBF16PS run on scalar hardware FMA;
// hand-made cases for the order of the two products, DAZ and FTZ; the promotion epilogue.
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/test_util.hpp"
#include "tile/tile_dot_test_body.hpp"
#include "tile/tile_test.hpp"

DSK_TILE_DOT_TEST_DEFINE_RUNNERS(generic)

namespace dsk::tile_test {
namespace {

uint32_t bits(float x) {
  return numeric::bits_of(x);
}

bf16 bf16_of(float x) {
  return numeric::f32_to_bf16(x);
}

// Operands of one dot-steps case with strides that are not the tight ones.
struct DotCase {
  int rows, cols;
  int64_t steps, lda, ldb, ldc;
  std::vector<bf16> a, b;
  std::vector<float> c;

  DotCase(DotShape shape, int64_t steps_, uint32_t seed)
      : rows(shape.rows),
        cols(16 * shape.vecs),
        steps(steps_),
        lda(2 * steps_ + 3),
        ldb(2 * 16 * shape.vecs + 6),
        ldc(16 * shape.vecs + 5) {
    a = random_bf16(static_cast<size_t>(rows * lda), seed, true);
    b = random_bf16(static_cast<size_t>(steps * ldb), seed + 1, true);
    c = random_accumulators(static_cast<size_t>(rows * ldc), seed + 2);
  }
};

std::vector<Backend> dot_backends() {
  std::vector<Backend> out = {Backend::generic};
  if (backend_supported(Backend::avx512)) out.push_back(Backend::avx512);
  return out;
}

const DotRunners& dot_runners(Backend b) {
  return b == Backend::generic ? generic_dot_runners() : avx512_dot_runners();
}

void expect_same_bits(const std::vector<float>& actual, const std::vector<float>& expected,
                      const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_EQ(bits(actual[i]), bits(expected[i]))
        << what << ": element " << i << ": " << actual[i] << " vs " << expected[i];
}

TEST(TileDot, RandomStepsEqualAcrossBackendsAndSdm) {
  uint32_t seed = 100;
  for (int shape = 0; shape < kNumDotShapes; ++shape) {
    for (int64_t steps : {1, 7, 64}) {
      const DotCase base(kDotShapes[shape], steps, seed += 3);
      std::vector<float> expected = base.c;
      if (backend_supported(Backend::avx512))
        sdm_reference_dot(base.rows, base.cols, base.a.data(), base.lda, base.b.data(), base.ldb,
                          steps, expected.data(), base.ldc);
      std::vector<float> first;
      for (Backend be : dot_backends()) {
        std::vector<float> c = base.c;
        dot_runners(be).steps(shape, base.a.data(), base.lda, base.b.data(), base.ldb, steps,
                              c.data(), base.ldc);
        const std::string what =
            fmt::format("{} shape {}x{} steps {}", backend_name(be), base.rows, base.cols, steps);
        if (backend_supported(Backend::avx512)) expect_same_bits(c, expected, what + " vs SDM");
        if (first.empty())
          first = c;
        else
          expect_same_bits(c, first, what + " vs generic");
      }
    }
  }
}

// Random bf16 and f32 bit patterns over the whole exponent range (denormals, overflow to inf and
// cancellation included): generic and hardware agree bit for bit, NaN up to its payload.
TEST(TileDot, GenericMatchesHardwareOverTheWholeRange) {
  if (!backend_supported(Backend::avx512)) GTEST_SKIP() << "no avx512 backend to compare with";
  std::mt19937 rng(2024);
  const auto random_bits16 = [&] {
    const uint32_t e = rng() % 255;  // exponent 0..254 (0: denormal or zero)
    return static_cast<uint16_t>((rng() & 0x807Fu) | (e << 7));
  };
  constexpr int64_t kSteps = 512;
  for (int round = 0; round < 40; ++round) {
    std::vector<bf16> a(2 * kSteps), b(kSteps * 32);
    for (bf16& x : a) x.bits = random_bits16();
    for (bf16& x : b) x.bits = random_bits16();
    std::vector<float> c(16);
    for (float& x : c) x = numeric::float_of((rng() & 0x807FFFFFu) | ((rng() % 255) << 23));
    std::vector<float> generic = c, hardware = c;
    generic_dot_runners().steps(1, a.data(), 0, b.data(), 32, kSteps, generic.data(), 16);
    avx512_dot_runners().steps(1, a.data(), 0, b.data(), 32, kSteps, hardware.data(), 16);
    for (int i = 0; i < 16; ++i) {
      if (std::isnan(generic[i]) && std::isnan(hardware[i])) continue;
      EXPECT_EQ(bits(generic[i]), bits(hardware[i])) << "round " << round << " lane " << i;
    }
  }
}

// Single steps near the f32 normal limit, where FTZ decides: many random accumulators and
// products around 2^-126.
TEST(TileDot, GenericMatchesHardwareAroundTheNormalLimit) {
  if (!backend_supported(Backend::avx512)) GTEST_SKIP() << "no avx512 backend to compare with";
  std::mt19937 rng(7);
  constexpr int64_t kSteps = 1;
  for (int round = 0; round < 20000; ++round) {
    bf16 a[2], b[32];
    for (bf16& x : a) x.bits = static_cast<uint16_t>((rng() & 0x807Fu) | ((50 + rng() % 20) << 7));
    for (bf16& x : b) x.bits = static_cast<uint16_t>((rng() & 0x807Fu) | ((1 + rng() % 20) << 7));
    std::vector<float> c(16);
    for (float& x : c) x = numeric::float_of((rng() & 0x80FFFFFFu));  // exponent 0 or 1
    std::vector<float> generic = c, hardware = c;
    generic_dot_runners().steps(1, a, 0, b, 32, kSteps, generic.data(), 16);
    avx512_dot_runners().steps(1, a, 0, b, 32, kSteps, hardware.data(), 16);
    for (int i = 0; i < 16; ++i)
      ASSERT_EQ(bits(generic[i]), bits(hardware[i])) << "round " << round << " lane " << i;
  }
}

// One 1 x 16 step with the same pair in every lane: acc + a . b.
float one_step(Backend be, float acc, float a_even, float a_odd, float b_even, float b_odd) {
  const bf16 a[2] = {bf16_of(a_even), bf16_of(a_odd)};
  std::vector<bf16> b(32);
  for (int i = 0; i < 16; ++i) {
    b[2 * i] = bf16_of(b_even);
    b[2 * i + 1] = bf16_of(b_odd);
  }
  std::vector<float> c(16, acc);
  dot_runners(be).steps(1, a, 2, b.data(), 32, 1, c.data(), 16);
  for (float x : c) EXPECT_EQ(bits(x), bits(c[0]));
  return c[0];
}

TEST(TileDot, OddProductFirst) {
  // Odd first: 1 - 1 = 0, then 0 + 2^-30. Even first would lose 2^-30 against 1.
  for (Backend be : dot_backends())
    EXPECT_EQ(one_step(be, 1.0f, 0x1p-15f, -1.0f, 0x1p-15f, 1.0f), 0x1p-30f) << backend_name(be);
}

TEST(TileDot, DenormalInputsReadAsZero) {
  const float denormal_bf16 = numeric::float_of(0x00010000u);  // bf16 0x0001
  for (Backend be : dot_backends()) {
    EXPECT_EQ(bits(one_step(be, 0.0f, denormal_bf16, 0.0f, 0x1p100f, 0.0f)), bits(0.0f));
    // A denormal accumulator reads as zero of its sign: -0 + 0 * 0 stays -0 ... plus +0 gives +0.
    EXPECT_EQ(bits(one_step(be, -0x1p-140f, 0.0f, 0.0f, 0.0f, 0.0f)), bits(0.0f));
    EXPECT_EQ(one_step(be, 0x1p-140f, 1.0f, 0.0f, 1.0f, 0.0f), 1.0f);
  }
}

TEST(TileDot, TinyResultsFlushToZero) {
  for (Backend be : dot_backends()) {
    EXPECT_EQ(bits(one_step(be, 0.0f, 0x1p-70f, 0.0f, 0x1p-70f, 0.0f)), bits(0.0f));
    EXPECT_EQ(bits(one_step(be, 0.0f, -0x1p-70f, 0.0f, 0x1p-70f, 0.0f)), bits(-0.0f));
    EXPECT_EQ(one_step(be, 0.0f, 0x1p-63f, 0.0f, 0x1p-63f, 0.0f), 0x1p-126f);
  }
}

TEST(TileDot, PromoteIsOneFmaPerElement) {
  uint32_t seed = 900;
  for (int shape = 0; shape < kNumDotShapes; ++shape) {
    const DotCase base(kDotShapes[shape], 9, seed += 5);
    const std::vector<float> row_scale = random_floats(static_cast<size_t>(base.rows), seed, false);
    const std::vector<float> col_scale =
        random_floats(static_cast<size_t>(base.cols), seed + 1, false);
    // The partial sums alone, then the promotion written out.
    std::vector<float> partial(base.c.size(), 0.0f);
    generic_dot_runners().steps(shape, base.a.data(), base.lda, base.b.data(), base.ldb, base.steps,
                                partial.data(), base.ldc);
    std::vector<float> expected = base.c;
    for (int r = 0; r < base.rows; ++r)
      for (int n = 0; n < base.cols; ++n) {
        float& x = expected[r * base.ldc + n];
        volatile float scale = row_scale[r] * col_scale[n];
        x = std::fma(partial[r * base.ldc + n], scale, x);
      }
    for (Backend be : dot_backends()) {
      std::vector<float> c = base.c;
      dot_runners(be).promote(shape, base.a.data(), base.lda, base.b.data(), base.ldb, base.steps,
                              c.data(), base.ldc, row_scale.data(), col_scale.data());
      expect_same_bits(c, expected, fmt::format("{} shape {}", backend_name(be), shape));
    }
  }
}

}  // namespace
}  // namespace dsk::tile_test
