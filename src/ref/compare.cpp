// The upstream comparison metrics: calc_diff (DeepGEMM) and the allclose rule of FlashMLA's tests.
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref {
namespace {

// 1 - 2*sxy / (sxx + syy), with the both-all-zero case defined as 0.
double cosine_difference(double sxy, double sxx_plus_syy) {
  return sxx_plus_syy == 0.0 ? 0.0 : 1.0 - 2.0 * sxy / sxx_plus_syy;
}

// Kernelkit's relative error: the 1e-6 keeps elements whose expected value is 0 finite.
constexpr double kRelErrFloor = 1e-6;

bool same_special(double a, double e) {
  if (std::isnan(a) || std::isnan(e)) return std::isnan(a) && std::isnan(e);
  if (std::isinf(a) || std::isinf(e)) return a == e;  // same infinity, same sign
  return true;
}

std::string format_coords(const Shape& coords) {
  return fmt::format("[{}]", fmt::join(coords, ", "));
}

std::string describe(const AllcloseResult& r, const AllcloseOptions& o) {
  const std::string numbers =
      fmt::format("max abs err {:.3g}, max rel err {:.3g}, cos_diff {:.3g} (cos_tol {:.3g})",
                  r.max_abs_err, r.max_rel_err, r.cos_diff, o.cos_tol);
  if (r.passed) return fmt::format("allclose passed: {} elements, {}", r.num_elements, numbers);
  if (r.num_bad == 0)
    return fmt::format(
        "allclose failed: cos_diff {:.3g} > cos_tol {:.3g}; every element within "
        "abs_tol {:.3g} or rel_tol {:.3g}; {}",
        r.cos_diff, o.cos_tol, o.abs_tol, o.rel_tol, numbers);
  return fmt::format(
      "allclose failed: {} of {} elements bad (NaN/inf mismatch or beyond abs_tol {:.3g} and "
      "rel_tol {:.3g}); first at {}: actual {:.9g} vs expected {:.9g}; {}",
      r.num_bad, r.num_elements, o.abs_tol, o.rel_tol, format_coords(r.first_bad_coords),
      r.first_bad_actual, r.first_bad_expected, numbers);
}

}  // namespace

double calc_diff(const Tensor& x, const Tensor& y) {
  double sxy = 0.0, sxx_plus_syy = 0.0;
  detail::for_each_row_pair("dsk::ref::calc_diff", x, y,
                            [&](int64_t, const double* a, const double* b, int64_t n) {
                              for (int64_t i = 0; i < n; ++i) {
                                sxy += a[i] * b[i];
                                sxx_plus_syy += a[i] * a[i] + b[i] * b[i];
                              }
                            });
  return cosine_difference(sxy, sxx_plus_syy);
}

AllcloseResult allclose(const Tensor& actual, const Tensor& expected,
                        const AllcloseOptions& options) {
  AllcloseResult r;
  double sxy = 0.0, sxx_plus_syy = 0.0;
  auto mark_bad = [&](int64_t index, double a, double e) {
    if (r.num_bad++ > 0) return;
    r.first_bad_index = index;
    r.first_bad_actual = a;
    r.first_bad_expected = e;
  };
  detail::for_each_row_pair(
      "dsk::ref::allclose", actual, expected,
      [&](int64_t start, const double* a, const double* e, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          if (!std::isfinite(a[i]) || !std::isfinite(e[i])) {
            if (!same_special(a[i], e[i])) mark_bad(start + i, a[i], e[i]);
            continue;  // matched specials count as 0 in the cosine, like kernelkit
          }
          sxy += a[i] * e[i];
          sxx_plus_syy += a[i] * a[i] + e[i] * e[i];
          const double abs_err = std::fabs(a[i] - e[i]);
          const double rel_err = abs_err / (std::fabs(e[i]) + kRelErrFloor);
          r.max_abs_err = std::max(r.max_abs_err, abs_err);
          r.max_rel_err = std::max(r.max_rel_err, rel_err);
          if (!(abs_err == 0.0 || abs_err < options.abs_tol || rel_err < options.rel_tol))
            mark_bad(start + i, a[i], e[i]);
        }
      });
  r.num_elements = detail::value_count(actual);
  r.cos_diff = cosine_difference(sxy, sxx_plus_syy);
  if (r.first_bad_index >= 0) r.first_bad_coords = detail::coordinates(actual, r.first_bad_index);
  r.passed = r.num_bad == 0 && std::fabs(r.cos_diff) <= options.cos_tol;
  r.message = describe(r, options);
  return r;
}

std::ostream& operator<<(std::ostream& os, const AllcloseResult& r) {
  return os << r.message;
}

}  // namespace dsk::ref
