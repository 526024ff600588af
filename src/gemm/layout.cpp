// Scale-factor layout tools (upstream csrc/apis/layout.hpp): TMA-aligned sizes, MN-major copies,
// packed UE8M0 words, and transform_sf_into_required_layout.
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include <dsk/core/check.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm {
namespace {

// A zero-filled buffer of `storage` elements viewed with the given shape and strides (the padding
// a TMA-aligned layout leaves between columns is zero, never uninitialised).
Tensor strided_zeros(const Shape& shape, const Shape& strides, int64_t storage, DType dtype) {
  auto buffer = std::make_shared<Tensor>(Tensor::zeros({storage}, dtype));
  return Tensor::from_blob(buffer->data_ptr(), shape, dtype, strides, buffer);
}

// The MN-major layout of [(groups,) mn, cols] with MN padded to `ld`: strides (ld * cols,) 1, ld.
Tensor mn_major_zeros(std::optional<int64_t> groups, int64_t mn, int64_t cols, int64_t ld,
                      DType dtype) {
  if (!groups.has_value()) return strided_zeros({mn, cols}, {1, ld}, ld * cols, dtype);
  return strided_zeros({*groups, mn, cols}, {ld * cols, 1, ld}, *groups * ld * cols, dtype);
}

std::optional<int64_t> batch_of(const Tensor& t) {
  return t.dim() == 3 ? std::optional<int64_t>(t.size(0)) : std::nullopt;
}

void check_sf_rank(const char* fn, const Tensor& sf) {
  check::defined(fn, "sf", sf);
  DSK_CHECK_ARG(sf.dim() == 2 || sf.dim() == 3, fn, "sf", "a [MN, SFK] or [G, MN, SFK] tensor",
                sf.describe());
}

// Calls fn(group, row, col, value_address) for every element of a 2-D or 3-D tensor.
template <class Fn>
void for_each_element(const Tensor& t, Fn&& fn) {
  const bool batched = t.dim() == 3;
  const int64_t groups = batched ? t.size(0) : 1;
  const auto es = static_cast<int64_t>(t.element_size());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < t.size(-2); ++r)
      for (int64_t c = 0; c < t.size(-1); ++c) {
        const int64_t offset =
            (batched ? g * t.stride(0) : 0) + r * t.stride(-2) + c * t.stride(-1);
        fn(g, r, c, static_cast<char*>(t.data_ptr()) + offset * es);
      }
}

// Element (g, r, c) of a 2-D or 3-D tensor as a byte address.
char* element_address(const Tensor& t, int64_t g, int64_t r, int64_t c) {
  const int64_t offset = (t.dim() == 3 ? g * t.stride(0) : 0) + r * t.stride(-2) + c * t.stride(-1);
  return static_cast<char*>(t.data_ptr()) + offset * static_cast<int64_t>(t.element_size());
}

}  // namespace

int64_t get_tma_aligned_size(int64_t x, int64_t element_size) {
  constexpr const char* fn = "get_tma_aligned_size";
  DSK_CHECK_ARG(element_size > 0 && 16 % element_size == 0, fn, "element_size",
                "a divisor of 16 (1, 2, 4, 8 or 16)", element_size);
  DSK_CHECK_ARG(x >= 0, fn, "x", "a size >= 0", x);
  return api::align(x, 16 / element_size);
}

Tensor get_mn_major_tma_aligned_tensor(const Tensor& sf) {
  constexpr const char* fn = "get_mn_major_tma_aligned_tensor";
  check_sf_rank(fn, sf);
  check::dtype_in(fn, "sf", sf, {DType::f32, DType::i32});
  const int64_t mn = sf.size(-2), cols = sf.size(-1);
  const int64_t ld = get_tma_aligned_size(mn, 4);
  const bool batch_ok = sf.dim() == 2 || sf.stride(0) == ld * cols;
  if (batch_ok && sf.stride(-2) == 1 && sf.stride(-1) == ld) return sf;  // already so
  Tensor out = mn_major_zeros(batch_of(sf), mn, cols, ld, sf.dtype());
  out.copy_(sf);
  return out;
}

