// M-grouped GEMMs (MoE experts): the contiguous layout (per-row group ids with -1 padding rows, or
// the psum layout of group ends) and the masked layout, with raw or pre-packed B. Each group's
// rows become one engine segment; groups without rows are never packed nor run.
#include <functional>
#include <span>

#include <fmt/format.h>

#include <dsk/core/check.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm {
namespace {

using api::CanonicalScales;
using api::OperandInfo;
using api::ScaleInfo;

constexpr std::initializer_list<DType> kFp8Operand = {DType::e4m3, DType::fp4x2};
constexpr std::initializer_list<DType> kScaleDtypes = {DType::f32, DType::i32, DType::i16};

// Group g's packed weight, made on first use.
using WeightSource = std::function<std::shared_ptr<const engine::PackedB>(int64_t group)>;

// Rows [r0, r1) of A and D (of batch `batch` when they are 3-D) multiplied by weight `group`.
struct Piece {
  int64_t group = 0, batch = 0, r0 = 0, r1 = 0;
};

// A contiguous layout resolved into the rows each group owns and the padding rows between them.
struct RowPlan {
  std::vector<Piece> pieces;
  std::vector<std::pair<int64_t, int64_t>> padding;
};

void run_pieces(const OperandInfo& a, const std::optional<ScaleInfo>& sfa,
                const WeightSource& weights, int64_t num_groups, const Tensor& d,
                std::span<const Piece> pieces) {
  std::vector<std::shared_ptr<const engine::PackedB>> packed(static_cast<size_t>(num_groups));
  std::vector<CanonicalScales> scales;
  scales.reserve(pieces.size());  // segments point into these: no reallocation
  std::vector<engine::Segment> segments;
  for (const Piece& p : pieces) {
    auto& weight = packed[static_cast<size_t>(p.group)];
    if (!weight) weight = weights(p.group);
    engine::Segment s;
    s.a = api::engine_operand(a, p.batch, p.r0, p.r1);
    if (sfa.has_value()) {
      scales.push_back(api::canonical_scales(*sfa, p.batch, p.r0, p.r1));
      s.a.sf = scales.back().view;
    }
    s.b = weight.get();
    s.d = api::engine_output(d, p.batch, p.r0, p.r1);
    segments.push_back(s);
  }
  engine::run(segments, false);
}

// Non-psum layout: one group id per row, -1 for padding. A group's run of rows starts at a
// multiple of the mk alignment (upstream pads every segment to it).
RowPlan plan_from_group_ids(const char* fn, const Tensor& layout, int64_t m, int64_t groups,
                            int64_t alignment) {
  const int32_t* ids = layout.data<int32_t>();
  RowPlan plan;
  for (int64_t i = 0; i < m;) {
    const int32_t g = ids[i];
    DSK_CHECK_ARG(g >= -1 && g < groups, fn, "grouped_layout",
                  fmt::format("group ids in [-1, {}) (-1 marks a padding row)", groups),
                  fmt::format("{} at row {}", g, i));
    int64_t end = i + 1;
    while (end < m && ids[end] == g) ++end;
    if (g >= 0) {
      DSK_CHECK_ARG(i % alignment == 0, fn, "grouped_layout",
                    fmt::format("every group segment to start at a multiple of the mk alignment "
                                "({}; get_mk_alignment_for_contiguous_layout)",
                                alignment),
                    fmt::format("group {} starting at row {}", g, i));
      plan.pieces.push_back({g, 0, i, end});
    } else {
      plan.padding.emplace_back(i, end);
    }
    i = end;
  }
  return plan;
}

// Psum layout: group g's rows are [align(end[g-1], alignment), end[g]); an empty group may also
// repeat the previous end. Rows outside every group are padding.
RowPlan plan_from_psum(const char* fn, const Tensor& layout, int64_t m, int64_t groups,
                       int64_t alignment) {
  const int32_t* ends = layout.data<int32_t>();
  RowPlan plan;
  int64_t prev_end = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t start = api::align(prev_end, alignment);
    const int64_t end = ends[g];
    const bool ok = end <= m && (end >= start || end == prev_end);
    DSK_CHECK_ARG(ok, fn, "grouped_layout",
                  fmt::format("psum group ends: group g ends at or after align(end[g-1], {}) (or "
                              "repeats end[g-1] when empty), and at most at M = {}",
                              alignment, m),
                  fmt::format("end {} for group {} after end {}", end, g, prev_end));
    if (end >= start) {
      if (start > prev_end) plan.padding.emplace_back(prev_end, start);
      if (end > start) plan.pieces.push_back({g, 0, start, end});
    }
    prev_end = end;
  }
  if (prev_end < m) plan.padding.emplace_back(prev_end, m);
  return plan;
}

