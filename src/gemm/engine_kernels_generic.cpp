// The generic (portable C++) GEMM kernels compiled into libdsk: runtime-shape variants and packer.
#include "gemm/engine_kernels_body.hpp"

namespace dsk::gemm::engine {

const IsaKernels& generic_kernels() {
  static const IsaKernels kernels = make_isa_kernels<tile::generic_t>();
  return kernels;
}

const IsaKernels& kernels_for(Backend isa) {
  switch (isa) {
    case Backend::amx:
      return amx_kernels();
    case Backend::avx512:
      return avx512_kernels();
    default:
      return generic_kernels();
  }
}

}  // namespace dsk::gemm::engine
