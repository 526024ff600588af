// The attention kernels of one backend as a table of function pointers, one table per ISA
// translation unit (kernels_generic.cpp, kernels_avx512.cpp); the API layer picks the table of
// dsk::backend(). Private to src/mla.
#pragma once

#include <dsk/kernels/mla/attention.hpp>

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

template <class I>
constexpr KernelTable make_kernel_table() {
  return KernelTable{.pack_queries = &k::pack_queries<I>,
                     .reset_state = &k::reset_state<I>,
                     .attend_gather = &k::attend_gather<I>,
                     .attend_paged = &k::attend_paged<I>,
                     .attend_fp8 = &k::attend_fp8<I>,
                     .finalize = &k::finalize<I>};
}

const KernelTable& kernel_table_generic();  // kernels_generic.cpp
const KernelTable& kernel_table_avx512();   // kernels_avx512.cpp (avx512 and amx backends)

}  // namespace dsk::mla::detail
