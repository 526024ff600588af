// The MQA-logits kernels of one backend (mqa_kernels_generic.cpp, mqa_kernels_avx512.cpp); the API
// layer (api_mqa_logits.cpp) picks the table of dsk::backend(). Private to src/gemm.
#pragma once

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

template <class I>
constexpr MqaKernels make_mqa_kernels() {
  return {&kernels::gemm::mqa_pack_kv<I>, &kernels::gemm::mqa_logits_block<I>,
          &kernels::gemm::widen_queries<I>, &kernels::gemm::mqa_paged_block<I>};
}

const MqaKernels& mqa_kernels_generic();
const MqaKernels& mqa_kernels_avx512();  // the avx512 and amx backends

}  // namespace dsk::gemm::detail
