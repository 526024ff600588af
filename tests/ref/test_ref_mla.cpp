// dsk::ref::mla, the FlashMLA oracle, against hand-computed cases: two keys, the sink formula,
// invalid entries, empty rows, the token dequantization rule, and the three functions agreeing
// with each other where their contracts overlap.
#include <cmath>
#include <cstring>
#include <limits>

#include <dsk/kernels/mla/kv_format.hpp>
#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::ref {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
namespace kv_format = kernels::mla;

Tensor f32(const Shape& shape, std::initializer_list<float> values) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor i32(const Shape& shape, std::initializer_list<int32_t> values) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// q [1, 1, 4] = e0 against k0 = [1, 2, 3, 4] and k1 = [2, -1, 0, 0] with scale 0.5: logits 0.5
// and 1.0, V = the first two dims.
struct TwoKeys {
  Tensor q = f32({1, 1, 4}, {1, 0, 0, 0});
  Tensor kv = f32({2, 1, 4}, {1, 2, 3, 4, 2, -1, 0, 0});
  double lse = std::log(std::exp(0.5) + std::exp(1.0));
  double w0 = std::exp(0.5 - lse), w1 = std::exp(1.0 - lse);
  double out0 = w0 * 1 + w1 * 2, out1 = w0 * 2 + w1 * -1;
};

TEST(RefMla, TwoKeysByHand) {
  const TwoKeys c;
  const mla::SparseFwdResult r = mla::sparse_fwd(c.q, c.kv, i32({1, 1, 2}, {0, 1}), 0.5, 2);
  ASSERT_EQ(r.out.sizes(), (Shape{1, 1, 2}));
  EXPECT_FLOAT_EQ(r.out.data<float>()[0], static_cast<float>(c.out0));
  EXPECT_FLOAT_EQ(r.out.data<float>()[1], static_cast<float>(c.out1));
  EXPECT_FLOAT_EQ(r.lse.data<float>()[0], static_cast<float>(c.lse));
  EXPECT_FLOAT_EQ(r.max_logits.data<float>()[0], 1.0f);
}

TEST(RefMla, SinkScalesOutAndLeavesLse) {
  const TwoKeys c;
  const Tensor indices = i32({1, 1, 2}, {1, 0});  // order does not matter
  for (float sink : {-1.5f, 0.0f, 2.0f}) {
    const auto r = mla::sparse_fwd(c.q, c.kv, indices, 0.5, 2, f32({1}, {sink}));
    // exp(lse) / (exp(lse) + exp(sink)): the sink is one more logit that has no value row.
    const double factor = std::exp(c.lse) / (std::exp(c.lse) + std::exp(sink));
    EXPECT_FLOAT_EQ(r.out.data<float>()[0], static_cast<float>(c.out0 * factor)) << sink;
    EXPECT_FLOAT_EQ(r.out.data<float>()[1], static_cast<float>(c.out1 * factor)) << sink;
    EXPECT_FLOAT_EQ(r.lse.data<float>()[0], static_cast<float>(c.lse)) << sink;
  }
  const auto plus = mla::sparse_fwd(c.q, c.kv, indices, 0.5, 2, f32({1}, {kInf}));
  EXPECT_EQ(plus.out.data<float>()[0], 0.0f);
  EXPECT_EQ(plus.out.data<float>()[1], 0.0f);
  EXPECT_FLOAT_EQ(plus.lse.data<float>()[0], static_cast<float>(c.lse));
  const auto minus = mla::sparse_fwd(c.q, c.kv, indices, 0.5, 2, f32({1}, {-kInf}));
  EXPECT_FLOAT_EQ(minus.out.data<float>()[0], static_cast<float>(c.out0));
}

TEST(RefMla, InvalidEntriesAndEmptyRows) {
  const TwoKeys c;
  const auto both = mla::sparse_fwd(c.q, c.kv, i32({1, 1, 2}, {0, 1}), 0.5, 2);
  // -1, s_kv, INT32_MIN / MAX and entries past topk_length do not count.
  const Tensor mixed = i32({1, 1, 7}, {-1, 0, std::numeric_limits<int32_t>::min(), 2, 1,
                                       std::numeric_limits<int32_t>::max(), 0});
  const auto r = mla::sparse_fwd(c.q, c.kv, mixed, 0.5, 2, std::nullopt, i32({1}, {6}));
  EXPECT_TRUE(allclose(r.out, both.out, {.abs_tol = 1e-7, .rel_tol = 1e-6}));
  EXPECT_FLOAT_EQ(r.lse.data<float>()[0], both.lse.data<float>()[0]);
  // Nothing valid (and topk_length 0): out 0, lse +inf, max_logits -inf, with or without a sink.
  for (const auto& length : {std::optional<Tensor>(), std::optional<Tensor>(i32({1}, {0}))}) {
    const Tensor indices = length ? i32({1, 1, 2}, {0, 1}) : i32({1, 1, 2}, {-1, 2});
    const auto e = mla::sparse_fwd(c.q, c.kv, indices, 0.5, 2, f32({1}, {0.25f}), length);
    EXPECT_EQ(e.out.data<float>()[0], 0.0f);
    EXPECT_EQ(e.out.data<float>()[1], 0.0f);
    EXPECT_EQ(e.lse.data<float>()[0], kInf);
    EXPECT_EQ(e.max_logits.data<float>()[0], -kInf);
  }
}

