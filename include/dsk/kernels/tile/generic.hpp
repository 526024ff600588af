// The generic backend of the tile layer: an emulated register file and portable scalar C++ for
// zero/load/store/mma, following the AMX numerics contract bit for bit (see unit.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/isa.hpp>
#include <dsk/kernels/tile/types.hpp>

namespace dsk::tile {
inline namespace DSK_TILE_ABI {
namespace detail {

// Eight 1 KiB registers, each 16 rows of 64 bytes, as AMX lays them out. Bytes of a row beyond the
// register's configured width are never read back, so they are left as they are.
struct alignas(64) EmulatedFile {
  std::byte reg[kNumRegs][kMaxRows * kRowBytes];

  template <TileRegister R>
  std::byte* row(int r) {
    return reg[R::id] + r * kRowBytes;
  }
  template <TileRegister R>
  const std::byte* row(int r) const {
    return reg[R::id] + r * kRowBytes;
  }
};

// ---- FP32 arithmetic with the AMX environment: DAZ, FTZ, round to nearest even ----
inline constexpr uint32_t kSignBit = 0x80000000u;
inline constexpr uint32_t kExponentBits = 0x7F800000u;
inline constexpr uint32_t kMinNormalBits = 0x00800000u;  // 2^-126

// DAZ: a denormal input reads as a zero of the same sign.
inline float daz(float x) {
  const uint32_t b = numeric::bits_of(x);
  return (b & kExponentBits) == 0 ? numeric::float_of(b & kSignBit) : x;
}

// a * b + c rounded once, then FTZ: a result that is tiny is replaced by a zero of its sign.
// x86 detects tininess after rounding (the result rounded to 24 bits with an unbounded exponent
// is below 2^-126), which std::fma's denormal result does not show in one case: a result of
// exactly +-2^-126 may come from a value that rounds below it with 24 bits. That case is decided
// again with the operands scaled by 2^64, where nothing is denormal.
inline float fma_ftz(float a, float b, float c) {
  const float r = std::fma(a, b, c);
  const uint32_t bits = numeric::bits_of(r);
  const uint32_t magnitude = bits & ~kSignBit;
  if (magnitude > kMinNormalBits) return r;
  if (magnitude < kMinNormalBits) return numeric::float_of(bits & kSignBit);
  // |r| = 2^-126, so |c| and |a * b| are far below the f32 range limit: scaling cannot overflow.
  // Scaling the smaller factor keeps it finite even when the other one is large.
  constexpr float kUp = 0x1p64f;
  const bool scale_a = std::fabs(a) <= std::fabs(b);
  const float scaled = std::fma(scale_a ? a * kUp : a, scale_a ? b : b * kUp, c * kUp);
  return std::fabs(scaled) < 0x1p-62f ? numeric::float_of(bits & kSignBit) : r;
}

template <class T>
T read(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void write(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

template <class Isa>
struct TileOps;

template <>
struct TileOps<generic_t> {
  using State = EmulatedFile;

  template <TileRegister... Regs>
  static void configure(State&) {}
  static void release(State&) {}

  template <TileRegister R>
  static void zero(State& s) {
    for (int r = 0; r < R::rows; ++r) std::memset(s.row<R>(r), 0, R::colsb);
  }

  template <TileRegister R>
  static void load(State& s, const void* src, int64_t stride) {
    const auto* p = static_cast<const std::byte*>(src);
    for (int r = 0; r < R::rows; ++r) std::memcpy(s.row<R>(r), p + r * stride, R::colsb);
  }

  template <TileRegister R>
  static void store(const State& s, void* dst, int64_t stride) {
    auto* p = static_cast<std::byte*>(dst);
    for (int r = 0; r < R::rows; ++r) std::memcpy(p + r * stride, s.row<R>(r), R::colsb);
  }

  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma(State& s) {
    if constexpr (std::same_as<typename A::element, bf16>) {
      mma_bf16<C, A, B>(s);
    } else {
      mma_int8<C, A, B>(s);
    }
  }

 private:
  static float bf16_at(const std::byte* row, int i) {
    return daz(numeric::bf16_to_f32(read<bf16>(row + 2 * i)));
  }

  // TDPBF16PS: per output element, an even and an odd chain from +0 over k2 ascending, then
  // C + (even + odd) (unit.hpp's contract).
  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma_bf16(State& s) {
    constexpr int kPairs = A::cols / 2;
    for (int m = 0; m < C::rows; ++m) {
      std::byte* c_row = s.row<C>(m);
      const std::byte* a_row = s.row<A>(m);
      for (int n = 0; n < C::cols; ++n) {
        float even = 0.0f, odd = 0.0f;
        for (int k2 = 0; k2 < kPairs; ++k2) {
          const std::byte* b_row = s.row<B>(k2);
          even = fma_ftz(bf16_at(a_row, 2 * k2), bf16_at(b_row, 2 * n), even);
          odd = fma_ftz(bf16_at(a_row, 2 * k2 + 1), bf16_at(b_row, 2 * n + 1), odd);
        }
        const float pair_sum = fma_ftz(even, 1.0f, odd);
        write<float>(c_row + 4 * n, fma_ftz(daz(read<float>(c_row + 4 * n)), 1.0f, pair_sum));
      }
    }
  }

  // TDPB[SU][SU]D: exact products, int32 sums that wrap around (done in uint32, where wrapping is
  // defined).
  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma_int8(State& s) {
    using TA = typename A::element;
    using TB = typename B::element;
    constexpr int kQuads = A::cols / 4;
    for (int m = 0; m < C::rows; ++m) {
      std::byte* c_row = s.row<C>(m);
      const std::byte* a_row = s.row<A>(m);
      for (int n = 0; n < C::cols; ++n) {
        uint32_t acc = read<uint32_t>(c_row + 4 * n);
        for (int k4 = 0; k4 < kQuads; ++k4) {
          const std::byte* b_row = s.row<B>(k4);
          for (int j = 0; j < 4; ++j) {
            const int32_t a = read<TA>(a_row + 4 * k4 + j);
            const int32_t b = read<TB>(b_row + 4 * n + j);
            acc += static_cast<uint32_t>(a * b);
          }
        }
        write<uint32_t>(c_row + 4 * n, acc);
      }
    }
  }
};

}  // namespace detail
}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile
