// The attention kernels in portable C++ (the generic backend).
#include "kernels.hpp"

namespace dsk::mla::detail {

const KernelTable& kernel_table_generic() {
  static constexpr KernelTable table = make_kernel_table<tile::generic_t>();
  return table;
}

}  // namespace dsk::mla::detail
