// Packing for the tile layer: B operands into VNNI form (from a K x N or an N x K matrix, or from
// N x K e4m3 codes widened to bf16 on the way), and zero-padded copies of row-major blocks, so
// kernels never load past a matrix edge.
//
// VNNI form of a logical K x N matrix B, with V = vnni_factor<T> (2 for bf16, 4 for bytes):
//   dst[g * ld_dst + n * V + j] = B(g * V + j, n)   for g < k_pad / V, n < n_pad, j < V,
// and zero where g * V + j >= K or n >= N. The B tile of k-block kb and n-block nb
// (TileB<Id, T, Kt, Nt>) then loads from dst + (kb * Kt / V) * ld_dst + nb * Nt * V with a stride
// of ld_dst * sizeof(T) bytes. The generic and avx512 versions write identical bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/isa.hpp>
#include <dsk/kernels/tile/types.hpp>

#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

// dst (rows_pad x cols_pad, row stride ld_dst elements) = src (rows x cols, row stride ld_src)
// extended with zeros. Needs rows <= rows_pad and cols <= cols_pad.
template <class T>
void copy_padded(const T* src, int64_t ld_src, int rows, int cols, T* dst, int64_t ld_dst,
                 int rows_pad, int cols_pad) {
  for (int r = 0; r < rows_pad; ++r) {
    T* out = dst + r * ld_dst;
    const int copied = r < rows ? cols : 0;
    if (copied > 0) std::memcpy(out, src + r * ld_src, sizeof(T) * copied);
    std::memset(static_cast<void*>(out + copied), 0, sizeof(T) * (cols_pad - copied));
  }
}

namespace detail {

// ---- generic ----
template <OperandElement T, class ElementAt>
void pack_vnni_generic(ElementAt element_at, int k, int n, T* dst, int64_t ld_dst, int k_pad,
                       int n_pad) {
  constexpr int V = vnni_factor<T>;
  for (int g = 0; g < k_pad / V; ++g) {
    T* out = dst + g * ld_dst;
    for (int nn = 0; nn < n_pad; ++nn) {
      for (int j = 0; j < V; ++j) {
        const int kk = g * V + j;
        out[nn * V + j] = (kk < k && nn < n) ? element_at(kk, nn) : T{};
      }
    }
  }
}

#if DSK_TILE_HAS_AVX512

inline __mmask64 low_bytes_mask(int64_t count) {
  return count >= 64 ? ~__mmask64{0} : (__mmask64{1} << std::max<int64_t>(count, 0)) - 1;
}
inline __mmask16 low_lanes_mask(int count) {
  return static_cast<__mmask16>(count >= 16 ? 0xFFFFu : (1u << std::max(count, 0)) - 1);
}

// In-place transpose of a 16 x 16 matrix of dwords held in 16 zmm rows.
inline void transpose_16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows, interleaved by dword
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // quads of rows: u[i + c] holds column 4L + c of rows i..i+3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather 128-bit lane L of the four quads into output row 4L + c
    const __m512i lo01 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);  // L0 L1 | L0 L1
    const __m512i hi01 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);  // L2 L3 | L2 L3
    const __m512i lo23 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i hi23 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);       // lane 0
    t[4 + c] = _mm512_shuffle_i32x4(lo01, lo23, 0xDD);   // lane 1
    t[8 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);   // lane 2
    t[12 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0xDD);  // lane 3
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// B is N x K: packed row g, column n is the dword at byte 4g of B's row n, so packing is a dword
// transpose done in 16 x 16 blocks.
template <OperandElement T>
void pack_vnni_nt_avx512(const T* b, int64_t ldb, int k, int n, T* dst, int64_t ld_dst, int k_pad,
                         int n_pad) {
  constexpr int V = vnni_factor<T>;
  const int groups = k_pad / V;
  const int64_t row_bytes = static_cast<int64_t>(k) * static_cast<int64_t>(sizeof(T));
  for (int n0 = 0; n0 < n_pad; n0 += 16) {
    const __mmask16 store_mask = low_lanes_mask(n_pad - n0);
    for (int g0 = 0; g0 < groups; g0 += 16) {
      const int64_t first_byte = 4 * static_cast<int64_t>(g0);
      const __mmask64 load_mask = low_bytes_mask(row_bytes - first_byte);
      __m512i rows[16];
      for (int i = 0; i < 16; ++i) {
        rows[i] = _mm512_setzero_si512();
        if (n0 + i >= n || first_byte >= row_bytes) continue;  // past B: zeros
        const auto* row = reinterpret_cast<const char*>(b + (n0 + i) * ldb);
        rows[i] = _mm512_maskz_loadu_epi8(load_mask, row + first_byte);
      }
      transpose_16x16_epi32(rows);
      const int count = std::min(16, groups - g0);
      for (int j = 0; j < count; ++j)
        _mm512_mask_storeu_epi32(dst + (g0 + j) * ld_dst + n0 * V, store_mask, rows[j]);
    }
  }
}

