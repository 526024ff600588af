// The tile-layer test bodies, written once against the tile layer and instantiated by each ISA's
// translation unit with DSK_TILE_TEST_DEFINE_RUNNERS(isa). Everything here has internal linkage,
// so no instantiation can stand in for another ISA's at link time.
#pragma once

#include <cstdlib>
#include <utility>

#include <dsk/kernels/tile/tile.hpp>

#include "tile/tile_test.hpp"

namespace dsk::tile_test {
namespace {

namespace tl = dsk::tile;

template <int Bytes>
using element_of_size =
    std::conditional_t<Bytes == 1, int8_t, std::conditional_t<Bytes == 2, bf16, float>>;

template <Int8Kind K>
using int8_a_t = std::conditional_t<K == Int8Kind::s8s8 || K == Int8Kind::s8u8, int8_t, uint8_t>;
template <Int8Kind K>
using int8_b_t = std::conditional_t<K == Int8Kind::s8s8 || K == Int8Kind::u8s8, int8_t, uint8_t>;

constexpr int round_up(int x, int to) {
  return (x + to - 1) / to * to;
}

template <class I>
struct Body {
  // ---- zero / load / store ----
  template <int S>
  using TileOf = tl::TReg<S % tl::kNumRegs, element_of_size<kTileShapes[S].element_bytes>,
                          kTileShapes[S].rows, kTileShapes[S].cols>;

  template <int S>
  static void load_store_case(const void* src, int64_t src_stride, void* dst, int64_t dst_stride) {
    using R = TileOf<S>;
    tl::TileUnit<I, R> unit;
    if constexpr (S % 3 != 1)
      unit.load(R{}, src, src_stride);
    else  // shapes 1 (ragged) and 4 (whole) through load_once: a hint, the same rows
      unit.load_once(R{}, src, src_stride);
    unit.store(R{}, dst, dst_stride);
  }

  template <int S>
  static void zero_store_case(const void* src, int64_t src_stride, void* dst, int64_t dst_stride) {
    using R = TileOf<S>;
    tl::TileUnit<I, R> unit;
    unit.load(R{}, src, src_stride);
    unit.zero(R{});
    unit.store(R{}, dst, dst_stride);
  }

  // ---- mma: register ids vary with the case so that every id gets used ----
  template <int S>
  static void mma_bf16_case(const void* a, int64_t a_stride, const void* b, int64_t b_stride,
                            void* c, int64_t c_stride) {
    constexpr MmaShape s = kBf16Shapes[S];
    using C = tl::TileC<S % 8, bf16, s.m, s.n>;
    using A = tl::TileA<(S + 3) % 8, bf16, s.m, s.k>;
    using B = tl::TileB<(S + 5) % 8, bf16, s.k, s.n>;
    tl::TileUnit<I, C, A, B> unit;
    unit.load(C{}, c, c_stride);
    unit.load(A{}, a, a_stride);
    unit.load(B{}, b, b_stride);
    unit.mma(C{}, A{}, B{});
    unit.store(C{}, c, c_stride);
  }

  template <int S, Int8Kind K>
  static void mma_int8_case(const void* a, int64_t a_stride, const void* b, int64_t b_stride,
                            void* c, int64_t c_stride) {
    constexpr MmaShape s = kInt8Shapes[S];
    using C = tl::TReg<(S + 7) % 8, int32_t, s.m, s.n>;
    using A = tl::TileA<(S + 1) % 8, int8_a_t<K>, s.m, s.k>;
    using B = tl::TileB<(S + 2) % 8, int8_b_t<K>, s.k, s.n>;
    tl::TileUnit<I, C, A, B> unit;
    unit.load(C{}, c, c_stride);
    unit.load(A{}, a, a_stride);
    unit.load(B{}, b, b_stride);
    unit.mma(C{}, A{}, B{});
    unit.store(C{}, c, c_stride);
  }

  template <Int8Kind K, int... S>
  static void mma_int8_kind(int shape, const void* a, int64_t a_stride, const void* b,
                            int64_t b_stride, void* c, int64_t c_stride,
                            std::integer_sequence<int, S...>) {
    using Fn = void (*)(const void*, int64_t, const void*, int64_t, void*, int64_t);
    static constexpr Fn kCases[] = {&mma_int8_case<S, K>...};
    kCases[shape](a, a_stride, b, b_stride, c, c_stride);
  }

  // ---- runtime shape -> instantiated case ----
  template <int... S>
  static void load_store(int shape, const void* src, int64_t src_stride, void* dst,
                         int64_t dst_stride, std::integer_sequence<int, S...>) {
    using Fn = void (*)(const void*, int64_t, void*, int64_t);
    static constexpr Fn kCases[] = {&load_store_case<S>...};
    kCases[shape](src, src_stride, dst, dst_stride);
  }

