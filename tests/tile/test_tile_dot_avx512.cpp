// The dot-tile test bodies instantiated for the avx512 backend (built with the AVX-512 flags), and
// the scalar-FMA transcription of the SDM's VDPBF16PS pseudocode the tests check against.
#include <immintrin.h>

#include <cstring>

#include "tile/tile_dot_test_body.hpp"

DSK_TILE_DOT_TEST_DEFINE_RUNNERS(avx512)

namespace dsk::tile_test {
namespace {

float bf16_value(const bf16* p) {
  return numeric::float_of(static_cast<uint32_t>(p->bits) << 16);
}

float fma_ss(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

}  // namespace

// For each element: acc = c; for s: acc += A odd * B odd; acc += A even * B even, with DAZ, FTZ
// and RNE from MXCSR. Inputs are read from and results written to memory inside the switched
// region (the asm statements clobber memory), so no FP operation can move outside it.
void sdm_reference_dot(int rows, int cols, const bf16* a, int64_t lda, const bf16* b, int64_t ldb,
                       int64_t steps, float* c, int64_t ldc) {
  uint32_t saved;
  const uint32_t env = 0x1F80u | 0x8000u | 0x0040u;  // masked, FTZ, DAZ, RNE
  asm volatile("stmxcsr %0" : "=m"(saved));
  asm volatile("ldmxcsr %0" : : "m"(env) : "memory");
  for (int r = 0; r < rows; ++r) {
    for (int n = 0; n < cols; ++n) {
      float acc = c[r * ldc + n];
      for (int64_t s = 0; s < steps; ++s) {
        const bf16* a_pair = a + r * lda + 2 * s;
        const bf16* b_pair = b + s * ldb + 2 * n;
        acc = fma_ss(bf16_value(a_pair + 1), bf16_value(b_pair + 1), acc);
        acc = fma_ss(bf16_value(a_pair), bf16_value(b_pair), acc);
      }
      std::memcpy(c + r * ldc + n, &acc, sizeof acc);
    }
  }
  asm volatile("ldmxcsr %0" : : "m"(saved) : "memory");
}

}  // namespace dsk::tile_test
