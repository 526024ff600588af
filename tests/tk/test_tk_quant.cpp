// dsk::tk quantisation: per-token / per-block / per-channel casts bit-exact against dsk::ref::tk
// and dsk::gemm's reference quantizers in every scale layout, non-finite inputs, the fused SwiGLU
// and RMSNorm casts (bit-identical to unfused-then-cast), and the cast back.
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/isa_test.hpp"
#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

using test::bitwise_equal;
using test::blocks_of;
using test::fresh_seed;
using test::Layout;
using test::same_cast;

// The layout each flag combination promises.
void expect_layout(const QuantTensor& q, int64_t rows, int64_t blocks, bool col_major,
                   bool packed) {
  const int64_t cols = packed ? blocks_of(blocks, 4) : blocks;
  ASSERT_EQ(q.sf.sizes(), (Shape{rows, cols}));
  EXPECT_EQ(q.sf.dtype(), packed ? DType::i32 : DType::f32);
  if (col_major) {
    EXPECT_EQ(q.sf.stride(0), 1);
    EXPECT_EQ(q.sf.stride(1), (rows + 3) / 4 * 4);
  } else {
    EXPECT_EQ(q.sf.stride(0), cols);
  }
  if (packed && blocks % 4 != 0)  // unused exponent bytes hold 1.0
    for (int64_t r = 0; r < rows; ++r) {
      const auto word = static_cast<uint32_t>(q.sf.at<int32_t>({r, cols - 1}));
      for (int64_t b = blocks % 4; b < 4; ++b) EXPECT_EQ((word >> (8 * b)) & 0xFF, 127u);
    }
}

constexpr Layout kLayouts[] = {{false, false, false},
                               {false, true, false},
                               {true, true, false},
                               {false, true, true},
                               {true, true, true}};

using Quant = test::PerBackend;

TEST_P(Quant, PerTokenCastMatchesTheReferenceInEveryLayout) {
  for (int64_t hidden : {7168, 2048, 512, 128})
    for (int64_t tokens : {1, 7, 4096}) {
      if (tokens * hidden > (int64_t{1} << 21)) continue;  // keeps the fp64 reference quick
      for (DType dtype : {DType::bf16, DType::f32})
        for (std::string_view fmt : {"e4m3", "e2m1"})
          for (int g : {128, 32, static_cast<int>(hidden)})
            for (const Layout& l : kLayouts) {
              if (fmt == "e2m1" && g != 32 && !l.round_sf) continue;
              // Large shapes: bf16 in, the plain and the GEMM-ready layouts only (keeps the test
              // quick).
              if (tokens == 4096 &&
                  (dtype != DType::bf16 || (&l != &kLayouts[0] && &l != &kLayouts[4])))
                continue;
              const uint64_t seed = fresh_seed();
              const Tensor x = ref::randn({tokens, hidden}, dtype, seed, 0.0f, 3.0f);
              const QuantTensor got = per_token_cast(x, fmt, g, l.col_major, l.round_sf, l.packed);
              SCOPED_TRACE(::testing::Message() << tokens << "x" << hidden << " " << dtype << " "
                                                << fmt << " g=" << g << " col_major " << l.col_major
                                                << " packed " << l.packed << " seed " << seed);
              expect_layout(got, tokens, blocks_of(hidden, g), l.col_major, l.packed);
              EXPECT_TRUE(same_cast(got, ref::tk::per_token_cast(x, fmt, g, l.round_sf), tokens,
                                    blocks_of(hidden, g)));
            }
    }
}