  template <int... S>
  static void zero_store(int shape, const void* src, int64_t src_stride, void* dst,
                         int64_t dst_stride, std::integer_sequence<int, S...>) {
    using Fn = void (*)(const void*, int64_t, void*, int64_t);
    static constexpr Fn kCases[] = {&zero_store_case<S>...};
    kCases[shape](src, src_stride, dst, dst_stride);
  }

  template <int... S>
  static void mma_bf16(int shape, const void* a, int64_t a_stride, const void* b, int64_t b_stride,
                       void* c, int64_t c_stride, std::integer_sequence<int, S...>) {
    using Fn = void (*)(const void*, int64_t, const void*, int64_t, void*, int64_t);
    static constexpr Fn kCases[] = {&mma_bf16_case<S>...};
    kCases[shape](a, a_stride, b, b_stride, c, c_stride);
  }

  static void mma_int8(int shape, Int8Kind kind, const void* a, int64_t a_stride, const void* b,
                       int64_t b_stride, void* c, int64_t c_stride) {
    const auto seq = std::make_integer_sequence<int, kNumInt8Shapes>{};
    switch (kind) {
      case Int8Kind::s8s8:
        return mma_int8_kind<Int8Kind::s8s8>(shape, a, a_stride, b, b_stride, c, c_stride, seq);
      case Int8Kind::s8u8:
        return mma_int8_kind<Int8Kind::s8u8>(shape, a, a_stride, b, b_stride, c, c_stride, seq);
      case Int8Kind::u8s8:
        return mma_int8_kind<Int8Kind::u8s8>(shape, a, a_stride, b, b_stride, c, c_stride, seq);
      case Int8Kind::u8u8:
        return mma_int8_kind<Int8Kind::u8u8>(shape, a, a_stride, b, b_stride, c, c_stride, seq);
    }
  }

  // ---- packing ----
  template <class T>
  static void pack(bool nt, const T* b, int64_t ldb, int k, int n, T* dst, int64_t ld_dst,
                   int k_pad, int n_pad) {
    if (nt)
      tl::pack_b_vnni_nt<I>(b, ldb, k, n, dst, ld_dst, k_pad, n_pad);
    else
      tl::pack_b_vnni_nn<I>(b, ldb, k, n, dst, ld_dst, k_pad, n_pad);
  }

  // ---- a small GEMM written once against the tile layer ----
  // C (m x n) = A (m x k) * B^T, B given as [n, k]. Operands are padded to whole 32 x 32 output
  // blocks and whole K tiles; each block keeps a 2 x 2 grid of 16 x 16 accumulators in tmm0-3,
  // two A tiles in tmm4-5 and two B tiles in tmm6-7.
  template <class TA, class TB>
  static void gemm_nt(int m, int n, int k, const TA* a, const TB* b, tl::accumulator_t<TA>* c) {
    using TC = tl::accumulator_t<TA>;
    constexpr int V = tl::vnni_factor<TB>;
    constexpr int kTileK = 64 / static_cast<int>(sizeof(TA));
    using C00 = tl::TileC<0, TA, 16, 16>;
    using C01 = tl::TileC<1, TA, 16, 16>;
    using C10 = tl::TileC<2, TA, 16, 16>;
    using C11 = tl::TileC<3, TA, 16, 16>;
    using A0 = tl::TileA<4, TA, 16, kTileK>;
    using A1 = tl::TileA<5, TA, 16, kTileK>;
    using B0 = tl::TileB<6, TB, kTileK, 16>;
    using B1 = tl::TileB<7, TB, kTileK, 16>;

    const int m_pad = round_up(m, 32), n_pad = round_up(n, 32), k_pad = round_up(k, kTileK);
    auto* a_pad = static_cast<TA*>(std::malloc(sizeof(TA) * m_pad * k_pad));
    auto* b_vnni = static_cast<TB*>(std::malloc(sizeof(TB) * k_pad * n_pad));
    auto* c_pad = static_cast<TC*>(std::malloc(sizeof(TC) * m_pad * n_pad));
    tl::copy_padded(a, k, m, k, a_pad, k_pad, m_pad, k_pad);
    const int64_t ld_vnni = int64_t{n_pad} * V;  // elements per packed row
    tl::pack_b_vnni_nt<I>(b, k, k, n, b_vnni, ld_vnni, k_pad, n_pad);

    const int64_t a_stride = int64_t{k_pad} * sizeof(TA);
    const int64_t b_stride = ld_vnni * sizeof(TB);
    const int64_t c_stride = int64_t{n_pad} * sizeof(TC);
    tl::TileUnit<I, C00, C01, C10, C11, A0, A1, B0, B1> unit;
    for (int mb = 0; mb < m_pad; mb += 32) {
      for (int nb = 0; nb < n_pad; nb += 32) {
        unit.zero(C00{});
        unit.zero(C01{});
        unit.zero(C10{});
        unit.zero(C11{});
        for (int kb = 0; kb < k_pad; kb += kTileK) {
          const TA* a_tile = a_pad + int64_t{mb} * k_pad + kb;
          const TB* b_tile = b_vnni + (kb / V) * ld_vnni + nb * V;
          unit.load(A0{}, a_tile, a_stride);
          unit.load(A1{}, a_tile + 16 * int64_t{k_pad}, a_stride);
          unit.load(B0{}, b_tile, b_stride);
          unit.load(B1{}, b_tile + 16 * V, b_stride);
          unit.mma(C00{}, A0{}, B0{});
          unit.mma(C01{}, A0{}, B1{});
          unit.mma(C10{}, A1{}, B0{});
          unit.mma(C11{}, A1{}, B1{});
        }
        TC* c_block = c_pad + int64_t{mb} * n_pad + nb;
        unit.store(C00{}, c_block, c_stride);
        unit.store(C01{}, c_block + 16, c_stride);
        unit.store(C10{}, c_block + 16 * int64_t{n_pad}, c_stride);
        unit.store(C11{}, c_block + 16 * int64_t{n_pad} + 16, c_stride);
      }
    }
    tl::copy_padded(c_pad, n_pad, m, n, c, n, m, n);
    std::free(a_pad);
    std::free(b_vnni);
    std::free(c_pad);
  }