// n tokens of random kv quantized with the header's per-token function, as [n, 1, 1, 656] bytes,
// and the bf16 [n, 576] values they stand for by the f32 rule (code * scale, exact for the
// power-of-two scales).
struct Tokens {
  Tensor bytes, values;
};
Tokens make_tokens(int64_t n, uint64_t seed) {
  const Tensor kv = randn({n, kv_format::kQkDim}, DType::f32, seed, 0.0f, 0.3f);
  Tokens t{Tensor::empty({n, 1, 1, kv_format::kTokenBytes}, DType::u8),
           Tensor::empty({n, kv_format::kQkDim}, DType::bf16)};
  for (int64_t i = 0; i < n; ++i) {
    const float* x = kv.data<float>() + i * kv_format::kQkDim;
    bf16 rope[kv_format::kRopeDim];
    for (int64_t r = 0; r < kv_format::kRopeDim; ++r)
      rope[r] = numeric::f32_to_bf16(x[kv_format::kLatentDim + r]);
    uint8_t* token = t.bytes.data<uint8_t>() + i * kv_format::kTokenBytes;
    kv_format::quantize_token(x, rope, token);
    bf16* v = t.values.data<bf16>() + i * kv_format::kQkDim;
    for (int64_t d = 0; d < kv_format::kLatentDim; ++d)
      v[d] = numeric::f32_to_bf16(numeric::e4m3_to_f32(e4m3{token[d]}) *
                                  kv_format::token_scale(token, d / kv_format::kScaleTile));
    std::memcpy(v + kv_format::kLatentDim, rope, sizeof(rope));
  }
  return t;
}

TEST(RefMla, DequantizeTokensUsesTheF32Rule) {
  const Tokens t = make_tokens(9, 3);
  const Tensor values = mla::dequantize_kv_tokens(t.bytes);
  ASSERT_EQ(values.sizes(), (Shape{9, 1, 1, kv_format::kQkDim}));
  EXPECT_EQ(std::memcmp(values.data_ptr(), t.values.data_ptr(), t.values.nbytes()), 0);
  // A strided view of the same tokens (rows 2 x 656 bytes apart), as e4m3, reads the same values.
  Tensor wide = Tensor::empty({9, 2 * kv_format::kTokenBytes}, DType::u8);
  Tensor strided = wide.slice(1, 0, kv_format::kTokenBytes);
  strided.copy_(t.bytes.view({9, kv_format::kTokenBytes}));
  const Tensor again = mla::dequantize_kv_tokens(strided.reinterpret(DType::e4m3));
  EXPECT_EQ(std::memcmp(again.data_ptr(), t.values.data_ptr(), t.values.nbytes()), 0);
}

