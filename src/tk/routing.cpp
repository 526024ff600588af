// MoE routing entry points: argument checks, then the routing kernels over token ranges, then the
// per-slot post-processing of top2_sum_gate (shared experts, physical replicas, EP/TP masking).
#include <cstring>

#include <dsk/tk.hpp>

#include "common.hpp"

namespace dsk::tk {
namespace {

using detail::kernel_table;
using detail::parallel_rows;

kernels::Scoring parse_scoring(const char* fn, std::string_view name) {
  if (name == "sigmoid") return kernels::Scoring::sigmoid;
  if (name == "sqrtsoftplus") return kernels::Scoring::sqrtsoftplus;
  if (name == "softmax") return kernels::Scoring::softmax;
  DSK_CHECK_ARG(false, fn, "scoring_func", "\"sigmoid\", \"sqrtsoftplus\" or \"softmax\"", name);
  return kernels::Scoring::sigmoid;
}

void check_logits(const char* fn, const char* arg, const Tensor& logits) {
  detail::check_rows(fn, arg, logits, {DType::f32});
  DSK_CHECK_ARG(logits.size(1) >= 1 && logits.size(1) <= kernels::kMaxExperts, fn, arg,
                "1 to " + std::to_string(kernels::kMaxExperts) + " experts (columns)",
                logits.size(1));
}

// A bool [num_tokens] tensor (contiguous).
void check_row_flags(const char* fn, const char* arg, const Tensor& t, int64_t num_tokens) {
  check::defined(fn, arg, t);
  check::dtype(fn, arg, t, DType::boolean);
  check::shape(fn, arg, t, {num_tokens});
  check::contiguous(fn, arg, t);
}

const uint8_t* flags_of(const std::optional<Tensor>& t) {
  return t ? static_cast<const uint8_t*>(t->data_ptr()) : nullptr;
}

// Runs the gate kernel; raises when a routed row has non-finite logits.
void run_gate(const char* fn, kernels::GateArgs args, int64_t num_tokens) {
  std::vector<uint8_t> non_finite(static_cast<size_t>(num_tokens), 0);
  args.non_finite = non_finite.data();
  const auto& table = kernel_table();
  const auto gate = args.num_experts == 256 && args.num_groups == 8 ? table.gate_256_8 : table.gate;
  parallel_rows(num_tokens, 16 * args.num_experts,
                [&](int64_t t0, int64_t t1) { gate(args, t0, t1); });
  for (int64_t t = 0; t < num_tokens; ++t)
    DSK_CHECK_ARG(non_finite[static_cast<size_t>(t)] == 0, fn, "logits", "finite values",
                  "NaN or inf in row " + std::to_string(t));
}

// What top2_sum_gate does after selecting: shared-expert slots, replicas, EP/TP masking.
struct PostProcess {
  int num_topk = 0;
  int num_physical_topk = 0;
  int num_routed_experts = 0;
  int num_extra_experts = 0;
  int ep_rank = 0, num_ep_ranks = 1, tp_rank = 0, num_tp_ranks = 1;
  const uint8_t* mask = nullptr;
  const int32_t* to_physical_map = nullptr;
  int64_t map_stride = 0;
  const int32_t* logical_count = nullptr;
  int64_t* unmapped = nullptr;
  int64_t unmapped_stride = 0;
};

// The upstream replica choice: spread tokens over replicas with a large prime.
constexpr int64_t kReplicaPrime = 23333;

int64_t mask_by_tp(int64_t idx, int64_t per_rank, int64_t num_tp_ranks, int64_t tp_rank) {
  if (idx < 0 || (idx / per_rank) % num_tp_ranks != tp_rank) return -1;
  idx -= tp_rank * per_rank;
  const int64_t per_dp = per_rank * num_tp_ranks;
  const int64_t dp = idx / per_dp;
  idx = idx - dp * per_dp + dp * per_rank;
  return idx < 0 ? -1 : idx;
}

void post_process(const PostProcess& p, int64_t* idx, float* w, int64_t t) {
  if (p.mask != nullptr && p.mask[t] == 0) {
    for (int j = p.num_topk; j < p.num_physical_topk; ++j) idx[j] = -1, w[j] = 0.0f;
    if (p.unmapped)
      for (int j = 0; j < p.num_topk; ++j) p.unmapped[t * p.unmapped_stride + j] = -1;
    return;
  }
  if (p.unmapped)
    for (int j = 0; j < p.num_topk; ++j) p.unmapped[t * p.unmapped_stride + j] = idx[j];
  for (int j = p.num_topk; j < p.num_physical_topk; ++j) {
    idx[j] = p.num_routed_experts + (j - p.num_topk);
    w[j] = 1.0f;
  }
  const int64_t per_rank = (p.num_routed_experts + p.num_extra_experts) / p.num_ep_ranks;
  for (int j = 0; j < p.num_physical_topk; ++j) {
    int64_t e = idx[j];
    if (p.to_physical_map != nullptr) {
      const int64_t count = p.logical_count[e];
      const int64_t replica = (p.ep_rank + t * kReplicaPrime) % count;
      e = p.to_physical_map[e * p.map_stride + replica];
    }
    idx[j] = mask_by_tp(e, per_rank, p.num_tp_ranks, p.tp_rank);
  }
}

}  // namespace

Tensor topk_gate(const Tensor& scores, int num_topk) {
  constexpr const char* fn = "tk::topk_gate";
  check_logits(fn, "scores", scores);
  const int64_t num_tokens = scores.size(0);
  const int num_experts = static_cast<int>(scores.size(1));
  check::in_range(fn, "num_topk", num_topk, 1, std::min(num_experts, kernels::kMaxTopk));
  Tensor idx = Tensor::empty({num_tokens, num_topk}, DType::i64);
  kernels::TopkArgs a;
  a.scores = static_cast<const float*>(scores.data_ptr());
  a.scores_stride = scores.stride(0);
  a.num_experts = num_experts;
  a.num_topk = num_topk;
  a.idx = static_cast<int64_t*>(idx.data_ptr());
  const auto kernel = kernel_table().topk;
  parallel_rows(num_tokens, 4 * num_experts, [&](int64_t t0, int64_t t1) { kernel(a, t0, t1); });
  return idx;
}

Tensor topk_sum_and_topk_group_idx(const Tensor& scores, int num_topk_sum, int num_topk_groups) {
  constexpr const char* fn = "tk::topk_sum_and_topk_group_idx";
  check::defined(fn, "scores", scores);
  check::dtype(fn, "scores", scores, DType::f32);
  check::dim(fn, "scores", scores, 3);
  check::contiguous(fn, "scores", scores);
  const int64_t num_tokens = scores.size(0);
  const int64_t num_groups = scores.size(1);
  const int64_t per_group = scores.size(2);
  check::in_range(fn, "scores.size(1)", num_groups, 1, kernels::kMaxGroups);
  check::in_range(fn, "scores.size(2)", per_group, 1, kernels::kMaxExperts);
  check::in_range(fn, "num_topk_sum", num_topk_sum, 1, std::min<int64_t>(2, per_group));
  check::in_range(fn, "num_topk_groups", num_topk_groups, 1, num_groups);
  detail::check_finite(fn, "scores", scores);
  Tensor idx = Tensor::empty({num_tokens, num_topk_groups}, DType::i64);
  kernels::GroupArgs a;
  a.scores = static_cast<const float*>(scores.data_ptr());
  a.scores_stride = num_groups * per_group;
  a.num_groups = static_cast<int>(num_groups);
  a.experts_per_group = static_cast<int>(per_group);
  a.topk_sum = num_topk_sum;
  a.num_topk_groups = num_topk_groups;
  a.idx = static_cast<int64_t*>(idx.data_ptr());
  const auto kernel = kernel_table().group;
  parallel_rows(num_tokens, 2 * num_groups * per_group,
                [&](int64_t t0, int64_t t1) { kernel(a, t0, t1); });
  return idx;
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
  constexpr const char* fn = "tk::top2_sum_gate";
  const kernels::Scoring scoring = parse_scoring(fn, scoring_func);
  check_logits(fn, "logits", logits);
  const int64_t num_tokens = logits.size(0);
  const int num_routed = static_cast<int>(logits.size(1));
  check::defined(fn, "bias", bias);
  check::dtype(fn, "bias", bias, DType::f32);
  check::shape(fn, "bias", bias, {num_routed});
  check::contiguous(fn, "bias", bias);
  detail::check_finite(fn, "bias", bias);
  check::in_range(fn, "num_topk", num_topk, 1, std::min(num_routed, kernels::kMaxTopk));
  DSK_CHECK_ARG((num_groups == 0) == (num_topk_groups == 0), fn, "num_topk_groups",
                "0 exactly when num_groups is 0", num_topk_groups);
  check::in_range(fn, "num_groups", num_groups, 0, kernels::kMaxGroups);
  check::in_range(fn, "num_topk_groups", num_topk_groups, 0, num_groups);
  if (num_groups > 0) {
    DSK_CHECK_ARG(num_routed % num_groups == 0, fn, "num_groups",
                  "a divisor of num_routed_experts (" + std::to_string(num_routed) + ")",
                  num_groups);
    DSK_CHECK_ARG(num_topk <= num_topk_groups * (num_routed / num_groups), fn, "num_topk",
                  "at most the experts of the kept groups (" +
                      std::to_string(num_topk_groups * (num_routed / num_groups)) + ")",
                  num_topk);
  }
  const int num_shared = use_shared_as_routed ? num_shared_experts : 0;
  if (use_shared_as_routed) {
    check::in_range(fn, "num_shared_experts", num_shared_experts, 1, 2);
    DSK_CHECK_ARG(
        num_topk % num_shared_experts == 0 && num_routed % (num_topk / num_shared_experts) == 0, fn,
        "num_shared_experts", "a divisor of num_topk whose quotient divides num_routed_experts",
        num_shared_experts);
  }
  check::in_range(fn, "num_ep_ranks", num_ep_ranks, 1, 1 << 20);
  check::in_range(fn, "ep_rank", ep_rank, 0, num_ep_ranks - 1);
  check::in_range(fn, "num_tp_ranks", num_tp_ranks, 1, 1 << 20);
  check::in_range(fn, "tp_rank", tp_rank, 0, num_tp_ranks - 1);
  if (mask) check_row_flags(fn, "mask", *mask, num_tokens);
  DSK_CHECK_ARG(to_physical_map.has_value() == logical_count.has_value(), fn, "logical_count",
                "given exactly when to_physical_map is", logical_count ? "given" : "absent");
  const int num_logical = num_routed + num_shared;
  int num_extra = 0;
  if (to_physical_map) {
    check::defined(fn, "to_physical_map", *to_physical_map);
    check::dtype(fn, "to_physical_map", *to_physical_map, DType::i32);
    check::dim(fn, "to_physical_map", *to_physical_map, 2);
    check::size(fn, "to_physical_map", *to_physical_map, 0, num_logical);
    check::contiguous(fn, "to_physical_map", *to_physical_map);
    check::defined(fn, "logical_count", *logical_count);
    check::dtype(fn, "logical_count", *logical_count, DType::i32);
    check::shape(fn, "logical_count", *logical_count, {num_logical});
    check::contiguous(fn, "logical_count", *logical_count);
    num_extra = static_cast<int>(to_physical_map->size(1)) - 1;
  }
  DSK_CHECK_ARG(num_shared <= num_extra, fn, "to_physical_map",
                "at least num_shared_experts extra replica columns", num_extra);
  DSK_CHECK_ARG((num_routed + num_extra) % num_ep_ranks == 0, fn, "num_ep_ranks",
                "a divisor of num_routed_experts + num_extra_experts (" +
                    std::to_string(num_routed + num_extra) + ")",
                num_ep_ranks);
  if (to_physical_map) {
    const int64_t cols = to_physical_map->size(1);
    const auto* map = static_cast<const int32_t*>(to_physical_map->data_ptr());
    const auto* count = static_cast<const int32_t*>(logical_count->data_ptr());
    for (int e = 0; e < num_logical; ++e) {
      DSK_CHECK_ARG(count[e] >= 1 && count[e] <= cols, fn, "logical_count",
                    "replica counts in [1, " + std::to_string(cols) + "]",
                    std::to_string(count[e]) + " for expert " + std::to_string(e));
      for (int r = 0; r < count[e]; ++r)
        DSK_CHECK_ARG(map[e * cols + r] >= 0 && map[e * cols + r] < num_routed + num_extra, fn,
                      "to_physical_map",
                      "physical ids in [0, " + std::to_string(num_routed + num_extra) + ")",
                      map[e * cols + r]);
    }
  }
  if (unmapped_topk_idx) {
    check::defined(fn, "unmapped_topk_idx", *unmapped_topk_idx);
    check::dtype(fn, "unmapped_topk_idx", *unmapped_topk_idx, DType::i64);
    check::shape(fn, "unmapped_topk_idx", *unmapped_topk_idx, {num_tokens, num_topk});
    check::last_dim_contiguous(fn, "unmapped_topk_idx", *unmapped_topk_idx);
  }
  if (fix_routing_mask) {
    DSK_CHECK_ARG(unmapped_topk_idx.has_value(), fn, "fix_routing_mask",
                  "given only with unmapped_topk_idx", "no unmapped_topk_idx");
    check_row_flags(fn, "fix_routing_mask", *fix_routing_mask, num_tokens);
    const auto* fix = flags_of(fix_routing_mask);
    const auto* fixed = static_cast<const int64_t*>(unmapped_topk_idx->data_ptr());
    const int64_t stride = unmapped_topk_idx->stride(0);
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (fix[t] == 0 || (mask && flags_of(mask)[t] == 0)) continue;
      for (int j = 0; j < num_topk; ++j)
        DSK_CHECK_ARG(fixed[t * stride + j] >= 0 && fixed[t * stride + j] < num_routed, fn,
                      "unmapped_topk_idx", "expert ids in [0, num_routed_experts) on fixed rows",
                      fixed[t * stride + j]);
    }
  }

