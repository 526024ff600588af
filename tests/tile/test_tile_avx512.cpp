// The tile-layer test bodies instantiated for the avx512 backend (built with the AVX-512 flags),
// and the scalar-FMA transcription of the SDM's TDPBF16PS pseudocode the bf16 tests check against.
#include <immintrin.h>

#include <cstring>

#include "tile/tile_test_body.hpp"

DSK_TILE_TEST_DEFINE_RUNNERS(avx512)

namespace dsk::tile_test {
namespace {

float load_f32(const void* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float load_bf16(const void* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return numeric::float_of(static_cast<uint32_t>(bits) << 16);
}

float fma_ss(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

}  // namespace

// for m, n: even = odd = 0; for k2: even += A[m][2k2] * B[k2][2n]; odd += A[m][2k2+1] *
// B[k2][2n+1]; then C[m][n] += even + odd (tile/unit.hpp's contract), with the hardware applying
// DAZ, FTZ and RNE from MXCSR. The asm statements clobber memory, and every input is read from
// (and the result written to) memory the caller can see, so no FP operation can move outside the
// region where MXCSR is switched.
void fma_model_mma_bf16(const MmaShape& shape, const void* a, int64_t a_stride, const void* b,
                        int64_t b_stride, void* c, int64_t c_stride) {
  const auto* ab = static_cast<const std::byte*>(a);
  const auto* bb = static_cast<const std::byte*>(b);
  auto* cb = static_cast<std::byte*>(c);
  uint32_t saved;
  const uint32_t amx_env = 0x1F80u | 0x8000u | 0x0040u;  // masked, FTZ, DAZ, RNE
  asm volatile("stmxcsr %0" : "=m"(saved));
  asm volatile("ldmxcsr %0" : : "m"(amx_env) : "memory");
  for (int m = 0; m < shape.m; ++m) {
    for (int n = 0; n < shape.n; ++n) {
      std::byte* out = cb + m * c_stride + 4 * n;
      float even = 0.0f, odd = 0.0f;
      for (int k2 = 0; k2 < shape.k / 2; ++k2) {
        const std::byte* a_pair = ab + m * a_stride + 4 * k2;
        const std::byte* b_pair = bb + k2 * b_stride + 4 * n;
        even = fma_ss(load_bf16(a_pair), load_bf16(b_pair), even);
        odd = fma_ss(load_bf16(a_pair + 2), load_bf16(b_pair + 2), odd);
      }
      const float acc = fma_ss(load_f32(out), 1.0f, fma_ss(even, 1.0f, odd));
      std::memcpy(out, &acc, sizeof acc);
    }
  }
  asm volatile("ldmxcsr %0" : : "m"(saved) : "memory");
}

}  // namespace dsk::tile_test
