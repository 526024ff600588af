// Exhaustive check (label "slow"): every one of the 2^32 f32 bit patterns goes through each bulk
// f32 -> narrow conversion of the vector backend and must give the scalar rule's bits.
#include <atomic>
#include <cstring>
#include <vector>

#include "common/test_util.hpp"

namespace dsk {
namespace {

template <class Narrow>
uint32_t bits_of(Narrow v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof(v));
  return b;
}

// Runs `check(first_pattern, count, mismatches)` over all 2^32 patterns in chunks, in parallel.
template <class Check>
int64_t count_mismatches(Check check) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::atomic<int64_t> mismatches{0};
  parallel_for((int64_t{1} << 32) / kChunk,
               [&](int64_t begin, int64_t end, int) {
                 std::vector<float> in(kChunk);
                 for (int64_t c = begin; c < end; ++c) {
                   for (int64_t i = 0; i < kChunk; ++i) {
                     const uint32_t b = static_cast<uint32_t>(c * kChunk + i);
                     std::memcpy(&in[i], &b, 4);
                   }
                   mismatches += check(in.data(), kChunk);
                 }
               },
               1);
  return mismatches.load();
}

template <class Narrow, class Bulk, class Scalar>
int64_t exhaustive(Bulk bulk, Scalar scalar) {
  return count_mismatches([&](const float* in, int64_t n) {
    std::vector<Narrow> out(n);
    bulk(in, out.data(), static_cast<size_t>(n));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += bits_of(out[i]) != bits_of(scalar(in[i]));
    return bad;
  });
}

class ExhaustiveF32 : public ::testing::Test {
 protected:
  void SetUp() override {
    DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
    saved_ = backend();
    set_backend(Backend::avx512);
  }
  void TearDown() override {
    if (backend_supported(Backend::avx512)) set_backend(saved_);
  }
  Backend saved_ = Backend::generic;
};

TEST_F(ExhaustiveF32, ToBf16) {
  EXPECT_EQ(exhaustive<bf16>(convert_f32_to_bf16, numeric::f32_to_bf16), 0);
}
TEST_F(ExhaustiveF32, ToF16) {
  EXPECT_EQ(exhaustive<f16>(convert_f32_to_f16, numeric::f32_to_f16), 0);
}
TEST_F(ExhaustiveF32, ToE4m3) {
  EXPECT_EQ(exhaustive<e4m3>(convert_f32_to_e4m3, numeric::f32_to_e4m3), 0);
}
TEST_F(ExhaustiveF32, ToE5m2) {
  EXPECT_EQ(exhaustive<e5m2>(convert_f32_to_e5m2, numeric::f32_to_e5m2), 0);
}
TEST_F(ExhaustiveF32, ToE2m1) {
  // Each pattern is the even (low nibble) element of one byte and the odd one of another.
  const int64_t bad = count_mismatches([](const float* in, int64_t n) {
    std::vector<fp4x2> out(n / 2);
    convert_f32_to_fp4x2(in, out.data(), static_cast<size_t>(n));
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; i += 2) {
      const fp4x2 expected =
          numeric::pack_e2m1(numeric::f32_to_e2m1(in[i]), numeric::f32_to_e2m1(in[i + 1]));
      mismatches += out[i / 2].bits != expected.bits;
    }
    return mismatches;
  });
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace dsk
