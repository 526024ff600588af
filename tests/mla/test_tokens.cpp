// The 656-byte MLA token through mla::quantize_kv_tokens / dequantize_kv_tokens: power-of-two
// scales by the formula (the 1e-4 floor for all-zero and tiny tiles), codes e4m3(x / scale),
// RoPE bytes untouched, the dequantized values, idempotence, strided inputs, thread counts, bad
// inputs.
#include <cmath>
#include <cstring>

#include <dsk/core/error.hpp>

#include "common/isa_test.hpp"
#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

constexpr int64_t kTile = kv_format::kScaleTile;

// The scale the format prescribes for a tile whose largest |x| is amax, computed independently of
// the header: 2^ceil(log2(max(amax / 448, 1e-4))), the quotient in f32 like upstream's quant.py.
float expected_scale(float amax) {
  const float q = std::max(amax / 448.0f, 1e-4f);
  return std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(static_cast<double>(q)))));
}

// kv f32 [n, 576] whose latent tiles span every scale regime: all zero, tiny (below the floor),
// ordinary, large, and amax exactly 448 * 2^k.
Tensor varied_kv(int64_t n) {
  Tensor kv = ref::randn({n, kv_format::kQkDim}, DType::f32, fresh_seed());
  const float tile_gain[] = {0.0f, 1e-7f, 1e-3f, 1.0f, 37.0f, 1e4f};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < kv_format::kNumScales; ++t) {
      float* x = kv.data<float>() + i * kv_format::kQkDim + t * kTile;
      const float gain = tile_gain[(i + 3 * t) % 6];
      for (int64_t d = 0; d < kTile; ++d) x[d] *= gain;
      if ((i + t) % 7 == 0) x[5] = -448.0f * 4.0f;  // amax = 448 * 2^2 exactly: scale 4
    }
  return kv;
}

const uint8_t* token(const Tensor& tokens, int64_t i) {
  return tokens.data<uint8_t>() + i * kv_format::kTokenBytes;
}

TEST(KvTokens, QuantizeFollowsTheFormula) {
  SCOPED_TRACE(seed_note());
  const int64_t n = 97;
  const Tensor kv = varied_kv(n);
  const Tensor tokens = mla::quantize_kv_tokens(kv);
  ASSERT_EQ(tokens.sizes(), (Shape{n, kv_format::kTokenBytes}));
  ASSERT_EQ(tokens.dtype(), DType::u8);
  for (int64_t i = 0; i < n; ++i) {
    const float* x = kv.data<float>() + i * kv_format::kQkDim;
    for (int64_t t = 0; t < kv_format::kNumScales; ++t) {
      float amax = 0.0f;
      for (int64_t d = 0; d < kTile; ++d) amax = std::max(amax, std::fabs(x[t * kTile + d]));
      float scale;
      std::memcpy(&scale, token(tokens, i) + kv_format::kScaleOffset + 4 * t, 4);
      ASSERT_EQ(scale, expected_scale(amax)) << "token " << i << " tile " << t << " amax " << amax;
      for (int64_t d = t * kTile; d < (t + 1) * kTile; ++d)
        ASSERT_EQ(token(tokens, i)[d], numeric::f32_to_e4m3(x[d] / scale).bits)
            << "token " << i << " dim " << d;
    }
    for (int64_t r = 0; r < kv_format::kRopeDim; ++r) {
      bf16 rope;
      std::memcpy(&rope, token(tokens, i) + kv_format::kRopeOffset + 2 * r, 2);
      ASSERT_EQ(rope.bits, numeric::f32_to_bf16(x[kv_format::kLatentDim + r]).bits)
          << i << "," << r;
    }
  }
}

