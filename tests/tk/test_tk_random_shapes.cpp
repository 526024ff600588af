// dsk::tk on shapes drawn at random: widths that are no multiple of a vector or a block (odd ones
// where the format allows), rows of any count, strided and misaligned rows, every block size and
// scale layout, on every backend. Each output starts poisoned (DSK_POISON_NEW_TENSORS, set for
// every test) and is compared element by element with dsk::ref::tk: bit for bit where the
// op is exact (codes, scales, the mapping, the fused casts against the unfused ones), within a
// per-element bound elsewhere. The grids of the other tk tests hold the upstream shapes; these
// cases look for the tails and offsets those grids do not reach. The seed is printed on failure.
#include <algorithm>
#include <cmath>
#include <random>

#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

using test::bitwise_equal;
using test::blocks_of;
using test::Layout;
using test::same_cast;
using test::values_of;

constexpr int kCasesPerOp = 40;

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  int64_t in(int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool coin() { return in(0, 1) == 1; }
  template <class T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[in(0, static_cast<int64_t>(values.size()) - 1)];
  }
  uint64_t seed() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

// Random rows [rows, cols] of `dtype`, contiguous or a column window of wider rows (a row stride
// larger than the width, and a start that is no multiple of a vector when the window is offset).
Tensor random_rows(Draw& d, int64_t rows, int64_t cols, DType dtype, float std = 1.0f) {
  if (d.coin()) return ref::randn({rows, cols}, dtype, d.seed(), 0.0f, std);
  const int64_t offset = d.in(0, 9);
  const Tensor wide = ref::randn({rows, cols + offset + d.in(0, 20)}, dtype, d.seed(), 0.0f, std);
  return wide.slice(1, offset, offset + cols);
}

// |got - want| <= rel * |want| + abs * max |want| for every element (want in f64).
::testing::AssertionResult close_everywhere(const Tensor& got, const Tensor& want, double rel,
                                            double abs) {
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << got.describe() << " vs " << want.describe();
  const std::vector<double> g = values_of(got), w = values_of(want);
  double largest = 0.0;
  for (double v : w) largest = std::max(largest, std::abs(v));
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - w[i]) <= rel * std::abs(w[i]) + abs * largest))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << g.size() << ": " << g[i] << ", want " << w[i];
  return ::testing::AssertionSuccess();
}

Layout random_layout(Draw& d) {
  const bool packed = d.in(0, 3) == 0;
  return {d.coin(), packed || d.coin(), packed};
}

using RandomShapes = test::PerBackend;

TEST_P(RandomShapes, PerTokenCastsMatchTheReference) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const bool fp4 = d.in(0, 2) == 0;
    const int64_t rows = d.in(1, 40);
    const int64_t hidden = fp4 ? 2 * d.in(1, 300) : d.in(1, 600);
    const int g = static_cast<int>(
        d.pick<int64_t>({16, 32, 64, 128, hidden, hidden}));  // hidden: one scale per row
    const DType dtype = d.pick({DType::bf16, DType::f32});
    const Layout l = random_layout(d);
    const Tensor x = random_rows(d, rows, hidden, dtype, d.pick({1e-3f, 1.0f, 300.0f}));
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << rows << "x" << hidden << " " << dtype << " "
                 << (fp4 ? "e2m1" : "e4m3") << " g " << g << " layout " << l.col_major << l.round_sf
                 << l.packed << " stride " << x.stride(0) << ", seed " << seed);
    const char* fmt = fp4 ? "e2m1" : "e4m3";
    const QuantTensor got = per_token_cast(x, fmt, g, l.col_major, l.round_sf, l.packed);
    const QuantTensor want = ref::tk::per_token_cast(x, fmt, g, l.round_sf);
    ASSERT_TRUE(same_cast(got, want, rows, blocks_of(hidden, g)));
    // The cast back: one f32 product per element, as the reference's.
    ASSERT_TRUE(bitwise_equal(cast_back(got, "fp32", {1, g}), ref::tk::cast_back(want, {1, g})));
  }
}

