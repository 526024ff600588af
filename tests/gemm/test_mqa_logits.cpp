// gemm::fp8_mqa_logits against dsk::ref::mqa_logits on every backend: the dequantised-input
// reference (< 5e-6) and the BF16-input reference (< 1e-3), -inf masks, causal and random ranges,
// the compressed output, BF16 logits, upstream strides, repeatability across runs and thread
// counts, backends bit for bit, bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>

#include "gemm/mqa_test_util.hpp"

namespace dsk::gemm_test {
namespace {

class MqaLogits : public dsk::test::PerBackend {};

TEST_P(MqaLogits, MatchesReferencesOnTheScaledGrid) {
  for (int64_t d : {32, 64, 128}) check_against_references(64, 1024, 32, d, true);
  check_against_references(64, 1024, 64, 128, false);
  check_against_references(64, 1024, 32, 64, true, true);
  check_against_references(29, 333, 4, 64, true);  // S not a multiple of 3, Skv of 64
  // Random ranges need enough queries for the BF16 bound: at S = 7 the FP8 rounding of the inputs
  // alone gave calc_diff >= 1e-3 in 2-3% of fresh draws (p99 1.04e-3 over 300); at S = 31 the
  // largest of 300 was 8.3e-4.
  check_against_references(31, 200, 12, 32, false);
}

// x bf16 [rows, d] -> FP4 e2m1 pairs with UE8M0 scales of 32 values, as upstream's FP4 logits
// take them: data fp4x2 [rows, d / 2] and one int32 of packed exponent bytes per row; and the
// values those stand for (f32 [rows, d]).
struct Fp4Rows {
  Tensor data, words, values;
};
Fp4Rows to_fp4_rows(const Tensor& x) {
  const int64_t rows = x.size(0), d = x.size(1);
  const Fp8Tensor q = gemm::per_token_cast_to_fp4(x, true, 32);
  Fp4Rows r{q.data, Tensor::empty({rows}, DType::i32), ref::dequantize(q.data, q.sf, 1, 32)};
  for (int64_t i = 0; i < rows; ++i) {
    uint32_t word = 0x7F7F7F7Fu;  // unused bytes: 2^0
    for (int64_t g = 0; g < d / 32; ++g) {
      const float sf = q.sf.data<float>()[i * q.sf.stride(0) + g];
      const uint32_t exponent = numeric::bits_of(sf) >> 23;
      word = (word & ~(0xFFu << (8 * g))) | (exponent << (8 * g));
    }
    r.words.data<int32_t>()[i] = static_cast<int32_t>(word);
  }
  return r;
}

TEST_P(MqaLogits, Fp4MatchesReferences) {
  for (int64_t d : {64, 128}) {
    const int64_t s = 40, h = 8, skv = 500;
    SCOPED_TRACE(fmt::format("FP4 D={} {}", d, seed_note()));
    const MqaProblem p = make_problem(s, skv, h, d, true);  // for weights, ranges, bf16 data
    const Fp4Rows q = to_fp4_rows(p.q_bf16.view({s * h, d}));
    const Fp4Rows kv = to_fp4_rows(p.kv_bf16);
    const Tensor logits =
        gemm::fp8_fp4_mqa_logits({q.data.view({s, h, d / 2}), q.words.view({s, h})},
                                 {kv.data, kv.words}, p.weights, p.ks, p.ke);
    const Tensor simulated =
        ref::mqa_logits(q.values.view({s, h, d}), kv.values, ones(skv), p.weights, p.ks, p.ke);
    EXPECT_LT(masked_diff(logits, simulated), 5e-6) << "vs the dequantised reference";
    const Tensor bf16_ref = ref::mqa_logits(p.q_bf16, p.kv_bf16, ones(skv), p.weights, p.ks, p.ke);
    EXPECT_LT(masked_diff(logits, bf16_ref), 0.02) << "vs the BF16 reference";
  }
}

TEST_P(MqaLogits, CompressedOutputAndBf16Logits) {
  SCOPED_TRACE(seed_note());
  const MqaProblem p = make_problem(40, 700, 8, 64, false);
  const Tensor full = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke);
  int64_t longest = 0;
  for (int64_t i = 0; i < 40; ++i)
    longest = std::max<int64_t>(longest, p.ke.data<int32_t>()[i] - p.ks.data<int32_t>()[i]);
  const Tensor packed = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke, false, longest + 5);
  ASSERT_EQ(packed.size(1), longest + 5);
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t j = p.ks.data<int32_t>()[i]; j < p.ke.data<int32_t>()[i]; ++j)
      ASSERT_EQ(packed.data<float>()[i * packed.stride(0) + j - p.ks.data<int32_t>()[i]],
                full.data<float>()[i * full.stride(0) + j])
          << i << "," << j;
  const Tensor half = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke, true, 0, DType::bf16);
  EXPECT_EQ(half.stride(0), (700 + 256 + 511) / 512 * 512);
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t j = 0; j < 700; ++j)
      ASSERT_EQ(half.data<bf16>()[i * half.stride(0) + j].bits,
                numeric::f32_to_bf16(full.data<float>()[i * full.stride(0) + j]).bits)
          << i << "," << j;
}

