// The reference quantizers of deep_gemm/utils/math.py, bit for bit: per-token, per-block and
// per-channel FP8 casts, the per-token FP4 cast and its inverse, ceil_to_ue8m0 and the UE8M0
// packing. The rules themselves live in dsk/kernels/quant.hpp (shared with dsk::tk).
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/gemm.hpp>
#include <dsk/kernels/quant.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm {
namespace {

using api::ceil_div;

constexpr std::initializer_list<DType> kFloatInputs = {DType::f32, DType::bf16, DType::f16};

// The values of a float tensor (f32, bf16 or f16; any strides) as a contiguous f32 array.
std::vector<float> values_f32(const Tensor& x) {
  const Tensor c = x.contiguous();
  std::vector<float> out(static_cast<size_t>(c.numel()));
  switch (c.dtype()) {
    case DType::bf16:
      convert_bf16_to_f32(c.data<bf16>(), out.data(), out.size());
      break;
    case DType::f16:
      convert_f16_to_f32(c.data<f16>(), out.data(), out.size());
      break;
    default:
      if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(float));
      break;
  }
  return out;
}

void check_matrix(const char* fn, const Tensor& x) {
  check::dtype_in(fn, "x", x, kFloatInputs);
  check::dim(fn, "x", x, 2);
}

void check_gran_k(const char* fn, int gran_k) {
  DSK_CHECK_ARG(gran_k > 0, fn, "gran_k", "a positive block size", gran_k);
}

void check_packed_request(const char* fn, bool use_ue8m0, bool use_packed_ue8m0) {
  DSK_CHECK_ARG(use_ue8m0 || !use_packed_ue8m0, fn, "use_packed_ue8m0",
                "false unless use_ue8m0 (only UE8M0 scales can be packed)", "true");
}

// |x| maximum as torch's amax computes it: NaN wins.
float amax_step(float amax, float x) {
  const float a = std::fabs(x);
  return (std::isnan(amax) || std::isnan(a)) ? NAN : (a > amax ? a : amax);
}

// quant::block_scale, plus torch's NaN rule: clamp(NaN, 1e-4) stays NaN.
float scale_for(float amax, float fmt_max, bool use_ue8m0) {
  if (std::isnan(amax)) return use_ue8m0 ? numeric::ceil_to_ue8m0(amax) : amax;
  return quant::block_scale(amax, fmt_max, use_ue8m0);
}

// Scales [rows, blocks] as f32, or (packed) as int32 [rows, ceil(blocks / 4)]: 4 UE8M0 bytes per
// word, the missing scales of the last word padded with 1.0 (as upstream pads them).
Tensor scales_tensor(const std::vector<float>& sf, int64_t rows, int64_t blocks, bool packed) {
  if (!packed) {
    Tensor out = Tensor::empty({rows, blocks}, DType::f32);
    if (!sf.empty()) std::memcpy(out.data_ptr(), sf.data(), sf.size() * sizeof(float));
    return out;
  }
  const int64_t words = ceil_div(blocks, 4);
  Tensor out = Tensor::empty({rows, words}, DType::i32);
  auto* bytes = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < words * 4; ++j)
      bytes[r * words * 4 + j] =
          j < blocks ? numeric::f32_to_ue8m0_exact(sf[r * blocks + j]).bits : uint8_t{127};
  return out;
}

// Scales a contiguous [rows, blocks] f32 array of powers of two read back from UE8M0 bytes the
// way upstream's unpack_ue8m0_from_int does (byte << 23: byte 0 reads as 0).
float unpacked_scale(uint8_t byte) {
  return numeric::float_of(static_cast<uint32_t>(byte) << 23);
}

// Per-row blocks of gran_k columns (per_token_cast_to_fp8/fp4): calls quantize(row, block, sf).
template <class Quantize>
std::vector<float> per_token_scales(const std::vector<float>& x, int64_t m, int64_t n, int gran_k,
                                    float fmt_max, bool use_ue8m0, Quantize quantize) {
  const int64_t blocks = ceil_div(n, gran_k);
  std::vector<float> sf(static_cast<size_t>(m * blocks));
  parallel_for(m, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        float amax = 0.0f;  // zero padding past n does not change the maximum
        for (int64_t c = b * gran_k; c < std::min(n, (b + 1) * gran_k); ++c)
          amax = amax_step(amax, x[r * n + c]);
        const float s = scale_for(amax, fmt_max, use_ue8m0);
        sf[r * blocks + b] = s;
        quantize(r, b, s);
      }
  });
  return sf;
}

}  // namespace

