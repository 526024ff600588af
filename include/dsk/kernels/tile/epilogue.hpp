// Row-level epilogue helpers for accumulator blocks after a tile store: per-row and per-column
// scaling, accumulation (plain and scaled) and the f32 -> bf16 output cast. Every helper works on
// a rows x cols block of f32 with row strides in elements and gives the same bits on every ISA.
//
// Each result is computed as written below, one f32 rounding per operation and no fused
// multiply-add, under the caller's MXCSR (round to nearest even, no FTZ/DAZ, for the backends to
// agree on denormals).
#pragma once

#include <cstdint>

#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/isa.hpp>

#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace dsk::tile {
inline namespace DSK_TILE_ABI {
namespace detail {

// Runs op(row, first_column, count) over the block in chunks of at most 16 columns.
template <class Op>
void for_each_chunk16(int rows, int cols, Op op) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; c += 16) op(r, c, cols - c < 16 ? cols - c : 16);
}

#if DSK_TILE_HAS_AVX512
inline __mmask16 lanes(int count) {
  return static_cast<__mmask16>(count >= 16 ? 0xFFFFu : (1u << count) - 1u);
}
#endif

// NOTES: g++ fuses a * b + c into an FMA by default in C++ (-ffp-contract=fast, -std=c++20
// included), across statements and across intrinsics, which changes the rounding and would make
// the backends disagree. A product that goes through an empty asm is opaque to the compiler, so
// it is rounded on its own everywhere. (Non-x86 builds of the generic code get no barrier.)
inline float rounded(float x) {
#if defined(__SSE2__)
  asm("" : "+x"(x));
#endif
  return x;
}
#if DSK_TILE_HAS_AVX512
inline __m512 rounded(__m512 x) {
  asm("" : "+v"(x));
  return x;
}
#endif

template <class I>
inline constexpr bool uses_avx512 = !std::same_as<vector_isa_t<I>, generic_t>;

}  // namespace detail

// data[r][c] = data[r][c] * row_scale[r]
template <Isa I>
void scale_rows(float* data, int64_t ld, int rows, int cols, const float* row_scale) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  detail::for_each_chunk16(rows, cols, [&](int r, int c, int count) {
    float* p = data + r * ld + c;
    if constexpr (detail::uses_avx512<I>) {
#if DSK_TILE_HAS_AVX512
      const __mmask16 m = detail::lanes(count);
      const __m512 x = _mm512_maskz_loadu_ps(m, p);
      _mm512_mask_storeu_ps(p, m, _mm512_mul_ps(x, _mm512_set1_ps(row_scale[r])));
#endif
    } else {
      for (int i = 0; i < count; ++i) p[i] = p[i] * row_scale[r];
    }
  });
}

// data[r][c] = data[r][c] * col_scale[c]
template <Isa I>
void scale_cols(float* data, int64_t ld, int rows, int cols, const float* col_scale) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  detail::for_each_chunk16(rows, cols, [&](int r, int c, int count) {
    float* p = data + r * ld + c;
    if constexpr (detail::uses_avx512<I>) {
#if DSK_TILE_HAS_AVX512
      const __mmask16 m = detail::lanes(count);
      const __m512 x = _mm512_maskz_loadu_ps(m, p);
      _mm512_mask_storeu_ps(p, m, _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, col_scale + c)));
#endif
    } else {
      for (int i = 0; i < count; ++i) p[i] = p[i] * col_scale[c + i];
    }
  });
}

// dst[r][c] = dst[r][c] + src[r][c]
template <Isa I>
void accumulate(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows, int cols) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  detail::for_each_chunk16(rows, cols, [&](int r, int c, int count) {
    float* d = dst + r * ld_dst + c;
    const float* s = src + r * ld_src + c;
    if constexpr (detail::uses_avx512<I>) {
#if DSK_TILE_HAS_AVX512
      const __mmask16 m = detail::lanes(count);
      const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), _mm512_maskz_loadu_ps(m, s));
      _mm512_mask_storeu_ps(d, m, sum);
#endif
    } else {
      for (int i = 0; i < count; ++i) d[i] = d[i] + s[i];
    }
  });
}

// scale = row_scale[r] * col_scale[c]; product = src[r][c] * scale; dst[r][c] = dst[r][c] +
// product (the block-scaled accumulation of an FP8 GEMM: per-row A scales times per-column B
// scales).
template <Isa I>
void accumulate_scaled(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                       int cols, const float* row_scale, const float* col_scale) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  detail::for_each_chunk16(rows, cols, [&](int r, int c, int count) {
    float* d = dst + r * ld_dst + c;
    const float* s = src + r * ld_src + c;
    if constexpr (detail::uses_avx512<I>) {
#if DSK_TILE_HAS_AVX512
      const __mmask16 m = detail::lanes(count);
      const __m512 scale =
          _mm512_mul_ps(_mm512_set1_ps(row_scale[r]), _mm512_maskz_loadu_ps(m, col_scale + c));
      const __m512 product = detail::rounded(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, s), scale));
      _mm512_mask_storeu_ps(d, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), product));
#endif
    } else {
      for (int i = 0; i < count; ++i) {
        const float scale = row_scale[r] * col_scale[c + i];
        const float product = detail::rounded(s[i] * scale);
        d[i] = d[i] + product;
      }
    }
  });
}

// dst[r][c] = bf16(src[r][c]), round to nearest even (convert.hpp's f32 -> bf16 rule).
template <Isa I>
void store_rows_bf16(const float* src, int64_t ld_src, int rows, int cols, bf16* dst,
                     int64_t ld_dst) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  for (int r = 0; r < rows; ++r)
    convert_n<I>(src + r * ld_src, dst + r * ld_dst, static_cast<size_t>(cols));
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile

DSK_SILENCE_GCC_BUG_105593_END
