// The MQA-logits kernels of the amx backend: the (query, head) x kv products on AMX tile
// registers; built with the AMX flags and run only where dsk::backend_supported(Backend::amx).
#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm::detail {

const MqaKernels& mqa_kernels_amx() {
  static constexpr MqaKernels kernels = make_mqa_kernels<tile::amx_t, true>();
  return kernels;
}

}  // namespace dsk::gemm::detail