void check_layout_tensor(const char* fn, const char* arg, const Tensor& t, int64_t size) {
  check::dtype(fn, arg, t, DType::i32);
  check::dim(fn, arg, t, 1);
  check::contiguous(fn, arg, t);
  check::size(fn, arg, t, 0, size);
}

void m_grouped_contiguous_impl(const char* fn, const OperandInfo& a,
                               const std::optional<ScaleInfo>& sfa, const WeightSource& weights,
                               int64_t groups, int64_t n, const Tensor& d,
                               const Tensor& grouped_layout, bool use_psum_layout,
                               bool ensure_zero_padding, std::optional<int> expected_m) {
  api::check_output(fn, "d", d, 2, {DType::bf16});
  DSK_CHECK_ARG(d.size(0) == a.mn && d.size(1) == n, fn, "d",
                fmt::format("shape [{}, {}] ([m, n] of a and b)", a.mn, n), d.describe());
  DSK_CHECK_ARG(n > 0 && a.k > 0 && groups > 0, fn, "b", "a weight with N, K and G all > 0",
                fmt::format("N = {}, K = {}, G = {}", n, a.k, groups));
  check_layout_tensor(fn, "grouped_layout", grouped_layout, use_psum_layout ? groups : a.mn);
  if (expected_m.has_value()) {
    DSK_CHECK_ARG(use_psum_layout, fn, "expected_m_for_psum_layout",
                  "no value without use_psum_layout", *expected_m);
    DSK_CHECK_ARG(*expected_m > 0, fn, "expected_m_for_psum_layout", "a positive hint",
                  *expected_m);
  }
  if (a.mn == 0) return;
  const int64_t alignment = get_mk_alignment_for_contiguous_layout();
  const RowPlan plan = use_psum_layout
                           ? plan_from_psum(fn, grouped_layout, a.mn, groups, alignment)
                           : plan_from_group_ids(fn, grouped_layout, a.mn, groups, alignment);
  if (ensure_zero_padding)
    for (const auto& [begin, end] : plan.padding) d.slice(0, begin, end).fill_bytes_(0);
  run_pieces(a, sfa, weights, groups, d, plan.pieces);
}

void m_grouped_masked_impl(const char* fn, const OperandInfo& a,
                           const std::optional<ScaleInfo>& sfa, const WeightSource& weights,
                           int64_t groups, int64_t n, const Tensor& d, const Tensor& masked_m,
                           int expected_m) {
  api::check_output(fn, "d", d, 3, {DType::bf16});
  DSK_CHECK_ARG(d.sizes() == (Shape{groups, a.mn, n}), fn, "d",
                fmt::format("shape [{}, {}, {}] ([G, m, n] of a and b)", groups, a.mn, n),
                d.describe());
  DSK_CHECK_ARG(a.mn > 0 && n > 0 && a.k > 0 && groups > 0, fn, "a.data", "M, N, K and G all > 0",
                fmt::format("M = {}, N = {}, K = {}, G = {}", a.mn, n, a.k, groups));
  DSK_CHECK_ARG(expected_m > 0, fn, "expected_m", "a positive hint", expected_m);
  check_layout_tensor(fn, "masked_m", masked_m, groups);
  std::vector<Piece> pieces;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = masked_m.data<int32_t>()[g];
    DSK_CHECK_ARG(rows >= 0 && rows <= a.mn, fn, "masked_m",
                  fmt::format("row counts in [0, {}] (M of a)", a.mn),
                  fmt::format("{} for group {}", rows, g));
    if (rows > 0) pieces.push_back({g, g, 0, rows});
  }
  run_pieces(a, sfa, weights, groups, d, pieces);
}

