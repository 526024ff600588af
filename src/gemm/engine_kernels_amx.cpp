// The amx GEMM kernels compiled into libdsk (built with the AMX flags): runtime-shape variants and
// packer. Run only where dsk::backend_supported(Backend::amx).
#include "gemm/engine_kernels_body.hpp"

namespace dsk::gemm::engine {

const IsaKernels& amx_kernels() {
  static const IsaKernels kernels = make_isa_kernels<tile::amx_t>();
  return kernels;
}

}  // namespace dsk::gemm::engine