// Column-major scales are written through tiles of 16 rows: row counts around and across a tile
// (and their split between threads), a last packed word the blocks do not fill (200 columns in
// blocks of 128: its two unused bytes keep 1.0), f32 and packed scales, all three row casts.
TEST_P(Quant, ColumnMajorScalesOfAnyRowCountMatchTheReference) {
  for (int64_t rows : {15, 16, 17, 37, 100}) {
    const uint64_t seed = fresh_seed();
    const Tensor x = ref::randn({rows, 2 * 200}, DType::bf16, seed, 0.0f, 2.0f);
    const Tensor w = ref::randn({200}, DType::f32, seed + 1, 1.0f, 0.2f);
    const Tensor y = rms_norm(x.slice(1, 0, 200), w, 1e-6f, DType::f32);
    const Tensor s = swiglu_forward(x, std::nullopt, 10.0f);
    for (const Layout& l : {kLayouts[2], kLayouts[4]})
      for (std::string_view fmt : {"e4m3", "e2m1"}) {
        const int g = fmt == "e4m3" ? 128 : 32;
        SCOPED_TRACE(::testing::Message()
                     << rows << " rows " << fmt << " packed " << l.packed << " seed " << seed);
        const QuantTensor got = per_token_cast(x, fmt, g, true, true, l.packed);
        expect_layout(got, rows, blocks_of(400, g), true, l.packed);
        EXPECT_TRUE(
            same_cast(got, ref::tk::per_token_cast(x, fmt, g, true), rows, blocks_of(400, g)));
        const QuantTensor narrow = per_token_cast(x.slice(1, 0, 200), fmt, g, true, true, l.packed);
        expect_layout(narrow, rows, blocks_of(200, g), true, l.packed);
        EXPECT_TRUE(same_cast(narrow, ref::tk::per_token_cast(x.slice(1, 0, 200), fmt, g, true),
                              rows, blocks_of(200, g)));
        const QuantTensor norm = rmsnorm_forward_and_per_token_cast(x.slice(1, 0, 200), w, 1e-6f,
                                                                    fmt, g, true, true, l.packed);
        EXPECT_TRUE(
            same_cast(norm, ref::tk::per_token_cast(y, fmt, g, true), rows, blocks_of(200, g)));
        const QuantTensor swiglu = swiglu_forward_and_per_token_cast(
            x, fmt, g, std::nullopt, 10.0f, std::nullopt, std::nullopt, true, true, l.packed);
        EXPECT_TRUE(
            same_cast(swiglu, ref::tk::per_token_cast(s, fmt, g, true), rows, blocks_of(200, g)));
      }
  }
}

TEST_P(Quant, PerTokenCastIsDeepGemmsQuantizer) {
  for (int64_t hidden : {7168, 200}) {  // 200: a partial last block
    const uint64_t seed = fresh_seed();
    const Tensor x = ref::randn({33, hidden}, DType::bf16, seed, 0.0f, 2.0f);
    for (bool ue8m0 : {false, true}) {
      const gemm::Fp8Tensor want = gemm::per_token_cast_to_fp8(x, ue8m0, 128, ue8m0);
      const QuantTensor got = per_token_cast(x, "e4m3", 128, false, ue8m0, ue8m0);
      EXPECT_TRUE(bitwise_equal(got.data, want.data)) << hidden << " seed " << seed;
      EXPECT_TRUE(bitwise_equal(got.sf, want.sf)) << hidden << " seed " << seed;
      const gemm::Fp8Tensor want4 = gemm::per_token_cast_to_fp4(x, ue8m0, 32, ue8m0);
      const QuantTensor got4 = per_token_cast(x, "e2m1", 32, false, ue8m0, ue8m0);
      EXPECT_TRUE(bitwise_equal(got4.data, want4.data)) << hidden << " seed " << seed;
      EXPECT_TRUE(bitwise_equal(got4.sf, want4.sf)) << hidden << " seed " << seed;
    }
  }
}

TEST_P(Quant, NonFiniteValuesFollowTheReference) {
  const Tensor clean = ref::randn({4, 512}, DType::f32, fresh_seed());
  Tensor x = clean.clone();
  x.at<float>({0, 5}) = NAN;
  x.at<float>({1, 130}) = std::numeric_limits<float>::infinity();
  x.at<float>({2, 300}) = -std::numeric_limits<float>::infinity();
  // A negative NaN next to a positive one: its code keeps its sign (0xFF) with both kinds of
  // scales, and with f32 scales the other codes of its block are 0x7F (quant::quantize_e4m3).
  x.at<float>({3, 7}) = -std::numeric_limits<float>::quiet_NaN();
  x.at<float>({3, 9}) = std::numeric_limits<float>::quiet_NaN();
  for (bool round_sf : {false, true}) {
    for (std::string_view fmt : {"e4m3", "e2m1"}) {
      const QuantTensor got = per_token_cast(x, fmt, 128, false, round_sf);
      EXPECT_TRUE(same_cast(got, ref::tk::per_token_cast(x, fmt, 128, round_sf), 4, 4))
          << fmt << " round_sf " << round_sf;
    }
    const gemm::Fp8Tensor want = gemm::per_token_cast_to_fp8(x, round_sf);
    const QuantTensor got = per_token_cast(x, "e4m3", 128, false, round_sf);
    EXPECT_TRUE(bitwise_equal(got.data, want.data));
    // NaN sf compares unequal to itself; compare bits.
    EXPECT_TRUE(bitwise_equal(got.sf, want.sf));
  }
  // The other blocks are untouched by their neighbours' specials.
  const QuantTensor a = per_token_cast(x, "e4m3", 128), b = per_token_cast(clean, "e4m3", 128);
  EXPECT_EQ(a.sf.at<float>({0, 1}), b.sf.at<float>({0, 1}));
  EXPECT_TRUE(std::isnan(a.sf.at<float>({0, 0})));
  EXPECT_TRUE(std::isinf(a.sf.at<float>({1, 1})));
  for (bool round_sf : {false, true}) {
    const QuantTensor c = per_token_cast(x, "e4m3", 128, false, round_sf);
    EXPECT_EQ(c.data.at<e4m3>({3, 7}).bits, 0xFF) << "round_sf " << round_sf;
    EXPECT_EQ(c.data.at<e4m3>({3, 9}).bits, 0x7F) << "round_sf " << round_sf;
    if (!round_sf) {
      EXPECT_EQ(c.data.at<e4m3>({3, 8}).bits, 0x7F);
    }
  }
}

