// dsk::tk norms and positions: RMSNorm, LayerNorm, DeepSeek's YaRN table, RoPE (interleaved and
// half split, positions, 4-D inputs, conjugate) and the Walsh-Hadamard transform, against
// dsk::ref::tk on every backend.
#include <cmath>
#include <limits>
#include <numbers>

#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

using test::bitwise_equal;
using test::fresh_seed;

using Norms = test::PerBackend;

TEST_P(Norms, RmsNormMatchesTheReference) {
  // 100 and 120: 3 and 4 vectors after the sum of squares' 64-value steps, the last partial.
  for (int64_t hidden : {7168, 2048, 512, 128, 100, 120})
    for (int64_t rows : {1, 7, 4096}) {
      if (rows * hidden > (int64_t{1} << 21)) continue;
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << rows << "x" << hidden << " seed " << seed);
      const Tensor x = ref::randn({rows, hidden}, DType::bf16, seed, 0.0f, 4.0f);
      const Tensor w = ref::randn({hidden}, DType::f32, seed + 1, 1.0f, 0.1f);
      const Tensor want = ref::tk::rms_norm(x, w, 1e-6);
      const Tensor y = rms_norm(x, w);
      EXPECT_EQ(y.dtype(), DType::bf16);
      EXPECT_LT(ref::calc_diff(y, want), 1e-5);
      EXPECT_LT(ref::calc_diff(rms_norm(x, w, 1e-6f, DType::f32), want), 1e-12);
      const Tensor w16 = ref::randn({hidden}, DType::bf16, seed + 2, 1.0f, 0.1f);
      EXPECT_LT(ref::calc_diff(rms_norm(x, w16, 1e-6f, DType::f32), ref::tk::rms_norm(x, w16)),
                1e-12);
    }
}

// A bf16 output is the f32 output rounded by the scalar rule, bit for bit: the bf16 rows' norm
// pass (in pairs, with its own weight order and narrowing) against the f32 one, on whole 32-value
// steps and tails, strided rows, bf16 weights, and rows with zeros, bf16 subnormal outputs (values
// far below the row's rms) and a NaN.
TEST_P(Norms, RmsNormBf16OutputIsTheF32OutputRounded) {
  for (int64_t hidden : {7168, 2048, 128, 120, 100, 96, 48, 31})
    for (DType wt : {DType::f32, DType::bf16}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "hidden " << hidden << " seed " << seed);
      Tensor wide = ref::randn({6, hidden + 40}, DType::bf16, seed, 0.0f, 3.0f);
      for (int64_t c = 1; c < hidden; ++c) {
        wide.at<bf16>({1, c}) = numeric::f32_to_bf16((c % 3 - 1) * 1e-40f);  // y subnormal
        if (c % 5 == 0) wide.at<bf16>({2, c}) = numeric::f32_to_bf16(0.0f);
      }
      wide.at<bf16>({3, hidden / 2}) = numeric::f32_to_bf16(NAN);
      const Tensor x = wide.slice(1, 0, hidden);
      Tensor w = ref::randn({hidden}, wt, seed + 1, 0.5f, 1.0f);
      if (wt == DType::f32) w.at<float>({hidden - 1}) = 0.0f;
      const Tensor y = rms_norm(x, w), y32 = rms_norm(x, w, 1e-6f, DType::f32);
      Tensor want = Tensor::empty(y32.sizes(), DType::bf16);
      for (int64_t r = 0; r < 6; ++r)
        for (int64_t c = 0; c < hidden; ++c)
          want.at<bf16>({r, c}) = numeric::f32_to_bf16(y32.at<float>({r, c}));
      EXPECT_TRUE(bitwise_equal(y, want));
      int subnormal = 0;
      for (int64_t c = 0; c < hidden; ++c)
        subnormal += std::fpclassify(y32.at<float>({1, c})) == FP_SUBNORMAL;
      EXPECT_GT(subnormal, 0);
    }
}

