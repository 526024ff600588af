// The select kernels of one backend as a table of function pointers, one table per ISA
// translation unit (kernels_generic.cpp, kernels_avx512.cpp); the API layer picks the table of
// dsk::backend() per call. Index 0 is f32 rows, 1 bf16. Private to src/select.
#pragma once

#include <cstdint>

#include <dsk/kernels/select/topk.hpp>

namespace dsk::select::detail {

using kernels::Buffer;
using kernels::RowArgs;

struct KernelTable {
  // Rows [row0, row1), each whole.
  void (*rows[2])(const RowArgs&, int64_t, int64_t, Buffer&);
  // The candidates of positions [begin, end) of one row; returns how many (<= k).
  int64_t (*segment[2])(const RowArgs&, int64_t, int64_t, int64_t, Buffer&);
  // One row from n gathered candidates.
  void (*merge[2])(const RowArgs&, int64_t, int64_t, Buffer&);
};

template <class I>
constexpr KernelTable make_kernel_table() {
  using namespace kernels;
  return KernelTable{.rows = {&topk_rows<I, float>, &topk_rows<I, bf16>},
                     .segment = {&segment_candidates<I, float>, &segment_candidates<I, bf16>},
                     .merge = {&merge_row<I, float>, &merge_row<I, bf16>}};
}

const KernelTable& kernel_table_generic();  // kernels_generic.cpp
const KernelTable& kernel_table_avx512();   // kernels_avx512.cpp (avx512 and amx backends)

}  // namespace dsk::select::detail
