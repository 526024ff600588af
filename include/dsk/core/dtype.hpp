// DType: the element types a Tensor can hold, their sizes and names, and bulk (vectorised)
// conversions between them. The scalar rules live in <dsk/kernels/numeric.hpp>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>

#include <dsk/kernels/numeric.hpp>

namespace dsk {

enum class DType : uint8_t {
  f64,
  f32,
  f16,
  bf16,
  e4m3,   // float8_e4m3fn
  e5m2,   // float8_e5m2
  fp4x2,  // two e2m1 per byte; shapes count bytes, like upstream's int8 view
  ue8m0,  // float8_e8m0fnu scale
  i8,
  u8,
  i16,
  i32,
  i64,
  boolean,
};

inline constexpr int kNumDTypes = static_cast<int>(DType::boolean) + 1;

// Bytes per element (fp4x2: one byte holds two values).
constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
      return 2;
    default:
      return 1;
  }
}

// Whether the dtype holds floating-point values (f64 ... fp4x2 and ue8m0), as opposed to integers
// and bool.
constexpr bool is_floating_point(DType t) {
  switch (t) {
    case DType::f64:
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::e4m3:
    case DType::e5m2:
    case DType::fp4x2:
    case DType::ue8m0:
      return true;
    default:
      return false;
  }
}

// The byte of a poisoned element, a value no correct kernel writes (ref::poison and
// DSK_POISON_NEW_TENSORS fill with it): 0xFF in the float formats (a NaN with every payload bit
// set; in e4m3 / e5m2 the -NaN only a NaN result becomes), 0x88 in fp4x2 (two e2m1 -0, which the
// quantizer never writes), 0x7F in integers and bool (not -1, the padding of index outputs).
constexpr uint8_t poison_byte(DType t) {
  if (t == DType::fp4x2) return 0x88;
  return is_floating_point(t) ? 0xFF : 0x7F;
}

// Upstream-style names: "float32", "bfloat16", "float8_e4m3fn", ...
std::string_view dtype_name(DType t);
std::ostream& operator<<(std::ostream& os, DType t);

// The DType of a C++ storage type, for Tensor::data<T>() checks.
template <class T>
struct dtype_of;
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<e4m3> {
  static constexpr DType value = DType::e4m3;
};
template <>
struct dtype_of<e5m2> {
  static constexpr DType value = DType::e5m2;
};
template <>
struct dtype_of<fp4x2> {
  static constexpr DType value = DType::fp4x2;
};
template <>
struct dtype_of<ue8m0> {
  static constexpr DType value = DType::ue8m0;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::i8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<int16_t> {
  static constexpr DType value = DType::i16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Scalar conversions, re-exported from numeric.hpp so host code writes dsk::f32_to_bf16(x).
using numeric::bf16_to_f32;
using numeric::ceil_to_ue8m0;
using numeric::e2m1_to_f32;
using numeric::e4m3_to_f32;
using numeric::e5m2_to_f32;
using numeric::f16_to_f32;
using numeric::f32_to_bf16;
using numeric::f32_to_e2m1;
using numeric::f32_to_e4m3;
using numeric::f32_to_e5m2;
using numeric::f32_to_f16;
using numeric::ue8m0_to_f32;

// Bulk conversions of n contiguous elements, using the vector unit of dsk::backend() and, for
// large n, the compute threads (results are bit-identical to the scalar rules whatever the split).
// fp4x2 arrays hold n/2 bytes; n must be even for them.
void convert_f32_to_bf16(const float* src, bf16* dst, size_t n);
void convert_bf16_to_f32(const bf16* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, f16* dst, size_t n);
void convert_f16_to_f32(const f16* src, float* dst, size_t n);
void convert_f32_to_e4m3(const float* src, e4m3* dst, size_t n);
void convert_e4m3_to_f32(const e4m3* src, float* dst, size_t n);
void convert_e4m3_to_bf16(const e4m3* src, bf16* dst, size_t n);
void convert_f32_to_e5m2(const float* src, e5m2* dst, size_t n);
void convert_e5m2_to_f32(const e5m2* src, float* dst, size_t n);
void convert_f32_to_fp4x2(const float* src, fp4x2* dst, size_t n);
void convert_fp4x2_to_f32(const fp4x2* src, float* dst, size_t n);

}  // namespace dsk