// bf16 rows in blocks of 32 / 64 / 128 take the 16-bit path when the inverse scale is a power of
// two; vectors with zeros, values that become e4m3 subnormals or underflow, bf16 subnormals, and
// blocks with inf or NaN (or f32 scales) take the f32 path. All of it is the reference, bit for
// bit, in per-token and per-block casts.
TEST_P(Quant, Bf16BlocksWithEveryKindOfValueMatchTheReference) {
  const uint64_t seed = fresh_seed();
  Tensor x = ref::randn({12, 1024 + 96}, DType::bf16, seed, 0.0f, 2.0f);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const auto put = [&](int64_t r, int64_t c, float v) {
    x.at<bf16>({r, c}) = numeric::f32_to_bf16(v);
  };
  for (int64_t c = 0; c < x.size(1); ++c) {
    const float u = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    put(0, c, c % 3 == 0 ? 0.0f : (c % 3 == 1 ? -0.0f : u));         // zeros
    put(1, c, u * (c % 5 == 0 ? 1e-6f : 1.0f));                      // e4m3 subnormals
    put(2, c, u * (c % 4 == 0 ? 1e-39f : 1e-30f));                   // bf16 subnormals
    put(3, c, u * std::ldexp(1.0f, static_cast<int>(c % 64) - 32));  // every binade
    put(4, c, u * 3e38f);                                            // near the top
  }
  x.at<bf16>({5, 40}) = numeric::f32_to_bf16(std::numeric_limits<float>::infinity());
  x.at<bf16>({6, 700}) = numeric::f32_to_bf16(-std::numeric_limits<float>::infinity());
  x.at<bf16>({7, 129}) = bf16{0x7FC1};
  x.at<bf16>({8, 1100}) = bf16{0x7F80 | 0x21};
  x.at<bf16>({9, 1000}) = bf16{0xFF80 | 0x21};  // a negative NaN keeps its sign
  x.at<bf16>({9, 100}) = bf16{0xFFC0};
  for (int g : {128, 64, 32})
    for (bool round_sf : {true, false}) {
      const QuantTensor got = per_token_cast(x, "e4m3", g, false, round_sf);
      EXPECT_TRUE(same_cast(got, ref::tk::per_token_cast(x, "e4m3", g, round_sf), x.size(0),
                            blocks_of(x.size(1), g)))
          << "g " << g << " round_sf " << round_sf << " seed " << seed;
      if (g != 128) continue;
      const gemm::Fp8Tensor want = gemm::per_token_cast_to_fp8(x, round_sf, 128, round_sf);
      const QuantTensor packed = per_token_cast(x, "e4m3", 128, false, round_sf, round_sf);
      EXPECT_TRUE(bitwise_equal(packed.data, want.data)) << "seed " << seed;
      EXPECT_TRUE(bitwise_equal(packed.sf, want.sf)) << "seed " << seed;
    }
  // Per-block casts: blocks of a multiple of 32 columns that tile the row take the bf16 amax
  // pass, the others the f32 one; blocks whose amax is a number take the integer e4m3 codes
  // with the fallback per vector.
  for (BlockSize bs : {BlockSize{1, 32}, {2, 32}, {3, 160}, {4, 64}, {1, 128}, {128, 128}})
    for (bool round_sf : {true, false}) {
      const QuantTensor got = per_block_cast(x, "e4m3", bs, false, round_sf);
      EXPECT_TRUE(same_cast(got, ref::tk::per_block_cast(x, "e4m3", bs, round_sf),
                            blocks_of(x.size(0), bs.first), blocks_of(x.size(1), bs.second)))
          << "block " << bs.first << "x" << bs.second << " round_sf " << round_sf << " seed "
          << seed;
    }
}

