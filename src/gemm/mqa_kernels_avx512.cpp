// The MQA-logits kernels for the avx512 backend (also amx); built with the AVX-512 flags.
#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm::detail {

const MqaKernels& mqa_kernels_avx512() {
  static constexpr MqaKernels kernels = make_mqa_kernels<tile::avx512_t>();
  return kernels;
}

}  // namespace dsk::gemm::detail
