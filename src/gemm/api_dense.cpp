// Dense GEMMs: fp8_fp4_gemm_{nt,nn,tn,tt} and bf16_gemm_{nt,nn,tn,tt}, raw or pre-packed B. nn, tn
// and tt transpose their operands' views (scales too) and run nt, as upstream does.
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
constexpr std::initializer_list<DType> kDenseOut = {DType::bf16, DType::f32};

// D (+)= A·Bᵀ for one A (with its scales when FP8/FP4) against one packed B.
void run_dense(const OperandInfo& a, const std::optional<ScaleInfo>& sfa, const engine::PackedB& b,
               const Tensor& d, bool accumulate) {
  engine::Segment segment;
  segment.a = api::engine_operand(a, 0, 0, a.mn);
  CanonicalScales scales;
  if (sfa.has_value()) {
    scales = api::canonical_scales(*sfa, 0, 0, a.mn);
    segment.a.sf = scales.view;
  }
  segment.b = &b;
  segment.d = api::engine_output(d, 0, 0, a.mn);
  engine::run(std::span<const engine::Segment>(&segment, 1), accumulate);
}

void check_dense_shapes(const char* fn, const char* b_arg, const OperandInfo& a, int64_t n,
                        int64_t k_b, const Tensor& d) {
  DSK_CHECK_ARG(k_b == a.k, fn, b_arg, fmt::format("K = {} (the K of a)", a.k), k_b);
  DSK_CHECK_ARG(d.size(0) == a.mn && d.size(1) == n, fn, "d",
                fmt::format("shape [{}, {}] ([m, n] of a and b)", a.mn, n), d.describe());
}

// A 2-D tensor's transposed view, after checking it is 2-D (the views nn/tn/tt take).
Tensor transposed(const char* fn, const char* arg, const Tensor& t) {
  check::dim(fn, arg, t, 2);
  return t.transpose(0, 1);
}

Fp8Tensor transposed(const char* fn, const char* data_arg, const char* sf_arg, const Fp8Tensor& x) {
  return {transposed(fn, data_arg, x.data), transposed(fn, sf_arg, x.sf)};
}

void fp8_fp4_gemm_nt_impl(const char* fn, const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                          const std::optional<Tensor>& c, const std::optional<Recipe>& recipe,
                          const std::optional<OperandRecipe>& recipe_a,
                          const std::optional<OperandRecipe>& recipe_b,
                          std::string_view compiled_dims) {
  api::check_compiled_dims(fn, compiled_dims);
  OperandInfo oa = api::parse_operand(fn, "a.data", a.data, 2, kFp8Operand);
  OperandInfo ob = api::parse_operand(fn, "b.data", b.data, 2, kFp8Operand);
  if (oa.dtype() == DType::fp4x2 && ob.dtype() == DType::fp4x2) {
    api::require_k_major(fn, "a.data", oa);  // upstream: FP4 x FP4 needs K-major operands
    api::require_k_major(fn, "b.data", ob);
  }
  api::check_output(fn, "d", d, 2, kDenseOut);
  check_dense_shapes(fn, "b.data", oa, ob.mn, ob.k, d);
  check::dtype_in(fn, "a.sf", a.sf, kScaleDtypes);
  check::dtype_in(fn, "b.sf", b.sf, kScaleDtypes);
  const api::Recipes r = api::resolve_recipes(fn, recipe, recipe_a, recipe_b, oa.dtype(),
                                              a.sf.dtype(), ob.dtype(), b.sf.dtype());
  const ScaleInfo sfa = api::parse_scales(fn, "a.sf", a.sf, std::nullopt, oa.mn, oa.k, r.a);
  const ScaleInfo sfb = api::parse_scales(fn, "b.sf", b.sf, std::nullopt, ob.mn, ob.k, r.b);
  if (api::early_return(fn, oa.mn, ob.mn, oa.k, d, c)) return;
  oa = api::to_k_major(fn, "a.data", oa);
  ob = api::to_k_major(fn, "b.data", ob);
  const auto packed = api::pack_group(ob, sfb, 0);
  run_dense(oa, sfa, *packed, d, c.has_value());
}

void bf16_gemm_nt_impl(const char* fn, const Tensor& a, const Tensor& b, const Tensor& d,
                       const std::optional<Tensor>& c, std::string_view compiled_dims) {
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a", a, 2, {DType::bf16});
  const OperandInfo ob = api::parse_operand(fn, "b", b, 2, {DType::bf16});
  api::check_output(fn, "d", d, 2, kDenseOut);
  check_dense_shapes(fn, "b", oa, ob.mn, ob.k, d);
  if (api::early_return(fn, oa.mn, ob.mn, oa.k, d, c)) return;
  const auto packed = api::pack_group(ob, std::nullopt, 0);
  run_dense(oa, std::nullopt, *packed, d, c.has_value());
}

}  // namespace

// ---- FP8 / FP4 ----

void fp8_fp4_gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c, std::optional<Recipe> recipe,
                     std::optional<OperandRecipe> recipe_a, std::optional<OperandRecipe> recipe_b,
                     std::string_view compiled_dims, bool /*disable_ue8m0_cast*/) {
  fp8_fp4_gemm_nt_impl("fp8_fp4_gemm_nt", a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims);
}

