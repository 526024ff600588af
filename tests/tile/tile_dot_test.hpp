// Shared declarations of the dot-tile tests (dsk/kernels/tile/dot.hpp): each ISA's translation unit
// (test_tile_dot.cpp for generic, test_tile_dot_avx512.cpp for avx512) instantiates the bodies of
// tile_dot_test_body.hpp and exposes them as plain function pointers.
#pragma once

#include <cstdint>

#include <dsk/kernels/numeric.hpp>

namespace dsk::tile_test {

// The (rows, vectors) shapes every ISA instantiates: the GEMM micro-tiles and small edge shapes.
struct DotShape {
  int rows, vecs;
};
inline constexpr DotShape kDotShapes[] = {{6, 4}, {1, 1}, {3, 2}, {14, 2}, {4, 4}, {5, 3}};
inline constexpr int kNumDotShapes = sizeof(kDotShapes) / sizeof(kDotShapes[0]);

struct DotRunners {
  // c (rows x 16 * vecs f32, row stride ldc) = c + the `steps` dot steps of kDotShapes[shape]:
  // A pairs at a + 2s (row stride lda elements), B row s at b + s * ldb (elements).
  void (*steps)(int shape, const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t steps,
                float* c, int64_t ldc);
  // A fresh tile (zeroed) advanced by the steps, then promoted into c with the scales.
  void (*promote)(int shape, const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t steps,
                  float* c, int64_t ldc, const float* row_scale, const float* col_scale);
};

const DotRunners& generic_dot_runners();
const DotRunners& avx512_dot_runners();

// VDPBF16PS as the SDM writes it, one scalar hardware FMA per product (odd first) under
// MXCSR = FTZ | DAZ | RNE; same conventions as DotRunners::steps with any rows x cols. Defined in
// the AVX-512 TU: call only where avx512 is supported.
void sdm_reference_dot(int rows, int cols, const bf16* a, int64_t lda, const bf16* b, int64_t ldb,
                       int64_t steps, float* c, int64_t ldc);

}  // namespace dsk::tile_test
