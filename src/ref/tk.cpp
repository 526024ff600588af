// dsk::ref::tk: plain fp64 references of the dsk::tk ops (contracts in include/dsk/tk.hpp).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>

#include <dsk/core/check.hpp>
#include <dsk/kernels/quant.hpp>
#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref::tk {
namespace {

// ---- tensors as fp64 ----

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(detail::value_count(t)));
  detail::for_each_raw_row(
      t, [&](const detail::RawRow& row) { detail::read_row(t.dtype(), row, out); });
  return out;
}

Tensor f64_tensor(const Shape& shape, const std::vector<double>& v) {
  Tensor t = Tensor::empty(shape, DType::f64);
  std::copy(v.begin(), v.end(), static_cast<double*>(t.data_ptr()));
  return t;
}

std::vector<int64_t> ids(const Tensor& t) {
  const std::vector<double> v = values(t);
  return std::vector<int64_t>(v.begin(), v.end());
}

// ---- routing ----

// Rank order of the tie rule: larger first, NaN last, equal values by smaller index.
bool ranks_before(double a, int64_t ia, double b, int64_t ib) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(b) && (!std::isnan(a) || ia < ib);
  if (a != b) return a > b;
  return ia < ib;
}

std::vector<int64_t> best_k(const double* v, int64_t n, int64_t k) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return ranks_before(v[a], a, v[b], b); });
  order.resize(static_cast<size_t>(k));
  return order;
}

double score(double x, std::string_view f) {
  if (f == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  if (f == "sqrtsoftplus") return std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x)));
  return x;  // identity; softmax is handled per row
}

std::vector<double> score_row(const double* logits, int64_t n, std::string_view f) {
  std::vector<double> s(static_cast<size_t>(n));
  if (f == "softmax") {
    const double m = *std::max_element(logits, logits + n);
    double sum = 0.0;
    for (int64_t e = 0; e < n; ++e) sum += s[e] = std::exp(logits[e] - m);
    for (double& v : s) v /= sum;
  } else {
    for (int64_t e = 0; e < n; ++e) s[e] = score(logits[e], f);
  }
  return s;
}

// The sum of the topk_sum largest values of v[0, n).
double top_sum(const double* v, int64_t n, int topk_sum) {
  std::vector<double> sorted(v, v + n);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  double s = 0.0;
  for (int i = 0; i < topk_sum; ++i) s += sorted[i];
  return s;
}

// The selection of one token: groups by top_sum of biased scores, then experts.
std::vector<int64_t> select(const std::vector<double>& biased, int num_groups, int num_topk_groups,
                            int topk_sum, int num_topk) {
  const int64_t n = static_cast<int64_t>(biased.size());
  std::vector<double> candidates = biased;
  if (num_groups > 1 && num_topk_groups < num_groups) {
    const int64_t per = n / num_groups;
    std::vector<double> group_scores(static_cast<size_t>(num_groups));
    for (int g = 0; g < num_groups; ++g)
      group_scores[g] = top_sum(biased.data() + g * per, per, topk_sum);
    const std::vector<int64_t> kept = best_k(group_scores.data(), num_groups, num_topk_groups);
    for (int g = 0; g < num_groups; ++g)
      if (std::find(kept.begin(), kept.end(), g) == kept.end())
        for (int64_t e = g * per; e < (g + 1) * per; ++e)
          candidates[e] = -std::numeric_limits<double>::infinity();
  }
  return best_k(candidates.data(), n, num_topk);
}

int64_t mask_by_tp(int64_t idx, int64_t per_rank, int64_t num_tp_ranks, int64_t tp_rank) {
  if (idx < 0 || (idx / per_rank) % num_tp_ranks != tp_rank) return -1;
  idx -= tp_rank * per_rank;
  const int64_t dp = idx / (per_rank * num_tp_ranks);
  idx -= dp * (per_rank * num_tp_ranks - per_rank);
  return idx < 0 ? -1 : idx;
}

// ---- quantisation ----

float fmt_max(std::string_view fmt) {
  return fmt == "e2m1" ? numeric::kE2m1Max : numeric::kE4m3Max;
}

