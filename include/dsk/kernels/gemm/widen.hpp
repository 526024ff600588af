// Widening of GEMM operands to bf16, the one format the dot and tile products consume: packed
// FP8 / FP4 weight rows into bf16 VNNI pairs (one row into registers, or rows into an L1 buffer),
// and blocks of A (bf16, e4m3 or e2m1, any strides) into a zero-padded row-major bf16 buffer.
//
// Power-of-two scales are folded in exactly: every widened e4m3 / e2m1 value is a normal bf16 (or
// zero), and multiplying it by 2^e adds e to its exponent field, which stays normal as long as
// |e| <= kMaxFoldExponent. Zeros are left alone (and NaN, on the A side; a weight whose layout says
// scales_foldable holds none).
#pragma once

#include <cstdint>
#include <cstring>

#include <dsk/kernels/gemm/layout.hpp>
#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/dot.hpp>

#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

namespace dsk::kernels::gemm {

// The largest |e| of a scale 2^e that may be folded into widened values (e4m3 magnitudes are
// 2^-9 .. 448, e2m1 0.5 .. 6: with |e| <= 100 every product is a normal bf16).
inline constexpr int kMaxFoldExponent = 100;

inline namespace DSK_TILE_ABI {

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace widen_detail {
template <class I>
inline constexpr bool use_avx512 = !std::same_as<tile::vector_isa_t<I>, tile::generic_t>;

// e of a power of two 2^e given as an f32 (its biased exponent minus 127).
inline int scale_exponent(float s) {
  return static_cast<int>((numeric::bits_of(s) >> 23) & 0xFFu) - 127;
}

// A bf16 multiplied by 2^e by moving its exponent; zero, inf and NaN stay as they are.
inline uint16_t fold_bf16(uint16_t x, int e) {
  const uint16_t magnitude = x & 0x7FFFu;
  if (magnitude == 0 || magnitude >= 0x7F80u) return x;
  return static_cast<uint16_t>(x + (e << 7));
}

inline uint16_t widen_scalar(Elem type, uint8_t code) {
  return type == Elem::e4m3 ? numeric::f32_to_bf16(numeric::e4m3_to_f32(e4m3{code})).bits
                            : numeric::f32_to_bf16(numeric::e2m1_to_f32(code)).bits;
}

// Pair j (column j) of a packed row as two bf16 bits.
inline uint32_t widen_pair_scalar(Elem type, const std::byte* row, int j) {
  const auto* b = reinterpret_cast<const uint8_t*>(row);
  if (type == Elem::bf16) {
    uint32_t pair;
    std::memcpy(&pair, b + 4 * j, sizeof pair);
    return pair;
  }
  const uint8_t lo = type == Elem::e4m3 ? b[2 * j] : static_cast<uint8_t>(b[j] & 0xFu);
  const uint8_t hi = type == Elem::e4m3 ? b[2 * j + 1] : static_cast<uint8_t>(b[j] >> 4);
  return widen_scalar(type, lo) | (static_cast<uint32_t>(widen_scalar(type, hi)) << 16);
}

}  // namespace widen_detail

// The fold of one panel row's 16-column group j: (e << 7) in both 16-bit halves of each lane,
// from the 16 power-of-two scales at scales16.
template <tile::Isa I>
inline tile::DotPairs<I> fold_shift(const float* scales16) {
  if constexpr (widen_detail::use_avx512<I>) {
#if DSK_TILE_HAS_AVX512
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(scales16));
    const __m512i e =
        _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xFF)),
                         _mm512_set1_epi32(127));
    const __m512i half = _mm512_and_si512(_mm512_slli_epi32(e, 7), _mm512_set1_epi32(0xFFFF));
    return _mm512_or_si512(half, _mm512_slli_epi32(half, 16));
#endif
  } else {
    tile::DotPairs<I> s;
    for (int i = 0; i < tile::kDotLanes; ++i) {
      const uint32_t half =
          static_cast<uint32_t>(widen_detail::scale_exponent(scales16[i]) << 7) & 0xFFFFu;
      s.lane[i] = half | (half << 16);
    }
    return s;
  }
}

