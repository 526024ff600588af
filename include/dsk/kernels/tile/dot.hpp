// Register-resident dot-product tiles: a Rows x (16 * Vecs) block of f32 accumulators held in
// vector registers, advanced one bf16 pair of K at a time with VDPBF16PS (A broadcast from memory,
// B as 16-column vectors of bf16 pairs, the VNNI row format of pack.hpp). The vector-register
// counterpart of TileUnit, for CPUs whose fastest bf16 product is AVX512-BF16 rather than AMX.
//
//   DotTile<I, 6, 4> acc;                       // 6 rows x 64 columns = 24 zmm accumulators
//   dot_zero(acc);
//   dot_steps(acc, a, lda, b, ldb, k2_count);   // acc[r][c] += sum over the pairs of K
//   dot_store(acc, c, ldc);
//
// Operands of one step k2: A pair (a[r * lda + 2k2], a[r * lda + 2k2 + 1]) for each row r, and
// B row k2 of a VNNI panel: b[k2 * ldb + 2c + j] = B(2k2 + j, c) for the 16 * Vecs columns c.
//
// Numerics contract (VDPBF16PS as the Intel SDM writes it, checked on AMD Zen 5 and on a Sapphire
// Rapids class Xeon): for each output
// element and each step, the odd product first, then the even one,
//     acc = acc + A[2k2+1] * B[2k2+1]
//     acc = acc + A[2k2]   * B[2k2]
// each an FMA rounded once to f32, round to nearest even, with DAZ on every input (the
// accumulator included) and FTZ on each result (tininess after rounding), whatever MXCSR says.
// Finite inputs give the same bits on the avx512 (and amx) and generic ISAs. This is NOT what
// TileUnit::mma does (separate even and odd chains, then C + (even + odd)), so a DotTile and a
// TileUnit computing the same product may differ in the last bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/epilogue.hpp>
#include <dsk/kernels/tile/generic.hpp>
#include <dsk/kernels/tile/isa.hpp>

#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

// Lanes of one dot vector: 16 f32 accumulators, or 16 bf16 pairs.
inline constexpr int kDotLanes = 16;

namespace detail {

// The vector types of an ISA's dot tiles. amx uses the AVX-512 vectors (vector_isa_t).
template <class I>
struct DotVectors;

template <>
struct DotVectors<generic_t> {
  struct F32 {
    float lane[kDotLanes];
  };
  struct Pairs {
    uint32_t lane[kDotLanes];  // bf16 pair: even element in the low half, odd in the high half
  };
};

#if DSK_TILE_HAS_AVX512
template <>
struct DotVectors<avx512_t> {
  using F32 = __m512;
  using Pairs = __m512i;
};
#endif

// NOTES: a * b + c rounded once to f32, for bf16 a and b and f32 c, without std::fma (a libm
// call on baseline x86-64): in f64 the product is exact (8 + 8 significant bits) and so is the
// sum whenever the exponents of c and a * b are within 29 of each other (it spans at most 53
// bits). Otherwise the smaller term is below 2^-29 of the larger, far from the half-ulp of an f32
// result, so rounding the f64 sum to f32 still gives the correctly rounded f32 sum. Then FTZ,
// with tininess after rounding (x86): the sum rounded to 24 bits with an unbounded exponent,
// which is the f32 rounding of the sum scaled by 2^64, must reach 2^-126.
__attribute__((always_inline)) inline float bf16_fma_ftz(float a, float b, float c) {
  const double sum = static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c);
  const float r = static_cast<float>(sum);
  if (std::fabs(r) > 0x1p-126f) return r;
  const float scaled = static_cast<float>(sum * 0x1p64);
  return std::fabs(scaled) < 0x1p-62f ? std::copysign(0.0f, r) : r;
}

