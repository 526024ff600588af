// The attention kernels of the amx backend: Q . K^T and P . V on AMX tile registers; built with
// the AMX flags and run only where dsk::backend_supported(Backend::amx).
#include "kernels.hpp"

namespace dsk::mla::detail {

const KernelTable& kernel_table_amx() {
  static constexpr KernelTable table = make_kernel_table<tile::amx_t, true>();
  return table;
}

}  // namespace dsk::mla::detail
