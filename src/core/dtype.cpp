#include <dsk/core/dtype.hpp>

#include <ostream>

namespace dsk {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "float64";
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::e4m3:
      return "float8_e4m3fn";
    case DType::e5m2:
      return "float8_e5m2";
    case DType::fp4x2:
      return "float4_e2m1fn_x2";
    case DType::ue8m0:
      return "float8_e8m0fnu";
    case DType::i8:
      return "int8";
    case DType::u8:
      return "uint8";
    case DType::i16:
      return "int16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::boolean:
      return "bool";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtype_name(t);
}

}  // namespace dsk