// x with the fold applied to its non-zero bf16 halves (weights: no NaN there).
template <tile::Isa I>
inline tile::DotPairs<I> apply_fold(tile::DotPairs<I> x, const tile::DotPairs<I>& shift) {
  if constexpr (widen_detail::use_avx512<I>) {
#if DSK_TILE_HAS_AVX512
    const __mmask32 nonzero = _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x7FFF));
    return _mm512_mask_add_epi16(x, nonzero, x, shift);
#endif
  } else {
    for (int i = 0; i < tile::kDotLanes; ++i) {
      uint32_t out = 0;
      for (int h = 0; h < 2; ++h) {
        const auto v = static_cast<uint16_t>(x.lane[i] >> (16 * h));
        const auto s = static_cast<uint16_t>(shift.lane[i] >> (16 * h));
        out |= static_cast<uint32_t>(v & 0x7FFFu ? static_cast<uint16_t>(v + s) : v) << (16 * h);
      }
      x.lane[i] = out;
    }
    return x;
  }
}

// Vectors [j0, j0 + V) of one VNNI row of a packed panel (16 columns each, kPanelCols pairs of
// `type` in the row) as bf16 pairs.
template <tile::Isa I, int V>
inline void widen_cols(Elem type, const std::byte* row, int j0, tile::DotPairs<I> (&out)[V]) {
  static_assert(V == 1 || V == 2 || V == 4, "1, 2 or 4 vectors of 16 columns");
  if constexpr (widen_detail::use_avx512<I>) {
#if DSK_TILE_HAS_AVX512
    if (type == Elem::bf16) {
      for (int j = 0; j < V; ++j) out[j] = _mm512_loadu_si512(row + 64 * (j0 + j));
    } else if (type == Elem::e4m3) {
      const std::byte* codes = row + 32 * j0;
      if constexpr (V == 1) {
        out[0] = tile::e4m3x32_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
      } else {
        for (int h = 0; h < V / 2; ++h) {
          const tile::Bf16x64 w = tile::e4m3x64_to_bf16(_mm512_loadu_si512(codes + 64 * h));
          out[2 * h] = w.first;
          out[2 * h + 1] = w.second;
        }
      }
    } else {
      for (int j = 0; j < V; ++j)
        out[j] = tile::e2m1x32_to_bf16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * (j0 + j))));
    }
#endif
  } else {
    for (int j = 0; j < V; ++j)
      for (int i = 0; i < tile::kDotLanes; ++i)
        out[j].lane[i] = widen_detail::widen_pair_scalar(type, row, 16 * (j0 + j) + i);
  }
}

// One whole VNNI row of a packed panel as 4 vectors of bf16 pairs.
template <tile::Isa I>
inline void widen_row(Elem type, const std::byte* row, tile::DotPairs<I> (&out)[4]) {
  widen_cols<I, 4>(type, row, 0, out);
}

// Rows of packed B a widening loop prefetches ahead of the row it converts (1 to 4 KiB: the rows
// come from L3 or DRAM, and a panel pass is too short for the hardware prefetchers to help).
inline constexpr int kWidenPrefetchRows = 16;

namespace widen_detail {

// Row i + kWidenPrefetchRows of `rows` into L1 when it is below prefetch_rows.
inline void prefetch_row_ahead(const std::byte* rows, int64_t row_bytes, int64_t i,
                               int64_t prefetch_rows) {
  if (i + kWidenPrefetchRows >= prefetch_rows) return;
  const std::byte* ahead = rows + (i + kWidenPrefetchRows) * row_bytes;
  for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b, 0, 3);
}

// `count` consecutive e4m3 panel rows widened to dst (row stride ld_dst), each 16-column group j
// times shift[j] when kFold. One loop per case, with no per-vector branch and nothing kept on the
// stack: at a few rows per item (routed experts) this loop, not the tiles, bounds the GEMM.
template <tile::Isa I, bool kFold>
void widen_e4m3_rows(const std::byte* rows, int64_t row_bytes, int64_t count, int64_t prefetch_rows,
                     const tile::DotPairs<I> (&shift)[4], bf16* dst, int64_t ld_dst) {
#if DSK_TILE_HAS_AVX512
  for (int64_t i = 0; i < count; ++i) {
    const std::byte* row = rows + i * row_bytes;
    prefetch_row_ahead(rows, row_bytes, i, prefetch_rows);
    const tile::Bf16x64 lo = tile::e4m3x64_to_bf16(_mm512_loadu_si512(row));
    const tile::Bf16x64 hi = tile::e4m3x64_to_bf16(_mm512_loadu_si512(row + 64));
    __m512i v[4] = {lo.first, lo.second, hi.first, hi.second};
    bf16* out = dst + i * ld_dst;
    for (int j = 0; j < 4; ++j) {
      if constexpr (kFold) v[j] = apply_fold<I>(v[j], shift[j]);
      _mm512_storeu_si512(out + 32 * j, v[j]);
    }
  }
#else
  (void)rows, (void)row_bytes, (void)count, (void)prefetch_rows, (void)shift, (void)dst,
      (void)ld_dst;
#endif
}