// A's recipe when B is pre-packed: recipe_a, else (gran_m, gran_k) of recipe, else the default.
OperandRecipe packed_call_recipe_a(const char* fn, const OperandInfo& a, DType sfa_dtype,
                                   const std::optional<Recipe>& recipe,
                                   const std::optional<OperandRecipe>& recipe_a) {
  DSK_CHECK_ARG(!(recipe.has_value() && recipe_a.has_value()), fn, "recipe",
                "either recipe or recipe_a, not both", "both");
  OperandRecipe r = api::default_operand_recipe(a.dtype(), sfa_dtype, false);
  if (recipe.has_value()) r = {std::get<0>(*recipe), std::get<2>(*recipe)};
  if (recipe_a.has_value()) r = *recipe_a;
  api::check_operand_recipe(fn, recipe_a.has_value() ? "recipe_a" : "recipe", r, sfa_dtype);
  return r;
}

void require_per_row_a(const char* fn, OperandRecipe ra) {
  DSK_CHECK_ARG(std::get<0>(ra) == 1, fn, "recipe",
                "gran_m 1 (one scale per row of a grouped contiguous A)",
                fmt::format("gran_m {}", std::get<0>(ra)));
}

void check_k(const char* fn, const char* b_arg, const OperandInfo& a, int64_t k_b) {
  DSK_CHECK_ARG(k_b == a.k, fn, b_arg, fmt::format("K = {} (the K of a)", a.k), k_b);
}

}  // namespace

// ---- contiguous ----

void m_grouped_fp8_fp4_gemm_nt_contiguous(
    const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d, const Tensor& grouped_layout,
    std::optional<Recipe> recipe, std::optional<OperandRecipe> recipe_a,
    std::optional<OperandRecipe> recipe_b, std::string_view compiled_dims,
    bool /*disable_ue8m0_cast*/, bool use_psum_layout, bool ensure_zero_padding,
    std::optional<int> expected_m_for_psum_layout) {
  constexpr const char* fn = "m_grouped_fp8_fp4_gemm_nt_contiguous";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a.data", a.data, 2, kFp8Operand);
  OperandInfo ob = api::parse_operand(fn, "b.data", b.data, 3, kFp8Operand);
  api::require_k_major(fn, "a.data", oa);
  if (oa.dtype() == DType::fp4x2 && ob.dtype() == DType::fp4x2)
    api::require_k_major(fn, "b.data", ob);
  check_k(fn, "b.data", oa, ob.k);
  check::dtype_in(fn, "a.sf", a.sf, kScaleDtypes);
  check::dtype_in(fn, "b.sf", b.sf, kScaleDtypes);
  const api::Recipes r = api::resolve_recipes(fn, recipe, recipe_a, recipe_b, oa.dtype(),
                                              a.sf.dtype(), ob.dtype(), b.sf.dtype());
  require_per_row_a(fn, r.a);
  const ScaleInfo sfa = api::parse_scales(fn, "a.sf", a.sf, std::nullopt, oa.mn, oa.k, r.a);
  const ScaleInfo sfb = api::parse_scales(fn, "b.sf", b.sf, ob.groups, ob.mn, ob.k, r.b);
  ob = api::to_k_major(fn, "b.data", ob);
  m_grouped_contiguous_impl(
      fn, oa, sfa, [&](int64_t g) { return api::pack_group(ob, sfb, g); }, ob.groups, ob.mn, d,
      grouped_layout, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout);
}

void m_grouped_fp8_fp4_gemm_nt_contiguous(
    const Fp8Tensor& a, const PackedWeight& b, const Tensor& d, const Tensor& grouped_layout,
    std::optional<Recipe> recipe, std::optional<OperandRecipe> recipe_a,
    std::string_view compiled_dims, bool /*disable_ue8m0_cast*/, bool use_psum_layout,
    bool ensure_zero_padding, std::optional<int> expected_m_for_psum_layout) {
  constexpr const char* fn = "m_grouped_fp8_fp4_gemm_nt_contiguous";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a.data", a.data, 2, kFp8Operand);
  api::require_k_major(fn, "a.data", oa);
  api::check_packed_weight(fn, b, true, std::nullopt, oa.k);
  check::dtype_in(fn, "a.sf", a.sf, kScaleDtypes);
  const OperandRecipe ra = packed_call_recipe_a(fn, oa, a.sf.dtype(), recipe, recipe_a);
  require_per_row_a(fn, ra);
  const ScaleInfo sfa = api::parse_scales(fn, "a.sf", a.sf, std::nullopt, oa.mn, oa.k, ra);
  const auto& groups = b.impl().groups;
  m_grouped_contiguous_impl(
      fn, oa, sfa, [&](int64_t g) { return groups[static_cast<size_t>(g)]; }, b.num_groups(), b.n(),
      d, grouped_layout, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout);
}

void m_grouped_bf16_gemm_nt_contiguous(const Tensor& a, const Tensor& b, const Tensor& d,
                                       const Tensor& grouped_layout, std::string_view compiled_dims,
                                       bool use_psum_layout,
                                       std::optional<int> expected_m_for_psum_layout) {
  constexpr const char* fn = "m_grouped_bf16_gemm_nt_contiguous";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a", a, 2, {DType::bf16});
  const OperandInfo ob = api::parse_operand(fn, "b", b, 3, {DType::bf16});
  api::require_k_major(fn, "a", oa);
  check_k(fn, "b", oa, ob.k);
  m_grouped_contiguous_impl(
      fn, oa, std::nullopt, [&](int64_t g) { return api::pack_group(ob, std::nullopt, g); },
      ob.groups, ob.mn, d, grouped_layout, use_psum_layout, true, expected_m_for_psum_layout);
}

void m_grouped_bf16_gemm_nt_contiguous(const Tensor& a, const PackedWeight& b, const Tensor& d,
                                       const Tensor& grouped_layout, std::string_view compiled_dims,
                                       bool use_psum_layout,
                                       std::optional<int> expected_m_for_psum_layout) {
  constexpr const char* fn = "m_grouped_bf16_gemm_nt_contiguous";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a", a, 2, {DType::bf16});
  api::require_k_major(fn, "a", oa);
  api::check_packed_weight(fn, b, false, std::nullopt, oa.k);
  const auto& groups = b.impl().groups;
  m_grouped_contiguous_impl(
      fn, oa, std::nullopt, [&](int64_t g) { return groups[static_cast<size_t>(g)]; },
      b.num_groups(), b.n(), d, grouped_layout, use_psum_layout, true, expected_m_for_psum_layout);
}

// ---- masked ----