  const int num_physical = num_topk + num_shared;
  GateResult r{Tensor::empty({num_tokens, num_physical}, DType::i64),
               Tensor::empty({num_tokens, num_physical}, DType::f32)};
  if (num_tokens == 0) return r;
  kernels::GateArgs a;
  a.logits = static_cast<const float*>(logits.data_ptr());
  a.logits_stride = logits.stride(0);
  a.bias = static_cast<const float*>(bias.data_ptr());
  a.num_experts = num_routed;
  a.num_topk = num_topk;
  a.num_groups = num_groups == 0 ? 1 : num_groups;
  a.num_topk_groups = num_groups == 0 ? 1 : num_topk_groups;
  a.topk_sum = 2;
  a.scoring = scoring;
  a.normalize = true;
  a.scale = routed_scaling_factor;
  a.mask = flags_of(mask);
  if (fix_routing_mask) {
    a.fix_mask = flags_of(fix_routing_mask);
    a.fixed_idx = static_cast<const int64_t*>(unmapped_topk_idx->data_ptr());
    a.fixed_stride = unmapped_topk_idx->stride(0);
  }
  a.idx = static_cast<int64_t*>(r.topk_idx.data_ptr());
  a.weights = static_cast<float*>(r.topk_weights.data_ptr());
  a.out_stride = num_physical;
  run_gate(fn, a, num_tokens);

