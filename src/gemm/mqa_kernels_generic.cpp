// The MQA-logits kernels for the generic backend.
#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm::detail {

const MqaKernels& mqa_kernels_generic() {
  static constexpr MqaKernels kernels = make_mqa_kernels<tile::generic_t>();
  return kernels;
}

}  // namespace dsk::gemm::detail