void m_grouped_fp8_fp4_gemm_nt_masked(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                                      const Tensor& masked_m, int expected_m,
                                      std::optional<Recipe> recipe,
                                      std::optional<OperandRecipe> recipe_a,
                                      std::optional<OperandRecipe> recipe_b,
                                      std::string_view compiled_dims, bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "m_grouped_fp8_fp4_gemm_nt_masked";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a.data", a.data, 3, kFp8Operand);
  const OperandInfo ob = api::parse_operand(fn, "b.data", b.data, 3, kFp8Operand);
  api::require_k_major(fn, "a.data", oa);
  api::require_k_major(fn, "b.data", ob);
  DSK_CHECK_ARG(ob.groups == oa.groups, fn, "b.data",
                fmt::format("{} groups (the G of a.data)", oa.groups), ob.groups);
  check_k(fn, "b.data", oa, ob.k);
  check::dtype_in(fn, "a.sf", a.sf, kScaleDtypes);
  check::dtype_in(fn, "b.sf", b.sf, kScaleDtypes);
  const api::Recipes r = api::resolve_recipes(fn, recipe, recipe_a, recipe_b, oa.dtype(),
                                              a.sf.dtype(), ob.dtype(), b.sf.dtype());
  const ScaleInfo sfa = api::parse_scales(fn, "a.sf", a.sf, oa.groups, oa.mn, oa.k, r.a);
  const ScaleInfo sfb = api::parse_scales(fn, "b.sf", b.sf, ob.groups, ob.mn, ob.k, r.b);
  m_grouped_masked_impl(
      fn, oa, sfa, [&](int64_t g) { return api::pack_group(ob, sfb, g); }, oa.groups, ob.mn, d,
      masked_m, expected_m);
}

void m_grouped_fp8_fp4_gemm_nt_masked(const Fp8Tensor& a, const PackedWeight& b, const Tensor& d,
                                      const Tensor& masked_m, int expected_m,
                                      std::optional<Recipe> recipe,
                                      std::optional<OperandRecipe> recipe_a,
                                      std::string_view compiled_dims, bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "m_grouped_fp8_fp4_gemm_nt_masked";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a.data", a.data, 3, kFp8Operand);
  api::require_k_major(fn, "a.data", oa);
  api::check_packed_weight(fn, b, true, oa.groups, oa.k);
  check::dtype_in(fn, "a.sf", a.sf, kScaleDtypes);
  const OperandRecipe ra = packed_call_recipe_a(fn, oa, a.sf.dtype(), recipe, recipe_a);
  const ScaleInfo sfa = api::parse_scales(fn, "a.sf", a.sf, oa.groups, oa.mn, oa.k, ra);
  const auto& groups = b.impl().groups;
  m_grouped_masked_impl(
      fn, oa, sfa, [&](int64_t g) { return groups[static_cast<size_t>(g)]; }, oa.groups, b.n(), d,
      masked_m, expected_m);
}

void m_grouped_bf16_gemm_nt_masked(const Tensor& a, const Tensor& b, const Tensor& d,
                                   const Tensor& masked_m, int expected_m,
                                   std::string_view compiled_dims) {
  constexpr const char* fn = "m_grouped_bf16_gemm_nt_masked";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a", a, 3, {DType::bf16});
  const OperandInfo ob = api::parse_operand(fn, "b", b, 3, {DType::bf16});
  api::require_k_major(fn, "a", oa);
  api::require_k_major(fn, "b", ob);
  DSK_CHECK_ARG(ob.groups == oa.groups, fn, "b", fmt::format("{} groups (the G of a)", oa.groups),
                ob.groups);
  check_k(fn, "b", oa, ob.k);
  m_grouped_masked_impl(
      fn, oa, std::nullopt, [&](int64_t g) { return api::pack_group(ob, std::nullopt, g); },
      oa.groups, ob.mn, d, masked_m, expected_m);
}

void m_grouped_bf16_gemm_nt_masked(const Tensor& a, const PackedWeight& b, const Tensor& d,
                                   const Tensor& masked_m, int expected_m,
                                   std::string_view compiled_dims) {
  constexpr const char* fn = "m_grouped_bf16_gemm_nt_masked";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a", a, 3, {DType::bf16});
  api::require_k_major(fn, "a", oa);
  api::check_packed_weight(fn, b, false, oa.groups, oa.k);
  const auto& groups = b.impl().groups;
  m_grouped_masked_impl(
      fn, oa, std::nullopt, [&](int64_t g) { return groups[static_cast<size_t>(g)]; }, oa.groups,
      b.n(), d, masked_m, expected_m);
}

}  // namespace dsk::gemm
