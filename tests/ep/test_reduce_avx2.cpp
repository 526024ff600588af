// The portable instance of the combine's row reduction built for AVX2, as src/ep/reduce_avx2.cpp
// builds it for the generic backend, for test_reduce.cpp. Built with the AVX2 flags; only this
// function is.
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::kernels {

void (*avx2_sum_rows_for_test())(const bf16* const*, int, bool, int64_t, bf16*) {
  return &sum_bf16_rows<tile::generic_t>;
}

}  // namespace dsk::ep::kernels
