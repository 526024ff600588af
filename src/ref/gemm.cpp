// The GEMM oracle of dsk::gemm: D = C + A·Bᵀ in fp64, and the dequantization of FP8/FP4 operands
// with their block scales.
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_gemm_operand(const char* fn, const char* arg, const Tensor& t) {
  check::defined(fn, arg, t);
  DSK_CHECK_ARG(t.dim() == 2 || t.dim() == 3, fn, arg, "a 2-D or 3-D tensor", t.describe());
  DSK_CHECK_ARG(t.dtype() != DType::fp4x2, fn, arg, "values (dequantize FP4 operands first)",
                t.dtype());
}

// Whether every value of `dtype` is exact in f32 (then operands are stored as f32, halving the
// memory of large references; products and sums stay fp64).
bool exact_in_f32(DType dtype) {
  return dtype != DType::f64 && dtype != DType::i32 && dtype != DType::i64;
}

// The values of a tensor (fp4x2: two per byte), row-major, as T; `transpose_last` stores each
// [rows, cols] matrix of a 2-D or 3-D tensor transposed ([cols, rows]).
template <class T>
std::vector<T> read_values(const Tensor& t, bool transpose_last) {
  std::vector<T> out(static_cast<size_t>(detail::value_count(t)));
  const int64_t rows = t.dim() >= 2 ? t.size(-2) : 1;
  const int64_t cols = (t.dim() >= 1 ? t.size(-1) : 1) * detail::values_per_element(t.dtype());
  std::vector<double> row;
  int64_t r = 0;  // the flat index of the row being read
  detail::for_each_raw_row(t, [&](const detail::RawRow& raw) {
    row.clear();
    detail::read_row(t.dtype(), raw, row);
    const int64_t batch = r / rows, i = r % rows;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t at = transpose_last ? (batch * cols + j) * rows + i : r * cols + j;
      out[static_cast<size_t>(at)] = static_cast<T>(row[static_cast<size_t>(j)]);
    }
    ++r;
  });
  return out;
}

// Rows [r0, r1) of one batch: out[r][j] = sum_kk a[r][kk] * bt[kk][j] in fp64, summed in
// increasing kk. Four rows share each pass over Bᵀ, and columns go in chunks that stay in L1.
template <class T>
void multiply_rows(const T* a, const T* bt, double* out, int64_t r0, int64_t r1, int64_t n,
                   int64_t k) {
  constexpr int64_t kRows = 4, kCols = 256;
  double acc[kRows][kCols];
  for (int64_t i0 = r0; i0 < r1; i0 += kRows) {
    const int64_t rows = std::min(kRows, r1 - i0);
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t cols = std::min(kCols, n - j0);
      for (int64_t i = 0; i < rows; ++i) std::fill_n(acc[i], cols, 0.0);
      for (int64_t kk = 0; kk < k; ++kk) {
        const T* b_row = bt + kk * n + j0;
        for (int64_t i = 0; i < rows; ++i) {
          const double a_ik = a[(i0 + i) * k + kk];
          for (int64_t j = 0; j < cols; ++j) acc[i][j] += a_ik * static_cast<double>(b_row[j]);
        }
      }
      for (int64_t i = 0; i < rows; ++i) std::copy_n(acc[i], cols, out + (i0 + i) * n + j0);
    }
  }
}

// out [groups, m, n] = A [groups, m, k] · Bᵀ, operands stored as T.
template <class T>
void multiply(const Tensor& a, const Tensor& b, int64_t groups, int64_t m, int64_t n, int64_t k,
              double* out) {
  const std::vector<T> av = read_values<T>(a, false);
  const std::vector<T> bt = read_values<T>(b, true);  // [groups, k, n]
  parallel_for(
      groups * m,
      [&](int64_t begin, int64_t end, int) {
        for (int64_t g = begin / m; g < groups && g * m < end; ++g) {
          const int64_t r0 = std::max(begin, g * m) - g * m;
          const int64_t r1 = std::min(end, (g + 1) * m) - g * m;
          multiply_rows(av.data() + g * m * k, bt.data() + g * k * n, out + g * m * n, r0, r1, n,
                        k);
        }
      },
      4);
}

}  // namespace