Fp8Tensor per_token_cast_to_fp8(const Tensor& x, bool use_ue8m0, int gran_k,
                                bool use_packed_ue8m0) {
  constexpr const char* fn = "per_token_cast_to_fp8";
  check_matrix(fn, x);
  check_gran_k(fn, gran_k);
  check_packed_request(fn, use_ue8m0, use_packed_ue8m0);
  const int64_t m = x.size(0), n = x.size(1);
  const std::vector<float> v = values_f32(x);
  Tensor q = Tensor::empty({m, n}, DType::e4m3);
  e4m3* out = q.data<e4m3>();
  const auto sf = per_token_scales(
      v, m, n, gran_k, numeric::kE4m3Max, use_ue8m0, [&](int64_t r, int64_t b, float s) {
        const float inv = quant::inverse_scale(s);
        for (int64_t c = b * gran_k; c < std::min(n, (b + 1) * gran_k); ++c)
          out[r * n + c] = quant::quantize_e4m3(v[r * n + c], inv);
      });
  return {q, scales_tensor(sf, m, ceil_div(n, gran_k), use_packed_ue8m0)};
}

Fp8Tensor per_block_cast_to_fp8(const Tensor& x, bool use_ue8m0, int gran_k) {
  constexpr const char* fn = "per_block_cast_to_fp8";
  check_matrix(fn, x);
  check_gran_k(fn, gran_k);
  const int64_t m = x.size(0), n = x.size(1);
  const int64_t row_blocks = ceil_div(m, gran_k), col_blocks = ceil_div(n, gran_k);
  const std::vector<float> v = values_f32(x);
  Tensor q = Tensor::empty({m, n}, DType::e4m3);
  e4m3* out = q.data<e4m3>();
  std::vector<float> sf(static_cast<size_t>(row_blocks * col_blocks));
  parallel_for(row_blocks, [&](int64_t begin, int64_t end, int) {
    for (int64_t rb = begin; rb < end; ++rb)
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        const int64_t r0 = rb * gran_k, r1 = std::min(m, r0 + gran_k);
        const int64_t c0 = cb * gran_k, c1 = std::min(n, c0 + gran_k);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) amax = amax_step(amax, v[r * n + c]);
        const float s = scale_for(amax, numeric::kE4m3Max, use_ue8m0);
        sf[rb * col_blocks + cb] = s;
        const float inv = quant::inverse_scale(s);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            out[r * n + c] = quant::quantize_e4m3(v[r * n + c], inv);
      }
  });
  return {q, scales_tensor(sf, row_blocks, col_blocks, false)};
}

Fp8Tensor per_channel_cast_to_fp8(const Tensor& x, bool use_ue8m0, int gran_k) {
  constexpr const char* fn = "per_channel_cast_to_fp8";
  check_matrix(fn, x);
  check_gran_k(fn, gran_k);
  const int64_t m = x.size(0), n = x.size(1);
  DSK_CHECK_ARG(m % gran_k == 0, fn, "x",
                fmt::format("a row count divisible by gran_k ({})", gran_k), m);
  const int64_t row_blocks = m / gran_k;
  const std::vector<float> v = values_f32(x);
  Tensor q = Tensor::empty({m, n}, DType::e4m3);
  e4m3* out = q.data<e4m3>();
  std::vector<float> sf(static_cast<size_t>(row_blocks * n));
  parallel_for(row_blocks, [&](int64_t begin, int64_t end, int) {
    for (int64_t rb = begin; rb < end; ++rb)
      for (int64_t c = 0; c < n; ++c) {
        float amax = 0.0f;
        for (int64_t r = rb * gran_k; r < (rb + 1) * gran_k; ++r)
          amax = amax_step(amax, v[r * n + c]);
        const float s = scale_for(amax, numeric::kE4m3Max, use_ue8m0);
        sf[rb * n + c] = s;
        const float inv = quant::inverse_scale(s);
        for (int64_t r = rb * gran_k; r < (rb + 1) * gran_k; ++r)
          out[r * n + c] = quant::quantize_e4m3(v[r * n + c], inv);
      }
  });
  return {q, scales_tensor(sf, row_blocks, n, false)};
}

