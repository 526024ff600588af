// Weight pre-packing: pack_weight converts B [N,K] or [G,N,K] (with its scales) into the engine's
// packed layout once, so GEMMs taking a PackedWeight skip the packing a raw B costs every call.
#include <fmt/format.h>

#include <dsk/core/check.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm {
namespace {

void check_weight_rank(const char* fn, const char* arg, const Tensor& t) {
  check::defined(fn, arg, t);
  DSK_CHECK_ARG(t.dim() == 2 || t.dim() == 3, fn, arg, "a [N, K] or [G, N, K] weight",
                t.describe());
}

void check_weight_size(const char* fn, const char* arg, const api::OperandInfo& b) {
  DSK_CHECK_ARG(b.groups > 0 && b.mn > 0 && b.k > 0, fn, arg, "G, N and K all > 0",
                fmt::format("G = {}, N = {}, K = {}", b.groups, b.mn, b.k));
}

PackedWeight pack_all_groups(const api::OperandInfo& b, const std::optional<api::ScaleInfo>& sfb) {
  auto impl = std::make_shared<PackedWeight::Impl>();
  impl->n = b.mn;
  impl->k = b.k;
  impl->dtype = b.dtype();
  for (int64_t g = 0; g < b.groups; ++g) impl->groups.push_back(api::pack_group(b, sfb, g));
  return PackedWeight(std::move(impl));
}

}  // namespace

int64_t PackedWeight::num_groups() const {
  return impl_ ? static_cast<int64_t>(impl_->groups.size()) : 0;
}
int64_t PackedWeight::n() const {
  return impl_ ? impl_->n : 0;
}
int64_t PackedWeight::k() const {
  return impl_ ? impl_->k : 0;
}
DType PackedWeight::dtype() const {
  return impl_ ? impl_->dtype : DType::bf16;
}
size_t PackedWeight::nbytes() const {
  size_t bytes = 0;
  if (impl_)
    for (const auto& g : impl_->groups) bytes += engine::packed_bytes(*g);
  return bytes;
}

PackedWeight pack_weight(const Tensor& b) {
  constexpr const char* fn = "pack_weight";
  check_weight_rank(fn, "b", b);
  check::dtype(fn, "b", b, DType::bf16);
  // BF16 weights may have any strides: the engine reads them through stride_r / stride_k.
  api::OperandInfo info;
  info.data = b;
  info.groups = b.dim() == 3 ? b.size(0) : 1;
  info.mn = b.size(-2);
  info.k = b.size(-1);
  check_weight_size(fn, "b", info);
  return pack_all_groups(info, std::nullopt);
}

PackedWeight pack_weight(const Fp8Tensor& b, std::optional<OperandRecipe> recipe_b,
                         bool /*disable_ue8m0_cast*/) {
  constexpr const char* fn = "pack_weight";
  check_weight_rank(fn, "b.data", b.data);
  const int dims = b.data.dim();
  api::OperandInfo info =
      api::parse_operand(fn, "b.data", b.data, dims, {DType::e4m3, DType::fp4x2});
  check_weight_size(fn, "b.data", info);
  check::dtype_in(fn, "b.sf", b.sf, {DType::f32, DType::i32, DType::i16});
  const OperandRecipe recipe =
      recipe_b.value_or(api::default_operand_recipe(info.dtype(), b.sf.dtype(), true));
  api::check_operand_recipe(fn, "recipe_b", recipe, b.sf.dtype());
  const std::optional<int64_t> groups =
      dims == 3 ? std::optional<int64_t>(info.groups) : std::nullopt;
  const api::ScaleInfo sfb = api::parse_scales(fn, "b.sf", b.sf, groups, info.mn, info.k, recipe);
  return pack_all_groups(api::to_k_major(fn, "b.data", info), sfb);
}

PackedWeight stack_packed_weights(const std::vector<PackedWeight>& parts) {
  constexpr const char* fn = "stack_packed_weights";
  DSK_CHECK_ARG(!parts.empty(), fn, "parts", "at least one packed weight", 0);
  auto impl = std::make_shared<PackedWeight::Impl>();
  for (size_t i = 0; i < parts.size(); ++i) {
    const PackedWeight& p = parts[i];
    DSK_CHECK_ARG(p.defined(), fn, "parts", "defined packed weights",
                  fmt::format("undefined part {}", i));
    if (i == 0) {
      impl->n = p.n();
      impl->k = p.k();
      impl->dtype = p.dtype();
    }
    DSK_CHECK_ARG(
        p.n() == impl->n && p.k() == impl->k && p.dtype() == impl->dtype, fn, "parts",
        fmt::format("N = {}, K = {}, {} like part 0", impl->n, impl->k, dtype_name(impl->dtype)),
        fmt::format("part {}: N = {}, K = {}, {}", i, p.n(), p.k(), dtype_name(p.dtype())));
    impl->groups.insert(impl->groups.end(), p.impl().groups.begin(), p.impl().groups.end());
  }
  return PackedWeight(std::move(impl));
}

}  // namespace dsk::gemm