// Codes of a [rows, cols] cast where value (r, c) belongs to block (r / bm, c / bk).
QuantTensor cast_blocks(const Tensor& x, std::string_view fmt, int64_t bm, int64_t bk,
                        bool round_sf) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<double> v = values(x);
  const int64_t block_rows = (rows + bm - 1) / bm, blocks = (cols + bk - 1) / bk;
  std::vector<float> amax(static_cast<size_t>(block_rows * blocks), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float a = std::fabs(static_cast<float>(v[r * cols + c]));
      float& m = amax[(r / bm) * blocks + c / bk];
      if (std::isnan(a) || std::isnan(m))
        m = NAN;  // torch's amax: NaN wins
      else if (a > m)
        m = a;
    }
  QuantTensor q;
  q.sf = Tensor::empty({block_rows, blocks}, DType::f32);
  auto* sf = static_cast<float*>(q.sf.data_ptr());
  for (size_t i = 0; i < amax.size(); ++i)
    sf[i] = std::isnan(amax[i]) ? (round_sf ? numeric::ceil_to_ue8m0(amax[i]) : amax[i])
                                : quant::block_scale(amax[i], fmt_max(fmt), round_sf);
  const bool fp4 = fmt == "e2m1";
  q.data = Tensor::empty({rows, fp4 ? cols / 2 : cols}, fp4 ? DType::fp4x2 : DType::e4m3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float inv = quant::inverse_scale(sf[(r / bm) * blocks + c / bk]);
      const float x_rc = static_cast<float>(v[r * cols + c]);
      if (!fp4) {
        static_cast<e4m3*>(q.data.data_ptr())[r * cols + c] = quant::quantize_e4m3(x_rc, inv);
      } else {
        auto* byte = static_cast<uint8_t*>(q.data.data_ptr()) + r * (cols / 2) + c / 2;
        const uint8_t code = quant::quantize_e2m1(x_rc, inv);
        *byte = c % 2 == 0 ? code : static_cast<uint8_t>((*byte & 0x0F) | (code << 4));
      }
    }
  return q;
}

// One row of [rows, cols] values rotated, in place in `out`.
void rotate_pairs(double* v, const float* cache_row, int64_t rot_dim, bool interleaved,
                  bool conjugate) {
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double c = cache_row[i];
    const double s = conjugate ? -static_cast<double>(cache_row[half + i]) : cache_row[half + i];
    const int64_t ia = interleaved ? 2 * i : i;
    const int64_t ib = interleaved ? 2 * i + 1 : i + half;
    const double a = v[ia], b = v[ib];
    v[ia] = a * c - b * s;
    v[ib] = b * c + a * s;
  }
}

}  // namespace

// ================================================================================================

Tensor topk_gate(const Tensor& scores, int num_topk) {
  const int64_t t_count = scores.size(0), n = scores.size(1);
  const std::vector<double> v = values(scores);
  Tensor out = Tensor::empty({t_count, num_topk}, DType::i64);
  for (int64_t t = 0; t < t_count; ++t) {
    const std::vector<int64_t> best = best_k(v.data() + t * n, n, num_topk);
    std::copy(best.begin(), best.end(), static_cast<int64_t*>(out.data_ptr()) + t * num_topk);
  }
  return out;
}

Tensor topk_sum_and_topk_group_idx(const Tensor& scores, int num_topk_sum, int num_topk_groups) {
  const int64_t t_count = scores.size(0), groups = scores.size(1), per = scores.size(2);
  const std::vector<double> v = values(scores);
  Tensor out = Tensor::empty({t_count, num_topk_groups}, DType::i64);
  for (int64_t t = 0; t < t_count; ++t) {
    std::vector<double> gs(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g)
      gs[g] = top_sum(v.data() + (t * groups + g) * per, per, num_topk_sum);
    const std::vector<int64_t> best = best_k(gs.data(), groups, num_topk_groups);
    std::copy(best.begin(), best.end(),
              static_cast<int64_t*>(out.data_ptr()) + t * num_topk_groups);
  }
  return out;
}

Tensor gate_scores(const Tensor& logits, std::string_view scoring_func) {
  const int64_t t_count = logits.size(0), n = logits.size(1);
  const std::vector<double> v = values(logits);
  std::vector<double> out;
  out.reserve(v.size());
  for (int64_t t = 0; t < t_count; ++t) {
    const std::vector<double> s = score_row(v.data() + t * n, n, scoring_func);
    out.insert(out.end(), s.begin(), s.end());
  }
  return f64_tensor({t_count, n}, out);
}

