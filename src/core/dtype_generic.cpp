// Bulk conversions in portable C++ (the generic backend): scalar loops over numeric.hpp's rules.
#include "dtype_convert.hpp"

namespace dsk::detail {

const ConvertTable& convert_table_generic() {
  static constexpr ConvertTable table = make_convert_table<tile::generic_t>();
  return table;
}

}  // namespace dsk::detail