TEST_P(Norms, LayerNormMatchesTheReference) {
  for (int64_t hidden : {128, 512, 7168, 30}) {
    const uint64_t seed = fresh_seed();
    const Tensor x = ref::randn({3, 5, hidden}, DType::f32, seed, 1.0f, 2.0f);  // 3-D input
    const Tensor w = ref::randn({hidden}, DType::f32, seed + 1, 1.0f, 0.1f);
    const Tensor b = ref::randn({hidden}, DType::f32, seed + 2);
    const Tensor y = layer_norm(x, w, b);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_LT(ref::calc_diff(y, ref::tk::layer_norm(x, w, b)), 1e-12) << seed;
    EXPECT_LT(ref::calc_diff(layer_norm(x, w, std::nullopt, 1e-5f, DType::bf16),
                             ref::tk::layer_norm(x, w, std::nullopt, 1e-5)),
              1e-5);
  }
}

// Rows of 128 go in batches of 16 with their statistics four rows at a time (layer_norm_stats):
// every row comes out bit for bit as it does alone, in a call of 37 rows (two whole batches, then
// one group of four and a single row), with and without bias, f32 and bf16 in and out, strided.
TEST_P(Norms, LayerNormOf128ColumnsIsTheSameRowByRow) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Tensor w = ref::randn({128}, DType::f32, seed + 1, 1.0f, 0.1f);
  const Tensor b = ref::randn({128}, DType::f32, seed + 2);
  for (DType in : {DType::f32, DType::bf16}) {
    const Tensor x = ref::randn({37, 160}, in, seed, 0.5f, 2.0f).slice(1, 16, 144);  // strided
    for (DType out : {DType::f32, DType::bf16})
      for (bool bias : {true, false}) {
        const std::optional<Tensor> bb = bias ? std::optional<Tensor>(b) : std::nullopt;
        const Tensor y = layer_norm(x, w, bb, 1e-6f, out);
        for (int64_t r = 0; r < 37; ++r)
          ASSERT_TRUE(bitwise_equal(y.slice(0, r, r + 1),
                                    layer_norm(x.slice(0, r, r + 1), w, bb, 1e-6f, out)))
              << "row " << r << " bias " << bias;
      }
  }
}

TEST(Yarn, DeepSeekFrequenciesAndTable) {
  const RopeConfig v3;
  EXPECT_EQ(yarn_correction_range(v3), (std::pair<int, int>{10, 23}));
  const std::vector<double> f = rope_frequencies(v3), want = ref::tk::rope_frequencies(v3);
  ASSERT_EQ(f.size(), 32u);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], want[i], 1e-15 * want[i]) << i;
  // Dims below 10 keep the base frequency, dims from 23 on are divided by 40.
  EXPECT_DOUBLE_EQ(f[3], std::pow(10000.0, -6.0 / 64));
  EXPECT_NEAR(f[30], std::pow(10000.0, -60.0 / 64) / 40, 1e-18);
  EXPECT_NEAR(yarn_mscale(40.0), 0.1 * std::log(40.0) + 1.0, 1e-15);
  EXPECT_NEAR(std::pow(192.0, -0.5) * std::pow(yarn_mscale(40.0), 2), 0.1352337789, 1e-9);
  const Tensor cache = yarn_cos_sin_cache(v3);
  ASSERT_EQ(cache.sizes(), (Shape{16384, 64}));
  for (int64_t p : {0, 1, 4095, 16383})
    for (int i : {0, 9, 17, 31}) {
      EXPECT_FLOAT_EQ(cache.at<float>({p, i}), static_cast<float>(std::cos(p * f[i])));
      EXPECT_FLOAT_EQ(cache.at<float>({p, 32 + i}), static_cast<float>(std::sin(p * f[i])));
    }
  // Without YaRN (short contexts) the base frequencies are used.
  RopeConfig short_ctx;
  short_ctx.max_seq_len = 4096;
  EXPECT_DOUBLE_EQ(rope_frequencies(short_ctx)[30], std::pow(10000.0, -60.0 / 64));
}

