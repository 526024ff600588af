// The MQA-logits kernels of one backend (mqa_kernels_generic.cpp, mqa_kernels_avx512.cpp); the API
// layer (api_mqa_logits.cpp) picks the table of dsk::backend(). Private to src/gemm.
#pragma once

#include <optional>

#include <dsk/kernels/gemm/mqa_logits.hpp>

#include "../core/products.hpp"

namespace dsk::gemm::detail {

struct MqaKernels {
  void (*pack_kv)(const uint8_t*, int64_t, bool, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                  bf16*, bf16*);
  void (*block)(const kernels::gemm::MqaArgs&, int64_t, int64_t, kernels::gemm::MqaScratch&);
  void (*widen_queries)(const kernels::gemm::MqaArgs&, int64_t, int64_t,
                        kernels::gemm::MqaScratch&);
  void (*paged_blocks)(const kernels::gemm::MqaPagedArgs&, const kernels::gemm::MqaArgs&, int64_t,
                       int64_t, int64_t, kernels::gemm::MqaScratch&, bf16* panel);
};

// The kernels of ISA I: the products on tile registers when kTiles (amx, or AMX emulated by the
// avx512 and generic tile units), else on dot tiles.
template <class I, bool kTiles>
constexpr MqaKernels make_mqa_kernels() {
  using V = tile::vector_isa_t<I>;
  return {&kernels::gemm::mqa_pack_kv<V>, &kernels::gemm::mqa_logits_block<I, kTiles>,
          &kernels::gemm::widen_queries<V>, &kernels::gemm::mqa_paged_blocks<I, kTiles>};
}

using dsk::detail::Products;

const MqaKernels& mqa_kernels_generic(Products products);
const MqaKernels& mqa_kernels_avx512(Products products);
const MqaKernels& mqa_kernels_amx();  // tile registers

// Overrides the API layer's choice (core/products.hpp) for tests and A/B timing: tile registers
// on avx512 or generic emulate AMX; dot tiles on amx run the avx512 kernels. nullopt restores the
// default. Not thread-safe: set it between calls.
void set_mqa_products_override(std::optional<Products> products);

}  // namespace dsk::gemm::detail
