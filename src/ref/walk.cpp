// Row-major traversal of strided tensors and reading their elements as fp64 (see walk.hpp).
#include "walk.hpp"

#include <cstring>

#include <dsk/core/check.hpp>

namespace dsk::ref::detail {
namespace {

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T, class Convert>
void append(const RawRow& row, std::vector<double>& out, Convert convert) {
  for (int64_t i = 0; i < row.length; ++i)
    out.push_back(static_cast<double>(convert(load<T>(row.first + i * row.stride_bytes))));
}

template <class T>
void append_plain(const RawRow& row, std::vector<double>& out) {
  append<T>(row, out, [](T v) { return v; });
}

}  // namespace

void for_each_raw_row(const Tensor& t, const std::function<void(const RawRow&)>& fn) {
  if (t.numel() == 0) return;
  const int d = t.dim();
  const auto es = static_cast<int64_t>(t.element_size());
  const int64_t length = d == 0 ? 1 : t.size(-1);
  const int64_t stride = d == 0 ? 0 : t.stride(-1);
  const int64_t rows = t.numel() / length;
  std::vector<int64_t> index(d > 0 ? d - 1 : 0, 0);
  char* base = static_cast<char*>(t.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0;
    for (size_t i = 0; i < index.size(); ++i) offset += index[i] * t.stride(static_cast<int>(i));
    fn(RawRow{base + offset * es, length, stride * es});
    for (int i = static_cast<int>(index.size()) - 1; i >= 0; --i) {
      if (++index[i] < t.size(i)) break;
      index[i] = 0;
    }
  }
}

int64_t values_per_element(DType dtype) {
  return dtype == DType::fp4x2 ? 2 : 1;
}

int64_t value_count(const Tensor& t) {
  return t.numel() * values_per_element(t.dtype());
}

void read_row(DType dtype, const RawRow& row, std::vector<double>& out) {
  switch (dtype) {
    case DType::f64:
      return append_plain<double>(row, out);
    case DType::f32:
      return append_plain<float>(row, out);
    case DType::f16:
      return append<f16>(row, out, numeric::f16_to_f32);
    case DType::bf16:
      return append<bf16>(row, out, numeric::bf16_to_f32);
    case DType::e4m3:
      return append<e4m3>(row, out, numeric::e4m3_to_f32);
    case DType::e5m2:
      return append<e5m2>(row, out, numeric::e5m2_to_f32);
    case DType::ue8m0:
      return append<ue8m0>(row, out, numeric::ue8m0_to_f32);
    case DType::fp4x2:
      for (int64_t i = 0; i < row.length; ++i) {
        const auto byte = load<fp4x2>(row.first + i * row.stride_bytes);
        out.push_back(numeric::e2m1_to_f32(numeric::e2m1_low(byte)));
        out.push_back(numeric::e2m1_to_f32(numeric::e2m1_high(byte)));
      }
      return;
    case DType::i8:
      return append_plain<int8_t>(row, out);
    case DType::u8:
      return append_plain<uint8_t>(row, out);
    case DType::i16:
      return append_plain<int16_t>(row, out);
    case DType::i32:
      return append_plain<int32_t>(row, out);
    case DType::i64:
      return append_plain<int64_t>(row, out);
    case DType::boolean:
      return append<uint8_t>(row, out, [](uint8_t v) { return v != 0 ? 1 : 0; });
  }
}

void for_each_row_pair(
    const char* function, const Tensor& x, const Tensor& y,
    const std::function<void(int64_t, const double*, const double*, int64_t)>& fn) {
  check::defined(function, "x", x);
  check::defined(function, "y", y);
  DSK_CHECK_ARG(x.sizes() == y.sizes(), function, "y", "the shape of x " + x.describe(),
                y.describe());
  DSK_CHECK_ARG(values_per_element(x.dtype()) == values_per_element(y.dtype()), function, "y",
                std::string("fp4x2 on both sides or neither (x is ") +
                    std::string(dtype_name(x.dtype())) + ")",
                y.dtype());
  // Both walks visit rows in the same order; collect y's row pointers alongside x's.
  std::vector<RawRow> y_rows;
  for_each_raw_row(y, [&](const RawRow& row) { y_rows.push_back(row); });
  std::vector<double> a, b;
  size_t r = 0;
  int64_t start = 0;
  for_each_raw_row(x, [&](const RawRow& row) {
    a.clear();
    b.clear();
    read_row(x.dtype(), row, a);
    read_row(y.dtype(), y_rows[r++], b);
    fn(start, a.data(), b.data(), static_cast<int64_t>(a.size()));
    start += static_cast<int64_t>(a.size());
  });
}

Shape coordinates(const Tensor& t, int64_t index) {
  int64_t element = index / values_per_element(t.dtype());
  Shape coords(t.dim());
  for (int d = t.dim() - 1; d >= 0; --d) {
    coords[d] = element % t.size(d);
    element /= t.size(d);
  }
  return coords;
}

}  // namespace dsk::ref::detail
