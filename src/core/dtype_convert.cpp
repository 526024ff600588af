// The bulk conversions of dsk/core/dtype.hpp: argument checks, then the table of the backend in
// use (AVX-512 for avx512 and amx, scalar loops for generic), split over the threads when large.
#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>

#include <type_traits>

#include "dtype_convert.hpp"

namespace dsk {
namespace {

const detail::ConvertTable& table() {
  return backend() != Backend::generic ? detail::convert_table_avx512()
                                       : detail::convert_table_generic();
}

void check_even(const char* fn, size_t n) {
  DSK_CHECK_ARG(n % 2 == 0, fn, "n", "an even number of values (two per fp4x2 byte)", n);
}

// `values` elements past p; an fp4x2 byte holds two values.
template <class T>
T* advance(T* p, size_t values) {
  return p + (std::is_same_v<std::remove_const_t<T>, fp4x2> ? values / 2 : values);
}

// NOTES: one core cannot saturate DRAM (spec/cpu.md §8: ~12 GB/s of ~25 on two cores), so large
// conversions are split over the compute threads. Chunks are 256 Ki values, a multiple of every
// vector width and even, so no fp4x2 byte is shared; results do not depend on the split.
template <class Src, class Dst>
void run(void (*fn)(const Src*, Dst*, size_t), const Src* src, Dst* dst, size_t n) {
  constexpr size_t kChunk = size_t{1} << 18;
  if (n <= 2 * kChunk) return fn(src, dst, n);
  parallel_for(
      static_cast<int64_t>(n),
      [&](int64_t begin, int64_t end, int) {
        const size_t b = static_cast<size_t>(begin);
        fn(advance(src, b), advance(dst, b), static_cast<size_t>(end) - b);
      },
      static_cast<int64_t>(kChunk));
}

}  // namespace

void convert_f32_to_bf16(const float* src, bf16* dst, size_t n) {
  run(table().f32_to_bf16, src, dst, n);
}
void convert_bf16_to_f32(const bf16* src, float* dst, size_t n) {
  run(table().bf16_to_f32, src, dst, n);
}
void convert_f32_to_f16(const float* src, f16* dst, size_t n) {
  run(table().f32_to_f16, src, dst, n);
}
void convert_f16_to_f32(const f16* src, float* dst, size_t n) {
  run(table().f16_to_f32, src, dst, n);
}
void convert_f32_to_e4m3(const float* src, e4m3* dst, size_t n) {
  run(table().f32_to_e4m3, src, dst, n);
}
void convert_e4m3_to_f32(const e4m3* src, float* dst, size_t n) {
  run(table().e4m3_to_f32, src, dst, n);
}
void convert_e4m3_to_bf16(const e4m3* src, bf16* dst, size_t n) {
  run(table().e4m3_to_bf16, src, dst, n);
}
void convert_f32_to_e5m2(const float* src, e5m2* dst, size_t n) {
  run(table().f32_to_e5m2, src, dst, n);
}
void convert_e5m2_to_f32(const e5m2* src, float* dst, size_t n) {
  run(table().e5m2_to_f32, src, dst, n);
}
void convert_f32_to_fp4x2(const float* src, fp4x2* dst, size_t n) {
  check_even("dsk::convert_f32_to_fp4x2", n);
  run(table().f32_to_fp4x2, src, dst, n);
}
void convert_fp4x2_to_f32(const fp4x2* src, float* dst, size_t n) {
  check_even("dsk::convert_fp4x2_to_f32", n);
  run(table().fp4x2_to_f32, src, dst, n);
}

}  // namespace dsk
