// The AVX-512 instance of the combine's row reduction, for test_reduce.cpp. Built with the AVX-512
// flags; only this function is, so the test's own code runs on every CPU.
#include <dsk/kernels/ep/reduce.hpp>

namespace dsk::ep::kernels {

void (*avx512_sum_rows_for_test())(const bf16* const*, int, bool, int64_t, bf16*) {
  return &sum_bf16_rows<tile::avx512_t>;
}

}  // namespace dsk::ep::kernels