  PostProcess p;
  p.num_topk = num_topk;
  p.num_physical_topk = num_physical;
  p.num_routed_experts = num_routed;
  p.num_extra_experts = num_extra;
  p.ep_rank = ep_rank;
  p.num_ep_ranks = num_ep_ranks;
  p.tp_rank = tp_rank;
  p.num_tp_ranks = num_tp_ranks;
  p.mask = a.mask;
  if (to_physical_map) {
    p.to_physical_map = static_cast<const int32_t*>(to_physical_map->data_ptr());
    p.map_stride = to_physical_map->size(1);
    p.logical_count = static_cast<const int32_t*>(logical_count->data_ptr());
  }
  if (unmapped_topk_idx) {
    p.unmapped = static_cast<int64_t*>(unmapped_topk_idx->data_ptr());
    p.unmapped_stride = unmapped_topk_idx->stride(0);
  }
  auto* idx = static_cast<int64_t*>(r.topk_idx.data_ptr());
  auto* w = static_cast<float*>(r.topk_weights.data_ptr());
  for (int64_t t = 0; t < num_tokens; ++t)
    post_process(p, idx + t * num_physical, w + t * num_physical, t);
  return r;
}

GateResult noaux_tc_gate(const Tensor& logits, const std::optional<Tensor>& e_score_correction_bias,
                         int num_topk, int n_group, int topk_group, float routed_scaling_factor,
                         std::string_view scoring_func, bool norm_topk_prob) {
  constexpr const char* fn = "tk::noaux_tc_gate";
  const kernels::Scoring scoring = parse_scoring(fn, scoring_func);
  check_logits(fn, "logits", logits);
  const int64_t num_tokens = logits.size(0);
  const int num_experts = static_cast<int>(logits.size(1));
  if (e_score_correction_bias) {
    const Tensor& b = *e_score_correction_bias;
    check::defined(fn, "e_score_correction_bias", b);
    check::dtype(fn, "e_score_correction_bias", b, DType::f32);
    check::shape(fn, "e_score_correction_bias", b, {num_experts});
    check::contiguous(fn, "e_score_correction_bias", b);
    detail::check_finite(fn, "e_score_correction_bias", b);
  }
  check::in_range(fn, "n_group", n_group, 1, kernels::kMaxGroups);
  DSK_CHECK_ARG(num_experts % n_group == 0, fn, "n_group",
                "a divisor of the number of experts (" + std::to_string(num_experts) + ")",
                n_group);
  check::in_range(fn, "topk_group", topk_group, 1, n_group);
  check::in_range(fn, "num_topk", num_topk, 1,
                  std::min(topk_group * (num_experts / n_group), kernels::kMaxTopk));
  GateResult r{Tensor::empty({num_tokens, num_topk}, DType::i64),
               Tensor::empty({num_tokens, num_topk}, DType::f32)};
  if (num_tokens == 0) return r;
  kernels::GateArgs a;
  a.logits = static_cast<const float*>(logits.data_ptr());
  a.logits_stride = logits.stride(0);
  a.bias = e_score_correction_bias ? static_cast<const float*>(e_score_correction_bias->data_ptr())
                                   : nullptr;
  a.num_experts = num_experts;
  a.num_topk = num_topk;
  a.num_groups = n_group;
  a.num_topk_groups = topk_group;
  a.topk_sum = e_score_correction_bias ? 2 : 1;
  a.scoring = scoring;
  a.normalize = norm_topk_prob;
  a.scale = routed_scaling_factor;
  a.idx = static_cast<int64_t*>(r.topk_idx.data_ptr());
  a.weights = static_cast<float*>(r.topk_weights.data_ptr());
  a.out_stride = num_topk;
  run_gate(fn, a, num_tokens);
  return r;
}