// NaNs of both signs in blocks with f32 and UE8M0 scales: per-token (f32 and bf16 rows),
// per-block and per-channel codes equal the reference and dsk::gemm's quantizers bit for bit (the
// NaN rule of quant::quantize_e4m3, which does not depend on the compiler's operand order).
TEST_P(Quant, NaNCodesOfBothSignsMatchTheReferenceInEveryCast) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Tensor x = ref::randn({256, 512}, DType::f32, seed);
  for (auto [r, c, sign] :
       {std::tuple{0, 3, -1.0f}, {0, 70, 1.0f}, {130, 300, -1.0f}, {255, 511, -1.0f}})
    x.at<float>({r, c}) = std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
  Tensor xb = Tensor::empty(x.sizes(), DType::bf16);
  for (int64_t i = 0; i < x.numel(); ++i)
    xb.data<bf16>()[i] = numeric::f32_to_bf16(x.data<float>()[i]);
  for (bool round_sf : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "round_sf " << round_sf);
    for (const Tensor& in : {x, xb}) {
      const QuantTensor t = per_token_cast(in, "e4m3", 128, false, round_sf);
      EXPECT_TRUE(same_cast(t, ref::tk::per_token_cast(in, "e4m3", 128, round_sf), 256, 4));
      EXPECT_TRUE(bitwise_equal(t.data, gemm::per_token_cast_to_fp8(in, round_sf).data));
      EXPECT_EQ(t.data.at<e4m3>({0, 3}).bits, 0xFF);
    }
    const QuantTensor b = per_block_cast(xb, "e4m3", {128, 128}, false, round_sf);
    EXPECT_TRUE(same_cast(b, ref::tk::per_block_cast(xb, "e4m3", {128, 128}, round_sf), 2, 4));
    EXPECT_TRUE(bitwise_equal(b.data, gemm::per_block_cast_to_fp8(xb, round_sf).data));
    const QuantTensor ch = per_channel_cast(xb, "e4m3", 128, round_sf);
    EXPECT_TRUE(same_cast(ch, ref::tk::per_channel_cast(xb, "e4m3", 128, round_sf), 2, 512));
    EXPECT_TRUE(bitwise_equal(ch.data, gemm::per_channel_cast_to_fp8(xb, round_sf).data));
  }
}

TEST_P(Quant, PerBlockAndPerChannelCasts) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 512}, {300, 200}, {1, 7168}}) {
    const uint64_t seed = fresh_seed();
    const Tensor x = ref::randn({rows, cols}, DType::bf16, seed, 0.0f, 2.0f);
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " seed " << seed);
    for (BlockSize bs : {BlockSize{128, 128}, BlockSize{32, 32}})
      for (std::string_view fmt : {"e4m3", "e2m1"})
        for (const Layout& l : kLayouts) {
          const QuantTensor got = per_block_cast(x, fmt, bs, l.col_major, l.round_sf, l.packed);
          const int64_t br = blocks_of(rows, bs.first), bc = blocks_of(cols, bs.second);
          expect_layout(got, br, bc, l.col_major, l.packed);
          EXPECT_TRUE(same_cast(got, ref::tk::per_block_cast(x, fmt, bs, l.round_sf), br, bc));
        }
    for (bool round_sf : {false, true}) {
      const gemm::Fp8Tensor want = gemm::per_block_cast_to_fp8(x, round_sf);
      const QuantTensor got = per_block_cast(x, "e4m3", {128, 128}, false, round_sf);
      EXPECT_TRUE(bitwise_equal(got.data, want.data));
      EXPECT_TRUE(bitwise_equal(got.sf, want.sf));
      const QuantTensor ch = per_channel_cast(x, "e4m3", 128, round_sf);
      EXPECT_TRUE(same_cast(ch, ref::tk::per_channel_cast(x, "e4m3", 128, round_sf),
                            blocks_of(rows, 128), cols));
      if (rows % 128 == 0) {
        const gemm::Fp8Tensor wc = gemm::per_channel_cast_to_fp8(x, round_sf);
        EXPECT_TRUE(bitwise_equal(ch.data, wc.data));
        EXPECT_TRUE(bitwise_equal(ch.sf, wc.sf));
      }
    }
  }
}

