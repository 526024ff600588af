// The table of bulk conversions one backend provides; dtype_convert.cpp picks a table per call
// from dsk::backend(). Private to src/core.
#pragma once

#include <cstddef>

#include <dsk/core/dtype.hpp>
#include <dsk/kernels/tile/convert.hpp>

namespace dsk::detail {

struct ConvertTable {
  void (*f32_to_bf16)(const float*, bf16*, size_t);
  void (*bf16_to_f32)(const bf16*, float*, size_t);
  void (*f32_to_f16)(const float*, f16*, size_t);
  void (*f16_to_f32)(const f16*, float*, size_t);
  void (*f32_to_e4m3)(const float*, e4m3*, size_t);
  void (*e4m3_to_f32)(const e4m3*, float*, size_t);
  void (*e4m3_to_bf16)(const e4m3*, bf16*, size_t);
  void (*f32_to_e5m2)(const float*, e5m2*, size_t);
  void (*e5m2_to_f32)(const e5m2*, float*, size_t);
  void (*f32_to_fp4x2)(const float*, fp4x2*, size_t);
  void (*fp4x2_to_f32)(const fp4x2*, float*, size_t);
};

// The table of tile::convert_n<Isa>; each ISA's translation unit instantiates it with its flags.
template <class Isa>
constexpr ConvertTable make_convert_table() {
  using tile::convert_n;
  return ConvertTable{
      &convert_n<Isa, float, bf16>,  &convert_n<Isa, bf16, float>,  &convert_n<Isa, float, f16>,
      &convert_n<Isa, f16, float>,   &convert_n<Isa, float, e4m3>,  &convert_n<Isa, e4m3, float>,
      &convert_n<Isa, e4m3, bf16>,   &convert_n<Isa, float, e5m2>,  &convert_n<Isa, e5m2, float>,
      &convert_n<Isa, float, fp4x2>, &convert_n<Isa, fp4x2, float>,
  };
}

const ConvertTable& convert_table_generic();  // dtype_generic.cpp: portable C++
const ConvertTable& convert_table_avx512();   // dtype_avx512.cpp: AVX-512 (also used for amx)

}  // namespace dsk::detail