// After a dword transpose of 16 rows of e4m3 codes, byte 4t + c of vector j is code 4j + c of row
// t. This order converts such a vector into VNNI group 2j of the 16 rows (their codes 4j, 4j + 1)
// followed by group 2j + 1 (codes 4j + 2, 4j + 3).
constexpr convert_detail::UnpackOrder make_vnni_pair_split() {
  convert_detail::UnpackOrder source{};
  for (int i = 0; i < 64; ++i) {
    const int group = i / 32, row = i % 32 / 2, code = i % 2;
    source.index[i] = static_cast<uint8_t>(4 * row + 2 * group + code);
  }
  return convert_detail::unpack_order_of(source);
}
inline constexpr convert_detail::UnpackOrder kVnniPairSplit = make_vnni_pair_split();

// One part of pack_vnni_nt_avx512 of e4m3 codes widened to bf16 in the same pass: columns
// [n0, n0 + 16) x depth [k0, k0 + 64). The transpose moves codes (half the bytes of their bf16
// values) and the widening shuffle also splits the groups.
inline void pack_vnni_nt_widen_part_avx512(const e4m3* b, int64_t ldb, int k, int n, bf16* dst,
                                           int64_t ld_dst, int k_pad, int n_pad, int n0, int k0) {
  const int groups = k_pad / 2;
  const __mmask16 store_mask = low_lanes_mask(n_pad - n0);
  const __mmask64 load_mask = low_bytes_mask(k - k0);
  __m512i rows[16];
  for (int i = 0; i < 16; ++i)
    rows[i] = n0 + i < n && k0 < k ? _mm512_maskz_loadu_epi8(load_mask, b + (n0 + i) * ldb + k0)
                                   : _mm512_setzero_si512();
  transpose_16x16_epi32(rows);
  for (int j = 0; j < 16 && k0 / 2 + 2 * j < groups; ++j) {
    const int g = k0 / 2 + 2 * j;
    const Bf16x64 v = e4m3x64_to_bf16_ordered(rows[j], kVnniPairSplit);
    _mm512_mask_storeu_epi32(dst + g * ld_dst + n0 * 2, store_mask, v.first);
    if (g + 1 < groups)
      _mm512_mask_storeu_epi32(dst + (g + 1) * ld_dst + n0 * 2, store_mask, v.second);
  }
}

// 16 consecutive elements of one B row, zero-extended to dwords.
template <OperandElement T>
__m512i load_16_as_dwords(const T* src, __mmask16 mask) {
  if constexpr (sizeof(T) == 2) {
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, src));
  } else {
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, src));
  }
}

// B is K x N: packed row g interleaves B rows gV .. gV+V-1 element by element.
template <OperandElement T>
void pack_vnni_nn_avx512(const T* b, int64_t ldb, int k, int n, T* dst, int64_t ld_dst, int k_pad,
                         int n_pad) {
  constexpr int V = vnni_factor<T>;
  constexpr int kBits = 8 * static_cast<int>(sizeof(T));
  for (int g = 0; g < k_pad / V; ++g) {
    for (int n0 = 0; n0 < n_pad; n0 += 16) {
      const __mmask16 load_mask = low_lanes_mask(n - n0);
      __m512i packed = _mm512_setzero_si512();
      for (int j = 0; j < V; ++j) {
        const int kk = g * V + j;
        if (kk >= k || n0 >= n) continue;
        const __m512i lane = load_16_as_dwords(b + kk * ldb + n0, load_mask);
        packed = _mm512_or_si512(packed, _mm512_sll_epi32(lane, _mm_cvtsi32_si128(j * kBits)));
      }
      _mm512_mask_storeu_epi32(dst + g * ld_dst + n0 * V, low_lanes_mask(n_pad - n0), packed);
    }
  }
}

