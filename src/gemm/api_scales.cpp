// Recipes and scale factors of dsk::gemm's API layer: upstream's defaults and checks, and the
// conversion of every accepted scale form into the engine's canonical f32 blocks.
#include <cstring>

#include <fmt/format.h>

#include <dsk/core/check.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm::api {
namespace {

// How many UE8M0 scales one element of a scale tensor holds.
int64_t scales_per_element(DType sf_dtype) {
  switch (sf_dtype) {
    case DType::i32:
      return 4;
    case DType::i16:
      return 2;
    default:
      return 1;
  }
}

// Scale j (0-based along K) of one row of packed UE8M0 words.
float packed_scale(const char* row, int64_t stride_bytes, int64_t per_word, int64_t j) {
  uint32_t word = 0;
  std::memcpy(&word, row + (j / per_word) * stride_bytes, per_word == 4 ? 4 : 2);
  const auto byte = static_cast<uint8_t>(word >> (8 * (j % per_word)));
  return numeric::ue8m0_to_f32(ue8m0{byte});
}

std::string recipe_text(OperandRecipe r) {
  return fmt::format("({}, {})", std::get<0>(r), std::get<1>(r));
}

}  // namespace

// ---- recipes ----

void check_operand_recipe(const char* fn, const char* arg, OperandRecipe recipe, DType sf_dtype) {
  const auto [gran_mn, gran_k] = recipe;
  DSK_CHECK_ARG(gran_mn >= 1, fn, arg, "gran_mn >= 1", recipe_text(recipe));
  DSK_CHECK_ARG(gran_k == 32 || gran_k == 128, fn, arg, "gran_k 32 or 128", recipe_text(recipe));
  if (sf_dtype == DType::i32)
    DSK_CHECK_ARG(gran_mn == 1, fn, arg, "gran_mn 1 with packed UE8M0 int32 scales",
                  recipe_text(recipe));
  if (sf_dtype == DType::i16)
    DSK_CHECK_ARG(gran_k == 32, fn, arg, "gran_k 32 with int16 (2 x UE8M0) scales",
                  recipe_text(recipe));
}

OperandRecipe default_operand_recipe(DType data_dtype, DType sf_dtype, bool is_b) {
  if (data_dtype == DType::fp4x2 || sf_dtype == DType::i16) return {1, 32};
  if (is_b && sf_dtype == DType::f32) return {128, 128};
  return {1, 128};
}

Recipes resolve_recipes(const char* fn, const std::optional<Recipe>& recipe,
                        const std::optional<OperandRecipe>& recipe_a,
                        const std::optional<OperandRecipe>& recipe_b, DType a_dtype,
                        DType sfa_dtype, DType b_dtype, DType sfb_dtype) {
  DSK_CHECK_ARG(!(recipe.has_value() && (recipe_a.has_value() || recipe_b.has_value())), fn,
                "recipe", "either recipe or the pair (recipe_a, recipe_b), not both",
                "recipe together with recipe_a or recipe_b");
  DSK_CHECK_ARG(recipe_a.has_value() == recipe_b.has_value(), fn,
                recipe_a.has_value() ? "recipe_b" : "recipe_a",
                "recipe_a and recipe_b given together", "only one of them");
  Recipes r;
  const char* arg_a = "recipe";
  const char* arg_b = "recipe";
  if (recipe.has_value()) {
    const auto [gran_m, gran_n, gran_k] = *recipe;
    r.a = {gran_m, gran_k};
    r.b = {gran_n, gran_k};
  } else if (recipe_a.has_value()) {
    r.a = *recipe_a;
    r.b = *recipe_b;
    arg_a = "recipe_a";
    arg_b = "recipe_b";
  } else {
    const bool per_operand = a_dtype == DType::fp4x2 || b_dtype == DType::fp4x2 ||
                             sfa_dtype == DType::i16 || sfb_dtype == DType::i16;
    if (per_operand) {
      r.a = default_operand_recipe(a_dtype, sfa_dtype, false);
      r.b = default_operand_recipe(b_dtype, sfb_dtype, false);
    } else if (sfb_dtype == DType::f32) {
      r.a = {1, 128};  // (1, 128, 128): the FP32 (legacy) default
      r.b = {128, 128};
    } else {
      r.a = {1, 128};  // (1, 1, 128): the packed UE8M0 default
      r.b = {1, 128};
    }
  }
  check_operand_recipe(fn, arg_a, r.a, sfa_dtype);
  check_operand_recipe(fn, arg_b, r.b, sfb_dtype);
  return r;
}

