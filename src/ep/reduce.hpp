// The combine's row reduction (dsk/kernels/ep/reduce.hpp) for the running backend. Private to
// src/ep.
#pragma once

#include <cstdint>

#include <dsk/core/dtype.hpp>

namespace dsk::ep::detail {

using SumRowsFn = void (*)(const bf16* const* rows, int n, bool from_zero, int64_t cols, bf16* out);

SumRowsFn sum_rows_generic();       // reduce.cpp (baseline x86-64)
SumRowsFn sum_rows_generic_avx2();  // reduce_avx2.cpp: the same code built for AVX2
SumRowsFn sum_rows_avx512();        // reduce_avx512.cpp (avx512 and amx backends)
// The instance of dsk::backend(); on the generic backend the AVX2 build where the CPU has AVX2.
SumRowsFn sum_rows();

}  // namespace dsk::ep::detail