// `count` consecutive panel rows of any type widened to dst (row stride ld_dst), folded by shift
// when `fold`; the rows below prefetch_rows (counted from `rows`, 0: none) are prefetched ahead.
template <tile::Isa I>
void widen_rows(Elem type, const std::byte* rows, int64_t row_bytes, int64_t count,
                int64_t prefetch_rows, bool fold, const tile::DotPairs<I> (&shift)[4], bf16* dst,
                int64_t ld_dst) {
  if constexpr (use_avx512<I>) {
    if (type == Elem::e4m3) {
      if (fold)
        widen_e4m3_rows<I, true>(rows, row_bytes, count, prefetch_rows, shift, dst, ld_dst);
      else
        widen_e4m3_rows<I, false>(rows, row_bytes, count, prefetch_rows, shift, dst, ld_dst);
      return;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (use_avx512<I>) prefetch_row_ahead(rows, row_bytes, i, prefetch_rows);
    tile::DotPairs<I> v[4];
    widen_row<I>(type, rows + i * row_bytes, v);
    bf16* out = dst + i * ld_dst;
    for (int j = 0; j < 4; ++j) {
      if (fold) v[j] = apply_fold<I>(v[j], shift[j]);
      if constexpr (use_avx512<I>) {
#if DSK_TILE_HAS_AVX512
        _mm512_storeu_si512(out + 32 * j, v[j]);
#endif
      } else {
        std::memcpy(out + 32 * j, v[j].lane, sizeof v[j].lane);
      }
    }
  }
}

}  // namespace widen_detail

// Rows [k2_begin, k2_end) of panel `panel` widened to bf16 pairs at dst (kPanelRowBf16 elements of
// each row at dst + i * ld_dst), with the panel's scales folded in when `fold`. Rows below
// prefetch_end (none by default) are prefetched ahead of the conversion.
template <tile::Isa I>
void widen_panel_rows(const PackedLayout& l, const std::byte* base, int64_t panel, int64_t k2_begin,
                      int64_t k2_end, bool fold, bf16* dst, int64_t ld_dst,
                      int64_t prefetch_end = 0) {
  const std::byte* data = panel_data(base, l, panel);
  const int64_t rows_per_block = fold ? l.scale_gran_k / 2 : layout_rows(l);
  for (int64_t k2 = k2_begin; k2 < k2_end;) {
    const int64_t block_end = std::min(k2_end, (k2 / rows_per_block + 1) * rows_per_block);
    tile::DotPairs<I> shift[4]{};
    if (fold) {
      const float* scales = panel_scales(base, l, panel, k2 / rows_per_block);
      for (int j = 0; j < 4; ++j) shift[j] = fold_shift<I>(scales + 16 * j);
    }
    widen_detail::widen_rows<I>(l.type, data + k2 * l.row_bytes, l.row_bytes, block_end - k2,
                                std::max<int64_t>(prefetch_end - k2, 0), fold, shift,
                                dst + (k2 - k2_begin) * ld_dst, ld_dst);
    k2 = block_end;
  }
}

// ---- A blocks ----

// A [m, k] as the kernels read it: element (r, kk) at data + r * stride_r + kk * stride_k
// (elements; e2m1 is K-major, stride_k == 1 counting bytes), scales (r, kb) at
// sf[(r / sf_gran_m) * sf_ld + kb], one per sf_gran_k values of K (sf == nullptr: none).
struct OperandA {
  const void* data = nullptr;
  int64_t stride_r = 0, stride_k = 1;
  const float* sf = nullptr;
  int64_t sf_ld = 0;
  int sf_gran_m = 1, sf_gran_k = 128;
};

