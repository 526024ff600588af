// The portable instance of the combines' row reductions built for AVX2, as src/ep/reduce_avx2.cpp
// builds it for the generic backend, for test_reduce.cpp. Built with the AVX2 flags; only this
// function is.
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::kernels {

RowSums avx2_row_sums_for_test() {
  return row_sums<tile::generic_t>();
}

}  // namespace dsk::ep::kernels