Fp8Tensor per_token_cast_to_fp4(const Tensor& x, bool use_ue8m0, int gran_k,
                                bool use_packed_ue8m0) {
  constexpr const char* fn = "per_token_cast_to_fp4";
  check_matrix(fn, x);
  check_gran_k(fn, gran_k);
  check_packed_request(fn, use_ue8m0, use_packed_ue8m0);
  const int64_t m = x.size(0), n = x.size(1);
  DSK_CHECK_ARG(n % 2 == 0, fn, "x", "an even number of columns (two FP4 values per byte)", n);
  const std::vector<float> v = values_f32(x);
  std::vector<uint8_t> codes(static_cast<size_t>(m * n));
  const auto sf = per_token_scales(
      v, m, n, gran_k, numeric::kE2m1Max, use_ue8m0, [&](int64_t r, int64_t b, float s) {
        const float inv = quant::inverse_scale(s);
        for (int64_t c = b * gran_k; c < std::min(n, (b + 1) * gran_k); ++c)
          codes[r * n + c] = quant::quantize_e2m1(v[r * n + c], inv);
      });
  Tensor packed = Tensor::empty({m, n / 2}, DType::fp4x2);
  fp4x2* out = packed.data<fp4x2>();
  for (int64_t i = 0; i < m * n / 2; ++i)
    out[i] = numeric::pack_e2m1(codes[2 * i], codes[2 * i + 1]);
  return {packed, scales_tensor(sf, m, ceil_div(n, gran_k), use_packed_ue8m0)};
}

Tensor cast_back_from_fp4(const Tensor& packed, const Tensor& sf, int gran_k,
                          bool use_packed_ue8m0) {
  constexpr const char* fn = "cast_back_from_fp4";
  check::dtype_in(fn, "packed", packed, {DType::fp4x2, DType::i8, DType::u8});
  check::dim(fn, "packed", packed, 2);
  check_gran_k(fn, gran_k);
  const int64_t m = packed.size(0), n = 2 * packed.size(1);
  const int64_t blocks = ceil_div(n, gran_k);
  check::dtype(fn, "sf", sf, use_packed_ue8m0 ? DType::i32 : DType::f32);
  check::shape(fn, "sf", sf, {m, use_packed_ue8m0 ? ceil_div(blocks, 4) : blocks});
  const Tensor bytes = packed.reinterpret(DType::u8).contiguous();
  const Tensor scales = sf.contiguous();
  Tensor out = Tensor::empty({m, n}, DType::f32);
  float* o = out.data<float>();
  const auto* b = static_cast<const uint8_t*>(bytes.data_ptr());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const uint8_t byte = b[r * (n / 2) + c / 2];
      const float value = numeric::e2m1_to_f32(c % 2 == 0 ? byte & 0xF : byte >> 4);
      const int64_t block = c / gran_k;
      const float s = use_packed_ue8m0
                          ? unpacked_scale(static_cast<const uint8_t*>(
                                scales.data_ptr())[r * ceil_div(blocks, 4) * 4 + block])
                          : scales.data<float>()[r * blocks + block];
      o[r * n + c] = value * s;
    }
  return out;
}

Tensor ceil_to_ue8m0(const Tensor& x) {
  constexpr const char* fn = "ceil_to_ue8m0";
  check::dtype_in(fn, "x", x, kFloatInputs);
  std::vector<float> v = values_f32(x);
  Tensor out = Tensor::empty(x.sizes(), DType::f32);
  float* o = static_cast<float*>(out.data_ptr());
  for (size_t i = 0; i < v.size(); ++i) o[i] = numeric::ceil_to_ue8m0(v[i]);
  return out;
}

Tensor pack_ue8m0_to_int(const Tensor& sf) {
  constexpr const char* fn = "pack_ue8m0_to_int";
  check::dtype(fn, "sf", sf, DType::f32);
  DSK_CHECK_ARG(sf.dim() >= 1 && sf.size(-1) % 4 == 0, fn, "sf",
                "a last dimension divisible by 4 (four scales per int32)", sf.describe());
  const std::vector<float> v = values_f32(sf);
  Shape shape = sf.sizes();
  shape.back() /= 4;
  Tensor out = Tensor::empty(shape, DType::i32);
  auto* bytes = static_cast<uint8_t*>(out.data_ptr());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t bits = numeric::bits_of(v[i]);
    // Upstream's assertion: a zero mantissa (the value is +-2^e, 0 or inf).
    DSK_CHECK_ARG((bits & 0x7FFFFFu) == 0, fn, "sf",
                  "UE8M0 values: floats with a zero mantissa (powers of two)",
                  fmt::format("{} at flat index {}", v[i], i));
    bytes[i] = static_cast<uint8_t>(bits >> 23);
  }
  return out;
}

Tensor unpack_ue8m0_from_int(const Tensor& packed) {
  constexpr const char* fn = "unpack_ue8m0_from_int";
  check::dtype(fn, "packed", packed, DType::i32);
  DSK_CHECK_ARG(packed.dim() >= 1, fn, "packed", "at least 1 dimension", packed.describe());
  const Tensor c = packed.contiguous();
  Shape shape = packed.sizes();
  shape.back() *= 4;
  Tensor out = Tensor::empty(shape, DType::f32);
  const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
  float* o = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = unpacked_scale(bytes[i]);
  return out;
}

}  // namespace dsk::gemm