// One VDPBF16PS lane, with the hardware's order and its DAZ / FTZ / RNE environment. Always
// inlined: the compiler kept it out of line, so every lane of the generic dot tiles went through
// libdsk's PLT (60% of a generic model step; 18% fewer CPU samples inlined, AMD Zen 3).
__attribute__((always_inline)) inline float dot_pair_generic(float acc, uint32_t a_pair,
                                                             uint32_t b_pair) {
  const auto half = [](uint32_t pair, int j) {
    return daz(numeric::float_of(j == 0 ? pair << 16 : pair & 0xFFFF0000u));
  };
  acc = bf16_fma_ftz(half(a_pair, 1), half(b_pair, 1), daz(acc));
  return bf16_fma_ftz(half(a_pair, 0), half(b_pair, 0), acc);
}

}  // namespace detail

// The f32 and bf16-pair vectors of ISA I (generic: arrays; avx512 / amx: zmm registers).
template <Isa I>
using DotF32 = typename detail::DotVectors<vector_isa_t<I>>::F32;
template <Isa I>
using DotPairs = typename detail::DotVectors<vector_isa_t<I>>::Pairs;

// Rows x (16 * Vecs) f32 accumulators. Keep a tile in a local variable and pass it only to the
// inline functions below, so that the compiler can keep it in registers (24 zmm for 6 x 64 leave
// room for 4 B vectors and a broadcast A pair out of 32).
template <Isa I, int Rows, int Vecs>
struct DotTile {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  static_assert(Rows >= 1 && Vecs >= 1, "a dot tile has at least one row and one vector");
  static constexpr int rows = Rows;
  static constexpr int vecs = Vecs;
  static constexpr int cols = kDotLanes * Vecs;
  DotF32<I> acc[Rows][Vecs];
};

#define DSK_DOT_UNROLL _Pragma("GCC unroll 16")

namespace detail {
template <class I>
inline constexpr bool dot_avx512 = !std::same_as<vector_isa_t<I>, generic_t>;
}  // namespace detail

// 64 bytes of bf16 pairs (16 columns of one VNNI row) into a vector.
template <Isa I>
inline DotPairs<I> dot_load_pairs(const void* src) {
  if constexpr (detail::dot_avx512<I>) {
#if DSK_TILE_HAS_AVX512
    return _mm512_loadu_si512(src);
#endif
  } else {
    DotPairs<I> v;
    std::memcpy(v.lane, src, sizeof v.lane);
    return v;
  }
}

template <Isa I, int Rows, int Vecs>
inline void dot_zero(DotTile<I, Rows, Vecs>& t) {
  DSK_DOT_UNROLL
  for (int r = 0; r < Rows; ++r) {
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v) {
      if constexpr (detail::dot_avx512<I>) {
#if DSK_TILE_HAS_AVX512
        t.acc[r][v] = _mm512_setzero_ps();
#endif
      } else {
        for (float& x : t.acc[r][v].lane) x = 0.0f;
      }
    }
  }
}

// The tile = the Rows x cols block of f32 at c, row r at c + r * ldc (elements).
template <Isa I, int Rows, int Vecs>
inline void dot_load(DotTile<I, Rows, Vecs>& t, const float* c, int64_t ldc) {
  DSK_DOT_UNROLL
  for (int r = 0; r < Rows; ++r) {
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v) {
      const float* p = c + r * ldc + kDotLanes * v;
      if constexpr (detail::dot_avx512<I>) {
#if DSK_TILE_HAS_AVX512
        t.acc[r][v] = _mm512_loadu_ps(p);
#endif
      } else {
        std::memcpy(t.acc[r][v].lane, p, sizeof t.acc[r][v].lane);
      }
    }
  }
}

template <Isa I, int Rows, int Vecs>
inline void dot_store(const DotTile<I, Rows, Vecs>& t, float* c, int64_t ldc) {
  DSK_DOT_UNROLL
  for (int r = 0; r < Rows; ++r) {
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v) {
      float* p = c + r * ldc + kDotLanes * v;
      if constexpr (detail::dot_avx512<I>) {
#if DSK_TILE_HAS_AVX512
        _mm512_storeu_ps(p, t.acc[r][v]);
#endif
      } else {
        std::memcpy(p, t.acc[r][v].lane, sizeof t.acc[r][v].lane);
      }
    }
  }
}