TEST_P(RandomShapes, PerBlockAndPerChannelCastsMatchTheReference) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const bool fp4 = d.in(0, 2) == 0;
    const int64_t rows = d.in(1, 300);
    const int64_t cols = fp4 ? 2 * d.in(1, 150) : d.in(1, 300);
    const int bm = static_cast<int>(d.pick<int64_t>({1, 3, 16, 32, 128, d.in(1, 200)}));
    const int bk = static_cast<int>(  // e2m1 blocks hold whole bytes
        fp4 ? d.pick<int64_t>({16, 32, 128, 2 * d.in(1, 100)})
            : d.pick<int64_t>({16, 32, 128, d.in(1, 200)}));
    const DType dtype = d.pick({DType::bf16, DType::f32});
    const Layout l = random_layout(d);
    const Tensor x = random_rows(d, rows, cols, dtype, d.pick({1e-3f, 1.0f, 300.0f}));
    const char* fmt = fp4 ? "e2m1" : "e4m3";
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << rows << "x" << cols << " " << dtype << " " << fmt
                 << " block " << bm << "x" << bk << " layout " << l.col_major << l.round_sf
                 << l.packed << " stride " << x.stride(0) << ", seed " << seed);
    const QuantTensor got = per_block_cast(x, fmt, {bm, bk}, l.col_major, l.round_sf, l.packed);
    const QuantTensor want = ref::tk::per_block_cast(x, fmt, {bm, bk}, l.round_sf);
    ASSERT_TRUE(same_cast(got, want, blocks_of(rows, bm), blocks_of(cols, bk)));
    ASSERT_TRUE(
        bitwise_equal(cast_back(got, "fp32", {bm, bk}), ref::tk::cast_back(want, {bm, bk})));
    const int per_tokens = static_cast<int>(d.pick<int64_t>({1, 5, 32, 128, d.in(1, 300)}));
    SCOPED_TRACE(::testing::Message() << "per channel, " << per_tokens << " rows per scale");
    const QuantTensor channel = per_channel_cast(x, fmt, per_tokens, l.round_sf);
    ASSERT_TRUE(same_cast(channel, ref::tk::per_channel_cast(x, fmt, per_tokens, l.round_sf),
                          blocks_of(rows, per_tokens), cols));
  }
}

TEST_P(RandomShapes, FusedCastsAreTheCastsOfTheirRows) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const int64_t rows = d.in(1, 40);
    const int64_t hidden = d.in(1, 400);
    const int g = static_cast<int>(d.pick<int64_t>({16, 32, 64, 128, hidden}));
    const Layout l = random_layout(d);
    const DType dtype = d.pick({DType::bf16, DType::f32});
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << rows << "x" << hidden << " " << dtype << " g " << g
                 << " layout " << l.col_major << l.round_sf << l.packed << ", seed " << seed);
    // SwiGLU + cast, with a clamp, pos_to_expert, and routing weights drawn at random.
    const Tensor x = random_rows(d, rows, 2 * hidden, dtype, 2.0f);
    const std::optional<float> clamp =
        d.coin() ? std::optional<float>(static_cast<float>(d.in(1, 20)) / 4) : std::nullopt;
    const auto experts =
        d.coin() ? std::optional<Tensor>(ref::randint({rows}, DType::i32, d.seed(), -1, 3))
                 : std::nullopt;
    const bool weighted = d.coin();
    const auto slots =
        weighted ? std::optional<Tensor>(ref::randint({rows}, DType::i32, d.seed(), -1, 2 * rows))
                 : std::nullopt;
    const auto weights = weighted
                             ? std::optional<Tensor>(ref::randn({rows, 2}, DType::f32, d.seed()))
                             : std::nullopt;
    const Tensor y = swiglu_forward(x, experts, clamp, slots, weights);
    ASSERT_TRUE(close_everywhere(y, ref::tk::swiglu_forward(x, experts, clamp, slots, weights),
                                 1e-6, 1e-12));
    const QuantTensor fused = swiglu_forward_and_per_token_cast(
        x, "e4m3", g, experts, clamp, slots, weights, l.col_major, l.round_sf, l.packed);
    const QuantTensor unfused = per_token_cast(y, "e4m3", g, l.col_major, l.round_sf, l.packed);
    ASSERT_TRUE(bitwise_equal(fused.data, unfused.data)) << "SwiGLU + cast";
    ASSERT_TRUE(bitwise_equal(fused.sf, unfused.sf)) << "SwiGLU + cast";
    // RMSNorm + cast.
    const Tensor r = random_rows(d, rows, hidden, dtype, d.pick({1e-3f, 1.0f, 300.0f}));
    const Tensor w = ref::randn({hidden}, d.pick({DType::f32, DType::bf16}), d.seed(), 1.0f, 0.2f);
    const QuantTensor normed = rmsnorm_forward_and_per_token_cast(
        r, w, 1e-6f, "e4m3", g, l.col_major, l.round_sf, l.packed);
    const QuantTensor plain = per_token_cast(rms_norm(r, w, 1e-6f, DType::f32), "e4m3", g,
                                             l.col_major, l.round_sf, l.packed);
    ASSERT_TRUE(bitwise_equal(normed.data, plain.data)) << "RMSNorm + cast";
    ASSERT_TRUE(bitwise_equal(normed.sf, plain.sf)) << "RMSNorm + cast";
  }
}

