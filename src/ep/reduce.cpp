// The combines' row reductions: the portable instance and the choice by backend.
#include "ep/reduce.hpp"

#include <dsk/core/cpu.hpp>
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::detail {

RowSums row_sums_generic() {
  return kernels::row_sums<tile::generic_t>();
}

RowSums row_sums() {
  if (backend() != Backend::generic) return row_sums_avx512();
  static const bool avx2 = cpu_features().avx2 && cpu_features().fma && cpu_features().f16c;
  return avx2 ? row_sums_generic_avx2() : row_sums_generic();
}

}  // namespace dsk::ep::detail
