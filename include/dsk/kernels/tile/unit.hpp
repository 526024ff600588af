// TileUnit<Isa, Regs...>: the tile registers a kernel uses, configured for their shapes while the
// unit lives, and the operations on them (zero, load, store, mma), the same on every ISA.
//
// Numerics contract (all backends, bit for bit):
//   bf16 x bf16 -> f32 (TDPBF16PS, as measured on Sapphire Rapids-class hardware; the SDM's
//     older pseudocode, one chain through C, is not what the hardware does): for each output
//     element C[m][n], two chains start from +0 and run over k2 ascending,
//       even = even + A[m][2k2]   * B[2k2][n]
//       odd  = odd  + A[m][2k2+1] * B[2k2+1][n]
//     and then C[m][n] = C[m][n] + (even + odd). Every step is rounded once to f32, round to
//     nearest even (the bf16 product is exact in f32, so a chain step is an FMA), with DAZ
//     (denormal A, B and C inputs read as zero of their sign) and FTZ (a result that is tiny after
//     rounding becomes zero of its sign). MXCSR is neither used nor changed. Finite inputs give
//     the same bits everywhere; a NaN result is NaN on every backend but its payload may differ.
//     (tests/tile checks this against the hardware wherever AMX runs.)
//   s8/u8 x s8/u8 -> s32 (TDPBSSD, TDPBSUD, TDPBUSD, TDPBUUD): exact products, int32 sums that wrap
//     around.
//
// Usage (one thread; a thread has at most one live unit, since AMX has one palette per thread):
//   using C = TileC<0, bf16, 16, 16>;  using A = TileA<1, bf16, 16, 32>;
//   using B = TileB<2, bf16, 32, 16>;
//   TileUnit<Isa, C, A, B> unit;     // contents are unspecified until zeroed or loaded
//   unit.zero(C{});
//   unit.load(A{}, a, lda_bytes);  unit.load(B{}, b_vnni, ldb_bytes);  // or load_once (a hint)
//   unit.mma(C{}, A{}, B{});
//   unit.store(C{}, c, ldc_bytes);
// Strides are in bytes and may be any value (odd, negative); a load reads and a store writes
// exactly Rows rows of Cols elements.
#pragma once

#include <cstdint>
#include <type_traits>

#include <dsk/kernels/tile/amx.hpp>
#include <dsk/kernels/tile/avx512.hpp>
#include <dsk/kernels/tile/generic.hpp>
#include <dsk/kernels/tile/isa.hpp>
#include <dsk/kernels/tile/types.hpp>

namespace dsk::tile {
inline namespace DSK_TILE_ABI {

namespace detail {
template <class R, class... Regs>
inline constexpr bool one_of = (std::is_same_v<R, Regs> || ...);

template <TileRegister... Regs>
constexpr bool distinct_ids() {
  const int ids[] = {Regs::id...};
  for (int i = 0; i < static_cast<int>(sizeof...(Regs)); ++i)
    for (int j = 0; j < i; ++j)
      if (ids[i] == ids[j]) return false;
  return true;
}
}  // namespace detail

template <Isa I, TileRegister... Regs>
class TileUnit {
  static_assert(isa_compiled<I>,
                "this translation unit lacks the instructions of the ISA: avx512 needs "
                "-mavx512{f,bw,vl,dq,bf16,vnni}, amx also -mamx-{tile,bf16,int8}");
  static_assert(sizeof...(Regs) >= 1, "a unit holds at least one register");
  static_assert(detail::distinct_ids<Regs...>(), "each tile register id appears once in a unit");

  using Ops = detail::TileOps<I>;

 public:
  using isa = I;

  TileUnit() : state_{} { Ops::template configure<Regs...>(state_); }
  ~TileUnit() { Ops::release(state_); }
  TileUnit(const TileUnit&) = delete;
  TileUnit& operator=(const TileUnit&) = delete;

  // R = 0.
  template <TileRegister R>
  requires detail::one_of<R, Regs...>
  void zero(R) { Ops::template zero<R>(state_); }

  // R = the Rows x Cols elements at src, row r at src + r * stride_bytes.
  template <TileRegister R>
  requires detail::one_of<R, Regs...>
  void load(R, const void* src, int64_t stride_bytes) {
    Ops::template load<R>(state_, src, stride_bytes);
  }

  // load, with the hint that these rows will not be read again soon (TILELOADDT1 on amx, a plain
  // load elsewhere): a streamed operand then leaves the L1 lines to the operand that is reused.
  template <TileRegister R>
  requires detail::one_of<R, Regs...>
  void load_once(R r, const void* src, int64_t stride_bytes) {
    if constexpr (std::same_as<I, amx_t>)
      Ops::template load_once<R>(state_, src, stride_bytes);
    else
      load(r, src, stride_bytes);
  }

  // The Rows x Cols elements at dst, row r at dst + r * stride_bytes, = R.
  template <TileRegister R>
  requires detail::one_of<R, Regs...>
  void store(R, void* dst, int64_t stride_bytes) {
    Ops::template store<R>(state_, dst, stride_bytes);
  }

  // C += A * B (B in VNNI form), with the numerics of the contract above.
  template <TileRegister C, TileRegister A, TileRegister B>
  requires detail::one_of<C, Regs...> && detail::one_of<A, Regs...> && detail::one_of<B, Regs...> &&
      MmaOperands<C, A, B>
  void mma(C, A, B) { Ops::template mma<C, A, B>(state_); }

 private:
  [[no_unique_address]] typename Ops::State state_;
};

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile
