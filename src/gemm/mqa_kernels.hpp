// The MQA-logits kernels of one backend (mqa_kernels_generic.cpp, mqa_kernels_avx512.cpp); the API
// layer (api_mqa_logits.cpp) picks the table of dsk::backend(). Private to src/gemm.
#pragma once

#include <optional>

#include <dsk/kernels/gemm/mqa_logits.hpp>

namespace dsk::gemm::detail {

struct MqaKernels {
  void (*pack_kv)(const uint8_t*, int64_t, bool, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                  bf16*, bf16*);
  void (*block)(const kernels::gemm::MqaArgs&, int64_t, int64_t, kernels::gemm::MqaScratch&);
  void (*widen_queries)(const kernels::gemm::MqaArgs&, int64_t, int64_t,
                        kernels::gemm::MqaScratch&);
  void (*paged_block)(const kernels::gemm::MqaPagedArgs&, const kernels::gemm::MqaArgs&, int64_t,
                      int64_t, kernels::gemm::MqaScratch&, kernels::gemm::MqaPagedBuffers&);
};

// The kernels of ISA I: the products on tile registers when kTiles (amx, or AMX emulated by the
// avx512 and generic tile units), else on dot tiles.
template <class I, bool kTiles>
constexpr MqaKernels make_mqa_kernels() {
  using V = tile::vector_isa_t<I>;
  return {&kernels::gemm::mqa_pack_kv<V>, &kernels::gemm::mqa_logits_block<I, kTiles>,
          &kernels::gemm::widen_queries<V>, &kernels::gemm::mqa_paged_block<I, kTiles>};
}

const MqaKernels& mqa_kernels_generic(bool tiles);
const MqaKernels& mqa_kernels_avx512(bool tiles);
const MqaKernels& mqa_kernels_amx();  // tile registers

// Whether the API runs the products on tile registers: by default on the amx backend only. Tests
// override it (true on avx512 or generic emulates AMX; false on amx runs the avx512 dot tiles);
// nullopt restores the default. Not thread-safe: set it between calls.
void set_mqa_tiles_override(std::optional<bool> tiles);

}  // namespace dsk::gemm::detail
