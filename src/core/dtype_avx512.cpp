// Bulk conversions with AVX-512 (avx512 and amx backends); built with the AVX-512 flags.
#include "dtype_convert.hpp"

namespace dsk::detail {

const ConvertTable& convert_table_avx512() {
  static constexpr ConvertTable table = make_convert_table<tile::avx512_t>();
  return table;
}

}  // namespace dsk::detail