void fp8_fp4_gemm_nn(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c, std::optional<Recipe> recipe,
                     std::optional<OperandRecipe> recipe_a, std::optional<OperandRecipe> recipe_b,
                     std::string_view compiled_dims, bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "fp8_fp4_gemm_nn";
  fp8_fp4_gemm_nt_impl(fn, a, transposed(fn, "b.data", "b.sf", b), d, c, recipe, recipe_a, recipe_b,
                       compiled_dims);
}

void fp8_fp4_gemm_tn(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c, std::optional<Recipe> recipe,
                     std::optional<OperandRecipe> recipe_a, std::optional<OperandRecipe> recipe_b,
                     std::string_view compiled_dims, bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "fp8_fp4_gemm_tn";
  fp8_fp4_gemm_nt_impl(fn, transposed(fn, "a.data", "a.sf", a), transposed(fn, "b.data", "b.sf", b),
                       d, c, recipe, recipe_a, recipe_b, compiled_dims);
}

void fp8_fp4_gemm_tt(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c, std::optional<Recipe> recipe,
                     std::optional<OperandRecipe> recipe_a, std::optional<OperandRecipe> recipe_b,
                     std::string_view compiled_dims, bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "fp8_fp4_gemm_tt";
  fp8_fp4_gemm_nt_impl(fn, transposed(fn, "a.data", "a.sf", a), b, d, c, recipe, recipe_a, recipe_b,
                       compiled_dims);
}

void fp8_fp4_gemm_nt(const Fp8Tensor& a, const PackedWeight& b, const Tensor& d,
                     const std::optional<Tensor>& c, std::optional<Recipe> recipe,
                     std::optional<OperandRecipe> recipe_a, std::string_view compiled_dims,
                     bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "fp8_fp4_gemm_nt";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a.data", a.data, 2, kFp8Operand);
  api::check_output(fn, "d", d, 2, kDenseOut);
  api::check_packed_weight(fn, b, true, 1, oa.k);
  if (oa.dtype() == DType::fp4x2 && b.dtype() == DType::fp4x2)
    api::require_k_major(fn, "a.data", oa);
  check_dense_shapes(fn, "b", oa, b.n(), b.k(), d);
  check::dtype_in(fn, "a.sf", a.sf, kScaleDtypes);
  DSK_CHECK_ARG(!(recipe.has_value() && recipe_a.has_value()), fn, "recipe",
                "either recipe or recipe_a, not both", "both");
  OperandRecipe ra = api::default_operand_recipe(oa.dtype(), a.sf.dtype(), false);
  if (recipe.has_value()) ra = {std::get<0>(*recipe), std::get<2>(*recipe)};
  if (recipe_a.has_value()) ra = *recipe_a;
  api::check_operand_recipe(fn, recipe_a.has_value() ? "recipe_a" : "recipe", ra, a.sf.dtype());
  const ScaleInfo sfa = api::parse_scales(fn, "a.sf", a.sf, std::nullopt, oa.mn, oa.k, ra);
  if (api::early_return(fn, oa.mn, b.n(), oa.k, d, c)) return;
  run_dense(api::to_k_major(fn, "a.data", oa), sfa, *b.impl().groups[0], d, c.has_value());
}

// ---- BF16 ----

void bf16_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& d, const std::optional<Tensor>& c,
                  std::string_view compiled_dims) {
  bf16_gemm_nt_impl("bf16_gemm_nt", a, b, d, c, compiled_dims);
}

void bf16_gemm_nn(const Tensor& a, const Tensor& b, const Tensor& d, const std::optional<Tensor>& c,
                  std::string_view compiled_dims) {
  constexpr const char* fn = "bf16_gemm_nn";
  bf16_gemm_nt_impl(fn, a, transposed(fn, "b", b), d, c, compiled_dims);
}

void bf16_gemm_tn(const Tensor& a, const Tensor& b, const Tensor& d, const std::optional<Tensor>& c,
                  std::string_view compiled_dims) {
  constexpr const char* fn = "bf16_gemm_tn";
  bf16_gemm_nt_impl(fn, transposed(fn, "a", a), transposed(fn, "b", b), d, c, compiled_dims);
}

void bf16_gemm_tt(const Tensor& a, const Tensor& b, const Tensor& d, const std::optional<Tensor>& c,
                  std::string_view compiled_dims) {
  constexpr const char* fn = "bf16_gemm_tt";
  bf16_gemm_nt_impl(fn, transposed(fn, "a", a), b, d, c, compiled_dims);
}

void bf16_gemm_nt(const Tensor& a, const PackedWeight& b, const Tensor& d,
                  const std::optional<Tensor>& c, std::string_view compiled_dims) {
  constexpr const char* fn = "bf16_gemm_nt";
  api::check_compiled_dims(fn, compiled_dims);
  const OperandInfo oa = api::parse_operand(fn, "a", a, 2, {DType::bf16});
  api::check_output(fn, "d", d, 2, kDenseOut);
  api::check_packed_weight(fn, b, false, 1, oa.k);
  check_dense_shapes(fn, "b", oa, b.n(), b.k(), d);
  if (api::early_return(fn, oa.mn, b.n(), oa.k, d, c)) return;
  run_dense(oa, std::nullopt, *b.impl().groups[0], d, c.has_value());
}

}  // namespace dsk::gemm
