// The combine's row reduction (dsk/kernels/ep/reduce.hpp) for the running backend. Private to
// src/ep.
#pragma once

#include <cstdint>

#include <dsk/core/dtype.hpp>

namespace dsk::ep::detail {

using SumRowsFn = void (*)(const bf16* const* rows, int n, bool from_zero, int64_t cols, bf16* out);

SumRowsFn sum_rows_generic();  // reduce.cpp
SumRowsFn sum_rows_avx512();   // reduce_avx512.cpp (avx512 and amx backends)
// The instance of dsk::backend().
SumRowsFn sum_rows();

}  // namespace dsk::ep::detail
