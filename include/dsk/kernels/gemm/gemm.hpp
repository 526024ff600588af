// dsk::gemm's kernels: D = (accumulate ? D : 0) + A . B^T over the work items of one call, with A
// bf16 / e4m3 / e2m1 (any strides) and B packed by dsk/kernels/gemm/layout.hpp, written once
// against the tile layer and instantiated per ISA (amx, avx512, generic) and per GemmConfig:
//
//   gemm<tile::avx512_t, GemmConfig{.path = Path::large_m, .a_type = Elem::bf16,
//                                   .b_type = Elem::bf16, .d_type = OutType::f32, .n = 2112,
//                                   .k = 7168, .block_k = 256}>(args);
//
// The JIT compiles one such instantiation per shape; libdsk carries the runtime-shape variant
// (every knob 0 / any) as the fallback. Both run the same code, so they give the same bits, and
// the result does not depend on the knobs, the items or the thread count (args.hpp).
#pragma once

#include <dsk/kernels/gemm/args.hpp>
#include <dsk/kernels/gemm/large_m.hpp>
#include <dsk/kernels/gemm/small_m.hpp>

namespace dsk::kernels::gemm {
inline namespace DSK_TILE_ABI {

template <tile::Isa I, GemmConfig kConfig>
void gemm(const GemmArgs& args) {
  static_assert(tile::isa_compiled<I>, "this translation unit lacks the instructions of the ISA");
  const Problem p = resolve_problem<kConfig>(args);
  for (int64_t i = args.item_begin; i < args.item_end; ++i) {
    const GemmItem& item = args.items[i];
    const GemmSegment& s = args.segments[item.segment];
    if constexpr (kConfig.path == Path::small_m)
      small_m_item<I>(p, s, item, args.scratch);
    else
      large_m_item<I>(p, s, item, args.scratch);
  }
}

// The amx kernel's large-M algorithm on ISA I's TileUnit, which emulates AMX bit for bit on
// avx512 and generic: for tests on machines without AMX (every item runs the large-M path).
template <tile::Isa I, GemmConfig kConfig>
void gemm_tile_path(const GemmArgs& args) {
  const Problem p = resolve_problem<kConfig>(args);
  for (int64_t i = args.item_begin; i < args.item_end; ++i) {
    const GemmItem& item = args.items[i];
    large_m_item<I, true>(p, args.segments[item.segment], item, args.scratch);
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