GateResult top2_sum_gate(const Tensor& logits, const Tensor& bias, int num_topk,
                         int num_topk_groups, int num_groups, bool use_shared_as_routed,
                         int num_shared_experts, float routed_scaling_factor, int ep_rank,
                         int num_ep_ranks, int tp_rank, int num_tp_ranks,
                         std::string_view scoring_func, const std::optional<Tensor>& mask,
                         const std::optional<Tensor>& fix_routing_mask,
                         const std::optional<Tensor>& to_physical_map,
                         const std::optional<Tensor>& logical_count,
                         const std::optional<Tensor>& unmapped_topk_idx) {
  const int64_t t_count = logits.size(0), n = logits.size(1);
  const int shared = use_shared_as_routed ? num_shared_experts : 0;
  const int physical = num_topk + shared;
  const std::vector<double> s_all = values(gate_scores(logits, scoring_func));
  const std::vector<double> b = values(bias);
  const int extra = to_physical_map ? static_cast<int>(to_physical_map->size(1)) - 1 : 0;
  const int64_t per_rank = (n + extra) / num_ep_ranks;
  GateResult r{Tensor::empty({t_count, physical}, DType::i64),
               Tensor::empty({t_count, physical}, DType::f32)};
  auto* idx = static_cast<int64_t*>(r.topk_idx.data_ptr());
  auto* w = static_cast<float*>(r.topk_weights.data_ptr());
  for (int64_t t = 0; t < t_count; ++t) {
    int64_t* row_idx = idx + t * physical;
    float* row_w = w + t * physical;
    if (mask && mask->at<uint8_t>({t}) == 0) {
      std::fill_n(row_idx, physical, -1);
      std::fill_n(row_w, physical, 0.0f);
      if (unmapped_topk_idx)
        for (int j = 0; j < num_topk; ++j) unmapped_topk_idx->at<int64_t>({t, j}) = -1;
      continue;
    }
    const double* s = s_all.data() + t * n;
    std::vector<int64_t> chosen;
    if (fix_routing_mask && fix_routing_mask->at<uint8_t>({t}) != 0) {
      for (int j = 0; j < num_topk; ++j) chosen.push_back(unmapped_topk_idx->at<int64_t>({t, j}));
    } else {
      std::vector<double> biased(s, s + n);
      for (int64_t e = 0; e < n; ++e) biased[e] += b[e];
      chosen = select(biased, num_groups, num_topk_groups, 2, num_topk);
    }
    double sum = 1e-20;
    for (int64_t e : chosen) sum += s[e];
    for (int j = 0; j < num_topk; ++j) {
      row_idx[j] = chosen[j];
      row_w[j] = static_cast<float>(s[chosen[j]] / sum * routed_scaling_factor);
      if (unmapped_topk_idx) unmapped_topk_idx->at<int64_t>({t, j}) = chosen[j];
    }
    for (int j = num_topk; j < physical; ++j) {
      row_idx[j] = n + (j - num_topk);
      row_w[j] = 1.0f;
    }
    for (int j = 0; j < physical; ++j) {
      int64_t e = row_idx[j];
      if (to_physical_map) {
        const int64_t replica = (ep_rank + t * 23333) % logical_count->at<int32_t>({e});
        e = to_physical_map->at<int32_t>({e, replica});
      }
      row_idx[j] = mask_by_tp(e, per_rank, num_tp_ranks, tp_rank);
    }
  }
  return r;
}

GateResult noaux_tc_gate(const Tensor& logits, const std::optional<Tensor>& e_score_correction_bias,
                         int num_topk, int n_group, int topk_group, float routed_scaling_factor,
                         std::string_view scoring_func, bool norm_topk_prob) {
  const int64_t t_count = logits.size(0), n = logits.size(1);
  const std::vector<double> s_all = values(gate_scores(logits, scoring_func));
  const std::vector<double> b =
      e_score_correction_bias ? values(*e_score_correction_bias) : std::vector<double>(n, 0.0);
  GateResult r{Tensor::empty({t_count, num_topk}, DType::i64),
               Tensor::empty({t_count, num_topk}, DType::f32)};
  for (int64_t t = 0; t < t_count; ++t) {
    const double* s = s_all.data() + t * n;
    std::vector<double> biased(s, s + n);
    for (int64_t e = 0; e < n; ++e) biased[e] += b[e];
    const std::vector<int64_t> chosen =
        select(biased, n_group, topk_group, e_score_correction_bias ? 2 : 1, num_topk);
    double sum = 1e-20;
    for (int64_t e : chosen) sum += s[e];
    for (int j = 0; j < num_topk; ++j) {
      r.topk_idx.at<int64_t>({t, j}) = chosen[j];
      const double weight = norm_topk_prob ? s[chosen[j]] / sum : s[chosen[j]];
      r.topk_weights.at<float>({t, j}) = static_cast<float>(weight * routed_scaling_factor);
    }
  }
  return r;
}

