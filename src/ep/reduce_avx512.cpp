// The combine's row reduction with AVX-512; built with the AVX-512 flags.
#include <dsk/kernels/ep/reduce.hpp>

#include "ep/reduce.hpp"

namespace dsk::ep::detail {

SumRowsFn sum_rows_avx512() {
  return &kernels::sum_bf16_rows<tile::avx512_t>;
}

}  // namespace dsk::ep::detail