// A weight whose codes (8 MiB) are written around the caches: bf16 rows in 128 x 128 blocks, with
// zeros and tiny values that send some 64-value groups through the plain-store fallback among
// the streamed ones, an odd width whose rows end mid-line, and a NaN block; codes and scales equal
// the reference's, on a recycled poisoned buffer.
TEST_P(Quant, PerBlockCastOfALargeWeightStreamsItsCodes) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4096, 2048}, {2050, 4100}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " seed " << seed);
    Tensor x = ref::randn({rows, cols}, DType::bf16, seed);
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 2000; ++i) {
      const int64_t r = static_cast<int64_t>(rng() % rows), c = static_cast<int64_t>(rng() % cols);
      x.at<bf16>({r, c}) = i % 2 == 0 ? bf16{0} : numeric::f32_to_bf16(1e-7f);
    }
    x.at<bf16>({300, 1000}) = bf16{0x7FC0};
    for (bool round_sf : {false, true}) {
      ref::poison(Tensor::empty({rows, cols}, DType::e4m3));
      const QuantTensor got = per_block_cast(x, "e4m3", {128, 128}, false, round_sf);
      EXPECT_TRUE(same_cast(got, ref::tk::per_block_cast(x, "e4m3", {128, 128}, round_sf),
                            blocks_of(rows, 128), blocks_of(cols, 128)))
          << "round_sf " << round_sf;
    }
  }
}

TEST_P(Quant, CastBackDequantizesEveryLayout) {
  const uint64_t seed = fresh_seed();
  const Tensor x = ref::randn({77, 7168}, DType::bf16, seed);
  for (std::string_view fmt : {"e4m3", "e2m1"})
    for (const Layout& l : kLayouts) {
      const int g = fmt == "e2m1" ? 32 : 128;
      const QuantTensor q = per_token_cast(x, fmt, g, l.col_major, l.round_sf, l.packed);
      const Tensor want = ref::tk::cast_back(q, {1, g});
      EXPECT_TRUE(bitwise_equal(cast_back(q, "fp32", {1, g}), want)) << fmt << " seed " << seed;
      const Tensor bf = cast_back(q, "bf16", {1, g});
      EXPECT_LT(ref::calc_diff(bf, want), 1e-5);
      // The round trip is as close as the format allows.
      EXPECT_LT(ref::calc_diff(want, x), fmt == "e4m3" ? 1e-3 : 2e-2);
    }
  const QuantTensor blocks = per_block_cast(x, "e4m3", {32, 32}, true, true, true);
  EXPECT_TRUE(
      bitwise_equal(cast_back(blocks, "fp32", {32, 32}), ref::tk::cast_back(blocks, {32, 32})));
}

// ---- fused casts ----

TEST_P(Quant, SwigluCastIsSwigluThenCast) {
  // 200 = 128 + 4 * 16 + 8: the kernel's eight-vector step, four whole vectors, a partial one.
  for (int64_t hidden : {2048, 512, 128, 200})
    for (int64_t rows : {1, 7, 1024}) {
      const uint64_t seed = fresh_seed();
      const Tensor x = ref::randn({rows, 2 * hidden}, DType::bf16, seed, 0.0f, 2.0f);
      const Tensor experts = ref::randint({rows}, DType::i32, seed + 1, -1, 4);
      const Tensor slots = ref::randint({rows}, DType::i32, seed + 2, -1, 3 * rows);
      const Tensor weights = ref::randn({rows, 3}, DType::f32, seed + 3);
      for (std::optional<float> clamp : {std::optional<float>{}, {0.5f}, {10.0f}})
        for (int options = 0; options < 3; ++options) {
          if (rows == 1024 && clamp != 10.0f) continue;  // keeps the test quick
          const auto pos_to_expert = options >= 1 ? std::optional<Tensor>(experts) : std::nullopt;
          const auto pos = options == 2 ? std::optional<Tensor>(slots) : std::nullopt;
          const auto w = options == 2 ? std::optional<Tensor>(weights) : std::nullopt;
          SCOPED_TRACE(::testing::Message()
                       << rows << "x" << hidden << " clamp " << clamp.value_or(0) << " options "
                       << options << " seed " << seed);
          const Tensor y = swiglu_forward(x, pos_to_expert, clamp, pos, w);
          EXPECT_LT(ref::calc_diff(y, ref::tk::swiglu_forward(x, pos_to_expert, clamp, pos, w)),
                    1e-12);
          for (int g : {32, 64, 128})
            for (const Layout& l : {kLayouts[0], kLayouts[4]}) {
              if (g != 128 && rows == 1024) continue;
              const QuantTensor fused = swiglu_forward_and_per_token_cast(
                  x, "e4m3", g, pos_to_expert, clamp, pos, w, l.col_major, l.round_sf, l.packed);
              const QuantTensor unfused =
                  per_token_cast(y, "e4m3", g, l.col_major, l.round_sf, l.packed);
              EXPECT_TRUE(bitwise_equal(fused.data, unfused.data)) << "g " << g;
              EXPECT_TRUE(bitwise_equal(fused.sf, unfused.sf)) << "g " << g;
            }
        }
    }
}

