// The plain operations of dsk::ref::model (contracts in model_ops.hpp).
#include "model_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/kernels/mla/kv_format.hpp>
#include <dsk/kernels/quant.hpp>

#include "walk.hpp"

namespace dsk::ref::model::detail {
namespace {

constexpr int64_t kQuantBlock = 128;   // act_quant's block along K
constexpr int64_t kWeightBlock = 128;  // FP8 weights: one scale per 128 x 128 block
constexpr int64_t kMinTaskMacs = int64_t{1} << 18;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

float e4m3_value(float x) {
  return numeric::e4m3_to_f32(numeric::f32_to_e4m3(x));
}

float abs_max(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

}  // namespace

std::vector<float> values_f32(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<float> out(static_cast<size_t>(c.numel()));
  if (c.dtype() == DType::f32) {
    std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(float));
  } else if (c.dtype() == DType::bf16) {
    convert_bf16_to_f32(c.data<bf16>(), out.data(), out.size());
  } else {
    std::vector<double> v;
    v.reserve(out.size());
    dsk::ref::detail::for_each_raw_row(c, [&](const dsk::ref::detail::RawRow& row) {
      dsk::ref::detail::read_row(c.dtype(), row, v);
    });
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(v[i]);
  }
  return out;
}

Matrix dequantize_weight(const Tensor& weight, const Tensor* scale_inv) {
  constexpr const char* fn = "dsk::ref::model::Reference";
  check::dim(fn, "weight", weight, 2);
  Matrix w;
  w.rows = weight.size(0);
  w.cols = weight.size(1);
  if (weight.dtype() != DType::e4m3) {
    w.values = values_f32(weight);
    return w;
  }
  DSK_CHECK_ARG(scale_inv != nullptr, fn, "weight", "an FP8 weight with its weight_scale_inv",
                weight.describe());
  const Shape scale_shape = {ceil_div(w.rows, kWeightBlock), ceil_div(w.cols, kWeightBlock)};
  check::shape(fn, "weight_scale_inv", *scale_inv, scale_shape);
  const std::vector<float> scale = values_f32(*scale_inv);
  const Tensor codes = weight.contiguous();
  const auto* code = static_cast<const uint8_t*>(codes.data_ptr());
  w.values.resize(static_cast<size_t>(w.rows * w.cols));
  // value * scale rounded to f32, as upstream's weight_dequant computes it before its bf16 cast.
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c)
      w.values[r * w.cols + c] = numeric::e4m3_to_f32(e4m3{code[r * w.cols + c]}) *
                                 scale[(r / kWeightBlock) * scale_shape[1] + c / kWeightBlock];
  return w;
}

void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = numeric::round_to_bf16(x[i]);
}

