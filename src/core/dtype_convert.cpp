// The bulk conversions of dsk/core/dtype.hpp: argument checks, then the table of the backend in
// use (AVX-512 for avx512 and amx, scalar loops for generic).
#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>

#include "dtype_convert.hpp"

namespace dsk {
namespace {

// The backend check in cpu.cpp does not ask for VBMI, which the e4m3 tables use; every CPU with
// AVX512-BF16 but Cooper Lake has it.
const detail::ConvertTable& table() {
  static const bool vbmi = cpu_features().avx512_vbmi;
  return backend() != Backend::generic && vbmi ? detail::convert_table_avx512()
                                               : detail::convert_table_generic();
}

void check_even(const char* fn, size_t n) {
  DSK_CHECK_ARG(n % 2 == 0, fn, "n", "an even number of values (two per fp4x2 byte)", n);
}

}  // namespace

void convert_f32_to_bf16(const float* src, bf16* dst, size_t n) {
  table().f32_to_bf16(src, dst, n);
}
void convert_bf16_to_f32(const bf16* src, float* dst, size_t n) {
  table().bf16_to_f32(src, dst, n);
}
void convert_f32_to_f16(const float* src, f16* dst, size_t n) {
  table().f32_to_f16(src, dst, n);
}
void convert_f16_to_f32(const f16* src, float* dst, size_t n) {
  table().f16_to_f32(src, dst, n);
}
void convert_f32_to_e4m3(const float* src, e4m3* dst, size_t n) {
  table().f32_to_e4m3(src, dst, n);
}
void convert_e4m3_to_f32(const e4m3* src, float* dst, size_t n) {
  table().e4m3_to_f32(src, dst, n);
}
void convert_e4m3_to_bf16(const e4m3* src, bf16* dst, size_t n) {
  table().e4m3_to_bf16(src, dst, n);
}
void convert_f32_to_e5m2(const float* src, e5m2* dst, size_t n) {
  table().f32_to_e5m2(src, dst, n);
}
void convert_e5m2_to_f32(const e5m2* src, float* dst, size_t n) {
  table().e5m2_to_f32(src, dst, n);
}
void convert_f32_to_fp4x2(const float* src, fp4x2* dst, size_t n) {
  check_even("dsk::convert_f32_to_fp4x2", n);
  table().f32_to_fp4x2(src, dst, n);
}
void convert_fp4x2_to_f32(const fp4x2* src, float* dst, size_t n) {
  check_even("dsk::convert_fp4x2_to_f32", n);
  table().fp4x2_to_f32(src, dst, n);
}

}  // namespace dsk