// ---- scale factors ----

ScaleInfo parse_scales(const char* fn, const char* arg, const Tensor& sf,
                       std::optional<int64_t> groups, int64_t mn, int64_t k, OperandRecipe recipe) {
  check::dtype_in(fn, arg, sf, {DType::f32, DType::i32, DType::i16});
  check::dim(fn, arg, sf, groups.has_value() ? 3 : 2);
  ScaleInfo s;
  s.sf = sf;
  std::tie(s.gran_mn, s.gran_k) = recipe;
  const int64_t blocks_k = ceil_div(k, s.gran_k);
  s.blocks_k = blocks_k;
  const int64_t per_element = scales_per_element(sf.dtype());
  const int64_t rows = ceil_div(mn, s.gran_mn);
  const int64_t cols = ceil_div(blocks_k, per_element);
  s.one_row_per_mn = sf.dtype() == DType::i16 && s.gran_mn > 1 && sf.size(-2) == mn;
  const int64_t want_rows = s.one_row_per_mn ? mn : rows;
  Shape want = {want_rows, cols};
  if (groups.has_value()) want.insert(want.begin(), *groups);
  const bool ok = sf.sizes() == want;
  DSK_CHECK_ARG(ok, fn, arg,
                fmt::format("shape {} for {} scales of an operand [{}{}, {}] with (gran_mn, "
                            "gran_k) = ({}, {})",
                            detail::to_text(want), dtype_name(sf.dtype()),
                            groups ? fmt::format("{}, ", *groups) : "", mn, k, s.gran_mn, s.gran_k),
                sf.describe());
  return s;
}

bool all_powers_of_two(const float* values, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t bits = numeric::bits_of(values[r * ld + c]);
      const uint32_t exponent = bits >> 23;  // the sign bit must be 0 too
      if ((bits & 0x7FFFFFu) != 0 || exponent == 0 || exponent >= 255) return false;
    }
  return true;
}

CanonicalScales canonical_scales(const ScaleInfo& s, int64_t group, int64_t r0, int64_t r1) {
  const Tensor sf = s.sf.dim() == 3 ? s.sf.select(0, group) : s.sf;
  const int gran_mn = s.one_row_per_mn ? 1 : s.gran_mn;
  const int64_t row0 = r0 / gran_mn;
  const int64_t rows = ceil_div(r1, gran_mn) - row0;
  const int64_t per_element = scales_per_element(sf.dtype());
  const int64_t blocks_k = s.blocks_k;  // the tail of the last packed word is padding
  CanonicalScales out;
  out.view.gran_mn = gran_mn;
  out.view.gran_k = s.gran_k;
  const auto es = static_cast<int64_t>(sf.element_size());
  const char* base = static_cast<const char*>(sf.data_ptr()) + row0 * sf.stride(-2) * es;
  if (sf.dtype() == DType::f32 && (sf.stride(-1) == 1 || blocks_k <= 1)) {
    out.view.data = reinterpret_cast<const float*>(base);  // already canonical: no copy
    out.view.ld = rows > 1 ? sf.stride(-2) : blocks_k;
  } else {
    out.storage.resize(static_cast<size_t>(rows * blocks_k));
    for (int64_t r = 0; r < rows; ++r) {
      const char* row = base + r * sf.stride(-2) * es;
      float* dst = out.storage.data() + r * blocks_k;
      for (int64_t j = 0; j < blocks_k; ++j) {
        if (per_element == 1)
          std::memcpy(&dst[j], row + j * sf.stride(-1) * es, sizeof(float));
        else
          dst[j] = packed_scale(row, sf.stride(-1) * es, per_element, j);
      }
    }
    out.view.data = out.storage.data();
    out.view.ld = blocks_k;
  }
  out.view.power_of_two = all_powers_of_two(out.view.data, rows, blocks_k, out.view.ld);
  return out;
}

}  // namespace dsk::gemm::api