TEST_P(RandomShapes, NormsMatchTheReference) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const int64_t rows = d.in(1, 40);
    const int64_t hidden = d.in(1, 600);
    const DType in = d.pick({DType::bf16, DType::f32, DType::f16});
    const DType out = d.pick({DType::bf16, DType::f32});
    const Tensor x = random_rows(d, rows, hidden, in, d.pick({1e-2f, 1.0f, 30.0f}));
    const Tensor w = ref::randn({hidden}, d.pick({DType::f32, DType::bf16}), d.seed(), 1.0f, 0.2f);
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << rows << "x" << hidden << " " << in << " -> " << out
                 << " stride " << x.stride(0) << ", seed " << seed);
    // f32 outputs within f32 arithmetic; bf16 ones within one rounding more.
    const double rel = out == DType::f32 ? 1e-5 : 1.0 / 128;
    ASSERT_TRUE(close_everywhere(rms_norm(x, w, 1e-6f, out), ref::tk::rms_norm(x, w), rel, 1e-6));
    if (in == DType::f16) continue;  // layer_norm reads f32 / bf16
    const auto bias =
        d.coin() ? std::optional<Tensor>(ref::randn({hidden}, w.dtype(), d.seed())) : std::nullopt;
    ASSERT_TRUE(close_everywhere(layer_norm(x, w, bias, 1e-5f, out),
                                 ref::tk::layer_norm(x, w, bias, 1e-5), rel, 1e-5));
  }
}

TEST_P(RandomShapes, RopeAndHadamardMatchTheReference) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const int rot = static_cast<int>(d.pick<int64_t>({32, 64, 128, 256}));
    const int64_t tokens = d.in(1, 30), heads = d.in(1, 9);
    const DType dtype = d.pick({DType::bf16, DType::f32, DType::f16});
    const bool interleaved = d.coin(), conjugate = d.coin();
    RopeConfig c;
    c.rot_dim = rot;
    c.max_seq_len = 512;
    const Tensor table = yarn_cos_sin_cache(c);
    const int64_t offset = d.in(0, 100);  // + tokens stays inside the 512-row table
    const auto positions =
        d.coin()
            ? std::optional<Tensor>(ref::randint({tokens}, DType::i64, d.seed(), 0, 512 - offset))
            : std::nullopt;
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << tokens << " tokens, " << heads << " heads, rot " << rot
                 << " " << dtype << " interleaved " << interleaved << " conjugate " << conjugate
                 << " offset " << offset << ", seed " << seed);
    // The rope part of wider heads, in place through a view.
    const int64_t lead = d.pick<int64_t>({0, 64, 7});
    const Tensor before = ref::randn({tokens, heads, lead + rot}, dtype, d.seed());
    Tensor q = before.clone();
    Tensor part = q.slice(2, lead, lead + rot);
    apply_rotary(part, table, std::nullopt, positions, interleaved, conjugate, offset);
    const double rel = dtype == DType::f32 ? 1e-6 : 1.0 / 128;
    ASSERT_TRUE(
        close_everywhere(part,
                         ref::tk::apply_rotary(before.slice(2, lead, lead + rot).contiguous(),
                                               table, positions, interleaved, conjugate, offset),
                         rel, 1e-6));
    ASSERT_TRUE(bitwise_equal(q.slice(2, 0, lead), before.slice(2, 0, lead)));
    // Hadamard of a power-of-two width, strided rows.
    const int64_t n = int64_t{1} << d.in(4, 10);
    const Tensor x = random_rows(d, d.in(1, 40), n, dtype);
    const float scale = 1.0f / std::sqrt(static_cast<float>(n));
    SCOPED_TRACE(::testing::Message() << "hadamard " << x.size(0) << "x" << n);
    ASSERT_TRUE(close_everywhere(hadamard_transform(x, scale),
                                 ref::tk::hadamard_transform(x, scale), rel, 1e-6));
  }
}