// The NaN policy (docs/tk.md): a NaN gate or up gives a NaN output value, with or without the
// clamp (whose bounds must not replace it), and nothing else in the row changes; the fused cast
// then makes that block's scale NaN, as the unfused cast of the same rows does.
TEST_P(Quant, SwigluKeepsANaNGateOrUpWithTheClamp) {
  const uint64_t seed = fresh_seed();
  const int64_t inter = 256;
  Tensor x = ref::randn({4, 2 * inter}, DType::bf16, seed, 0.0f, 2.0f);
  const bf16 nan{0x7FC0}, negative_nan{0xFFC0};
  x.at<bf16>({0, 5}) = nan;                    // gate
  x.at<bf16>({1, inter + 44}) = negative_nan;  // up
  x.at<bf16>({2, 7}) = negative_nan;           // gate
  x.at<bf16>({3, inter + 200}) = nan;          // up
  const std::vector<std::pair<int64_t, int64_t>> nans = {{0, 5}, {1, 44}, {2, 7}, {3, 200}};
  for (std::optional<float> clamp : {std::optional<float>{}, std::optional<float>{0.5f}}) {
    SCOPED_TRACE(::testing::Message() << "clamp " << clamp.value_or(0) << " seed " << seed);
    const Tensor y = swiglu_forward(x, std::nullopt, clamp);
    const Tensor expected = ref::tk::swiglu_forward(x, std::nullopt, clamp);
    int64_t nan_count = 0;
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < inter; ++c) {
        const float v = y.at<float>({r, c});
        const double e = expected.at<double>({r, c});
        nan_count += std::isnan(v) ? 1 : 0;
        EXPECT_EQ(std::isnan(v), std::isnan(e)) << r << ", " << c;
        if (!std::isnan(e)) {
          EXPECT_NEAR(v, e, 1e-5 * (1.0 + std::abs(e))) << r << ", " << c;
        }
      }
    EXPECT_EQ(nan_count, static_cast<int64_t>(nans.size()));
    for (auto [r, c] : nans) EXPECT_TRUE(std::isnan(y.at<float>({r, c}))) << r << ", " << c;
    const QuantTensor fused = swiglu_forward_and_per_token_cast(
        x, "e4m3", 128, std::nullopt, clamp, std::nullopt, std::nullopt, false, true, true);
    const QuantTensor unfused = per_token_cast(y, "e4m3", 128, false, true, true);
    EXPECT_TRUE(bitwise_equal(fused.data, unfused.data));
    EXPECT_TRUE(bitwise_equal(fused.sf, unfused.sf));
  }
}

TEST_P(Quant, RmsnormCastIsRmsnormThenCast) {
  // 176 = 128 + 48: a partial last block after the blocks whose amax the norm pass takes.
  for (int64_t hidden : {7168, 2048, 512, 128, 176})
    for (int64_t rows : {1, 7, 4096}) {
      if (rows * hidden > (int64_t{1} << 21)) continue;
      const uint64_t seed = fresh_seed();
      const Tensor x = ref::randn({rows, hidden}, DType::bf16, seed);
      const Tensor w = ref::randn({hidden}, DType::f32, seed + 1, 1.0f, 0.2f);
      SCOPED_TRACE(::testing::Message() << rows << "x" << hidden << " seed " << seed);
      const Tensor y = rms_norm(x, w, 1e-6f, DType::f32);
      for (int g : {32, 128, static_cast<int>(hidden)})
        for (const Layout& l : {kLayouts[0], kLayouts[1], kLayouts[4]}) {
          if (l.col_major && g == hidden) continue;
          const QuantTensor fused = rmsnorm_forward_and_per_token_cast(
              x, w, 1e-6f, "e4m3", g, l.col_major, l.round_sf, l.packed);
          const QuantTensor unfused =
              per_token_cast(y, "e4m3", g, l.col_major, l.round_sf, l.packed);
          EXPECT_TRUE(bitwise_equal(fused.data, unfused.data));
          EXPECT_TRUE(bitwise_equal(fused.sf, unfused.sf));
        }
      // And close to the fp64 reference once dequantized.
      const QuantTensor q = rmsnorm_forward_and_per_token_cast(x, w, 1e-6f, "e4m3", 128);
      EXPECT_LT(ref::calc_diff(cast_back(q, "fp32", {1, 128}), ref::tk::rms_norm(x, w)), 1e-3);
    }
}