TEST_P(Norms, RopeMatchesTheReference) {
  const Tensor cache = yarn_cos_sin_cache();
  for (bool interleaved : {true, false})
    for (DType dtype : {DType::bf16, DType::f32})
      for (int rot : {64, 128}) {
        const uint64_t seed = fresh_seed();
        SCOPED_TRACE(::testing::Message() << "interleaved " << interleaved << " " << dtype
                                          << " rot " << rot << " seed " << seed);
        RopeConfig c;
        c.rot_dim = rot;
        c.max_seq_len = 8192;
        const Tensor table = rot == 64 ? cache : yarn_cos_sin_cache(c);
        // MLA shape: [tokens, 128 heads, 64]; positions given.
        const Tensor x = ref::randn({37, 16, rot}, dtype, seed);
        const Tensor pos = ref::randint({37}, DType::i64, seed + 1, 0, 8000);
        Tensor q = x.clone();
        apply_rotary(q, table, std::nullopt, pos, interleaved);
        const Tensor want = ref::tk::apply_rotary(x, table, pos, interleaved);
        EXPECT_LT(ref::calc_diff(q, want), dtype == DType::f32 ? 1e-13 : 1e-5);
        // The rope half of wider heads, in place through a view, with a key and an offset.
        Tensor heads = ref::randn({2, 9, 4, rot + 64}, dtype, seed + 2);  // [batch, seq, h, d]
        Tensor keys = ref::randn({2, 9, 1, rot}, dtype, seed + 3);
        const Tensor heads_before = heads.clone(), keys_before = keys.clone();
        Tensor rope_part = heads.slice(3, 64, 64 + rot);
        apply_rotary(rope_part, table, keys, std::nullopt, interleaved, false, 100);
        EXPECT_LT(ref::calc_diff(rope_part, ref::tk::apply_rotary(
                                                heads_before.slice(3, 64, 64 + rot).contiguous(),
                                                table, std::nullopt, interleaved, false, 100)),
                  dtype == DType::f32 ? 1e-13 : 1e-5);
        EXPECT_TRUE(bitwise_equal(heads.slice(3, 0, 64), heads_before.slice(3, 0, 64)));
        EXPECT_LT(ref::calc_diff(keys, ref::tk::apply_rotary(keys_before, table, std::nullopt,
                                                             interleaved, false, 100)),
                  dtype == DType::f32 ? 1e-13 : 1e-5);
        // conjugate undoes the rotation.
        if (dtype == DType::f32) {
          Tensor back = q.clone();
          apply_rotary(back, table, std::nullopt, pos, interleaved, true);
          EXPECT_LT(ref::calc_diff(back, x), 1e-12);
        }
      }
}

TEST_P(Norms, RopePairsAsDocumented) {
  // One head, position 1, a table with angle pi/2 in pair 0: (a, b) -> (-b, a).
  Tensor table = Tensor::zeros({2, 32}, DType::f32);
  for (int i = 0; i < 16; ++i) table.at<float>({0, i}) = table.at<float>({1, i}) = 1.0f;
  table.at<float>({1, 0}) = 0.0f;
  table.at<float>({1, 16}) = 1.0f;
  Tensor x = Tensor::empty({1, 1, 32}, DType::f32);
  for (int i = 0; i < 32; ++i) x.at<float>({0, 0, i}) = static_cast<float>(i + 1);
  Tensor a = x.clone(), b = x.clone();
  apply_rotary(a, table, std::nullopt, std::nullopt, true, false, 1);  // pairs (0, 1)
  EXPECT_EQ(a.at<float>({0, 0, 0}), -2.0f);
  EXPECT_EQ(a.at<float>({0, 0, 1}), 1.0f);
  apply_rotary(b, table, std::nullopt, std::nullopt, false, false, 1);  // pairs (0, 16)
  EXPECT_EQ(b.at<float>({0, 0, 0}), -17.0f);
  EXPECT_EQ(b.at<float>({0, 0, 16}), 1.0f);
  EXPECT_EQ(b.at<float>({0, 0, 1}), 2.0f);
}

