// Tile register types: TReg<Id, T, Rows, Cols> names tile register tmm<Id> holding a Rows x Cols
// matrix of T, and the concepts that check operand shapes of a tile multiply at compile time.
//
// Operand conventions are AMX's (K counts logical elements; "VNNI form" stores B so that the
// elements one dot product combines are adjacent):
//   bf16:  A  M x K bf16 (K <= 32, even)       B  K/2 x 2N bf16: row k2 holds the pairs
//          C  M x N float (M, N <= 16)            (B[2k2][n], B[2k2+1][n]) for n < N
//   int8:  A  M x K bytes (K <= 64, K % 4 == 0) B  K/4 x 4N bytes: row k4 holds the quads
//          C  M x N int32                          (B[4k4+j][n], j < 4) for n < N
// A and B bytes are int8_t or uint8_t independently (s8s8, s8u8, u8s8, u8u8).
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <dsk/kernels/numeric.hpp>

namespace dsk::tile {

// The architectural limits of one tile register: 16 rows of 64 bytes, 8 registers.
inline constexpr int kMaxRows = 16;
inline constexpr int kRowBytes = 64;
inline constexpr int kNumRegs = 8;

template <class T>
concept OperandElement =
    std::same_as<T, bf16> || std::same_as<T, int8_t> || std::same_as<T, uint8_t>;
template <class T>
concept AccumulatorElement = std::same_as<T, float> || std::same_as<T, int32_t>;
template <class T>
concept TileElement = OperandElement<T> || AccumulatorElement<T>;

// How many consecutive K elements share one 32-bit VNNI group: 2 for bf16, 4 for bytes.
template <OperandElement T>
inline constexpr int vnni_factor = 4 / static_cast<int>(sizeof(T));

// The accumulator element of a multiply of T operands.
template <OperandElement T>
using accumulator_t = std::conditional_t<std::same_as<T, bf16>, float, int32_t>;

template <int Id, TileElement T, int Rows, int Cols>
struct TReg {
  static_assert(0 <= Id && Id < kNumRegs, "a tile register id is 0..7");
  static_assert(1 <= Rows && Rows <= kMaxRows, "a tile has 1..16 rows");
  static_assert(1 <= Cols && Cols * static_cast<int>(sizeof(T)) <= kRowBytes,
                "a tile row holds 1..64 bytes");
  // AMX raises #UD on a tile load or store whose configured row is not whole dwords.
  static_assert(Cols * static_cast<int>(sizeof(T)) % 4 == 0,
                "a tile row holds a multiple of 4 bytes");

  using element = T;
  static constexpr int id = Id;
  static constexpr int rows = Rows;
  static constexpr int cols = Cols;
  static constexpr int colsb = Cols * static_cast<int>(sizeof(T));  // bytes per row
};

// Registers by logical role: TileA<Id, T, M, K>, TileB<Id, T, K, N> (stored in VNNI form, so
// K / vnni rows of N * vnni elements) and TileC<Id, T, M, N> for the accumulator of T operands.
template <int Id, OperandElement T, int M, int K>
using TileA = TReg<Id, T, M, K>;
template <int Id, OperandElement T, int K, int N>
using TileB = TReg<Id, T, K / vnni_factor<T>, N * vnni_factor<T>>;
template <int Id, OperandElement T, int M, int N>
using TileC = TReg<Id, accumulator_t<T>, M, N>;

namespace types_detail {
template <class R>
struct is_treg : std::false_type {};
template <int Id, class T, int Rows, int Cols>
struct is_treg<TReg<Id, T, Rows, Cols>> : std::true_type {};
}  // namespace types_detail

template <class R>
concept TileRegister = types_detail::is_treg<R>::value;

// C += A * B is well formed: element types form one of the AMX products, the shapes agree
// (C rows = A rows, A's K = 4 * B rows in bytes, B and C rows have the same byte width) and the
// three registers are distinct (AMX raises #UD otherwise).
template <class C, class A, class B>
concept MmaOperands =
    TileRegister<C> && TileRegister<A> && TileRegister<B> && OperandElement<typename A::element> &&
        OperandElement<typename B::element> &&
        (std::same_as<typename A::element, bf16> == std::same_as<typename B::element, bf16>)&&std::
            same_as<typename C::element, accumulator_t<typename A::element>>&& C::rows
        == A::rows&& A::colsb % 4 == 0 &&
    A::colsb == 4 * B::rows&& B::colsb == C::colsb&& C::id != A::id&& C::id != B::id&& A::id
        != B::id;

}  // namespace dsk::tile