// Eight interleaved partial sums (so the loop vectorises without reassociating anything),
// combined pairwise. f32 x f32 products are exact in fp64.
double dot(const float* a, const float* b, int64_t n) {
  double part[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(a[k + j]) * b[k + j];
  for (int j = 0; k < n; ++k, ++j) part[j] += static_cast<double>(a[k]) * b[k];
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

Matrix columns(const Matrix& m, int64_t begin, int64_t end) {
  Matrix out(m.rows, end - begin);
  for (int64_t t = 0; t < m.rows; ++t) std::copy(m.row(t) + begin, m.row(t) + end, out.row(t));
  return out;
}

Matrix add(const Matrix& a, const Matrix& b) {
  Matrix out(a.rows, a.cols);
  for (size_t i = 0; i < a.values.size(); ++i) out.values[i] = a.values[i] + b.values[i];
  return out;
}

Matrix matmul_nt(const Matrix& x, const Matrix& w) {
  DSK_CHECK(x.cols == w.cols, "dsk::ref::model::matmul_nt", "inner dimensions differ");
  Matrix y(x.rows, w.rows);
  // Whole output columns per task, so each element's sum is the same for any partition; tasks of
  // at least kMinTaskMacs multiply-adds, so small products stay on one thread.
  const int64_t macs_per_column = std::max<int64_t>(1, x.rows * x.cols);
  parallel_for(
      w.rows,
      [&](int64_t n0, int64_t n1, int) {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t t = 0; t < x.rows; ++t)
            y.row(t)[n] = static_cast<float>(dot(x.row(t), w.row(n), x.cols));
      },
      ceil_div(kMinTaskMacs, macs_per_column));
  return y;
}

Matrix act_quant(const Matrix& x) {
  Matrix q(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t k0 = 0; k0 < x.cols; k0 += kQuantBlock) {
      const int64_t n = std::min(kQuantBlock, x.cols - k0);
      const float* in = x.row(t) + k0;
      const float scale = quant::block_scale(abs_max(in, n), numeric::kE4m3Max, true);
      const float inv = quant::inverse_scale(scale);
      for (int64_t k = 0; k < n; ++k) q.row(t)[k0 + k] = e4m3_value(in[k] * inv) * scale;
    }
  return q;
}

Matrix fp8_linear(const Matrix& x, const Matrix& w) {
  Matrix y = matmul_nt(act_quant(x), w);
  round_to_bf16(y);
  return y;
}

Matrix rms_norm(const Matrix& x, const std::vector<float>& weight, double eps) {
  Matrix y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    const float* in = x.row(t);
    double sum_sq = 0.0;
    for (int64_t i = 0; i < x.cols; ++i) sum_sq += static_cast<double>(in[i]) * in[i];
    const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(x.cols) + eps);
    for (int64_t i = 0; i < x.cols; ++i)
      y.row(t)[i] = static_cast<float>(weight[i] * (in[i] * inv_rms));
  }
  round_to_bf16(y);
  return y;
}

Matrix layer_norm(const Matrix& x, const std::vector<float>& weight, const std::vector<float>& bias,
                  double eps) {
  Matrix y(x.rows, x.cols);
  const auto n = static_cast<double>(x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    const float* in = x.row(t);
    double sum = 0.0;
    for (int64_t i = 0; i < x.cols; ++i) sum += in[i];
    const double mean = sum / n;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < x.cols; ++i) sum_sq += (in[i] - mean) * (in[i] - mean);
    const double inv_std = 1.0 / std::sqrt(sum_sq / n + eps);
    for (int64_t i = 0; i < x.cols; ++i)
      y.row(t)[i] = static_cast<float>(weight[i] * ((in[i] - mean) * inv_std) + bias[i]);
  }
  round_to_bf16(y);
  return y;
}

void rotate(float* x, const float* cos_sin, int64_t rot_dim, bool interleaved) {
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float* a = interleaved ? x + 2 * i : x + i;
    float* b = interleaved ? x + 2 * i + 1 : x + i + half;
    const float c = cos_sin[i], s = cos_sin[half + i];
    // The demo's complex product (a + ib)(c + is) in f32.
    const float re = *a * c - *b * s;
    const float im = *a * s + *b * c;
    *a = numeric::round_to_bf16(re);
    *b = numeric::round_to_bf16(im);
  }
}

void hadamard(float* x, int64_t n, double scale) {
  std::vector<double> v(x, x + n);
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  for (int64_t i = 0; i < n; ++i) x[i] = numeric::round_to_bf16(static_cast<float>(v[i] * scale));
}

float quantize_fp8_block(float* x, int64_t n) {
  const float scale = quant::block_scale(abs_max(x, n), numeric::kE4m3Max, true);
  const float inv = quant::inverse_scale(scale);
  for (int64_t i = 0; i < n; ++i) x[i] = e4m3_value(x[i] * inv);
  return scale;
}

void fp8_round_trip_latent(float* x, int64_t n) {
  constexpr int64_t tile = kernels::mla::kScaleTile;
  for (int64_t t0 = 0; t0 < n; t0 += tile) {
    const int64_t len = std::min(tile, n - t0);
    const float scale = kernels::mla::tile_scale(abs_max(x + t0, len));
    for (int64_t i = t0; i < t0 + len; ++i) x[i] = e4m3_value(x[i] / scale) * scale;
  }
}

}  // namespace dsk::ref::model::detail
