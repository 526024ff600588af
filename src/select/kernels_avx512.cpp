// The select kernels with AVX-512 (the avx512 and amx backends); built with the AVX-512 flags.
#include "kernels.hpp"

namespace dsk::select::detail {

const KernelTable& kernel_table_avx512() {
  static constexpr KernelTable table = make_kernel_table<tile::avx512_t>();
  return table;
}

}  // namespace dsk::select::detail