TEST_P(RandomShapes, MappingExpandAndReduceMatchTheReference) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const int64_t tokens = d.in(1, 200);
    const int k = static_cast<int>(d.in(1, 16));
    const int experts = static_cast<int>(d.in(1, 384));
    int alignment = static_cast<int>(d.pick<int64_t>({1, 16, 64, 128, d.in(1, 130)}));
    if (int64_t{alignment} * experts > 16384) alignment = static_cast<int>(d.in(1, 16));
    const DType id_dtype = d.pick({DType::i32, DType::i64});
    const int64_t hidden = d.in(1, 300);
    const DType dtype = d.pick({DType::bf16, DType::f32});
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << tokens << " tokens, top-" << k << " of " << experts
                 << ", alignment " << alignment << ", hidden " << hidden << " " << dtype
                 << ", seed " << seed);
    const Tensor idx = ref::randint({tokens, k}, id_dtype, d.seed(), -1, experts);
    const FusedMapping m = get_fused_mapping(idx, experts, 0, alignment);
    const FusedMapping want = ref::tk::get_fused_mapping(idx, experts, alignment);
    ASSERT_TRUE(test::same_mapping(m, want));
    const Tensor x = random_rows(d, tokens, hidden, dtype);
    ASSERT_TRUE(bitwise_equal(expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert),
                              ref::tk::expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert)));
    const Tensor rows = random_rows(d, m.pos_to_expert.size(0), hidden, dtype);
    const auto weights = d.coin() ? std::optional<Tensor>(ref::rand_uniform({tokens, k}, DType::f32,
                                                                            d.seed(), 0.0f, 1.0f))
                                  : std::nullopt;
    // Up to 16 terms summed in f32 (then rounded once for bf16).
    const double rel = dtype == DType::f32 ? 1e-5 : 1.0 / 128;
    ASSERT_TRUE(close_everywhere(reduce_fused(rows, weights, m.token_topk_to_pos),
                                 ref::tk::reduce_fused(rows, weights, m.token_topk_to_pos), rel,
                                 1e-5));
  }
}

// Scores rounded to bf16 (ref::randn), so rows hold ties, which the tie rule (the smaller index
// first) settles the same way in the kernel and the reference: compared in order.
TEST_P(RandomShapes, TopkSelectionsMatchTheReference) {
  const uint64_t seed = test::fresh_seed();
  Draw d(seed);
  for (int i = 0; i < kCasesPerOp; ++i) {
    const int64_t tokens = d.in(1, 60);
    const int experts = static_cast<int>(d.pick<int64_t>({d.in(1, 64), d.in(1, 1024)}));
    const int k = static_cast<int>(d.in(1, std::min(experts, 32)));
    SCOPED_TRACE(::testing::Message() << "case " << i << ": " << tokens << " tokens, top-" << k
                                      << " of " << experts << ", seed " << seed);
    const Tensor scores = random_rows(d, tokens, experts, DType::f32);
    ASSERT_TRUE(bitwise_equal(topk_gate(scores, k), ref::tk::topk_gate(scores, k)));
    const int groups = static_cast<int>(d.in(1, 32));
    const int per_group = static_cast<int>(d.in(1, 64));
    const int sum = static_cast<int>(d.in(1, std::min(2, per_group)));
    const int kept = static_cast<int>(d.in(1, groups));
    SCOPED_TRACE(::testing::Message() << groups << " groups of " << per_group << ", top-" << sum
                                      << " sums, " << kept << " kept");
    const Tensor grouped = ref::randn({tokens, groups, per_group}, DType::f32, d.seed());
    ASSERT_TRUE(bitwise_equal(topk_sum_and_topk_group_idx(grouped, sum, kept),
                              ref::tk::topk_sum_and_topk_group_idx(grouped, sum, kept)));
  }
}

DSK_TK_INSTANTIATE_PER_BACKEND(RandomShapes);

}  // namespace
}  // namespace dsk::tk
