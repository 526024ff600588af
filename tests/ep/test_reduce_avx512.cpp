// The AVX-512 instance of the combines' row reductions, for test_reduce.cpp. Built with the
// AVX-512 flags; only this function is, so the test's own code runs on every CPU.
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::kernels {

RowSums avx512_row_sums_for_test() {
  return row_sums<tile::avx512_t>();
}

}  // namespace dsk::ep::kernels