TEST_P(Norms, HadamardMatchesTheSylvesterMatrix) {
  for (int64_t n : {128, 16, 1024})
    for (DType dtype : {DType::bf16, DType::f32}) {
      const uint64_t seed = fresh_seed();
      const Tensor x = ref::randn({65, n}, dtype, seed);
      const float scale = 1.0f / std::sqrt(static_cast<float>(n));
      const Tensor y = hadamard_transform(x, scale);
      EXPECT_EQ(y.dtype(), dtype);
      EXPECT_LT(ref::calc_diff(y, ref::tk::hadamard_transform(x, scale)),
                dtype == DType::f32 ? 1e-12 : 1e-5)
          << n << " seed " << seed;
      if (dtype == DType::f32) {  // orthonormal: applying it twice gives x back
        EXPECT_LT(ref::calc_diff(hadamard_transform(y, scale), x), 1e-12);
      }
    }
  // Row 1 of H_16 is (+1, -1, +1, -1, ...): e_1 maps to it.
  Tensor e1 = Tensor::zeros({1, 16}, DType::f32);
  e1.at<float>({0, 1}) = 1.0f;
  const Tensor h = hadamard_transform(e1);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(h.at<float>({0, i}), i % 2 == 0 ? 1.0f : -1.0f);
}

// The documented policy: norms, RoPE and the Hadamard transform do not check values; a NaN or inf
// propagates as IEEE arithmetic does, within its row (norms, Hadamard) or its rotation pair (RoPE),
// and never into other rows.
TEST_P(Norms, NonFiniteValuesStayInTheirRow) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float bad : {NAN, kInf}) {
    const uint64_t seed = fresh_seed();
    Tensor x = ref::randn({4, 128}, DType::f32, seed);
    x.at<float>({1, 5}) = bad;
    const Tensor w = ref::randn({128}, DType::f32, seed + 1, 1.0f, 0.1f);
    const Tensor clean_rows = x.slice(0, 2, 4);
    for (const Tensor& y : {rms_norm(x, w), layer_norm(x, w, w), hadamard_transform(x, 0.088f)}) {
      EXPECT_FALSE(std::isfinite(y.at<float>({1, 5})));
      for (int64_t c = 0; c < 128; ++c) {
        EXPECT_TRUE(std::isfinite(y.at<float>({0, c})));
        EXPECT_TRUE(std::isfinite(y.at<float>({2, c})));
      }
    }
    EXPECT_TRUE(bitwise_equal(rms_norm(x, w).slice(0, 2, 4), rms_norm(clean_rows, w)));
    EXPECT_FALSE(std::isfinite(hadamard_transform(x).at<float>({1, 77})));  // mixes the row
    // RoPE: only the pair of the special value changes (here (5, 5 + 32), half split).
    Tensor q = x.view({4, 2, 64}).clone();
    apply_rotary(q, yarn_cos_sin_cache(), std::nullopt, std::nullopt, false, false, 3);
    for (int64_t c = 0; c < 64; ++c)
      EXPECT_EQ(std::isfinite(q.at<float>({1, 0, c})), c != 5 && c != 37) << c;
    EXPECT_TRUE(std::isfinite(q.at<float>({1, 1, 5})));
  }
}

DSK_TK_INSTANTIATE_PER_BACKEND(Norms);

TEST(NormBackends, AreBitwiseIdentical) {
  const uint64_t seed = fresh_seed();
  const Tensor x = ref::randn({50, 7168}, DType::bf16, seed);
  const Tensor w = ref::randn({7168}, DType::f32, seed + 1);
  const Tensor h = ref::randn({50, 64, 128}, DType::bf16, seed + 2);
  const Tensor cache = yarn_cos_sin_cache();
  std::vector<Tensor> outs;
  for (Backend b : dsk::test::supported_backends()) {
    dsk::test::ScopedBackend scoped(b);
    outs.push_back(rms_norm(x, w));
    outs.push_back(layer_norm(x, w, w));
    outs.push_back(hadamard_transform(h, 0.0884f));
    outs.push_back(layer_norm(h, w.slice(0, 0, 128), w.slice(0, 128, 256)));  // rows in registers
    Tensor r = h.clone();
    apply_rotary(r.slice(2, 0, 64), cache, std::nullopt, std::nullopt, false);
    outs.push_back(r);
  }
  for (size_t i = 5; i < outs.size(); ++i) EXPECT_TRUE(bitwise_equal(outs[i], outs[i % 5])) << i;
}

}  // namespace
}  // namespace dsk::tk