  static void gemm_int8_nt(Int8Kind kind, int m, int n, int k, const void* a, const void* b,
                           int32_t* c) {
    const auto* sa = static_cast<const int8_t*>(a);
    const auto* ua = static_cast<const uint8_t*>(a);
    const auto* sb = static_cast<const int8_t*>(b);
    const auto* ub = static_cast<const uint8_t*>(b);
    switch (kind) {
      case Int8Kind::s8s8:
        return gemm_nt(m, n, k, sa, sb, c);
      case Int8Kind::s8u8:
        return gemm_nt(m, n, k, sa, ub, c);
      case Int8Kind::u8s8:
        return gemm_nt(m, n, k, ua, sb, c);
      case Int8Kind::u8u8:
        return gemm_nt(m, n, k, ua, ub, c);
    }
  }

  static Runners make_runners() {
    Runners r{};
    r.load_store = [](int shape, const void* src, int64_t ss, void* dst, int64_t ds) {
      load_store(shape, src, ss, dst, ds, std::make_integer_sequence<int, kNumTileShapes>{});
    };
    r.zero_store = [](int shape, const void* src, int64_t ss, void* dst, int64_t ds) {
      zero_store(shape, src, ss, dst, ds, std::make_integer_sequence<int, kNumTileShapes>{});
    };
    r.mma_bf16 = [](int shape, const void* a, int64_t as, const void* b, int64_t bs, void* c,
                    int64_t cs) {
      mma_bf16(shape, a, as, b, bs, c, cs, std::make_integer_sequence<int, kNumBf16Shapes>{});
    };
    r.mma_int8 = &mma_int8;
    r.pack_bf16 = &pack<bf16>;
    r.pack_s8 = &pack<int8_t>;
    r.pack_u8 = &pack<uint8_t>;
    r.pack_e4m3_widen = &tl::pack_b_vnni_nt_widen<I>;
    r.scale_rows = &tl::scale_rows<I>;
    r.scale_cols = &tl::scale_cols<I>;
    r.accumulate = &tl::accumulate<I>;
    r.accumulate_scaled = &tl::accumulate_scaled<I>;
    r.store_rows_bf16 = &tl::store_rows_bf16<I>;
    r.gemm_bf16_nt = [](int m, int n, int k, const bf16* a, const bf16* b, float* c) {
      gemm_nt(m, n, k, a, b, c);
    };
    r.gemm_int8_nt = &gemm_int8_nt;
    return r;
  }
};

}  // namespace
}  // namespace dsk::tile_test

// Defines const Runners& <isa>_runners() for tile::<isa>_t in the including translation unit.
#define DSK_TILE_TEST_DEFINE_RUNNERS(isa)                                      \
  const ::dsk::tile_test::Runners& ::dsk::tile_test::isa##_runners() {         \
    static const Runners runners = Body<::dsk::tile::isa##_t>::make_runners(); \
    return runners;                                                            \
  }