TEST(KvTokens, ZeroAndTinyTilesGetTheFloorScale) {
  Tensor kv = Tensor::zeros({2, kv_format::kQkDim}, DType::f32);
  kv.data<float>()[kv_format::kQkDim + 3] = 1e-7f;  // token 1, tile 0: tiny
  const Tensor tokens = mla::quantize_kv_tokens(kv);
  const float floor_scale = std::ldexp(1.0f, -13);  // 2^ceil(log2(1e-4))
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t t = 0; t < kv_format::kNumScales; ++t)
      EXPECT_EQ(kv_format::token_scale(token(tokens, i), t), floor_scale) << i << "," << t;
  for (int64_t d = 0; d < kv_format::kLatentDim; ++d) EXPECT_EQ(token(tokens, 0)[d], 0) << d;
  EXPECT_EQ(token(tokens, 1)[3], numeric::f32_to_e4m3(1e-7f / floor_scale).bits);
}

TEST(KvTokens, Bf16RopeBytesAreCopiedUntouched) {
  const Tensor kv = bf16_data({33, kv_format::kQkDim}, 1.0f);
  const Tensor tokens = mla::quantize_kv_tokens(kv);
  for (int64_t i = 0; i < 33; ++i)
    EXPECT_EQ(std::memcmp(token(tokens, i) + kv_format::kRopeOffset,
                          kv.data<bf16>() + i * kv_format::kQkDim + kv_format::kLatentDim,
                          2 * kv_format::kRopeDim),
              0)
        << i;
  // The same values in f32 give the same tokens (bf16 data is exact in f32).
  Tensor as_f32 = Tensor::empty(kv.sizes(), DType::f32);
  for (int64_t i = 0; i < kv.numel(); ++i)
    as_f32.data<float>()[i] = numeric::bf16_to_f32(kv.data<bf16>()[i]);
  EXPECT_TRUE(bitwise_equal(mla::quantize_kv_tokens(as_f32), tokens));
}

TEST(KvTokens, DequantizeGivesCodeTimesScale) {
  SCOPED_TRACE(seed_note());
  const int64_t n = 61;
  const Tensor tokens = mla::quantize_kv_tokens(varied_kv(n));
  const Tensor values = mla::dequantize_kv_tokens(tokens);
  ASSERT_EQ(values.sizes(), (Shape{n, kv_format::kQkDim}));
  ASSERT_EQ(values.dtype(), DType::bf16);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* tk = token(tokens, i);
    const bf16* v = values.data<bf16>() + i * kv_format::kQkDim;
    for (int64_t d = 0; d < kv_format::kLatentDim; ++d) {
      // Exact: a 4-bit significand times a power of two fits bf16.
      const float want = numeric::e4m3_to_f32(e4m3{tk[d]}) * kv_format::token_scale(tk, d / kTile);
      ASSERT_EQ(numeric::bf16_to_f32(v[d]), want) << i << "," << d;
    }
    ASSERT_EQ(std::memcmp(v + kv_format::kLatentDim, tk + kv_format::kRopeOffset,
                          2 * kv_format::kRopeDim),
              0)
        << i;
  }
  // The reference's f32 rule (upstream's dequantize_k_cache) agrees bit for bit.
  EXPECT_TRUE(bitwise_equal(ref::mla::dequantize_kv_tokens(tokens), values));
}

TEST(KvTokens, RoundTripIsIdempotentAndCloseToTheInput) {
  SCOPED_TRACE(seed_note());
  const Tensor kv = ref::randn({40, kv_format::kQkDim}, DType::f32, fresh_seed());
  const Tensor once = mla::dequantize_kv_tokens(mla::quantize_kv_tokens(kv));
  const Tensor twice = mla::dequantize_kv_tokens(mla::quantize_kv_tokens(once));
  EXPECT_TRUE(bitwise_equal(once, twice)) << "dequantized values are fixed points";
  // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for values in the normal range of a tile.
  for (int64_t i = 0; i < kv.numel(); ++i) {
    const float x = kv.data<float>()[i], y = numeric::bf16_to_f32(once.data<bf16>()[i]);
    if (std::fabs(x) > 0.1f) {
      ASSERT_LE(std::fabs(y - x), std::fabs(x) / 16 + 1e-6f) << i;
    }
  }
}