TEST(RefMla, SparseDecodeIsSparseFwdOverTheDequantizedCache) {
  // 12 tokens in 4 pages of 3; slots 5 and 7 (unreferenced) hold NaN bytes.
  const int64_t n = 12, b = 2, s_q = 2, h_q = 3, topk = 5;
  Tokens t = make_tokens(n, 4);
  for (int64_t slot : {5, 7})
    std::memset(t.bytes.data<uint8_t>() + slot * kv_format::kTokenBytes, 0xFF,
                kv_format::kTokenBytes);
  const Tensor cache = t.bytes.view({4, 3, 1, kv_format::kTokenBytes});
  const Tensor q = randn({b, s_q, h_q, kv_format::kQkDim}, DType::bf16, 5);
  const Tensor indices = i32({b, s_q, topk}, {0,  -1, 3,  11, 2,    //
                                              -1, -1, -1, -1, -1,   // all invalid
                                              4,  6,  -1, 8,  9,    //
                                              1,  10, 5,  7,  0});  // 5, 7 past topk_length 2
  const Tensor lengths = i32({b}, {5, 2});
  const Tensor sinks = f32({h_q}, {0.5f, -kInf, kInf});
  const auto r = mla::sparse_decode(q, cache, indices, 0.2, 512, sinks, lengths);
  ASSERT_EQ(r.out.sizes(), (Shape{b, s_q, h_q, 512}));
  ASSERT_EQ(r.lse.sizes(), (Shape{b, h_q, s_q}));
  // The same rows through sparse_fwd over the dequantized values (-1 stays invalid there).
  const Tensor kv = t.values.view({n, 1, kv_format::kQkDim});
  for (int64_t i = 0; i < b; ++i)
    for (int64_t s = 0; s < s_q; ++s) {
      const Tensor qi = q.select(0, i).slice(0, s, s + 1);
      const Tensor idx = indices.select(0, i).slice(0, s, s + 1).unsqueeze(1);
      const auto want =
          mla::sparse_fwd(qi, kv, idx, 0.2, 512, sinks, i32({1}, {lengths.data<int32_t>()[i]}));
      EXPECT_TRUE(allclose(r.out.select(0, i).slice(0, s, s + 1), want.out,
                           {.abs_tol = 1e-7, .rel_tol = 1e-6}))
          << i << "," << s;
      EXPECT_TRUE(allclose(r.lse.select(0, i).slice(1, s, s + 1).transpose(0, 1), want.lse,
                           {.abs_tol = 1e-7, .rel_tol = 1e-6}))
          << i << "," << s;
    }
  EXPECT_EQ(r.lse.at<float>({0, 0, 1}), kInf);     // the all-invalid row
  EXPECT_EQ(r.out.at<float>({0, 0, 2, 7}), 0.0f);  // the +inf sink
  Tensor bad = indices.clone();
  bad.data<int32_t>()[3] = 12;
  EXPECT_THROW(mla::sparse_decode(q, cache, bad, 0.2), Error);
  bad.data<int32_t>()[3] = -2;
  EXPECT_THROW(mla::sparse_decode(q, cache, bad, 0.2), Error);
}

TEST(RefMla, DenseDecodeIsSparseFwdOverEachVisiblePrefix) {
  // Two kv heads, pages of 4, request 0 of length 7 through blocks {3, 0}, request 1 empty.
  const int64_t b = 2, s_q = 3, h_q = 4, h_kv = 2, d = 16, page = 4;
  const Tensor cache = randn({4, page, h_kv, d}, DType::bf16, 6);
  const Tensor q = randn({b, s_q, h_q, d}, DType::bf16, 7);
  const Tensor table = i32({b, 2}, {3, 0, 9, 9});  // request 1 reads no block
  const Tensor seqlens = i32({b}, {7, 0});
  for (bool causal : {false, true}) {
    const auto r = mla::dense_decode(q, cache, table, seqlens, 0.3, 8, causal);
    for (int64_t g = 0; g < h_kv; ++g) {
      // Request 0's keys of kv head g in order: slots 0..3 of block 3, then 0..2 of block 0.
      Tensor kv = Tensor::empty({7, 1, d}, DType::bf16);
      for (int64_t s = 0; s < 7; ++s)
        kv.select(0, s).select(0, 0).copy_(
            cache.select(0, s < 4 ? 3 : 0).select(0, s % 4).select(0, g));
      for (int64_t t = 0; t < s_q; ++t) {
        const int64_t visible = causal ? 7 - s_q + t + 1 : 7;
        Tensor idx = Tensor::empty({1, 1, visible}, DType::i32);
        for (int64_t s = 0; s < visible; ++s) idx.data<int32_t>()[s] = static_cast<int32_t>(s);
        const Tensor qt = q.select(0, 0).slice(0, t, t + 1).slice(1, 2 * g, 2 * g + 2);
        const auto want = mla::sparse_fwd(qt, kv, idx, 0.3, 8);
        EXPECT_TRUE(allclose(r.out.select(0, 0).slice(0, t, t + 1).slice(1, 2 * g, 2 * g + 2),
                             want.out, {.abs_tol = 1e-7, .rel_tol = 1e-6}))
            << causal << g << t;
        for (int64_t hh = 0; hh < 2; ++hh)
          EXPECT_FLOAT_EQ(r.lse.at<float>({0, 2 * g + hh, t}), want.lse.data<float>()[hh]);
      }
    }
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t h = 0; h < h_q; ++h) {
        EXPECT_EQ(r.lse.at<float>({1, h, t}), kInf);
        EXPECT_EQ(r.out.at<float>({1, t, h, 5}), 0.0f);
      }
  }
  // A table too short for the length, or a block outside the cache.
  EXPECT_THROW(mla::dense_decode(q, cache, table, i32({b}, {9, 0}), 0.3, 8), Error);
  EXPECT_THROW(mla::dense_decode(q, cache, i32({b, 2}, {4, 0, 0, 0}), seqlens, 0.3, 8), Error);
}

}  // namespace
}  // namespace dsk::ref
