// The MQA-logits kernels for the avx512 backend, and the dot-tile kernels of the amx backend when
// asked for; built with the AVX-512 flags. Its tile registers emulate AMX.
#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm::detail {

const MqaKernels& mqa_kernels_avx512(Products products) {
  static constexpr MqaKernels dots = make_mqa_kernels<tile::avx512_t, false>();
  static constexpr MqaKernels emulated = make_mqa_kernels<tile::avx512_t, true>();
  return products == Products::tile_registers ? emulated : dots;
}

}  // namespace dsk::gemm::detail