Tensor gemm_nt(const Tensor& a, const Tensor& b, const std::optional<Tensor>& c) {
  constexpr const char* fn = "dsk::ref::gemm_nt";
  check_gemm_operand(fn, "a", a);
  check_gemm_operand(fn, "b", b);
  DSK_CHECK_ARG(b.dim() == a.dim(), fn, "b", fmt::format("{} dimensions, like a", a.dim()),
                b.describe());
  const bool batched = a.dim() == 3;
  const int64_t groups = batched ? a.size(0) : 1;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-2);
  DSK_CHECK_ARG(
      b.size(-1) == k && (!batched || b.size(0) == groups), fn, "b",
      batched ? fmt::format("shape [{}, N, {}]", groups, k) : fmt::format("shape [N, {}]", k),
      b.describe());
  Shape out_shape = {m, n};
  if (batched) out_shape.insert(out_shape.begin(), groups);
  if (c.has_value()) {
    check::defined(fn, "c", *c);
    DSK_CHECK_ARG(c->sizes() == out_shape, fn, "c",
                  fmt::format("shape {}", ::dsk::detail::to_text(out_shape)), c->describe());
  }
  Tensor out = Tensor::zeros(out_shape, DType::f64);
  double* o = static_cast<double*>(out.data_ptr());
  if (m > 0 && n > 0) {
    if (exact_in_f32(a.dtype()) && exact_in_f32(b.dtype()))
      multiply<float>(a, b, groups, m, n, k, o);
    else
      multiply<double>(a, b, groups, m, n, k, o);
  }
  if (c.has_value()) {
    const std::vector<double> cv = read_values<double>(*c, false);
    for (size_t i = 0; i < cv.size(); ++i) o[i] += cv[i];
  }
  return out;
}

Tensor dequantize(const Tensor& data, const Tensor& sf, int gran_mn, int gran_k) {
  constexpr const char* fn = "dsk::ref::dequantize";
  check::dtype_in(fn, "data", data, {DType::e4m3, DType::fp4x2});
  DSK_CHECK_ARG(data.dim() == 2 || data.dim() == 3, fn, "data", "a 2-D or 3-D tensor",
                data.describe());
  const bool fp4 = data.dtype() == DType::fp4x2;
  if (fp4)
    DSK_CHECK_ARG(data.stride(-1) == 1 || data.size(-1) == 1, fn, "data",
                  "a K-major FP4 tensor (stride 1 in the last dimension)", data.describe());
  DSK_CHECK_ARG(gran_mn > 0 && gran_k > 0, fn, "gran_mn, gran_k", "positive block sizes",
                fmt::format("{}, {}", gran_mn, gran_k));
  check::dtype_in(fn, "sf", sf, {DType::f32, DType::i32, DType::i16});
  const int64_t groups = data.dim() == 3 ? data.size(0) : 1;
  const int64_t mn = data.size(-2), k = data.size(-1) * (fp4 ? 2 : 1);
  const int64_t per_word = sf.dtype() == DType::i32 ? 4 : sf.dtype() == DType::i16 ? 2 : 1;
  Shape want = {ceil_div(mn, gran_mn), ceil_div(ceil_div(k, gran_k), per_word)};
  if (data.dim() == 3) want.insert(want.begin(), groups);
  DSK_CHECK_ARG(sf.sizes() == want, fn, "sf", fmt::format("shape {}", ::dsk::detail::to_text(want)),
                sf.describe());

  // Values first (fp4x2 reads as two values per byte), then one scale per block.
  const std::vector<float> values = read_values<float>(data, false);
  Tensor out = Tensor::empty(data.dim() == 3 ? Shape{groups, mn, k} : Shape{mn, k}, DType::f32);
  float* o = static_cast<float*>(out.data_ptr());
  const auto es = static_cast<int64_t>(sf.element_size());
  const char* sf_base = static_cast<const char*>(sf.data_ptr());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < mn; ++r)
      for (int64_t kk = 0; kk < k; ++kk) {
        const int64_t block = kk / gran_k;
        const int64_t offset = (data.dim() == 3 ? g * sf.stride(0) : 0) +
                               (r / gran_mn) * sf.stride(-2) + (block / per_word) * sf.stride(-1);
        float scale;
        if (per_word == 1) {
          std::memcpy(&scale, sf_base + offset * es, sizeof scale);
        } else {
          uint32_t word = 0;
          std::memcpy(&word, sf_base + offset * es, static_cast<size_t>(es));
          scale =
              numeric::ue8m0_to_f32(ue8m0{static_cast<uint8_t>(word >> (8 * (block % per_word)))});
        }
        const int64_t i = (g * mn + r) * k + kk;
        o[i] = values[static_cast<size_t>(i)] * scale;
      }
  return out;
}

}  // namespace dsk::ref