Tensor group_count(const Tensor& group_idx, int num_groups) {
  Tensor out = Tensor::zeros({num_groups}, DType::i32);
  for (int64_t e : ids(group_idx))
    if (e >= 0) ++static_cast<int32_t*>(out.data_ptr())[e];
  return out;
}

NormalizedWeights normalize_weight(const Tensor& topk_weights) {
  const int64_t t_count = topk_weights.size(0), k = topk_weights.size(1);
  const std::vector<double> w = values(topk_weights);
  NormalizedWeights r{Tensor::empty({t_count}, DType::f32),
                      Tensor::empty({t_count, k}, DType::f32)};
  for (int64_t t = 0; t < t_count; ++t) {
    double sum = 1e-20;
    for (int64_t j = 0; j < k; ++j) sum += w[t * k + j];
    r.denominator.at<float>({t}) = static_cast<float>(sum);
    for (int64_t j = 0; j < k; ++j)
      r.normalized_weights.at<float>({t, j}) = static_cast<float>(w[t * k + j] / sum);
  }
  return r;
}

Tensor mask_indices_by_tp(const Tensor& indices, int64_t n, int num_ep_ranks, int tp_rank,
                          int num_tp_ranks) {
  const std::vector<int64_t> in = ids(indices);
  Tensor out = Tensor::empty(indices.sizes(), indices.dtype());
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t v = mask_by_tp(in[i], n / num_ep_ranks, num_tp_ranks, tp_rank);
    if (out.dtype() == DType::i64)
      static_cast<int64_t*>(out.data_ptr())[i] = v;
    else
      static_cast<int32_t*>(out.data_ptr())[i] = static_cast<int32_t>(v);
  }
  return out;
}

// ================================================================================================

FusedMapping get_fused_mapping(const Tensor& topk_idx, int num_experts, int alignment) {
  const std::vector<int64_t> id = ids(topk_idx);
  const int64_t t_count = topk_idx.size(0), k = topk_idx.size(1);
  FusedMapping m;
  m.expert_start = Tensor::empty({num_experts}, DType::i32);
  m.expert_end = Tensor::empty({num_experts}, DType::i32);
  m.num_tokens_per_expert = Tensor::empty({num_experts}, DType::i32);
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(num_experts));
  for (size_t i = 0; i < id.size(); ++i)
    if (id[i] >= 0) members[id[i]].push_back(static_cast<int64_t>(i));
  int64_t total = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int64_t rows =
        (static_cast<int64_t>(members[e].size()) + alignment - 1) / alignment * alignment;
    m.expert_start.at<int32_t>({e}) = static_cast<int32_t>(total);
    m.num_tokens_per_expert.at<int32_t>({e}) = static_cast<int32_t>(rows);
    total += rows;
    m.expert_end.at<int32_t>({e}) = static_cast<int32_t>(total);
    m.num_tokens_per_expert_list.push_back(static_cast<int>(rows));
  }
  m.pos_to_expert = Tensor::empty({total}, DType::i32);
  m.pos_to_token = Tensor::empty({total}, DType::i32);
  m.pos_to_token_topk = Tensor::empty({total}, DType::i32);
  m.token_topk_to_pos = Tensor::empty({t_count, k}, DType::i32);
  for (int64_t p = 0; p < total; ++p) {
    m.pos_to_expert.at<int32_t>({p}) = -1;
    m.pos_to_token.at<int32_t>({p}) = -1;
    m.pos_to_token_topk.at<int32_t>({p}) = -1;
  }
  for (int64_t i = 0; i < t_count * k; ++i)
    static_cast<int32_t*>(m.token_topk_to_pos.data_ptr())[i] = -1;
  for (int e = 0; e < num_experts; ++e)
    for (size_t j = 0; j < members[e].size(); ++j) {
      const int64_t p = m.expert_start.at<int32_t>({e}) + static_cast<int64_t>(j);
      const int64_t i = members[e][j];
      m.pos_to_expert.at<int32_t>({p}) = e;
      m.pos_to_token.at<int32_t>({p}) = static_cast<int32_t>(i / k);
      m.pos_to_token_topk.at<int32_t>({p}) = static_cast<int32_t>(i);
      static_cast<int32_t*>(m.token_topk_to_pos.data_ptr())[i] = static_cast<int32_t>(p);
    }
  return m;
}

