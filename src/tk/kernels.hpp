// The tk kernels of one backend as a table of function pointers, one table per ISA translation
// unit (kernels_generic.cpp, kernels_avx512.cpp); the API layer picks the table of dsk::backend()
// per call. Element types are table indices (Elt). Private to src/tk.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <dsk/core/dtype.hpp>
#include <dsk/kernels/tk/moe.hpp>
#include <dsk/kernels/tk/norm.hpp>
#include <dsk/kernels/tk/quant.hpp>
#include <dsk/kernels/tk/routing.hpp>
#include <dsk/kernels/tk/transform.hpp>

namespace dsk::tk::detail {

// Row element types of the tables: f32, bf16, f16 (and e4m3 for the combine).
enum Elt : int { kF32 = 0, kBf16 = 1, kF16 = 2, kE4m3 = 3 };

template <class T>
using RowsFn = void (*)(const T&, int64_t, int64_t);
template <class T>
using ScratchRowsFn = void (*)(const T&, int64_t, int64_t, float*);

struct KernelTable {
  RowsFn<kernels::TopkArgs> topk;
  RowsFn<kernels::GroupArgs> group;
  RowsFn<kernels::GateArgs> gate;
  // The gate for DeepSeek-V3's 256 experts in 8 groups, shapes fixed at compile time.
  RowsFn<kernels::GateArgs> gate_256_8;
  // [x] for x in f32, bf16
  RowsFn<kernels::TokenCastArgs> token_cast[2];
  ScratchRowsFn<kernels::SwigluCastArgs> swiglu_cast[2];
  RowsFn<kernels::BlockCastArgs> block_cast[2];
  RowsFn<kernels::BlockCastArgs> channel_cast[2];
  // [x][weight]
  ScratchRowsFn<kernels::NormCastArgs> norm_cast[2][2];
  // [out] for out in f32, bf16
  RowsFn<kernels::CastBackArgs> cast_back[2];
  // [x][weight][out] for x, out in f32, bf16, f16 and weight in f32, bf16
  RowsFn<kernels::NormArgs> rms_norm[3][2][3];
  RowsFn<kernels::NormArgs> layer_norm[3][2][3];
  // [x]
  RowsFn<kernels::RopeArgs> rope[3];
  RowsFn<kernels::HadamardArgs> hadamard[3];
  // [x][out] for x, out in f32, bf16, (f16 unused), e4m3
  RowsFn<kernels::ReduceArgs> reduce[4][4];
};

template <int E>
using EltType = std::conditional_t<
    E == kF32, float,
    std::conditional_t<E == kBf16, bf16, std::conditional_t<E == kF16, f16, e4m3>>>;

template <class I>
constexpr KernelTable make_kernel_table() {
  using namespace kernels;
  KernelTable t{};
  t.topk = &topk_rows<I>;
  t.group = &group_rows<I>;
  t.gate = &gate_rows<I>;
  t.gate_256_8 = &gate_rows<I, 256, 8>;
  t.token_cast[0] = &token_cast_rows<I, float>;
  t.token_cast[1] = &token_cast_rows<I, bf16>;
  t.swiglu_cast[0] = &swiglu_cast_rows<I, float>;
  t.swiglu_cast[1] = &swiglu_cast_rows<I, bf16>;
  t.block_cast[0] = &block_cast_rows<I, float>;
  t.block_cast[1] = &block_cast_rows<I, bf16>;
  t.channel_cast[0] = &channel_cast_rows<I, float>;
  t.channel_cast[1] = &channel_cast_rows<I, bf16>;
  t.norm_cast[0][0] = &norm_cast_rows<I, float, float>;
  t.norm_cast[0][1] = &norm_cast_rows<I, float, bf16>;
  t.norm_cast[1][0] = &norm_cast_rows<I, bf16, float>;
  t.norm_cast[1][1] = &norm_cast_rows<I, bf16, bf16>;
  t.cast_back[0] = &cast_back_rows<I, float>;
  t.cast_back[1] = &cast_back_rows<I, bf16>;
  [&]<int... X>(std::integer_sequence<int, X...>) {
    (
        [&] {
          constexpr int x = X / 6, w = (X / 3) % 2, o = X % 3;
          t.rms_norm[x][w][o] = &rms_norm_rows<I, EltType<x>, EltType<w>, EltType<o>>;
          t.layer_norm[x][w][o] = &layer_norm_rows<I, EltType<x>, EltType<w>, EltType<o>>;
        }(),
        ...);
  }
  (std::make_integer_sequence<int, 18>{});
  [&]<int... X>(std::integer_sequence<int, X...>) {
    ((t.rope[X] = &rope_rows<I, EltType<X>>, t.hadamard[X] = &hadamard_rows<I, EltType<X>>), ...);
  }
  (std::make_integer_sequence<int, 3>{});
  [&]<int... X>(std::integer_sequence<int, X...>) {
    (
        [&] {
          constexpr int x = X / 4, o = X % 4;
          if constexpr (x != kF16 && o != kF16)
            t.reduce[x][o] = &reduce_rows<I, EltType<x>, EltType<o>>;
        }(),
        ...);
  }
  (std::make_integer_sequence<int, 16>{});
  return t;
}

const KernelTable& kernel_table_generic();  // kernels_generic.cpp
const KernelTable& kernel_table_avx512();   // kernels_avx512.cpp (avx512 and amx backends)

}  // namespace dsk::tk::detail
