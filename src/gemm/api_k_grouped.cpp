// K-grouped GEMM (weight gradients): D[g] = C[g] + A_gᵀ·B_g, where A [ΣK, M] and B [ΣK, N] hold
// the groups' K rows one after another (MN-major) and each group has its own K. Empty groups are
// allowed and leave D[g] = C[g].
#include <span>

#include <fmt/format.h>

#include <dsk/core/check.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm {
namespace {

// Where group g lives along ΣK: logical rows [start, start + k) of A and B, and its scale rows
// [sf_row, sf_row + ceil(k / gran_k)).
struct KGroup {
  int64_t start = 0, k = 0, sf_row = 0;
};

// Resolves grouped_layout (the K of each group, or with use_psum_layout each group's end, the
// group starting at align(previous end, alignment)) and checks ks_cpu against it.
std::vector<KGroup> plan_k_groups(const char* fn, const Tensor& layout,
                                  const std::optional<std::vector<int>>& ks_cpu,
                                  bool use_psum_layout, int64_t sum_k, int gran_k,
                                  int64_t alignment) {
  const int32_t* values = layout.data<int32_t>();
  const auto groups = layout.numel();
  const bool has_ks = ks_cpu.has_value() && !ks_cpu->empty();
  if (has_ks)
    DSK_CHECK_ARG(static_cast<int64_t>(ks_cpu->size()) == groups, fn, "ks_cpu",
                  fmt::format("{} entries (one per group)", groups), ks_cpu->size());
  std::vector<KGroup> plan(static_cast<size_t>(groups));
  int64_t cursor = 0, sf_rows = 0;
  for (int64_t g = 0; g < groups; ++g) {
    KGroup& group = plan[static_cast<size_t>(g)];
    const int64_t v = values[g];
    if (use_psum_layout) {
      group.start = api::align(cursor, alignment);
      const bool ok = v <= sum_k && (v >= group.start || v == cursor);
      DSK_CHECK_ARG(ok, fn, "grouped_layout",
                    fmt::format("psum group ends: group g ends at or after align(end[g-1], {}) "
                                "(or repeats end[g-1] when empty), and at most at ΣK = {}",
                                alignment, sum_k),
                    fmt::format("end {} for group {} after end {}", v, g, cursor));
      group.k = v >= group.start ? v - group.start : 0;
      cursor = v;
    } else {
      DSK_CHECK_ARG(
          v >= 0 && v % alignment == 0, fn, "grouped_layout",
          fmt::format("K of each group >= 0 and a multiple of the mk alignment ({})", alignment),
          fmt::format("{} for group {}", v, g));
      group.start = cursor;
      group.k = v;
      cursor += v;
    }
    const int64_t padded_k = api::align(group.k, alignment);
    if (has_ks) {
      const int64_t given = (*ks_cpu)[static_cast<size_t>(g)];
      DSK_CHECK_ARG(given == padded_k, fn, "ks_cpu",
                    fmt::format("{} for group {} (its K from grouped_layout, aligned to {})",
                                padded_k, g, alignment),
                    given);
    }
    group.sf_row = sf_rows;
    sf_rows += api::ceil_div(padded_k, gran_k);
  }
  if (!use_psum_layout)
    DSK_CHECK_ARG(cursor == sum_k, fn, "grouped_layout",
                  fmt::format("group sizes summing to ΣK = {} (the rows of a.data)", sum_k),
                  cursor);
  return plan;
}

// Scale rows [g.sf_row, + ceil(g.k / gran_k)) of a k-grouped sf [rows, mn] (any strides),
// transposed into the canonical [mn, ceil(g.k / gran_k)].
api::CanonicalScales group_scales(const Tensor& sf, const KGroup& g, int64_t mn, int gran_k) {
  api::CanonicalScales out;
  const int64_t blocks = api::ceil_div(g.k, gran_k);
  out.storage.resize(static_cast<size_t>(mn * blocks));
  const auto* base = static_cast<const float*>(sf.data_ptr());
  for (int64_t r = 0; r < mn; ++r)
    for (int64_t b = 0; b < blocks; ++b)
      out.storage[r * blocks + b] = base[(g.sf_row + b) * sf.stride(0) + r * sf.stride(1)];
  out.view = {out.storage.data(), blocks, 1, gran_k, false};
  out.view.power_of_two = api::all_powers_of_two(out.storage.data(), mn, blocks, blocks);
  return out;
}

// Group g of an MN-major [ΣK, mn] operand as the engine's [mn, k] view.
engine::Operand group_operand(const Tensor& x, const KGroup& g, const api::CanonicalScales& sf) {
  engine::Operand o;
  const int64_t mn = x.size(1);
  o.data = static_cast<const uint8_t*>(x.data_ptr()) + g.start * mn;  // e4m3: one byte each
  o.dtype = DType::e4m3;
  o.rows = mn;
  o.k = g.k;
  o.stride_r = 1;
  o.stride_k = mn;
  o.sf = sf.view;
  return o;
}

}  // namespace