Tensor get_mn_major_tma_aligned_packed_ue8m0_tensor(const Tensor& sf) {
  constexpr const char* fn = "get_mn_major_tma_aligned_packed_ue8m0_tensor";
  check_sf_rank(fn, sf);
  check::dtype(fn, "sf", sf, DType::f32);
  const int64_t mn = sf.size(-2), sf_k = sf.size(-1);
  const int64_t ld = get_tma_aligned_size(mn, 4);
  Tensor out = mn_major_zeros(batch_of(sf), mn, api::ceil_div(sf_k, 4), ld, DType::i32);
  for_each_element(sf, [&](int64_t g, int64_t r, int64_t c, const char* p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    DSK_CHECK_ARG(api::all_powers_of_two(&v, 1, 1, 1), fn, "sf",
                  "positive normal powers of two (UE8M0 values, e.g. from ceil_to_ue8m0)",
                  fmt::format("{} at [{}, {}, {}]", v, g, r, c));
    // Scale c goes to byte c % 4 of word c / 4 (little-endian, as upstream).
    char* word = element_address(out, g, r, c / 4);
    word[c % 4] = static_cast<char>(numeric::f32_to_ue8m0_exact(v).bits);
  });
  return out;
}

Tensor transform_sf_into_required_layout(const Tensor& sf, int64_t mn, int64_t k,
                                         std::optional<Recipe> recipe,
                                         std::optional<OperandRecipe> recipe_ab,
                                         std::optional<int64_t> num_groups,
                                         std::optional<bool> is_sfa, bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "transform_sf_into_required_layout";
  DSK_CHECK_ARG(recipe.has_value() != recipe_ab.has_value(), fn, "recipe",
                "exactly one of recipe (with is_sfa) and recipe_ab",
                recipe.has_value() ? "both" : "neither");
  OperandRecipe gran;
  if (recipe.has_value()) {
    DSK_CHECK_ARG(is_sfa.has_value(), fn, "is_sfa",
                  "true or false with a 3-element recipe (which operand sf belongs to)", "none");
    const auto [gran_m, gran_n, gran_k] = *recipe;
    gran = {*is_sfa ? gran_m : gran_n, gran_k};
  } else {
    DSK_CHECK_ARG(!is_sfa.has_value(), fn, "is_sfa", "no value with recipe_ab", *is_sfa);
    gran = *recipe_ab;
  }
  DSK_CHECK_ARG(mn >= 0 && k >= 0, fn, "mn, k", "sizes >= 0", fmt::format("{}, {}", mn, k));
  if (num_groups.has_value())
    DSK_CHECK_ARG(*num_groups >= 0, fn, "num_groups", "a count >= 0", *num_groups);
  check::dtype_in(fn, "sf", sf, {DType::f32, DType::i32, DType::i16});
  api::check_operand_recipe(fn, recipe.has_value() ? "recipe" : "recipe_ab", gran, sf.dtype());
  const api::ScaleInfo info = api::parse_scales(fn, "sf", sf, num_groups, mn, k, gran);

  if (sf.dtype() == DType::f32 && info.gran_mn > 1) return sf;  // read as given: any strides
  if (sf.dtype() != DType::i16) return get_mn_major_tma_aligned_tensor(sf);
  // Ascend's int16 form: one row per MN (rows repeated when gran_mn > 1), MN-major, unpadded.
  const int64_t cols = sf.size(-1);
  Tensor out = mn_major_zeros(batch_of(sf), mn, cols, mn, DType::i16);
  const int64_t row_step = info.one_row_per_mn ? 1 : info.gran_mn;
  for_each_element(out, [&](int64_t g, int64_t r, int64_t c, char* p) {
    std::memcpy(p, element_address(sf, g, r / row_step, c), sizeof(int16_t));
  });
  return out;
}

}  // namespace dsk::gemm
