// The attention kernels' FP8 token dequantization on AVX-512 against kv_format.hpp's rule.
// Built with the AVX-512 flags; skipped on CPUs without the avx512 backend.
#include <cstring>
#include <iterator>
#include <vector>

#include <dsk/kernels/mla/attention.hpp>

#include "common/isa_test.hpp"
#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

// The attention kernels' dequantization (Fp8Source: a byte table plus an exponent add when the
// scale is a power of two, the f32 route otherwise) gives kv_format's bits on every backend: all
// 256 codes (zeros and NaN included) under power-of-two scales from the smallest to the largest
// the table route accepts, just past them, and scales that are not powers of two.
void gives_the_formats_bits() {
  const float scales[] = {1.0f,    0x1p-117f, 0x1p119f, 0x1p-118f, 0x1p120f, 0x1p-14f,
                          0x1p40f, 3.0f,      0.7f,     -2.0f,     0.0f,     1e-40f};
  std::vector<uint8_t> tk(kv_format::kTokenBytes);
  std::vector<bf16> want(kv_format::kQkDim), got(kv_format::kQkDim);
  for (size_t first = 0; first < std::size(scales); ++first) {
    for (int64_t d = 0; d < kv_format::kLatentDim; ++d)
      tk[d] = static_cast<uint8_t>((d * 7 + first * 3) % 256);  // every code in every tile
    for (int64_t t = 0; t < kv_format::kNumScales; ++t) {
      const float scale = scales[(first + t) % std::size(scales)];
      std::memcpy(tk.data() + kv_format::kScaleOffset + 4 * t, &scale, 4);
    }
    for (int64_t d = 0; d < 2 * kv_format::kRopeDim; ++d)
      tk[kv_format::kRopeOffset + d] = static_cast<uint8_t>(d * 13);
    kv_format::dequantize_token_bf16(tk.data(), want.data());
    const auto check = [&](const char* isa) {
      for (int64_t d = 0; d < kv_format::kQkDim; ++d) {
        uint16_t a, b;
        std::memcpy(&a, &got[d], 2);
        std::memcpy(&b, &want[d], 2);
        ASSERT_EQ(a, b) << isa << " scale set " << first << " value " << d;
      }
    };
    kernels::mla::Fp8Source<tile::generic_t>::dequantize(tk.data(), got.data());
    check("generic");
    kernels::mla::Fp8Source<tile::avx512_t>::dequantize(tk.data(), got.data());
    check("avx512");
  }
}

}  // namespace
}  // namespace dsk::mla_test

// Registered by a baseline file (common/isa_test.hpp).
namespace dsk::test {
DSK_ISA_TESTS(mla_dequantize_avx512_tests, {"KernelDequantization", "GivesTheFormatsBits",
                                            Backend::avx512, &mla_test::gives_the_formats_bits});
}  // namespace dsk::test
