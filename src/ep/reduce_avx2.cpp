// The combines' row reductions, portable code compiled for AVX2 (*_avx2.cpp gets -mavx2 -mfma ...):
// the generic backend's instance on CPUs that have AVX2. The same source and, with
// -ffp-contract=off, the same bits as the baseline build in reduce.cpp; on an AMD Zen 3 it sums
// rows about 1.6x (from DRAM) to 2x (from the caches) faster.
#include <dsk/kernels/ep/reduce.hpp>

#include "ep/reduce.hpp"

namespace dsk::ep::detail {

RowSums row_sums_generic_avx2() {
  return kernels::row_sums<tile::generic_t>();
}

}  // namespace dsk::ep::detail
