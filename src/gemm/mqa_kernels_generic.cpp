// The MQA-logits kernels for the generic backend (its tile registers emulate AMX).
#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm::detail {

const MqaKernels& mqa_kernels_generic(Products products) {
  static constexpr MqaKernels dots = make_mqa_kernels<tile::generic_t, false>();
  static constexpr MqaKernels emulated = make_mqa_kernels<tile::generic_t, true>();
  return products == Products::tile_registers ? emulated : dots;
}

}  // namespace dsk::gemm::detail
