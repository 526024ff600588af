// The attention kernels in portable C++ (the generic backend; its tile registers emulate AMX).
#include "kernels.hpp"

namespace dsk::mla::detail {

const KernelTable& kernel_table_generic(Products products) {
  static constexpr KernelTable dots = make_kernel_table<tile::generic_t, false>();
  static constexpr KernelTable tiles = make_kernel_table<tile::generic_t, true>();
  return products == Products::tile_registers ? tiles : dots;
}

}  // namespace dsk::mla::detail
