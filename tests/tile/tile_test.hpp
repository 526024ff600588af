// Shared declarations of the tile-layer tests. Each ISA has its own translation unit
// (test_tile_generic.cpp, test_tile_avx512.cpp, test_tile_amx.cpp) that instantiates the test
// bodies of tile_test_body.hpp for its ISA and exposes them as plain function pointers; the tests
// compare those across backends and against the references in test_tile_helpers.cpp.
//
// Only plain types cross translation units here, and everything with code is defined in one TU:
// an inline function compiled in the AVX-512 TU could otherwise be the copy the linker keeps.
#pragma once

#include <cstdint>
#include <vector>

#include <dsk/core/cpu.hpp>
#include <dsk/kernels/numeric.hpp>

namespace dsk::tile_test {

// ---- shapes instantiated by every ISA ----
struct TileShape {
  int element_bytes;  // 1: int8_t, 2: bf16, 4: float
  int rows, cols;
};
inline constexpr TileShape kTileShapes[] = {{2, 16, 32}, {2, 7, 14}, {1, 16, 64}, {1, 3, 8},
                                            {4, 16, 16}, {4, 9, 7},  {4, 1, 1}};
inline constexpr int kNumTileShapes = sizeof(kTileShapes) / sizeof(kTileShapes[0]);

struct MmaShape {
  int m, n, k;  // logical: C is m x n, A is m x k, B is k x n
};
inline constexpr MmaShape kBf16Shapes[] = {{16, 16, 32}, {5, 7, 10}, {16, 1, 2}, {1, 16, 32},
                                           {11, 13, 30}, {1, 1, 4},  {16, 16, 4}};
inline constexpr int kNumBf16Shapes = sizeof(kBf16Shapes) / sizeof(kBf16Shapes[0]);
inline constexpr int kBf16EdgeShape = 5;  // {1, 1, 4}: two k pairs, for hand-made cases

inline constexpr MmaShape kInt8Shapes[] = {
    {16, 16, 64}, {3, 9, 20}, {16, 1, 4}, {1, 16, 64}, {13, 11, 60}};
inline constexpr int kNumInt8Shapes = sizeof(kInt8Shapes) / sizeof(kInt8Shapes[0]);

// Signedness of A and B in an int8 multiply.
enum class Int8Kind { s8s8, s8u8, u8s8, u8u8 };
inline constexpr Int8Kind kInt8Kinds[] = {Int8Kind::s8s8, Int8Kind::s8u8, Int8Kind::u8s8,
                                          Int8Kind::u8u8};
const char* int8_kind_name(Int8Kind kind);

// ---- what each ISA's translation unit provides (strides in bytes unless named ld*) ----
struct Runners {
  // Loads tile kTileShapes[shape] from src, stores it to dst.
  void (*load_store)(int shape, const void* src, int64_t src_stride, void* dst, int64_t dst_stride);
  // Loads the tile from src, zeroes it, stores it to dst.
  void (*zero_store)(int shape, const void* src, int64_t src_stride, void* dst, int64_t dst_stride);
  // C += A * B for kBf16Shapes[shape]: A m x k bf16, B in VNNI form (k/2 rows of 2n bf16),
  // C m x n f32, each loaded from / stored to its buffer.
  void (*mma_bf16)(int shape, const void* a, int64_t a_stride, const void* b, int64_t b_stride,
                   void* c, int64_t c_stride);
  // C += A * B for kInt8Shapes[shape] (B: k/4 rows of 4n bytes, C int32).
  void (*mma_int8)(int shape, Int8Kind kind, const void* a, int64_t a_stride, const void* b,
                   int64_t b_stride, void* c, int64_t c_stride);
  // pack_b_vnni_nn (nt = false) or pack_b_vnni_nt (nt = true).
  void (*pack_bf16)(bool nt, const bf16* b, int64_t ldb, int k, int n, bf16* dst, int64_t ld_dst,
                    int k_pad, int n_pad);
  void (*pack_s8)(bool nt, const int8_t* b, int64_t ldb, int k, int n, int8_t* dst, int64_t ld_dst,
                  int k_pad, int n_pad);
  void (*pack_u8)(bool nt, const uint8_t* b, int64_t ldb, int k, int n, uint8_t* dst,
                  int64_t ld_dst, int k_pad, int n_pad);
  // pack_b_vnni_nt_widen: e4m3 codes [n, k] into bf16 VNNI form.
  void (*pack_e4m3_widen)(const e4m3* b, int64_t ldb, int k, int n, bf16* dst, int64_t ld_dst,
                          int k_pad, int n_pad);
  // The epilogue helpers, as declared in epilogue.hpp.
  void (*scale_rows)(float* data, int64_t ld, int rows, int cols, const float* row_scale);
  void (*scale_cols)(float* data, int64_t ld, int rows, int cols, const float* col_scale);
  void (*accumulate)(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                     int cols);
  void (*accumulate_scaled)(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                            int cols, const float* row_scale, const float* col_scale);
  void (*store_rows_bf16)(const float* src, int64_t ld_src, int rows, int cols, bf16* dst,
                          int64_t ld_dst);
  // c (m x n, contiguous) = a (m x k, contiguous) * b^T with b given as [n, k], built from the
  // primitives: zero-padded copy of A, VNNI packing of B, a 2 x 2 register-blocked tile loop.
  void (*gemm_bf16_nt)(int m, int n, int k, const bf16* a, const bf16* b, float* c);
  void (*gemm_int8_nt)(Int8Kind kind, int m, int n, int k, const void* a, const void* b,
                       int32_t* c);
};

const Runners& generic_runners();
const Runners& avx512_runners();
const Runners& amx_runners();
// The runners of backend b; b must be supported by this CPU.
const Runners& runners_for(Backend b);

// TDPBF16PS written out from tile/unit.hpp's contract (two chains, then C + (even + odd)), one
// scalar hardware FMA per step under MXCSR = FTZ | DAZ | RNE (defined in the AVX-512 TU: call it
// only where avx512 is supported). Same buffer conventions as Runners::mma_bf16, with the shape
// given at run time.
void fma_model_mma_bf16(const MmaShape& shape, const void* a, int64_t a_stride, const void* b,
                        int64_t b_stride, void* c, int64_t c_stride);

// ---- test data (test_tile_helpers.cpp) ----
// Random non-zero bf16: mostly |x| in [2^-7, 2^3], some tiny normals (2^-126 .. 2^-97) whose
// products fall below the f32 normal range, and, with `with_denormals`, some bf16 denormals.
std::vector<bf16> random_bf16(size_t n, uint32_t seed, bool with_denormals);
// Random non-zero f32 accumulators: mostly normal, some near 2^-126, some denormal.
std::vector<float> random_accumulators(size_t n, uint32_t seed);
// Random bytes, the extremes (0x00, 0x7F, 0x80, 0xFF) at least once when n >= 4.
std::vector<uint8_t> random_bytes(size_t n, uint32_t seed);
// Random non-zero f32 in [-1, 1] (a sprinkle of denormals when `with_denormals`).
std::vector<float> random_floats(size_t n, uint32_t seed, bool with_denormals);

}  // namespace dsk::tile_test
