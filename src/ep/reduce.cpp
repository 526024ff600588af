// The combine's row reduction: the portable instance and the choice by backend.
#include "ep/reduce.hpp"

#include <dsk/core/cpu.hpp>
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::detail {

SumRowsFn sum_rows_generic() {
  return &kernels::sum_bf16_rows<tile::generic_t>;
}

SumRowsFn sum_rows() {
  if (backend() != Backend::generic) return sum_rows_avx512();
  static const bool avx2 = cpu_features().avx2 && cpu_features().fma && cpu_features().f16c;
  return avx2 ? sum_rows_generic_avx2() : sum_rows_generic();
}

}  // namespace dsk::ep::detail
