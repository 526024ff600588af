// The attention kernels of one backend as a table of function pointers, the tables of an ISA in
// its translation unit (kernels_generic.cpp, kernels_avx512.cpp, kernels_amx.cpp); the API layer
// picks the table of dsk::backend(). Private to src/mla.
#pragma once

#include <optional>

#include <dsk/kernels/mla/attention.hpp>

#include "../core/products.hpp"

namespace dsk::mla::detail {

namespace k = kernels::mla;

struct KernelTable {
  void (*pack_queries)(const k::Problem&, const bf16*, const k::RowMap&, k::Scratch&);
  void (*reset_state)(const k::Problem&, k::State&);
  void (*attend_gather)(const k::Problem&, const k::GatherSource&, int64_t, int64_t, k::Scratch&,
                        k::State&);
  void (*attend_paged)(const k::Problem&, const k::PagedSource&, int64_t, int64_t, k::Scratch&,
                       k::State&);
  void (*attend_fp8)(const k::Problem&, const k::Fp8Slots&, int64_t, int64_t, k::Scratch&,
                     k::State&);
  void (*finalize)(const k::Problem&, const k::State&, const float*, bf16*, const k::RowMap&,
                   float*, const k::RowMap&, float*, const k::RowMap&);
};

// The kernels of ISA I: the products on tile registers when kTiles (amx, or AMX emulated by the
// avx512 and generic tile units), else on dot tiles.
template <class I, bool kTiles>
constexpr KernelTable make_kernel_table() {
  using V = tile::vector_isa_t<I>;
  return KernelTable{.pack_queries = &k::pack_queries<V>,
                     .reset_state = &k::reset_state<V>,
                     .attend_gather = &k::attend_gather<I, kTiles>,
                     .attend_paged = &k::attend_paged<I, kTiles>,
                     .attend_fp8 = &k::attend_fp8<I, kTiles>,
                     .finalize = &k::finalize<V>};
}

using dsk::detail::Products;

const KernelTable& kernel_table_generic(Products);  // kernels_generic.cpp
const KernelTable& kernel_table_avx512(Products);   // kernels_avx512.cpp
const KernelTable& kernel_table_amx();              // kernels_amx.cpp (tile registers)

// Overrides the API layer's choice (core/products.hpp) for tests and A/B timing: tile registers
// on avx512 or generic emulate AMX; dot tiles on amx run the avx512 kernels. nullopt restores the
// default. Not thread-safe: set it between calls.
void set_products_override(std::optional<Products> products);

}  // namespace dsk::mla::detail
