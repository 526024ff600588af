// The combine's row reduction: the portable instance and the choice by backend.
#include "ep/reduce.hpp"

#include <dsk/core/cpu.hpp>
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::detail {

SumRowsFn sum_rows_generic() {
  return &kernels::sum_bf16_rows<tile::generic_t>;
}

SumRowsFn sum_rows() {
  return backend() == Backend::generic ? sum_rows_generic() : sum_rows_avx512();
}

}  // namespace dsk::ep::detail
