// The API layer's shared helpers (src/gemm/api_*.cpp): checking operands, scale factors, recipes
// and outputs the way upstream's csrc/apis/gemm.hpp does, and turning them into the canonical
// problems of the engine contract (src/gemm/engine.hpp). Private to src/gemm.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

#include <dsk/core/tensor.hpp>
#include <dsk/gemm.hpp>

#include "gemm/engine.hpp"

namespace dsk::gemm::api {

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
constexpr int64_t align(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// ---- operands ----

// Which of the last two dimensions has unit stride: K (row-major [mn, k]) or MN (column-major).
enum class Major { k, mn };

// A checked operand of logical shape [(groups,) mn, k]. For fp4x2 the packed dimension counts
// bytes, so the logical size along it is twice the tensor's size (upstream check_ab_fp8_fp4).
struct OperandInfo {
  Tensor data;
  Major major = Major::k;
  int64_t groups = 1, mn = 0, k = 0;
  DType dtype() const { return data.dtype(); }
};

// Checks rank (`dims`, 2 or 3), dtype, upstream's major rule (one of the last two strides is 1;
// a 3-D operand has stride(0) == size(-2) * size(-1)) and returns the logical shape.
OperandInfo parse_operand(const char* fn, const char* arg, const Tensor& t, int dims,
                          std::initializer_list<DType> dtypes);
void require_k_major(const char* fn, const char* arg, const OperandInfo& op);
// An FP4 operand stored MN-major (two MN neighbours per byte) repacked to K-major, as upstream's
// sm120_to_k_major; any other operand is returned as is.
OperandInfo to_k_major(const char* fn, const char* arg, const OperandInfo& op);
// The engine's view of rows [r0, r1) of group g (K-major FP4 only).
engine::Operand engine_operand(const OperandInfo& op, int64_t group, int64_t r0, int64_t r1);

// ---- recipes and scale factors ----

// (gran_mn, gran_k) of A and B after applying upstream's defaults.
struct Recipes {
  OperandRecipe a{1, 128}, b{128, 128};
};

// Checks that exactly one of `recipe` and the (recipe_a, recipe_b) pair is given (or none), and
// fills in the defaults: FP8 x FP8 takes (1, 128, 128) with FP32 scales of B and (1, 1, 128) with
// packed UE8M0 int32 ones; an FP4 operand or Ascend int16 scales take (1, 32) per operand, the
// FP8 operand beside them (1, 128).
Recipes resolve_recipes(const char* fn, const std::optional<Recipe>& recipe,
                        const std::optional<OperandRecipe>& recipe_a,
                        const std::optional<OperandRecipe>& recipe_b, DType a_dtype,
                        DType sfa_dtype, DType b_dtype, DType sfb_dtype);
// The default (gran_mn, gran_k) of an operand given alone (pack_weight's B, a PackedWeight
// call's A).
OperandRecipe default_operand_recipe(DType data_dtype, DType sf_dtype, bool is_b);

// Scale factors of one operand, checked against its logical [(groups,) mn, k] and recipe. Forms:
//   f32 [(G,) ceil(mn / gran_mn), ceil(k / gran_k)], any strides (MN- or K-major)
//   i32 [(G,) ceil(mn / gran_mn), ceil(k / (4 gran_k))]: 4 UE8M0 bytes per word, byte j of word q
//       is scale 4q + j (gran_mn must be 1, as upstream)
//   i16 [(G,) ceil(mn / gran_mn) or mn, ceil(k / (2 gran_k))]: 2 UE8M0 per word (Ascend; gran_k
//       32); with mn rows, the rows are already repeated per MN (the required layout)
struct ScaleInfo {
  Tensor sf;
  int gran_mn = 1, gran_k = 128;
  int64_t blocks_k = 0;         // ceil(k / gran_k): the scales a row really has
  bool one_row_per_mn = false;  // i16 given in the required layout
};

ScaleInfo parse_scales(const char* fn, const char* arg, const Tensor& sf,
                       std::optional<int64_t> groups, int64_t mn, int64_t k, OperandRecipe recipe);
// Checks a recipe for an operand whose scales have dtype `sf_dtype`.
void check_operand_recipe(const char* fn, const char* arg, OperandRecipe recipe, DType sf_dtype);

// The engine's f32 scales of rows [r0, r1) of group g (r0 a multiple of gran_mn). Points into the
// caller's tensor when it already is f32 with unit stride along K; owns a converted copy
// otherwise.
struct CanonicalScales {
  std::vector<float> storage;
  engine::Scales view;
};
CanonicalScales canonical_scales(const ScaleInfo& s, int64_t group, int64_t r0, int64_t r1);
// Whether every value is a positive normal power of two (UE8M0 recipes).
bool all_powers_of_two(const float* values, int64_t rows, int64_t cols, int64_t ld);

// ---- outputs and the trivial cases ----

// D (or C): rank `dims`, dtype in `dtypes`, row-major (stride(-1) == 1; upstream
// check_major_type_cd), rows that do not overlap, and a contiguous batch for 3-D.
void check_output(const char* fn, const char* arg, const Tensor& d, int dims,
                  std::initializer_list<DType> dtypes);
// Rows [r0, r1) of group g of D.
engine::Output engine_output(const Tensor& d, int64_t group, int64_t r0, int64_t r1);
// Upstream's early_return: checks C against D (same dtype and shape; C == D needs equal strides;
// partial overlaps are refused), returns true when nothing is left to compute (m or n is 0, or k
// is 0: D then holds C, or zeros without C), and otherwise copies a separate C into D.
bool early_return(const char* fn, int64_t m, int64_t n, int64_t k, const Tensor& d,
                  const std::optional<Tensor>& c);
// compiled_dims: a subset of "mnk" (a JIT hint on GPUs; checked, otherwise unused on CPUs).
void check_compiled_dims(const char* fn, std::string_view compiled_dims);

// ---- weights ----

// Packs group g of a raw B operand (FP8/FP4 with its scales, or BF16 with none).
std::shared_ptr<const engine::PackedB> pack_group(const OperandInfo& b,
                                                  const std::optional<ScaleInfo>& sfb,
                                                  int64_t group);
// Checks a pre-packed weight against the call: defined, dtype family, number of groups, K.
void check_packed_weight(const char* fn, const PackedWeight& b, bool fp8_family,
                         std::optional<int64_t> groups, int64_t k);

}  // namespace dsk::gemm::api