Tensor group_count(const Tensor& group_idx, int num_groups) {
  constexpr const char* fn = "tk::group_count";
  detail::check_ids_tensor(fn, "group_idx", group_idx);
  check::in_range(fn, "num_groups", num_groups, 1, 1 << 24);
  detail::check_id_range(fn, "group_idx", group_idx, -1, num_groups);
  Tensor out = Tensor::zeros({num_groups}, DType::i32);
  auto* counts = static_cast<int32_t*>(out.data_ptr());
  const int64_t n = group_idx.numel();
  detail::with_ids(group_idx, [&](const auto* ids) {
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] >= 0) ++counts[ids[i]];
  });
  return out;
}

NormalizedWeights normalize_weight(const Tensor& topk_weights) {
  constexpr const char* fn = "tk::normalize_weight";
  check::defined(fn, "topk_weights", topk_weights);
  check::dtype(fn, "topk_weights", topk_weights, DType::f32);
  check::dim(fn, "topk_weights", topk_weights, 2);
  check::contiguous(fn, "topk_weights", topk_weights);
  const int64_t num_tokens = topk_weights.size(0);
  const int64_t k = topk_weights.size(1);
  NormalizedWeights r{Tensor::empty({num_tokens}, DType::f32),
                      Tensor::empty({num_tokens, k}, DType::f32)};
  const auto* w = static_cast<const float*>(topk_weights.data_ptr());
  auto* den = static_cast<float*>(r.denominator.data_ptr());
  auto* out = static_cast<float*>(r.normalized_weights.data_ptr());
  for (int64_t t = 0; t < num_tokens; ++t) {
    float sum = 1e-20f;  // as top2_sum_gate: a row of zeros gives zeros, not NaN
    for (int64_t j = 0; j < k; ++j) sum += w[t * k + j];
    den[t] = sum;
    for (int64_t j = 0; j < k; ++j) out[t * k + j] = w[t * k + j] / sum;
  }
  return r;
}

