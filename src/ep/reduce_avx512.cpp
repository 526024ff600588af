// The combines' row reductions with AVX-512; built with the AVX-512 flags.
#include <dsk/kernels/ep/reduce.hpp>

#include "ep/reduce.hpp"

namespace dsk::ep::detail {

RowSums row_sums_avx512() {
  return kernels::row_sums<tile::avx512_t>();
}

}  // namespace dsk::ep::detail
