// The quantisation rules of DeepGEMM's reference quantizers (deep_gemm/utils/math.py), written
// once: dsk::gemm's per_*_cast_to_fp8/fp4 and dsk::tk's quantisation kernels both use them, so
// their codes and scales are bit-identical.
//
//   sf   = max(amax, 1e-4) / fmt_max            (f32; fmt_max = 448 for e4m3, 6 for e2m1)
//   sf   = ceil_to_ue8m0(sf)                    when use_ue8m0
//   code = to_format(x * (1 / sf))              (f32 reciprocal, then an f32 product)
//
// Header-only and dependency-free: JIT-compiled kernels include it.
#pragma once

#include <dsk/kernels/numeric.hpp>

namespace dsk::quant {
inline namespace DSK_TILE_ABI {

// The floor upstream clamps every block's absolute maximum to (avoids a zero scale).
inline constexpr float kAmaxFloor = 1e-4f;

// The scale of a block whose largest |x| is `amax`, for a format whose largest value is `fmt_max`.
constexpr float block_scale(float amax, float fmt_max, bool use_ue8m0) {
  const float sf = (amax > kAmaxFloor ? amax : kAmaxFloor) / fmt_max;
  return use_ue8m0 ? numeric::ceil_to_ue8m0(sf) : sf;
}

// What each element is multiplied by before rounding: the f32 reciprocal of the scale.
constexpr float inverse_scale(float sf) {
  return 1.0f / sf;
}

// The code of x: x * inv_sf rounded to e4m3, where a NaN x keeps its own NaN (sign included).
// That only matters in a block holding a NaN with f32 scales (sf and inv_sf NaN): IEEE leaves
// open which of two NaN operands a product returns, x86 returns the first, and compilers swap
// the operands of a product, so x * inv_sf alone made the sign of such a code depend on the
// build. With this rule a NaN x codes as 0x7F or 0xFF by its sign and every other element of the
// block as 0x7F (the positive NaN that 1 / NaN is), in the reference and in every kernel.
constexpr e4m3 quantize_e4m3(float x, float inv_sf) {
  return numeric::f32_to_e4m3(x != x ? x : x * inv_sf);
}
constexpr uint8_t quantize_e2m1(float x, float inv_sf) {
  return numeric::f32_to_e2m1(x * inv_sf);
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::quant
