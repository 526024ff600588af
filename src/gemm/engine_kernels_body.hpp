// The body of engine_kernels_<isa>.cpp: the runtime-shape kernel variants and the packer of one
// ISA, instantiated in the translation unit built with that ISA's flags. Included once per ISA TU.
#pragma once

#include <dsk/jit.hpp>
#include <dsk/kernels/gemm/gemm.hpp>

#include "gemm/engine_kernels.hpp"

namespace dsk::gemm::engine {
namespace {

template <class I>
void pack_panels_for(const kg::PackedLayout& layout, const kg::PackSource& source, int64_t p0,
                     int64_t p1, std::byte* dst) {
  for (int64_t p = p0; p < p1; ++p)
    kg::pack_panel<I>(layout, source, p, dst + p * layout.panel_bytes);
}

template <class I>
IsaKernels make_isa_kernels() {
  constexpr kg::GemmConfig kLarge{.path = kg::Path::large_m};
  constexpr kg::GemmConfig kSmall{.path = kg::Path::small_m};
  return {.large_m = &kg::gemm<I, kLarge>,
          .small_m = &kg::gemm<I, kSmall>,
          .large_m_entry = &jit::aot_entry<kg::GemmArgs, &kg::gemm<I, kLarge>>,
          .small_m_entry = &jit::aot_entry<kg::GemmArgs, &kg::gemm<I, kSmall>>,
          .pack_panels = &pack_panels_for<I>};
}

}  // namespace
}  // namespace dsk::gemm::engine