void k_grouped_fp8_gemm_tn_contiguous(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                                      const std::optional<std::vector<int>>& ks_cpu,
                                      const Tensor& grouped_layout, const std::optional<Tensor>& c,
                                      Recipe recipe, std::string_view compiled_dims,
                                      bool use_psum_layout) {
  constexpr const char* fn = "k_grouped_fp8_gemm_tn_contiguous";
  api::check_compiled_dims(fn, compiled_dims);
  const auto [gran_m, gran_n, gran_k] = recipe;
  DSK_CHECK_ARG(gran_m == 1 && gran_n == 1 && (gran_k == 32 || gran_k == 128), fn, "recipe",
                "(1, 1, gran_k) with gran_k 32 or 128",
                fmt::format("({}, {}, {})", gran_m, gran_n, gran_k));
  check::dtype(fn, "d", d, DType::f32);
  check::dim(fn, "d", d, 3);
  check::contiguous(fn, "d", d);
  const int64_t groups = d.size(0), m = d.size(1), n = d.size(2);
  for (const auto& [x, arg, mn] : {std::tuple{a.data, "a.data", m}, {b.data, "b.data", n}}) {
    check::dtype(fn, arg, x, DType::e4m3);
    check::dim(fn, arg, x, 2);
    check::contiguous(fn, arg, x);
    DSK_CHECK_ARG(x.size(1) == mn, fn, arg,
                  fmt::format("[ΣK, {}] (MN-major, matching d [G, M, N])", mn), x.describe());
  }
  const int64_t sum_k = a.data.size(0);
  DSK_CHECK_ARG(b.data.size(0) == sum_k, fn, "b.data",
                fmt::format("ΣK = {} rows (those of a.data)", sum_k), b.data.size(0));
  DSK_CHECK_ARG(c.has_value(), fn, "c", "a tensor: C is required (D[g] = C[g] + A_gᵀ·B_g)", "none");
  check::contiguous(fn, "c", *c);
  check::dtype(fn, "grouped_layout", grouped_layout, DType::i32);
  check::dim(fn, "grouped_layout", grouped_layout, 1);
  check::contiguous(fn, "grouped_layout", grouped_layout);
  check::size(fn, "grouped_layout", grouped_layout, 0, groups);

  const int64_t alignment = get_mk_alignment_for_contiguous_layout();
  const std::vector<KGroup> plan =
      plan_k_groups(fn, grouped_layout, ks_cpu, use_psum_layout, sum_k, gran_k, alignment);
  const int64_t sf_rows =
      groups == 0
          ? 0
          : plan.back().sf_row + api::ceil_div(api::align(plan.back().k, alignment), gran_k);
  for (const auto& [sf, arg, mn] : {std::tuple{a.sf, "a.sf", m}, {b.sf, "b.sf", n}}) {
    check::dtype(fn, arg, sf, DType::f32);
    check::shape(fn, arg, sf, {sf_rows, mn});
  }
  int64_t total_k = 0;
  for (const KGroup& g : plan) total_k += g.k;
  if (api::early_return(fn, m, n, total_k, d, c)) return;

  std::vector<api::CanonicalScales> scales;
  scales.reserve(2 * plan.size());  // the segments point into these
  std::vector<std::shared_ptr<const engine::PackedB>> weights;
  std::vector<engine::Segment> segments;
  for (int64_t g = 0; g < groups; ++g) {
    const KGroup& group = plan[static_cast<size_t>(g)];
    if (group.k == 0) continue;
    scales.push_back(group_scales(a.sf, group, m, gran_k));
    const engine::Operand op_a = group_operand(a.data, group, scales.back());
    scales.push_back(group_scales(b.sf, group, n, gran_k));
    weights.push_back(engine::pack_b(group_operand(b.data, group, scales.back())));
    engine::Segment s;
    s.a = op_a;
    s.b = weights.back().get();
    s.d = api::engine_output(d, g, 0, m);
    segments.push_back(s);
  }
  engine::run(segments, true);
}

}  // namespace dsk::gemm