TEST(KvTokens, StridedAndHigherRankInputs) {
  const Tensor kv = bf16_data({20, kv_format::kQkDim}, 1.0f);
  const Tensor tokens = mla::quantize_kv_tokens(kv);
  EXPECT_TRUE(bitwise_equal(mla::quantize_kv_tokens(strided_copy(kv)), tokens));
  const Tensor values = mla::dequantize_kv_tokens(tokens);
  EXPECT_TRUE(bitwise_equal(mla::dequantize_kv_tokens(strided_copy(tokens)), values));
  // A [blocks, page, 1, 656] cache, as e4m3 and as int8, dequantizes to [blocks, page, 1, 576].
  const Tensor cache = tokens.view({5, 4, 1, kv_format::kTokenBytes});
  for (DType as : {DType::e4m3, DType::i8}) {
    const Tensor v = mla::dequantize_kv_tokens(cache.reinterpret(as));
    ASSERT_EQ(v.sizes(), (Shape{5, 4, 1, kv_format::kQkDim})) << as;
    EXPECT_TRUE(bitwise_equal(v.view({20, kv_format::kQkDim}), values)) << as;
  }
  const Tensor none = mla::quantize_kv_tokens(Tensor::empty({0, kv_format::kQkDim}, DType::f32));
  EXPECT_EQ(none.sizes(), (Shape{0, kv_format::kTokenBytes}));
}

TEST(KvTokens, SameBytesForAnyThreadCount) {
  const Tensor kv = ref::randn({1000, kv_format::kQkDim}, DType::f32, fresh_seed());
  const int saved = get_num_threads();
  set_num_threads(1);
  const Tensor one = mla::quantize_kv_tokens(kv);
  const Tensor one_values = mla::dequantize_kv_tokens(one);
  set_num_threads(std::max(2, saved));
  EXPECT_TRUE(bitwise_equal(mla::quantize_kv_tokens(kv), one));
  EXPECT_TRUE(bitwise_equal(mla::dequantize_kv_tokens(one), one_values));
  set_num_threads(saved);
}

// Raises dsk::Error naming the function.
template <class Call>
void expect_error(const Call& call, const char* function, const char* what) {
  try {
    call();
    ADD_FAILURE() << "no dsk::Error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(function), std::string::npos) << e.what();
  }
}

TEST(KvTokens, BadInputsRaise) {
  const Tensor kv = ref::randn({4, kv_format::kQkDim}, DType::f32, 1);
  const char* q = "quantize_kv_tokens";
  expect_error([&] { mla::quantize_kv_tokens(ref::randn({4, 576}, DType::f16, 1)); }, q, "f16");
  expect_error([&] { mla::quantize_kv_tokens(kv.view({2, 2, 576})); }, q, "3-D kv");
  expect_error([&] { mla::quantize_kv_tokens(ref::randn({4, 575}, DType::f32, 1)); }, q, "575");
  expect_error([&] { mla::quantize_kv_tokens(kv.slice(1, 0, 512)); }, q, "512 dims");
  const Tensor wide = ref::randn({4, 2 * kv_format::kQkDim}, DType::f32, 1);
  const Tensor every_other = wide.view({4, kv_format::kQkDim, 2}).select(2, 0);
  expect_error([&] { mla::quantize_kv_tokens(every_other); }, q, "strided last dimension");
  const Tensor tokens = mla::quantize_kv_tokens(kv);
  const char* dq = "dequantize_kv_tokens";
  expect_error([&] { mla::dequantize_kv_tokens(kv); }, dq, "f32 tokens");
  expect_error([&] { mla::dequantize_kv_tokens(tokens.slice(1, 0, 655)); }, dq, "655 bytes");
  const Tensor wide_tokens = Tensor::zeros({4, 2 * kv_format::kTokenBytes}, DType::u8);
  expect_error(
      [&] {
        mla::dequantize_kv_tokens(wide_tokens.view({4, kv_format::kTokenBytes, 2}).select(2, 0));
      },
      dq, "strided bytes");
  expect_error([&] { mla::dequantize_kv_tokens(Tensor::zeros({}, DType::u8)); }, dq, "0-d");
}

}  // namespace
}  // namespace dsk::mla_test

// The kernels' FP8 token dequantization on AVX-512 (test_dequantize_avx512.cpp).
namespace dsk::test {
DSK_REGISTER_ISA_TESTS(mla_dequantize_avx512_tests);
}  // namespace dsk::test
