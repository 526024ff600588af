// The combines' row reductions (dsk/kernels/ep/reduce.hpp) for the running backend. Private to
// src/ep.
#pragma once

#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::detail {

using kernels::RowSums;

RowSums row_sums_generic();       // reduce.cpp (baseline x86-64)
RowSums row_sums_generic_avx2();  // reduce_avx2.cpp: the same code built for AVX2
RowSums row_sums_avx512();        // reduce_avx512.cpp (avx512 and amx backends)
// The instance of dsk::backend(); on the generic backend the AVX2 build where the CPU has AVX2.
RowSums row_sums();

}  // namespace dsk::ep::detail
