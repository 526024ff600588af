// The avx512 GEMM kernels compiled into libdsk (built with the AVX-512 flags): runtime-shape
// variants and packer.
#include "gemm/engine_kernels_body.hpp"

namespace dsk::gemm::engine {

const IsaKernels& avx512_kernels() {
  static const IsaKernels kernels = make_isa_kernels<tile::avx512_t>();
  return kernels;
}

}  // namespace dsk::gemm::engine