// SwiGLU + cast with UE8M0 e4m3 scales in blocks of 32, 64 and 128 keeps its bf16 rows rounded
// to odd (swiglu_blocks_odd); its codes must still be those of the f32 rows, bit for bit, on
// gates and ups of every kind: zeros, e4m3 subnormal and f32 subnormal products, a huge product
// next to tiny ones, every binade, inf and NaN, with and without routing weights and clamp.
TEST_P(Quant, SwigluCastWithUe8m0ScalesIsTheCastOfTheF32Rows) {
  const uint64_t seed = fresh_seed();
  const int64_t inter = 1024 + 128;
  Tensor x = ref::randn({8, 2 * inter}, DType::bf16, seed, 0.0f, 2.0f);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const auto put = [&](int64_t r, int64_t c, float gate, float up) {
    x.at<bf16>({r, c}) = numeric::f32_to_bf16(gate);
    x.at<bf16>({r, inter + c}) = numeric::f32_to_bf16(up);
  };
  for (int64_t c = 0; c < inter; ++c) {
    const float u = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
    put(0, c, u, c % 3 == 0 ? 0.0f : (c % 3 == 1 ? -0.0f : u));         // zeros
    put(1, c, u, u * (c % 5 == 0 ? 1e-6f : 1.0f));                      // e4m3 subnormals
    put(2, c, c == 77 ? 80.0f : u, c == 77 ? 3e38f : u * 1e-38f);       // huge and tiny
    put(3, c, u, u * std::ldexp(1.0f, static_cast<int>(c % 64) - 32));  // every binade
    put(4, c, c % 7 == 0 ? -100.0f : u, u);                             // silu to -0
  }
  x.at<bf16>({5, 40}) = numeric::f32_to_bf16(std::numeric_limits<float>::infinity());
  x.at<bf16>({6, inter + 700}) = bf16{0xFF80 | 0x21};  // NaN
  const Tensor experts = ref::randint({8}, DType::i32, seed + 1, 0, 4);
  const Tensor slots = ref::randint({8}, DType::i32, seed + 2, 0, 16);
  const Tensor weights = ref::randn({8, 2}, DType::f32, seed + 3);
  for (int g : {32, 64, 128})
    for (bool weighted : {false, true})
      for (std::optional<float> clamp : {std::optional<float>{}, std::optional<float>{3.0f}}) {
        const auto pos = weighted ? std::optional<Tensor>(slots) : std::nullopt;
        const auto w = weighted ? std::optional<Tensor>(weights) : std::nullopt;
        const auto experts_opt = weighted ? std::optional<Tensor>(experts) : std::nullopt;
        const Tensor y = swiglu_forward(x, experts_opt, clamp, pos, w);
        const QuantTensor fused = swiglu_forward_and_per_token_cast(
            x, "e4m3", g, experts_opt, clamp, pos, w, false, true, true);
        const QuantTensor unfused = per_token_cast(y, "e4m3", g, false, true, true);
        const std::string what = "g " + std::to_string(g) + (weighted ? " weighted" : "") +
                                 (clamp ? " clamped" : "") + " seed " + std::to_string(seed);
        EXPECT_TRUE(bitwise_equal(fused.data, unfused.data)) << what;
        EXPECT_TRUE(bitwise_equal(fused.sf, unfused.sf)) << what;
      }
}