Tensor expand_to_fused(const Tensor& x, const Tensor& token_topk_to_pos,
                       const Tensor& pos_to_expert) {
  const int64_t rows = pos_to_expert.size(0), hidden = x.size(1), k = token_topk_to_pos.size(1);
  Tensor out = Tensor::zeros({rows, hidden}, x.dtype());
  const size_t row_bytes = static_cast<size_t>(hidden) * x.element_size();
  for (int64_t t = 0; t < x.size(0); ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = token_topk_to_pos.at<int32_t>({t, j});
      if (p >= 0)
        std::memcpy(static_cast<char*>(out.data_ptr()) + p * row_bytes, &x.at<uint8_t>({t, 0}),
                    row_bytes);
    }
  return out;
}

Tensor reduce_fused(const Tensor& x, const std::optional<Tensor>& topk_weights,
                    const Tensor& token_topk_to_pos, const std::optional<Tensor>& x_sf,
                    std::optional<float> sf) {
  const int64_t hidden = x.size(1), t_count = token_topk_to_pos.size(0),
                k = token_topk_to_pos.size(1);
  const std::vector<double> v = values(x);
  std::vector<double> out(static_cast<size_t>(t_count * hidden), 0.0);
  for (int64_t t = 0; t < t_count; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = token_topk_to_pos.at<int32_t>({t, j});
      if (p < 0) continue;
      double s = topk_weights ? topk_weights->at<float>({t, j}) : 1.0;
      if (x_sf) s *= x_sf->at<float>({p});
      for (int64_t c = 0; c < hidden; ++c) out[t * hidden + c] += v[p * hidden + c] * s;
    }
  if (sf)
    for (double& o : out) o *= *sf;
  return f64_tensor({t_count, hidden}, out);
}

// ================================================================================================

QuantTensor per_token_cast(const Tensor& x, std::string_view fmt, int num_per_channels,
                           bool round_sf) {
  return cast_blocks(x, fmt, 1, num_per_channels, round_sf);
}

QuantTensor per_block_cast(const Tensor& x, std::string_view fmt, BlockSize block_size,
                           bool round_sf) {
  return cast_blocks(x, fmt, block_size.first, block_size.second, round_sf);
}

QuantTensor per_channel_cast(const Tensor& x, std::string_view fmt, int num_per_tokens,
                             bool round_sf) {
  return cast_blocks(x, fmt, num_per_tokens, 1, round_sf);
}

Tensor unpack_scales(const Tensor& sf, int64_t rows, int64_t blocks) {
  Tensor out = Tensor::empty({rows, blocks}, DType::f32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      if (sf.dtype() == DType::f32) {
        out.at<float>({r, b}) = sf.at<float>({r, b});
      } else {
        const int32_t word = sf.at<int32_t>({r, b / 4});
        const auto byte = static_cast<uint8_t>(static_cast<uint32_t>(word) >> (8 * (b % 4)));
        out.at<float>({r, b}) = numeric::ue8m0_to_f32(ue8m0{byte});
      }
    }
  return out;
}

