// Helpers of the dsk::tk tests: fresh seeds, backend parameterisation, byte-exact comparisons.
#pragma once

#include <cstring>
#include <random>
#include <string>

#include <dsk/ref.hpp>
#include <dsk/tk.hpp>

#include "common/test_util.hpp"

namespace dsk::tk::test {

// A fresh seed per call: every run draws new data (the seed is printed on failure by callers).
inline uint64_t fresh_seed() {
  static std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// Runs the test body once per backend this CPU supports (tests/common/test_util.hpp).
using dsk::test::PerBackend;
#define DSK_TK_INSTANTIATE_PER_BACKEND(Suite) DSK_INSTANTIATE_PER_BACKEND(Suite)

// Values of a float tensor in row-major order, as fp64 (any dtype, any strides).
inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out;
  const Tensor src = t.contiguous();
  const int64_t n = src.numel();
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = static_cast<const char*>(src.data_ptr()) + i * src.element_size();
    switch (src.dtype()) {
      case DType::f64:
        out[i] = *reinterpret_cast<const double*>(p);
        break;
      case DType::f32:
        out[i] = *reinterpret_cast<const float*>(p);
        break;
      case DType::bf16:
        out[i] = numeric::bf16_to_f32(*reinterpret_cast<const bf16*>(p));
        break;
      case DType::f16:
        out[i] = numeric::f16_to_f32(*reinterpret_cast<const f16*>(p));
        break;
      case DType::e4m3:
        out[i] = numeric::e4m3_to_f32(*reinterpret_cast<const e4m3*>(p));
        break;
      case DType::i32:
        out[i] = *reinterpret_cast<const int32_t*>(p);
        break;
      case DType::i64:
        out[i] = static_cast<double>(*reinterpret_cast<const int64_t*>(p));
        break;
      default:
        ADD_FAILURE() << "values_of: unsupported dtype " << src.dtype();
        return out;
    }
  }
  return out;
}

// Byte-for-byte equality of two tensors of the same shape and dtype (any strides); on failure the
// message names the first differing element.
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.describe() << " vs " << b.describe();
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const size_t es = ca.element_size();
  const auto* pa = static_cast<const uint8_t*>(ca.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(cb.data_ptr());
  for (int64_t i = 0; i < ca.numel(); ++i)
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << " of " << ca.numel() << " differs (" << a.describe() << ")";
  return ::testing::AssertionSuccess();
}

// Scale factors of any tk layout as f32 [rows, blocks] (see ref::tk::unpack_scales).
inline Tensor scales_of(const QuantTensor& q, int64_t rows, int64_t blocks) {
  return ref::tk::unpack_scales(q.sf, rows, blocks);
}

// Blocks of g values in a row of n (the last one may be shorter): scale columns of a cast.
inline int64_t blocks_of(int64_t n, int64_t g) {
  return (n + g - 1) / g;
}

// The scale layout flags of a cast: use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0.
struct Layout {
  bool col_major, round_sf, packed;
};

// Codes and scales (the scales in whatever layout) equal to the reference's f32 [scale_rows,
// blocks].
inline ::testing::AssertionResult same_cast(const QuantTensor& got, const QuantTensor& want,
                                            int64_t scale_rows, int64_t blocks) {
  if (auto r = bitwise_equal(got.data, want.data); !r) return r << " (codes)";
  if (auto r = bitwise_equal(scales_of(got, scale_rows, blocks), want.sf); !r)
    return r << " (scales)";
  return ::testing::AssertionSuccess();
}

// Every tensor of two fused mappings bitwise equal; on failure the message names the first that
// differs.
inline ::testing::AssertionResult same_mapping(const FusedMapping& got, const FusedMapping& want) {
  const std::pair<const char*, const Tensor FusedMapping::*> fields[] = {
      {"pos_to_expert", &FusedMapping::pos_to_expert},
      {"pos_to_token", &FusedMapping::pos_to_token},
      {"pos_to_token_topk", &FusedMapping::pos_to_token_topk},
      {"token_topk_to_pos", &FusedMapping::token_topk_to_pos},
      {"expert_start", &FusedMapping::expert_start},
      {"expert_end", &FusedMapping::expert_end},
      {"num_tokens_per_expert", &FusedMapping::num_tokens_per_expert}};
  for (const auto& [name, field] : fields)
    if (auto r = bitwise_equal(got.*field, want.*field); !r) return r << " (" << name << ")";
  return ::testing::AssertionSuccess();
}

// Poisoned output buffers for ops that take `out`.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  ref::poison(t);
  return t;
}

// A bool [n] tensor from a predicate on the row index.
template <class Pred>
Tensor bool_rows(int64_t n, Pred pred) {
  Tensor t = Tensor::empty({n}, DType::boolean);
  for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(t.data_ptr())[i] = pred(i) ? 1 : 0;
  return t;
}

}  // namespace dsk::tk::test
