// The attention kernels for the avx512 backend, and the dot-tile kernels of the amx backend when
// asked for; built with the AVX-512 flags. Its tile registers emulate AMX.
#include "kernels.hpp"

namespace dsk::mla::detail {

const KernelTable& kernel_table_avx512(Products products) {
  static constexpr KernelTable dots = make_kernel_table<tile::avx512_t, false>();
  static constexpr KernelTable tiles = make_kernel_table<tile::avx512_t, true>();
  return products == Products::tile_registers ? tiles : dots;
}

}  // namespace dsk::mla::detail