TEST_P(MqaLogits, RepeatableAcrossRunsAndThreads) {
  SCOPED_TRACE(seed_note());
  const MqaProblem p = make_problem(30, 600, 8, 128, true);
  const Tensor first = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke);
  const int threads = get_num_threads();
  for (int run = 0; run < 20; ++run) {
    set_num_threads(run % 2 == 0 ? 1 : std::max(2, threads));
    ASSERT_TRUE(bitwise_equal(gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke), first))
        << "run " << run;
  }
  set_num_threads(threads);
}

TEST(MqaLogitsBackends, AgreeBitForBit) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  SCOPED_TRACE(seed_note());
  const MqaProblem p = make_problem(20, 300, 8, 64, false);
  Tensor out[2];
  int n = 0;
  for (Backend b : {Backend::generic, Backend::avx512}) {
    dsk::test::ScopedBackend scoped(b);
    out[n++] = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke);
  }
  EXPECT_TRUE(bitwise_equal(out[0], out[1]));
}

TEST(MqaLogitsErrors, BadInputsRaise) {
  const MqaProblem p = make_problem(6, 100, 4, 32, true);
  auto raises = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << "no dsk::Error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fp8_mqa_logits"), std::string::npos) << e.what();
    }
  };
  const auto& w = p.weights;
  raises([&] { gemm::fp8_mqa_logits(p.q_bf16, p.kv, w, p.ks, p.ke); }, "bf16 q");
  raises(
      [&] {
        gemm::fp8_mqa_logits(to_e4m3(randn_bf16({6, 6, 32})), p.kv, w, p.ks, p.ke);
      },
      "6 heads");
  raises(
      [&] {
        gemm::fp8_mqa_logits(to_e4m3(randn_bf16({6, 4, 48})), p.kv, w, p.ks, p.ke);
      },
      "head dim 48");
  raises([&] { gemm::fp8_mqa_logits(p.q, {p.kv.data, ones(99)}, w, p.ks, p.ke); }, "kv_sf size");
  raises([&] { gemm::fp8_mqa_logits(p.q, p.kv, randn_f32({6, 5}), p.ks, p.ke); }, "weights");
  Tensor bad_end = p.ke.clone();
  bad_end.data<int32_t>()[3] = 101;
  raises([&] { gemm::fp8_mqa_logits(p.q, p.kv, w, p.ks, bad_end); }, "end past Skv");
  raises([&] { gemm::fp8_mqa_logits(p.q, p.kv, w, p.ke, p.ks); }, "start after end");
  raises([&] { gemm::fp8_mqa_logits(p.q, p.kv, w, p.ks, p.ke, true, 200); },
         "clean with compressed output");
  raises([&] { gemm::fp8_mqa_logits(p.q, p.kv, w, p.ks, p.ke, false, 3); },
         "max_seqlen_k below a row's length");
  raises([&] { gemm::fp8_mqa_logits(p.q, p.kv, w, p.ks, p.ke, true, 0, DType::f16); },
         "f16 logits");
  const Fp4Rows q4 = to_fp4_rows(p.q_bf16.view({24, 32}).contiguous());
  raises(
      [&] {
        gemm::fp8_fp4_mqa_logits({q4.data.view({6, 4, 16}), q4.words.view({6, 4})}, p.kv, w, p.ks,
                                 p.ke);
      },
      "FP4 q with head dim 32");
  raises(
      [&] {
        gemm::fp8_fp4_mqa_logits({p.q, q4.words.view({6, 4})}, p.kv, w, p.ks, p.ke);
      },
      "q_sf with e4m3 q");
}

DSK_INSTANTIATE_PER_BACKEND(MqaLogits);

}  // namespace
}  // namespace dsk::gemm_test