namespace widen_detail {

// Converts `count` values of row r starting at k0 (count even for e2m1, k0 even) into dst.
template <tile::Isa I>
void widen_a_values(Elem type, const OperandA& a, int64_t r, int64_t k0, int64_t count, bf16* dst) {
  const auto* bytes = static_cast<const uint8_t*>(a.data);
  if (type == Elem::bf16) {
    const auto* row = static_cast<const bf16*>(a.data) + r * a.stride_r;
    if (a.stride_k == 1) {
      std::memcpy(dst, row + k0, static_cast<size_t>(count) * sizeof(bf16));
    } else {
      for (int64_t i = 0; i < count; ++i) dst[i] = row[(k0 + i) * a.stride_k];
    }
  } else if (type == Elem::e4m3) {
    const uint8_t* row = bytes + r * a.stride_r;
    if (a.stride_k == 1) {
      tile::convert_n<tile::vector_isa_t<I>>(reinterpret_cast<const e4m3*>(row + k0), dst,
                                             static_cast<size_t>(count));
    } else {
      for (int64_t i = 0; i < count; ++i)
        dst[i].bits = widen_scalar(Elem::e4m3, row[(k0 + i) * a.stride_k]);
    }
  } else {
    const uint8_t* row = bytes + r * a.stride_r + k0 / 2;
    tile::convert_n<tile::vector_isa_t<I>>(reinterpret_cast<const fp4x2*>(row), dst,
                                           static_cast<size_t>(count));
  }
}

// Multiplies the bf16 values x[0, count) by 2^e in place (zero, inf and NaN unchanged).
template <tile::Isa I>
void fold_values(bf16* x, int64_t count, int e) {
  int64_t i = 0;
  if constexpr (use_avx512<I>) {
#if DSK_TILE_HAS_AVX512
    const __m512i shift = _mm512_set1_epi16(static_cast<int16_t>(e << 7));
    const __m512i magnitude_mask = _mm512_set1_epi16(0x7FFF);
    const __m512i inf = _mm512_set1_epi16(0x7F80);
    for (; i + 32 <= count; i += 32) {
      const __m512i v = _mm512_loadu_si512(x + i);
      const __m512i magnitude = _mm512_and_si512(v, magnitude_mask);
      const __mmask32 finite_nonzero =
          _mm512_test_epi16_mask(v, magnitude_mask) & _mm512_cmplt_epu16_mask(magnitude, inf);
      _mm512_storeu_si512(x + i, _mm512_mask_add_epi16(v, finite_nonzero, v, shift));
    }
#endif
  }
  for (; i < count; ++i) x[i].bits = fold_bf16(x[i].bits, e);
}

}  // namespace widen_detail

// Rows [r0, r0 + rows) and K [k0, k0 + kc) of A widened to bf16 at dst (row stride ld_dst
// elements), K past k0 + kc zero up to kc_pad, with A's power-of-two scales folded in when `fold`.
// Needs k0 and kc even for e2m1 unless k0 + kc is the end of K.
template <tile::Isa I>
void widen_a_block(Elem type, const OperandA& a, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                   int64_t kc_pad, bool fold, bf16* dst, int64_t ld_dst) {
  for (int64_t i = 0; i < rows; ++i) {
    bf16* out = dst + i * ld_dst;
    const int64_t r = r0 + i;
    widen_detail::widen_a_values<I>(type, a, r, k0, type == Elem::e2m1 ? round_up(kc, 2) : kc, out);
    if (fold) {
      for (int64_t c = 0; c < kc;) {
        const int64_t kb = (k0 + c) / a.sf_gran_k;
        const int64_t end = std::min(kc, (kb + 1) * a.sf_gran_k - k0);
        const float s = a.sf[(r / a.sf_gran_m) * a.sf_ld + kb];
        widen_detail::fold_values<I>(out + c, end - c, widen_detail::scale_exponent(s));
        c = end;
      }
    }
    std::memset(static_cast<void*>(out + kc), 0, static_cast<size_t>(kc_pad - kc) * sizeof(bf16));
  }
}

DSK_SILENCE_GCC_BUG_105593_END

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
