// Helpers shared by the dsk::gemm suites: fresh seeds, scoped settings, operands quantized in the
// upstream forms, and the two references every GEMM test compares with (upstream's "BF16 inputs"
// reference and the much tighter "dequantized inputs" one).
#pragma once

#include <atomic>
#include <cstring>
#include <random>
#include <string>

#include <fmt/format.h>

#include <dsk/gemm.hpp>
#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::gemm_test {

using gemm::Fp8Tensor;
using gemm::OperandRecipe;
using gemm::Recipe;

// ---- fresh data ----

// A base drawn once per process, so every run sees new data; failures print it (SCOPED_TRACE).
inline uint64_t base_seed() {
  static const uint64_t seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  return seed;
}
// A new seed per call.
inline uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{0};
  return base_seed() + 0x9E3779B97F4A7C15ull * ++counter;
}
inline std::string seed_note() {
  return fmt::format("base seed {:#x}", base_seed());
}

// N(0, 1) rounded to bf16 (a zero draw is possible but never a zero tensor).
inline Tensor randn_bf16(const Shape& shape) {
  return ref::randn(shape, DType::bf16, fresh_seed());
}
inline Tensor randn_f32(const Shape& shape, float std = 1.0f) {
  return ref::randn(shape, DType::f32, fresh_seed(), 0.0f, std);
}

// An uninitialised tensor filled with the poison pattern.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  ref::poison(t);
  return t;
}

using test::bitwise_equal;

// ---- scoped settings ----

class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(get_num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(saved_); }

 private:
  int saved_;
};

class ScopedDeterministic {
 public:
  explicit ScopedDeterministic(bool on) : saved_(get_deterministic_algorithms()) {
    use_deterministic_algorithms(on);
  }
  ~ScopedDeterministic() { use_deterministic_algorithms(saved_); }

 private:
  bool saved_;
};

class ScopedAlignment {
 public:
  explicit ScopedAlignment(int alignment) : saved_(gemm::get_mk_alignment_for_contiguous_layout()) {
    gemm::set_mk_alignment_for_contiguous_layout(alignment);
  }
  ~ScopedAlignment() { gemm::set_mk_alignment_for_contiguous_layout(saved_); }

 private:
  int saved_;
};

// The API suites run the engine's built-in runtime-shape kernels: the JIT specialises a kernel per
// (N, K), and these suites visit hundreds of shapes (the JIT path has its own tests, and
// Dense.JitKernelsMatchTheBuiltInOnes covers it through the API).
class NoJit : public ::testing::Test {
 private:
  test::ScopedEnv no_jit_{"DSK_GEMM_JIT", "0"};
};

// ---- quantized operands ----

// The upstream ways of quantizing one operand of a test.
enum class Quant {
  token_f32,     // per_token_cast_to_fp8, FP32 scales:           recipe (1, 128)
  block_f32,     // per_block_cast_to_fp8, FP32 scales:           recipe (128, 128)
  token_ue8m0,   // per_token_cast_to_fp8, UE8M0 values in FP32:  recipe (1, 128)
  token_packed,  // per_token_cast_to_fp8, packed UE8M0 int32:    recipe (1, 128)
  fp4,           // per_token_cast_to_fp4, gran_k 32, UE8M0 FP32: recipe (1, 32)
};

inline const char* quant_name(Quant q) {
  switch (q) {
    case Quant::token_f32:
      return "token_f32";
    case Quant::block_f32:
      return "block_f32";
    case Quant::token_ue8m0:
      return "token_ue8m0";
    case Quant::token_packed:
      return "token_packed";
    default:
      return "fp4";
  }
}

inline OperandRecipe recipe_of(Quant q) {
  switch (q) {
    case Quant::block_f32:
      return {128, 128};
    case Quant::fp4:
      return {1, 32};
    default:
      return {1, 128};
  }
}

struct QuantOperand {
  Fp8Tensor x;
  OperandRecipe recipe;
  Tensor values;  // f32: what x stands for (dsk::ref::dequantize)
};

// Quantizes x [mn, k] (bf16) the way `q` says.
inline QuantOperand quantize(const Tensor& x, Quant q) {
  QuantOperand out;
  out.recipe = recipe_of(q);
  switch (q) {
    case Quant::token_f32:
      out.x = gemm::per_token_cast_to_fp8(x, false);
      break;
    case Quant::block_f32:
      out.x = gemm::per_block_cast_to_fp8(x, false);
      break;
    case Quant::token_ue8m0:
      out.x = gemm::per_token_cast_to_fp8(x, true);
      break;
    case Quant::token_packed:
      out.x = gemm::per_token_cast_to_fp8(x, true, 128, true);
      break;
    case Quant::fp4:
      out.x = gemm::per_token_cast_to_fp4(x, true, 32);
      break;
  }
  out.values =
      ref::dequantize(out.x.data, out.x.sf, std::get<0>(out.recipe), std::get<1>(out.recipe));
  return out;
}

// Quantizes every group of x [G, mn, k] alike and stacks the results.
inline QuantOperand quantize_groups(const Tensor& x, Quant q) {
  const int64_t groups = x.size(0);
  QuantOperand first = quantize(x.select(0, 0), q);
  QuantOperand out;
  out.recipe = first.recipe;
  auto stacked = [&](const Tensor& like) {
    Shape shape = like.sizes();
    shape.insert(shape.begin(), groups);
    return Tensor::empty(shape, like.dtype());
  };
  out.x = {stacked(first.x.data), stacked(first.x.sf)};
  out.values = stacked(first.values);
  for (int64_t g = 0; g < groups; ++g) {
    const QuantOperand part = g == 0 ? first : quantize(x.select(0, g), q);
    out.x.data.select(0, g).copy_(part.x.data);
    out.x.sf.select(0, g).copy_(part.x.sf);
    out.values.select(0, g).copy_(part.values);
  }
  return out;
}

// The tolerances of spec/gemm.md §5 against the BF16 reference.
inline double upstream_tolerance(Quant a, Quant b) {
  const int fp4 = (a == Quant::fp4) + (b == Quant::fp4);
  return fp4 == 2 ? 2e-2 : fp4 == 1 ? 1e-2 : 1e-3;
}
// Against the dequantized reference only the kernels' own rounding remains: f32 accumulation,
// and for a BF16 D its final rounding.
inline double dequantized_tolerance(DType d_dtype) {
  return d_dtype == DType::bf16 ? 1e-5 : 1e-9;
}

// The result of comparing one output with both references.
inline void expect_close(const Tensor& d, const Tensor& bf16_ref, double tolerance,
                         const Tensor& dequant_ref, double tight, const std::string& what) {
  EXPECT_EQ(ref::count_poisoned(d), 0) << what << ": elements never written";
  const double diff = ref::calc_diff(d, bf16_ref);
  EXPECT_LT(diff, tolerance) << what << ": calc_diff vs the BF16 reference";
  const double tight_diff = ref::calc_diff(d, dequant_ref);
  EXPECT_LT(tight_diff, tight) << what << ": calc_diff vs the dequantized reference";
}

}  // namespace dsk::gemm_test
