// The plain operations dsk::ref::model builds the DeepSeek-V3.2 forward from (spec/attention.md
// §5.3): activations as f32 matrices, FP8 linears with per-1x128 activation quantization, norms,
// RoPE, the Walsh-Hadamard transform and the one-scale FP8 casts of the indexer. Private to
// src/ref.
//
// Values that the upstream demo (inference/model.py) stores as bf16 are kept here as their exact
// f32 values: every function below that "returns bf16" rounds its f32 results to bf16 and back.
#pragma once

#include <cstdint>
#include <vector>

#include <dsk/core/tensor.hpp>

namespace dsk::ref::model::detail {

// rows x cols f32 values, row-major: one row per token.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;

  Matrix() = default;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), values(static_cast<size_t>(r * c), 0.0f) {}
  float* row(int64_t r) { return values.data() + r * cols; }
  const float* row(int64_t r) const { return values.data() + r * cols; }
};

// ---- tensors of a checkpoint as f32 ----

// The values of a float tensor (any dtype and strides) as a contiguous f32 array.
std::vector<float> values_f32(const Tensor& t);
// A weight [out, in] as f32: an e4m3 weight times its 128 x 128 block scales (scale_inv f32
// [ceil(out / 128), ceil(in / 128)]), or a bf16 / f32 weight as it is.
Matrix dequantize_weight(const Tensor& weight, const Tensor* scale_inv);
// Rounds every value to the nearest bf16 (what storing a tensor as bf16 does).
void round_to_bf16(float* x, int64_t n);
inline void round_to_bf16(Matrix& m) {
  round_to_bf16(m.values.data(), static_cast<int64_t>(m.values.size()));
}
// Columns [begin, end) of every row.
Matrix columns(const Matrix& m, int64_t begin, int64_t end);
// a + b elementwise in f32 (the demo's residual sum x.float() + residual.float()).
Matrix add(const Matrix& a, const Matrix& b);

// ---- linears ----

// sum_i a[i] * b[i] with exact fp64 products, summed in a fixed order (the same for any caller).
double dot(const float* a, const float* b, int64_t n);

// y[t, n] = sum_k x[t, k] * w[n, k] for every row of x: products and sums in fp64, each element
// summed in the same order whatever the number of rows or threads; results rounded to f32.
Matrix matmul_nt(const Matrix& x, const Matrix& w);
// The demo's act_quant with UE8M0 scales: per 1 x 128 block of each row,
// s = 2^ceil(log2(max(amax, 1e-4) / 448)), code = e4m3(x / s) (RNE, saturating); returns code * s.
Matrix act_quant(const Matrix& x);
// The demo's FP8 Linear: act_quant(x), the product with the dequantized weight, output bf16.
Matrix fp8_linear(const Matrix& x, const Matrix& w);

// ---- norms (fp64 math, bf16 results) ----

// weight * x / sqrt(mean(x^2) + eps) per row.
Matrix rms_norm(const Matrix& x, const std::vector<float>& weight, double eps);
// weight * (x - mean) / sqrt(var + eps) + bias per row (biased variance).
Matrix layer_norm(const Matrix& x, const std::vector<float>& weight, const std::vector<float>& bias,
                  double eps);

// ---- positions ----

// Rotates rot_dim values in place (bf16 results) by the angles of one position: cos_sin holds
// cos of pair i in column i and its sin in column rot_dim / 2 + i (dsk::tk::yarn_cos_sin_cache).
// Interleaved pairs are (x[2i], x[2i + 1]) (MLA); otherwise (x[i], x[i + rot_dim / 2]) (the
// indexer, NeoX rotate-half).
void rotate(float* x, const float* cos_sin, int64_t rot_dim, bool interleaved);

// ---- the indexer's transforms ----

// x <- scale * H x in place, H the Sylvester-ordered Walsh-Hadamard matrix of size n (a power of
// two), fp64 butterflies, bf16 results.
void hadamard(float* x, int64_t n, double scale);
// Quantizes n values with one UE8M0 scale (act_quant's rule for a single block): x is replaced by
// the e4m3 codes' values (not multiplied by the scale), and the scale is returned.
float quantize_fp8_block(float* x, int64_t n);
// The 656-byte MLA token's latent round trip: per tile of 128 values,
// s = 2^ceil(log2(max(amax / 448, 1e-4))), x <- e4m3(x / s) * s.
void fp8_round_trip_latent(float* x, int64_t n);

}  // namespace dsk::ref::model::detail