// With power-of-two (UE8M0) e4m3 scales the fused cast keeps its f32 row as bf16 rounded to odd
// (norm_cast_rows); its codes must still be those of the f32 row. Rows of every kind: zeros,
// values that normalise to e4m3 subnormals, f32 subnormals and zero next to a huge one, every
// binade, inf and NaN; weights with zeros, subnormals, negatives and huge values (products past
// f32's range). Blocks of 32, 64 and 128, and an input of 8 MiB, which prefetches its rows.
TEST_P(Quant, RmsnormCastWithUe8m0ScalesKeepsTheF32RowsCodes) {
  const uint64_t seed = fresh_seed();
  const int64_t hidden = 1024 + 128;
  Tensor x = ref::randn({12, hidden}, DType::bf16, seed, 0.0f, 2.0f);
  Tensor w = ref::randn({hidden}, DType::f32, seed + 1, 1.0f, 0.5f);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const auto put = [&](int64_t r, int64_t c, float v) {
    x.at<bf16>({r, c}) = numeric::f32_to_bf16(v);
  };
  for (int64_t c = 0; c < hidden; ++c) {
    const float u = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    put(0, c, c % 3 == 0 ? 0.0f : (c % 3 == 1 ? -0.0f : u));          // zeros
    put(1, c, u * (c % 5 == 0 ? 1e-6f : 1.0f));                       // e4m3 subnormals
    put(2, c, c == 77 ? 3e38f : u * (c % 4 == 0 ? 1e-39f : 1e-30f));  // a huge one: tiny rest
    put(3, c, u * std::ldexp(1.0f, static_cast<int>(c % 64) - 32));   // every binade
    if (c % 97 == 0) w.at<float>({c}) = 0.0f;
    if (c % 89 == 0) w.at<float>({c}) = 1e-40f * u;  // subnormal weights
    if (c % 83 == 0) w.at<float>({c}) = 1e30f * u;   // products past f32's range
  }
  x.at<bf16>({5, 40}) = numeric::f32_to_bf16(std::numeric_limits<float>::infinity());
  x.at<bf16>({6, 700}) = bf16{0xFF80 | 0x21};  // NaN
  // The same weights as bf16 (the odd rows load them in pairs too), the same rows as f32 (the
  // rows of f32 inputs are written vector by vector).
  Tensor w_bf16 = Tensor::empty({hidden}, DType::bf16);
  for (int64_t c = 0; c < hidden; ++c)
    w_bf16.data<bf16>()[c] = numeric::f32_to_bf16(w.data<float>()[c]);
  Tensor x_f32 = Tensor::empty(x.sizes(), DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i)
    x_f32.data<float>()[i] = numeric::bf16_to_f32(x.data<bf16>()[i]);
  for (const Tensor& input : {x, x_f32})
    for (const Tensor& weight : {w, w_bf16})
      for (int g : {32, 64, 128})
        for (const Layout& l : {kLayouts[1], kLayouts[3], kLayouts[4]}) {
          const QuantTensor fused = rmsnorm_forward_and_per_token_cast(
              input, weight, 1e-6f, "e4m3", g, l.col_major, l.round_sf, l.packed);
          const QuantTensor unfused = per_token_cast(rms_norm(input, weight, 1e-6f, DType::f32),
                                                     "e4m3", g, l.col_major, l.round_sf, l.packed);
          const std::string what = "g " + std::to_string(g) + " input " +
                                   std::string(dtype_name(input.dtype())) + " weight " +
                                   std::string(dtype_name(weight.dtype())) + " seed " +
                                   std::to_string(seed);
          EXPECT_TRUE(bitwise_equal(fused.data, unfused.data)) << what;
          EXPECT_TRUE(bitwise_equal(fused.sf, unfused.sf)) << what;
        }
  const Tensor large = ref::randn({2048, 2048}, DType::bf16, seed + 2);  // 8 MiB
  const Tensor w_large = ref::randn({2048}, DType::bf16, seed + 3, 1.0f, 0.2f);
  const QuantTensor fused =
      rmsnorm_forward_and_per_token_cast(large, w_large, 1e-6f, "e4m3", 128, false, true, true);
  const QuantTensor unfused =
      per_token_cast(rms_norm(large, w_large, 1e-6f, DType::f32), "e4m3", 128, false, true, true);
  EXPECT_TRUE(bitwise_equal(fused.data, unfused.data)) << "seed " << seed;
  EXPECT_TRUE(bitwise_equal(fused.sf, unfused.sf)) << "seed " << seed;
}

DSK_TK_INSTANTIATE_PER_BACKEND(Quant);

TEST(QuantBackends, AreBitwiseIdentical) {
  const uint64_t seed = fresh_seed();
  const Tensor x = ref::randn({64, 2 * 1536}, DType::bf16, seed, 0.0f, 3.0f);
  const Tensor w = ref::randn({1536}, DType::bf16, seed + 1);
  std::vector<Tensor> outs;
  for (Backend b : dsk::test::supported_backends()) {
    dsk::test::ScopedBackend scoped(b);
    outs.push_back(swiglu_forward(x, std::nullopt, 7.0f));
    outs.push_back(swiglu_forward_and_per_token_cast(x, "e2m1", 32, std::nullopt, 7.0f).data);
    outs.push_back(
        rmsnorm_forward_and_per_token_cast(x.slice(1, 0, 1536), w, 1e-6f, "e4m3", 128).sf);
    outs.push_back(per_channel_cast(x, "e4m3", 16, true).data);
  }
  for (size_t i = 4; i < outs.size(); ++i) EXPECT_TRUE(bitwise_equal(outs[i], outs[i % 4])) << i;
}

}  // namespace
}  // namespace dsk::tk

// The integer e4m3 and e2m1 paths on AVX-512 (test_tk_quant_avx512.cpp).
namespace dsk::test {
DSK_REGISTER_ISA_TESTS(tk_quant_avx512_tests);
}  // namespace dsk::test