// Row r of one step of K: acc[r][16v + i] += the bf16 pair at a . b[v] lane i.
template <Isa I, int Rows, int Vecs>
inline void dot_row_step(DotTile<I, Rows, Vecs>& t, int r, const bf16* a,
                         const DotPairs<I> (&b)[Vecs]) {
  uint32_t pair;
  std::memcpy(&pair, a, sizeof pair);
  if constexpr (detail::dot_avx512<I>) {
#if DSK_TILE_HAS_AVX512
    const __m512bh a_pair = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v)
      t.acc[r][v] = _mm512_dpbf16_ps(t.acc[r][v], a_pair, (__m512bh)b[v]);
#endif
  } else {
    for (int v = 0; v < Vecs; ++v)
      for (int i = 0; i < kDotLanes; ++i)
        t.acc[r][v].lane[i] = detail::dot_pair_generic(t.acc[r][v].lane[i], pair, b[v].lane[i]);
  }
}

// One step of K: acc[r][16v + i] += A pair at a + r * lda (elements) . b[v] lane i.
template <Isa I, int Rows, int Vecs>
inline void dot_step(DotTile<I, Rows, Vecs>& t, const bf16* a, int64_t lda,
                     const DotPairs<I> (&b)[Vecs]) {
  DSK_DOT_UNROLL
  for (int r = 0; r < Rows; ++r) dot_row_step(t, r, a + r * lda, b);
}

// `steps` steps of K with each A row at its own address (gathered rows): step s reads the pair
// at rows[r] + 2s for row r, and B row s at b + s * ldb (elements).
template <Isa I, int Rows, int Vecs>
inline void dot_steps_rows(DotTile<I, Rows, Vecs>& t, const bf16* const (&rows)[Rows],
                           const bf16* b, int64_t ldb, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    DotPairs<I> row[Vecs];
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v) row[v] = dot_load_pairs<I>(b + s * ldb + 2 * kDotLanes * v);
    DSK_DOT_UNROLL
    for (int r = 0; r < Rows; ++r) dot_row_step(t, r, rows[r] + 2 * s, row);
  }
}

// `steps` steps of K: step s reads the A pairs at a + 2s (row stride lda elements) and B row s
// at b + s * ldb (elements; 2 * cols bf16 per row).
template <Isa I, int Rows, int Vecs>
inline void dot_steps(DotTile<I, Rows, Vecs>& t, const bf16* a, int64_t lda, const bf16* b,
                      int64_t ldb, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    DotPairs<I> row[Vecs];
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v) row[v] = dot_load_pairs<I>(b + s * ldb + 2 * kDotLanes * v);
    dot_step(t, a + 2 * s, lda, row);
  }
}

// DeepGEMM's promotion of a block's partial sums: c[r][j] = fma(t[r][j], row_scale[r] *
// col_scale[j], c[r][j]) (the scale product rounded to f32 first, then one fused rounding),
// under the caller's MXCSR.
template <Isa I, int Rows, int Vecs>
inline void dot_promote(const DotTile<I, Rows, Vecs>& t, float* c, int64_t ldc,
                        const float* row_scale, const float* col_scale) {
  DSK_DOT_UNROLL
  for (int r = 0; r < Rows; ++r) {
    DSK_DOT_UNROLL
    for (int v = 0; v < Vecs; ++v) {
      float* p = c + r * ldc + kDotLanes * v;
      const float* cs = col_scale + kDotLanes * v;
      if constexpr (detail::dot_avx512<I>) {
#if DSK_TILE_HAS_AVX512
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(row_scale[r]), _mm512_loadu_ps(cs));
        _mm512_storeu_ps(p, _mm512_fmadd_ps(t.acc[r][v], scale, _mm512_loadu_ps(p)));
#endif
      } else {
        for (int i = 0; i < kDotLanes; ++i)
          p[i] = std::fma(t.acc[r][v].lane[i], detail::rounded(row_scale[r] * cs[i]), p[i]);
      }
    }
  }
}

#undef DSK_DOT_UNROLL

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile

DSK_SILENCE_GCC_BUG_105593_END