Tensor cast_back(const QuantTensor& x, BlockSize block_size) {
  const bool fp4 = x.data.dtype() == DType::fp4x2;
  const int64_t rows = x.data.size(0), cols = x.data.size(1) * (fp4 ? 2 : 1);
  const int64_t bm = block_size.first, bk = block_size.second;
  const Tensor sf = unpack_scales(x.sf, (rows + bm - 1) / bm, (cols + bk - 1) / bk);
  const std::vector<double> v = values(x.data);
  Tensor out = Tensor::empty({rows, cols}, DType::f32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out.at<float>({r, c}) = static_cast<float>(v[r * cols + c]) * sf.at<float>({r / bm, c / bk});
  return out;
}

Tensor swiglu_forward(const Tensor& x, const std::optional<Tensor>& pos_to_expert,
                      std::optional<float> swiglu_clamp_value,
                      const std::optional<Tensor>& pos_to_token_topk,
                      const std::optional<Tensor>& topk_weights) {
  const int64_t rows = x.size(0), hidden = x.size(1) / 2;
  const std::vector<double> v = values(x);
  const std::vector<double> w = topk_weights ? values(*topk_weights) : std::vector<double>{};
  std::vector<double> out(static_cast<size_t>(rows * hidden), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (pos_to_expert && pos_to_expert->at<int32_t>({r}) < 0) continue;
    if (pos_to_token_topk && pos_to_token_topk->at<int32_t>({r}) < 0) continue;
    const double weight = topk_weights ? w[pos_to_token_topk->at<int32_t>({r})] : 1.0;
    for (int64_t c = 0; c < hidden; ++c) {
      double g = v[r * 2 * hidden + c], u = v[r * 2 * hidden + hidden + c];
      if (swiglu_clamp_value) {
        const double lim = *swiglu_clamp_value;
        g = std::min(g, lim);
        u = std::clamp(u, -lim, lim);
      }
      out[r * hidden + c] = g / (1.0 + std::exp(-g)) * u * weight;
    }
  }
  return f64_tensor({rows, hidden}, out);
}

// ================================================================================================

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  const std::vector<double> v = values(x), w = values(weight);
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < hidden; ++c) ss += v[r * hidden + c] * v[r * hidden + c];
    const double rstd = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t c = 0; c < hidden; ++c) out[r * hidden + c] = v[r * hidden + c] * rstd * w[c];
  }
  return f64_tensor(x.sizes(), out);
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                  double eps) {
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  const std::vector<double> v = values(x), w = values(weight);
  const std::vector<double> b = bias ? values(*bias) : std::vector<double>(hidden, 0.0);
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = v.data() + r * hidden;
    const double mean = std::accumulate(row, row + hidden, 0.0) / hidden;
    double var = 0.0;
    for (int64_t c = 0; c < hidden; ++c) var += (row[c] - mean) * (row[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / hidden + eps);
    for (int64_t c = 0; c < hidden; ++c) out[r * hidden + c] = (row[c] - mean) * rstd * w[c] + b[c];
  }
  return f64_tensor(x.sizes(), out);
}

std::vector<double> rope_frequencies(const dsk::tk::RopeConfig& config) {
  const int dim = config.rot_dim;
  std::vector<double> freqs;
  for (int i = 0; i < dim; i += 2)
    freqs.push_back(1.0 / std::pow(config.rope_theta, double(i) / dim));
  if (config.max_seq_len <= config.original_seq_len) return freqs;
  const auto correction = [&](double rotations) {
    return dim * std::log(config.original_seq_len / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(config.rope_theta));
  };
  const double low = std::max(std::floor(correction(config.beta_fast)), 0.0);
  const double high = std::min(std::ceil(correction(config.beta_slow)), dim - 1.0);
  for (size_t i = 0; i < freqs.size(); ++i) {
    const double ramp =
        std::clamp((static_cast<double>(i) - low) / (high == low ? 0.001 : high - low), 0.0, 1.0);
    const double smooth = 1.0 - ramp;
    freqs[i] = freqs[i] / config.rope_factor * (1.0 - smooth) + freqs[i] * smooth;
  }
  return freqs;
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos_sin_cache,
                    const std::optional<Tensor>& positions, bool interleaved, bool conjugate,
                    int64_t seqlen_offset) {
  const int64_t rot_dim = x.size(-1);
  const int64_t seqlen = x.size(x.dim() - 3);
  const int64_t heads = x.size(-2);
  const int64_t tokens = x.numel() / (heads * rot_dim);
  std::vector<double> v = values(x);
  const std::vector<int64_t> pos = positions ? ids(*positions) : std::vector<int64_t>{};
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = (positions ? pos[t] : t % seqlen) + seqlen_offset;
    const float* cache_row = &cos_sin_cache.at<float>({p, 0});
    for (int64_t h = 0; h < heads; ++h)
      rotate_pairs(v.data() + (t * heads + h) * rot_dim, cache_row, rot_dim, interleaved,
                   conjugate);
  }
  return f64_tensor(x.sizes(), v);
}

Tensor hadamard_transform(const Tensor& x, double scale) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const std::vector<double> v = values(x);
  std::vector<double> out(v.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j)
        sum += (std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0) * v[r * n + j];
      out[r * n + i] = scale * sum;
    }
  return f64_tensor(x.sizes(), out);
}

}  // namespace dsk::ref::tk