#endif  // DSK_TILE_HAS_AVX512

}  // namespace detail

// B given K x N, row-major (the "nn" layout): B(kk, nn) = b[kk * ldb + nn]. Packs it into VNNI
// form as described at the top of this file. Needs k <= k_pad, k_pad % vnni_factor<T> == 0,
// n <= n_pad and ld_dst >= n_pad * vnni_factor<T>.
template <Isa I, OperandElement T>
void pack_b_vnni_nn(const T* b, int64_t ldb, int k, int n, T* dst, int64_t ld_dst, int k_pad,
                    int n_pad) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  if constexpr (std::same_as<vector_isa_t<I>, generic_t>) {
    const auto at = [&](int kk, int nn) { return b[kk * ldb + nn]; };
    detail::pack_vnni_generic<T>(at, k, n, dst, ld_dst, k_pad, n_pad);
  } else {
#if DSK_TILE_HAS_AVX512
    detail::pack_vnni_nn_avx512(b, ldb, k, n, dst, ld_dst, k_pad, n_pad);
#endif
  }
}

// B given N x K, row-major (the "nt" layout of a weight [N, K]): B(kk, nn) = b[nn * ldb + kk].
// Same output and preconditions as pack_b_vnni_nn.
template <Isa I, OperandElement T>
void pack_b_vnni_nt(const T* b, int64_t ldb, int k, int n, T* dst, int64_t ld_dst, int k_pad,
                    int n_pad) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  if constexpr (std::same_as<vector_isa_t<I>, generic_t>) {
    const auto at = [&](int kk, int nn) { return b[nn * ldb + kk]; };
    detail::pack_vnni_generic<T>(at, k, n, dst, ld_dst, k_pad, n_pad);
  } else {
#if DSK_TILE_HAS_AVX512
    detail::pack_vnni_nt_avx512(b, ldb, k, n, dst, ld_dst, k_pad, n_pad);
#endif
  }
}

// pack_b_vnni_nt_widen (below) in parts of 16 columns x 64 depth, so that a kernel can spread the
// packing over other work: pack_widen_parts(k_pad, n_pad) parts, numbered 0 up; the parts write
// disjoint bytes, all of them together the bytes of pack_b_vnni_nt_widen.
inline int pack_widen_parts(int k_pad, int n_pad) {
  return (n_pad + 15) / 16 * ((k_pad + 63) / 64);
}

template <Isa I>
void pack_b_vnni_nt_widen_part(const e4m3* b, int64_t ldb, int k, int n, bf16* dst, int64_t ld_dst,
                               int k_pad, int n_pad, int part) {
  static_assert(isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  const int k_parts = (k_pad + 63) / 64;
  const int n0 = part / k_parts * 16, k0 = part % k_parts * 64;
  if constexpr (std::same_as<vector_isa_t<I>, generic_t>) {
    const auto at = [&](int kk, int nn) {
      return convert_scalar<bf16>(b[(n0 + nn) * ldb + k0 + kk]);
    };
    detail::pack_vnni_generic<bf16>(at, std::clamp(k - k0, 0, 64), std::clamp(n - n0, 0, 16),
                                    dst + k0 / 2 * ld_dst + n0 * 2, ld_dst,
                                    std::min(64, k_pad - k0), std::min(16, n_pad - n0));
  } else {
#if DSK_TILE_HAS_AVX512
    detail::pack_vnni_nt_widen_part_avx512(b, ldb, k, n, dst, ld_dst, k_pad, n_pad, n0, k0);
#endif
  }
}

// pack_b_vnni_nt of e4m3 codes b (N x K) widened to bf16 (exactly) on the way: the same bytes
// as widening B into a copy and packing that, without the copy.
template <Isa I>
void pack_b_vnni_nt_widen(const e4m3* b, int64_t ldb, int k, int n, bf16* dst, int64_t ld_dst,
                          int k_pad, int n_pad) {
  for (int part = 0; part < pack_widen_parts(k_pad, n_pad); ++part)
    pack_b_vnni_nt_widen_part<I>(b, ldb, k, n, dst, ld_dst, k_pad, n_pad, part);
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile

DSK_SILENCE_GCC_BUG_105593_END
