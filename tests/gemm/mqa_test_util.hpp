// Helpers of the MQA-logits suites (test_mqa_logits.cpp, slow_mqa_logits.cpp): problems in the
// upstream forms (e4m3 q unscaled, kv with per-row scales, causal / context-parallel / random
// ranges) and the check against both references.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {

struct MqaProblem {
  Tensor q_bf16, kv_bf16;  // the unquantised inputs
  Tensor q;                // e4m3 [S, H, D], unscaled
  Fp8Tensor kv;            // e4m3 [Skv, D] and f32 [Skv] (per-row amax / 448)
  Tensor weights;          // f32 [S, H]
  Tensor ks, ke;           // int32 [S]
};

inline Tensor to_e4m3(const Tensor& x) {
  Tensor out = Tensor::empty(x.sizes(), DType::e4m3);
  const Tensor f = Tensor::empty(x.sizes(), DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i)
    f.data<float>()[i] = numeric::bf16_to_f32(x.data<bf16>()[i]);
  convert_f32_to_e4m3(f.data<float>(), out.data<e4m3>(), static_cast<size_t>(x.numel()));
  return out;
}

// Ranges: causal without context parallelism (ks = 0, ke = i + Skv - S), causal over two
// context-parallel chunks, or random.
inline MqaProblem make_problem(int64_t s, int64_t skv, int64_t h, int64_t d, bool causal,
                               bool chunks = false) {
  MqaProblem p;
  p.q_bf16 = randn_bf16({s, h, d});
  p.kv_bf16 = randn_bf16({skv, d});
  p.q = to_e4m3(p.q_bf16);
  Tensor kv_scaled = Tensor::empty({skv, d}, DType::bf16);
  p.kv.sf = Tensor::empty({skv}, DType::f32);
  for (int64_t j = 0; j < skv; ++j) {
    float amax = 1e-4f;
    for (int64_t k = 0; k < d; ++k)
      amax = std::max(amax, std::fabs(numeric::bf16_to_f32(p.kv_bf16.data<bf16>()[j * d + k])));
    const float sf = amax / 448.0f;
    p.kv.sf.data<float>()[j] = sf;
    for (int64_t k = 0; k < d; ++k)
      kv_scaled.data<bf16>()[j * d + k] =
          numeric::f32_to_bf16(numeric::bf16_to_f32(p.kv_bf16.data<bf16>()[j * d + k]) / sf);
  }
  p.kv.data = to_e4m3(kv_scaled);
  p.weights = randn_f32({s, h});
  p.ks = Tensor::empty({s}, DType::i32);
  p.ke = Tensor::empty({s}, DType::i32);
  std::mt19937_64 rng(fresh_seed());
  for (int64_t i = 0; i < s; ++i) {
    int32_t a = 0, b = static_cast<int32_t>(std::max<int64_t>(0, i + skv - s));
    if (causal && chunks) {
      // Context parallelism: this rank holds two chunks of the sequence, the first and the last
      // s / 2 positions of skv, each attending causally to everything before it.
      const int64_t pos = i < s / 2 ? i : skv - (s - i);
      b = static_cast<int32_t>(pos + 1);
    }
    if (!causal) {
      a = static_cast<int32_t>(rng() % (skv + 1));
      b = static_cast<int32_t>(rng() % (skv + 1));
      if (a > b) std::swap(a, b);
    }
    p.ks.data<int32_t>()[i] = a;
    p.ke.data<int32_t>()[i] = b;
  }
  return p;
}

inline Tensor dequantized_kv(const MqaProblem& p) {
  const int64_t skv = p.kv.data.size(0), d = p.kv.data.size(1);
  Tensor kv = Tensor::empty({skv, d}, DType::f64);
  for (int64_t j = 0; j < skv; ++j)
    for (int64_t k = 0; k < d; ++k)
      kv.data<double>()[j * d + k] = numeric::e4m3_to_f32(p.kv.data.data<e4m3>()[j * d + k]);
  return kv;
}

inline Tensor ones(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::f32);
  std::fill(t.data<float>(), t.data<float>() + n, 1.0f);
  return t;
}

// Values of a logits tensor (f32 or bf16, any strides) as f64 [S, Skv], with -inf and NaN kept.
inline Tensor as_f64(const Tensor& x) {
  Tensor out = Tensor::empty(x.sizes(), DType::f64);
  for (int64_t i = 0; i < x.size(0); ++i)
    for (int64_t j = 0; j < x.size(1); ++j) {
      const int64_t at = i * x.stride(0) + j;
      out.data<double>()[i * x.size(1) + j] =
          x.dtype() == DType::f32 ? x.data<float>()[at] : numeric::bf16_to_f32(x.data<bf16>()[at]);
    }
  return out;
}

// -inf at the same places; calc_diff over the rest.
inline double masked_diff(const Tensor& got, const Tensor& want) {
  Tensor a = as_f64(got), b = want.clone();
  int64_t bad_masks = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const bool ai = std::isinf(a.data<double>()[i]), bi = std::isinf(b.data<double>()[i]);
    bad_masks += ai != bi;
    if (ai || bi) a.data<double>()[i] = b.data<double>()[i] = 0;
  }
  EXPECT_EQ(bad_masks, 0) << "-inf positions differ";
  return ref::calc_diff(a, b);
}

inline void check_against_references(int64_t s, int64_t skv, int64_t h, int64_t d, bool causal,
                                     bool chunks = false) {
  SCOPED_TRACE(fmt::format("S={} Skv={} H={} D={} causal={} chunks={} {}", s, skv, h, d, causal,
                           chunks, seed_note()));
  const MqaProblem p = make_problem(s, skv, h, d, causal, chunks);
  const Tensor logits = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke);
  ASSERT_EQ(logits.size(0), s);
  ASSERT_EQ(logits.size(1), skv);
  EXPECT_EQ(logits.stride(0), (skv + 256 + 255) / 256 * 256) << "upstream row stride";
  const Tensor simulated = ref::mqa_logits(p.q, dequantized_kv(p), p.kv.sf, p.weights, p.ks, p.ke);
  EXPECT_LT(masked_diff(logits, simulated), 5e-6) << "vs the dequantised reference";
  const Tensor bf16_ref = ref::mqa_logits(p.q_bf16, p.kv_bf16, ones(skv), p.weights, p.ks, p.ke);
  EXPECT_LT(masked_diff(logits, bf16_ref), 1e-3) << "vs the BF16 reference";
}

}  // namespace dsk::gemm_test
