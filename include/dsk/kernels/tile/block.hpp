// A register-blocked bf16 matrix product on the tile unit, the inner loop every tile kernel (the
// large-M GEMM, the attention scores and P.V) shares:
//   C (Rows x Cols f32, Rows and Cols each 16 or 32) (+)= A (Rows x K bf16, row-major) . B
// where B is in VNNI form (row g holds the pairs of K values 2g, 2g + 1 of every column), over K
// in steps of 32. Up to four 16 x 16 accumulators, two A tiles and two B tiles are the unit's
// eight registers: each step loads one tile per product when both sides are 32 wide.
#pragma once

#include <cstdint>

#include <dsk/kernels/tile/prefetch.hpp>
#include <dsk/kernels/tile/types.hpp>
#include <dsk/kernels/tile/unit.hpp>

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

// The eight registers of a block: accumulators C[row half][column half], A and B halves.
template <Isa T>
struct BlockRegs {
  using C00 = TileC<0, bf16, 16, 16>;
  using C01 = TileC<1, bf16, 16, 16>;
  using C10 = TileC<2, bf16, 16, 16>;
  using C11 = TileC<3, bf16, 16, 16>;
  using A0 = TileA<4, bf16, 16, 32>;
  using A1 = TileA<5, bf16, 16, 32>;
  using B0 = TileB<6, bf16, 32, 16>;
  using B1 = TileB<7, bf16, 32, 16>;
  using Unit = TileUnit<T, C00, C01, C10, C11, A0, A1, B0, B1>;
};

// C (Rows x Cols at c, row stride ldc floats) = (load_c ? C : 0) + A . B over k_pad values (a
// multiple of 32): A row r at a + r * lda (bf16), B row g at b + g * ldb (bf16, ldb >= 2 Cols).
// Steps run in K order, so the bits depend only on the operands (the unit's numerics contract).
// kStreamA: A's tiles are loaded with the hint that they are not read again soon (load_once), for
// loops that run many row blocks past one B kept in L1. feed: lines_per_step of its lines are
// prefetched before each step (the caller's next operands, arriving while this block computes);
// a Feed is anything with feed(lines): a PrefetchFeed, or a walk over scattered rows.
template <Isa T, int Rows, int Cols, bool kStreamA = false, class Feed = PrefetchFeed>
void mma_block(typename BlockRegs<T>::Unit& u, const bf16* a, int64_t lda, const bf16* b,
               int64_t ldb, int64_t k_pad, float* c, int64_t ldc, bool load_c, Feed* feed = nullptr,
               int lines_per_step = 0) {
  static_assert((Rows == 16 || Rows == 32) && (Cols == 16 || Cols == 32));
  using R = BlockRegs<T>;
  constexpr bool kTwoRows = Rows == 32, kTwoCols = Cols == 32;
  const int64_t a_stride = lda * 2, b_stride = ldb * 2, c_stride = ldc * 4;
  float* c10 = c + 16 * ldc;
  if (load_c) {
    u.load(typename R::C00{}, c, c_stride);
    if constexpr (kTwoCols) u.load(typename R::C01{}, c + 16, c_stride);
    if constexpr (kTwoRows) u.load(typename R::C10{}, c10, c_stride);
    if constexpr (kTwoRows && kTwoCols) u.load(typename R::C11{}, c10 + 16, c_stride);
  } else {
    u.zero(typename R::C00{});
    if constexpr (kTwoCols) u.zero(typename R::C01{});
    if constexpr (kTwoRows) u.zero(typename R::C10{});
    if constexpr (kTwoRows && kTwoCols) u.zero(typename R::C11{});
  }
  for (int64_t kk = 0; kk < k_pad; kk += 32) {
    const bf16* b_rows = b + kk / 2 * ldb;
    if (feed) feed->feed(lines_per_step);
    if constexpr (kStreamA) {
      u.load_once(typename R::A0{}, a + kk, a_stride);
      if constexpr (kTwoRows) u.load_once(typename R::A1{}, a + 16 * lda + kk, a_stride);
    } else {
      u.load(typename R::A0{}, a + kk, a_stride);
      if constexpr (kTwoRows) u.load(typename R::A1{}, a + 16 * lda + kk, a_stride);
    }
    u.load(typename R::B0{}, b_rows, b_stride);
    if constexpr (kTwoCols) u.load(typename R::B1{}, b_rows + 32, b_stride);
    u.mma(typename R::C00{}, typename R::A0{}, typename R::B0{});
    if constexpr (kTwoCols) u.mma(typename R::C01{}, typename R::A0{}, typename R::B1{});
    if constexpr (kTwoRows) u.mma(typename R::C10{}, typename R::A1{}, typename R::B0{});
    if constexpr (kTwoRows && kTwoCols)
      u.mma(typename R::C11{}, typename R::A1{}, typename R::B1{});
  }
  u.store(typename R::C00{}, c, c_stride);
  if constexpr (kTwoCols) u.store(typename R::C01{}, c + 16, c_stride);
  if constexpr (kTwoRows) u.store(typename R::C10{}, c10, c_stride);
  if constexpr (kTwoRows && kTwoCols) u.store(typename R::C11{}, c10 + 16, c_stride);
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile
