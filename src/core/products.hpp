// Which form of their products the kernel families with two forms run (the attention kernels,
// the MQA logits): the tile layer's dot tiles (vdpbf16ps, or its exact generic emulation) or its
// tile registers (AMX, or the avx512 / generic emulation of AMX). Their API layers choose with
// this one rule; tests and A/B timing override it. Private to src/.
#pragma once

#include <optional>

#include <dsk/core/cpu.hpp>

namespace dsk::detail {

enum class Products { dot_tiles, tile_registers };

// The override when there is one; else tile registers where real AMX runs them, dot tiles on the
// other backends (emulated tile registers are for tests: slower than dot tiles).
inline Products products_for(Backend b, std::optional<Products> override_products) {
  return override_products.value_or(b == Backend::amx ? Products::tile_registers
                                                      : Products::dot_tiles);
}

}  // namespace dsk::detail
