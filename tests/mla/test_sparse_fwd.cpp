// mla::flash_mla_sparse_fwd against dsk::ref::mla::sparse_fwd on every backend, with FlashMLA's
// tolerances: a representative part of the upstream grid (the rest is in slow_grid.cpp),
// invalid-index mixes, all-invalid rows, topk far above s_kv, sinks with +-inf, topk_length
// (0 included), head counts and topk off the kernel's tile sizes, strided inputs, and bitwise
// repeatability (every check runs twice; deterministic mode across thread counts too).
#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

class SparseFwd : public dsk::test::PerBackend {};

TEST_P(SparseFwd, RepresentativeUpstreamShapes) {
  // (s_q, s_kv, h_q, d_qk, topk) from the upstream grid (scaled to two cores).
  check_sparse_fwd(make_sparse_fwd(1, 128, 64, 576, 128));
  check_sparse_fwd(make_sparse_fwd(1, 1840, 128, 512, 256));
  check_sparse_fwd(make_sparse_fwd(62, 95, 64, 576, 128));
  check_sparse_fwd(make_sparse_fwd(13, 114, 128, 576, 384));
  check_sparse_fwd(make_sparse_fwd(7, 1521, 64, 512, 512));
}

TEST_P(SparseFwd, AllInvalidRowsAndTopkFarAboveSkv) {
  check_sparse_fwd(make_sparse_fwd(1, 128, 64, 576, 128, {.all_invalid_rows = true}));
  check_sparse_fwd(make_sparse_fwd(9, 256, 64, 512, 256, {.all_invalid_rows = true}));
  // s_kv 32, topk 2048: at most 32 valid entries among 2016+ invalid ones.
  check_sparse_fwd(make_sparse_fwd(4, 32, 64, 576, 2048));
  check_sparse_fwd(make_sparse_fwd(2, 64, 16, 512, 1000, {.invalid_mix = false}));
}

TEST_P(SparseFwd, SinksAndTopkLength) {
  check_sparse_fwd(make_sparse_fwd(11, 300, 64, 576, 128, {.sinks = true}));
  check_sparse_fwd(make_sparse_fwd(11, 300, 64, 576, 256, {.topk_length = true}));
  check_sparse_fwd(make_sparse_fwd(8, 200, 32, 512, 192,
                                   {.all_invalid_rows = true, .sinks = true, .topk_length = true}));
}

TEST_P(SparseFwd, HeadsAndTopkOffTheTileSizes) {
  for (int64_t h_q : {1, 3, 20}) check_sparse_fwd(make_sparse_fwd(5, 150, h_q, 576, 100));
  for (int64_t topk : {1, 2, 97}) check_sparse_fwd(make_sparse_fwd(6, 90, 24, 512, topk));
  check_sparse_fwd(make_sparse_fwd(3, 50, 7, 576, 64, {.sinks = true, .strided = false}));
}

TEST_P(SparseFwd, EverySinkRowRule) {
  // One row, 3 heads with sinks +inf (out 0), -inf (no effect) and 0; plus an empty row.
  SparseFwdProblem p = make_sparse_fwd(2, 40, 3, 576, 64, {.invalid_mix = false});
  p.attn_sink = Tensor::empty({3}, DType::f32);
  p.attn_sink->data<float>()[0] = kInf;
  p.attn_sink->data<float>()[1] = -kInf;
  p.attn_sink->data<float>()[2] = 0.0f;
  p.topk_length = i32_tensor({2}, {64, 0});
  check_sparse_fwd(p);
  const mla::SparseFwdResult r = run_sparse_fwd(p);
  auto value = [&](int64_t i, int64_t h, int64_t c) {
    return numeric::bf16_to_f32(r.out.at<bf16>({i, h, c}));
  };
  for (int64_t c = 0; c < 512; ++c) ASSERT_EQ(value(0, 0, c), 0.0f) << c;  // +-0
  for (int64_t h = 0; h < 3; ++h) {
    EXPECT_EQ(r.lse.at<float>({1, h}), kInf);
    EXPECT_EQ(r.max_logits.at<float>({1, h}), -kInf);
    EXPECT_EQ(value(1, h, 100), 0.0f);
  }
}

TEST_P(SparseFwd, DeterministicModeGivesTheSameBitsForAnyThreadCount) {
  const SparseFwdProblem p = make_sparse_fwd(1, 2000, 64, 576, 1536);  // one row: split keys
  const auto [one, two] = run_with_one_and_many_threads([&] { return run_sparse_fwd(p); });
  EXPECT_TRUE(bitwise_equal(one.out, two.out)) << seed_note();
  EXPECT_TRUE(bitwise_equal(one.lse, two.lse)) << seed_note();
}

DSK_INSTANTIATE_PER_BACKEND(SparseFwd);

}  // namespace
}  // namespace dsk::mla_test
