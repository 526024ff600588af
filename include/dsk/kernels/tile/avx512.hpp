// The avx512 backend of the tile layer: the emulated register file of the generic backend, with
// zero/load/store/mma written in AVX-512 and bitwise equal to it (and to AMX).
//
// TDPBF16PS is emulated with VFMADD231PS under MXCSR = RNE | FTZ | DAZ (not with VDPBF16PS,
// which runs one chain and adds the odd product first). One mma keeps the even and odd chains of
// up to 8 rows in 16 zmm registers, converts A to f32 once (even and odd elements in two arrays)
// and then runs, for each k2, two broadcast-from-memory FMAs per row against the even/odd halves
// of B's row k2, so the loop is bound by the FMA ports; C is read once, at the end.
#pragma once

#include <dsk/kernels/tile/isa.hpp>

#if DSK_TILE_HAS_AVX512

#include <immintrin.h>

#include <cstdint>

#include <dsk/kernels/tile/generic.hpp>

// Fully unrolls a loop over the rows of a tile (or the k steps of an int8 mma), so that both
// compilers keep one accumulator per row in a zmm register without shuffling them between
// iterations.
#define DSK_TILE_UNROLL _Pragma("GCC unroll 16")

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace dsk::tile {
inline namespace DSK_TILE_ABI {
namespace detail {

// MXCSR during an emulated TDPBF16PS: all exceptions masked, FTZ (bit 15), DAZ (bit 6), round to
// nearest even.
inline constexpr uint32_t kAmxMxcsr = 0x1F80u | 0x8000u | 0x0040u;

// NOTES: the FP environment is switched around each mma, not for the unit's lifetime, so code
// between tile operations (epilogues) computes under the caller's MXCSR on every backend, as it
// does next to real AMX, which ignores MXCSR. Restoring the saved word also drops the exception
// flags the emulation raised: AMX does not update MXCSR either. The register file is an in/out
// operand of both ldmxcsr statements, so the compiler cannot move its loads or stores (and with
// them the FMAs between them) outside the switched region.
inline uint32_t enter_amx_fp_env(EmulatedFile& file) {
  uint32_t saved;
  const uint32_t amx = kAmxMxcsr;
  asm volatile("stmxcsr %0" : "=m"(saved));
  asm volatile("ldmxcsr %1" : "+m"(file) : "m"(amx));
  return saved;
}
inline void leave_amx_fp_env(EmulatedFile& file, uint32_t saved) {
  asm volatile("ldmxcsr %1" : "+m"(file) : "m"(saved));
}

template <int Colsb>
inline constexpr __mmask64 row_mask = Colsb == 64 ? ~__mmask64{0} : (__mmask64{1} << Colsb) - 1;

template <>
struct TileOps<avx512_t> {
  using State = EmulatedFile;

  template <TileRegister... Regs>
  static void configure(State&) {}
  static void release(State&) {}

  template <TileRegister R>
  static void zero(State& s) {
    for (int r = 0; r < R::rows; ++r) _mm512_store_si512(s.row<R>(r), _mm512_setzero_si512());
  }

  template <TileRegister R>
  static void load(State& s, const void* src, int64_t stride) {
    const auto* p = static_cast<const std::byte*>(src);
    for (int r = 0; r < R::rows; ++r)
      _mm512_store_si512(s.row<R>(r), _mm512_maskz_loadu_epi8(row_mask<R::colsb>, p + r * stride));
  }

  template <TileRegister R>
  static void store(const State& s, void* dst, int64_t stride) {
    auto* p = static_cast<std::byte*>(dst);
    for (int r = 0; r < R::rows; ++r)
      _mm512_mask_storeu_epi8(p + r * stride, row_mask<R::colsb>, _mm512_load_si512(s.row<R>(r)));
  }

  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma(State& s) {
    if constexpr (std::same_as<typename A::element, bf16>) {
      const uint32_t saved = enter_amx_fp_env(s);
      mma_bf16<C, A, B>(s);
      leave_amx_fp_env(s, saved);
    } else {
      mma_int8<C, A, B>(s);
    }
  }

 private:
  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma_bf16(State& s) {
    // Rows in groups of 8: 16 chain accumulators + the two halves of a B row + a broadcast.
    constexpr int kGroup = C::rows < 8 ? C::rows : 8;
    for (int m0 = 0; m0 < C::rows; m0 += kGroup) mma_bf16_rows<C, A, B, kGroup>(s, m0);
  }

  // Rows [m0, m0 + kGroup) (clipped to the tile) of TDPBF16PS: the even and odd chains of
  // unit.hpp's contract in two zmm per row, then C + (even + odd).
  template <TileRegister C, TileRegister A, TileRegister B, int kGroup>
  static void mma_bf16_rows(State& s, int m0) {
    constexpr int kPairs = A::cols / 2;
    const int rows = C::rows - m0 < kGroup ? C::rows - m0 : kGroup;
    // A bf16 pair (lo, hi) in one dword becomes f32 lo = dword << 16 and hi = dword & 0xFFFF0000.
    const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    alignas(64) float a_even[kGroup][16];
    alignas(64) float a_odd[kGroup][16];
    __m512 even[kGroup], odd[kGroup];
    DSK_TILE_UNROLL
    for (int m = 0; m < kGroup; ++m) {
      const __m512i a = m < rows ? _mm512_load_si512(s.row<A>(m0 + m)) : _mm512_setzero_si512();
      _mm512_store_si512(a_even[m], _mm512_slli_epi32(a, 16));
      _mm512_store_si512(a_odd[m], _mm512_and_si512(a, high_half));
      even[m] = _mm512_setzero_ps();
      odd[m] = _mm512_setzero_ps();
    }
    for (int k2 = 0; k2 < kPairs; ++k2) {
      const __m512i b = _mm512_load_si512(s.row<B>(k2));
      const __m512 b_even = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
      const __m512 b_odd = _mm512_castsi512_ps(_mm512_and_si512(b, high_half));
      DSK_TILE_UNROLL
      for (int m = 0; m < kGroup; ++m) {
        even[m] = _mm512_fmadd_ps(_mm512_set1_ps(a_even[m][k2]), b_even, even[m]);
        odd[m] = _mm512_fmadd_ps(_mm512_set1_ps(a_odd[m][k2]), b_odd, odd[m]);
      }
    }
    DSK_TILE_UNROLL
    for (int m = 0; m < kGroup; ++m) {
      if (m >= rows) break;
      float* c = reinterpret_cast<float*>(s.row<C>(m0 + m));
      _mm512_store_ps(c, _mm512_add_ps(_mm512_load_ps(c), _mm512_add_ps(even[m], odd[m])));
    }
  }

  // VPDPBUSD multiplies unsigned bytes of its first source by signed bytes of its second and adds
  // the four products to an int32 with wrap-around, the exact arithmetic of TDPB*D. s8u8 and u8s8
  // map onto it directly; s8s8 and u8u8 flip the sign bit of A (a ^ 0x80 is a + 128 as a u8 and
  // a - 128 as an s8) and subtract the resulting 128 * column sum of B, which is exact mod 2^32.
  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma_int8(State& s) {
    constexpr bool kSignedA = std::same_as<typename A::element, int8_t>;
    constexpr bool kSignedB = std::same_as<typename B::element, int8_t>;
    constexpr int kRows = C::rows;
    constexpr int kQuads = A::cols / 4;
    // The four A bytes that meet B's row k4 in output row m, as one dword.
    const auto a_quad = [&](int m, int k4) { return read<int32_t>(s.row<A>(m) + 4 * k4); };
    __m512i acc[kRows];
    DSK_TILE_UNROLL
    for (int m = 0; m < kRows; ++m) acc[m] = _mm512_load_si512(s.row<C>(m));
    if constexpr (!kSignedA && kSignedB) {
      DSK_TILE_UNROLL
      for (int k4 = 0; k4 < kQuads; ++k4) {
        const __m512i b = _mm512_load_si512(s.row<B>(k4));
        DSK_TILE_UNROLL
        for (int m = 0; m < kRows; ++m) {
          acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_set1_epi32(a_quad(m, k4)), b);
        }
      }
    } else if constexpr (kSignedA && !kSignedB) {
      DSK_TILE_UNROLL
      for (int k4 = 0; k4 < kQuads; ++k4) {
        const __m512i b = _mm512_load_si512(s.row<B>(k4));
        DSK_TILE_UNROLL
        for (int m = 0; m < kRows; ++m) {
          acc[m] = _mm512_dpbusd_epi32(acc[m], b, _mm512_set1_epi32(a_quad(m, k4)));
        }
      }
    } else {
      const __m512i sign_bits = _mm512_set1_epi32(static_cast<int>(0x80808080u));
      alignas(64) int32_t a_flipped[kRows][16];
      DSK_TILE_UNROLL
      for (int m = 0; m < kRows; ++m) {
        _mm512_store_si512(a_flipped[m],
                           _mm512_xor_si512(_mm512_load_si512(s.row<A>(m)), sign_bits));
      }
      __m512i correction = _mm512_setzero_si512();
      DSK_TILE_UNROLL
      for (int k4 = 0; k4 < kQuads; ++k4) {
        const __m512i b = _mm512_load_si512(s.row<B>(k4));
        if constexpr (kSignedA) {  // (a + 128) * b, correction 128 * sum b
          correction = _mm512_dpbusd_epi32(correction, sign_bits, b);
          DSK_TILE_UNROLL
          for (int m = 0; m < kRows; ++m) {
            acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_set1_epi32(a_flipped[m][k4]), b);
          }
        } else {  // b * (a - 128), correction -128 * sum b
          correction = _mm512_dpbusd_epi32(correction, b, sign_bits);
          DSK_TILE_UNROLL
          for (int m = 0; m < kRows; ++m) {
            acc[m] = _mm512_dpbusd_epi32(acc[m], b, _mm512_set1_epi32(a_flipped[m][k4]));
          }
        }
      }
      DSK_TILE_UNROLL
      for (int m = 0; m < kRows; ++m) acc[m] = _mm512_sub_epi32(acc[m], correction);
    }
    DSK_TILE_UNROLL
    for (int m = 0; m < kRows; ++m) _mm512_store_si512(s.row<C>(m), acc[m]);
  }
};

}  // namespace detail
}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile

DSK_SILENCE_GCC_BUG_105593_END

#endif  // DSK_TILE_HAS_AVX512
