#include <dsk/core/check.hpp>

#include <sstream>

#include <fmt/format.h>

namespace dsk::check {

void defined(const char* fn, const char* arg, const Tensor& t) {
  DSK_CHECK_ARG(t.defined(), fn, arg, "a defined tensor", "an undefined tensor");
}

void dtype(const char* fn, const char* arg, const Tensor& t, DType expected) {
  defined(fn, arg, t);
  DSK_CHECK_ARG(t.dtype() == expected, fn, arg,
                std::string("dtype ") + std::string(dtype_name(expected)), t.dtype());
}

void dtype_in(const char* fn, const char* arg, const Tensor& t,
              std::initializer_list<DType> allowed) {
  defined(fn, arg, t);
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::ostringstream want;
  want << "dtype in {";
  const char* sep = "";
  for (DType d : allowed) {
    want << sep << d;
    sep = ", ";
  }
  want << "}";
  DSK_CHECK_ARG(false, fn, arg, want.str(), t.dtype());
}

void dim(const char* fn, const char* arg, const Tensor& t, int expected) {
  defined(fn, arg, t);
  DSK_CHECK_ARG(t.dim() == expected, fn, arg, fmt::format("{} dimensions", expected),
                fmt::format("{} ({})", t.dim(), t.describe()));
}

void shape(const char* fn, const char* arg, const Tensor& t, const Shape& expected) {
  defined(fn, arg, t);
  bool ok = t.dim() == static_cast<int>(expected.size());
  for (int d = 0; ok && d < t.dim(); ++d) ok = expected[d] == -1 || expected[d] == t.size(d);
  DSK_CHECK_ARG(ok, fn, arg, "shape " + detail::to_text(expected), t.sizes());
}

void size(const char* fn, const char* arg, const Tensor& t, int d, int64_t expected) {
  defined(fn, arg, t);
  DSK_CHECK_ARG(t.size(d) == expected, fn, arg, fmt::format("size {} in dimension {}", expected, d),
                t.size(d));
}

void contiguous(const char* fn, const char* arg, const Tensor& t) {
  defined(fn, arg, t);
  DSK_CHECK_ARG(t.is_contiguous(), fn, arg, "a contiguous tensor", t.describe());
}

void last_dim_contiguous(const char* fn, const char* arg, const Tensor& t) {
  defined(fn, arg, t);
  DSK_CHECK_ARG(t.dim() == 0 || t.stride(-1) == 1 || t.size(-1) == 1, fn, arg,
                "stride 1 in the last dimension", t.describe());
}

void aligned(const char* fn, const char* arg, const Tensor& t, size_t bytes) {
  defined(fn, arg, t);
  DSK_CHECK_ARG(reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0, fn, arg,
                fmt::format("data aligned to {} bytes", bytes), t.data_ptr());
}

void in_range(const char* fn, const char* arg, int64_t value, int64_t lo, int64_t hi) {
  DSK_CHECK_ARG(value >= lo && value <= hi, fn, arg, fmt::format("a value in [{}, {}]", lo, hi),
                value);
}

}  // namespace dsk::check
