// The attention kernels for the avx512 backend (also amx); built with the AVX-512 flags.
#include "kernels.hpp"

namespace dsk::mla::detail {

const KernelTable& kernel_table_avx512() {
  static constexpr KernelTable table = make_kernel_table<tile::avx512_t>();
  return table;
}

}  // namespace dsk::mla::detail
