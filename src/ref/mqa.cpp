// dsk::ref::mqa_logits: the indexer's logits as plain fp64 loops (contract in include/dsk/ref.hpp).
#include <algorithm>
#include <limits>

#include <dsk/core/check.hpp>
#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref {
namespace {

std::vector<double> all_values(const Tensor& t) {
  std::vector<double> out;
  detail::for_each_raw_row(
      t, [&](const detail::RawRow& row) { detail::read_row(t.dtype(), row, out); });
  return out;
}

}  // namespace

Tensor mqa_logits(const Tensor& q, const Tensor& kv, const Tensor& kv_sf, const Tensor& weights,
                  const Tensor& ks, const Tensor& ke) {
  constexpr const char* fn = "dsk::ref::mqa_logits";
  check::dim(fn, "q", q, 3);
  const int64_t s = q.size(0), h = q.size(1), d = q.size(2), skv = kv.size(0);
  check::shape(fn, "kv", kv, {skv, d});
  check::shape(fn, "kv_sf", kv_sf, {skv});
  check::shape(fn, "weights", weights, {s, h});
  const std::vector<double> qv = all_values(q), kvv = all_values(kv), sf = all_values(kv_sf),
                            w = all_values(weights), start = all_values(ks), end = all_values(ke);
  Tensor out = Tensor::empty({s, skv}, DType::f64);
  double* o = out.data<double>();
  std::fill(o, o + s * skv, -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < s; ++i)
    for (auto j = static_cast<int64_t>(start[i]); j < static_cast<int64_t>(end[i]); ++j) {
      double logit = 0;
      for (int64_t hh = 0; hh < h; ++hh) {
        double dot = 0;
        for (int64_t k = 0; k < d; ++k) dot += qv[(i * h + hh) * d + k] * kvv[j * d + k];
        logit += std::max(0.0, sf[j] * dot) * w[i * h + hh];
      }
      o[i * skv + j] = logit;
    }
  return out;
}

}  // namespace dsk::ref