Tensor mask_indices_by_tp(const Tensor& indices, int64_t n, int num_ep_ranks, int tp_rank,
                          int num_tp_ranks) {
  constexpr const char* fn = "tk::mask_indices_by_tp";
  detail::check_ids_tensor(fn, "indices", indices);
  check::in_range(fn, "num_ep_ranks", num_ep_ranks, 1, 1 << 20);
  check::in_range(fn, "num_tp_ranks", num_tp_ranks, 1, 1 << 20);
  check::in_range(fn, "tp_rank", tp_rank, 0, num_tp_ranks - 1);
  DSK_CHECK_ARG(n > 0 && n % num_ep_ranks == 0, fn, "n",
                "a positive multiple of num_ep_ranks (" + std::to_string(num_ep_ranks) + ")", n);
  detail::check_id_range(fn, "indices", indices, -1, n);
  Tensor out = Tensor::empty(indices.sizes(), indices.dtype());
  const int64_t per_gpu = n / num_ep_ranks;
  const int64_t count = indices.numel();
  detail::with_ids(indices, [&]<class Id>(const Id* ids) {
    auto* masked = static_cast<Id*>(out.data_ptr());  // out has the ids' type
    for (int64_t i = 0; i < count; ++i)
      masked[i] = static_cast<Id>(mask_by_tp(ids[i], per_gpu, num_tp_ranks, tp_rank));
  });
  return out;
}

}  // namespace dsk::tk
