// mla::flash_mla_with_kvcache in dense mode against dsk::ref::mla::dense_decode on every backend:
// b {1, 6}, s_q {1, 2, 4}, s_k {20, 140} (4096 in slow_grid.cpp), h_kv {1, 2}, h_q 16 / 64,
// causal and not, pages of 64 and of 61, block tables that permute the cache's blocks, an empty
// request, NaN in every cache position past a request's length, sinks, schedule reuse.
#include <dsk/core/error.hpp>

#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

class DenseDecode : public dsk::test::PerBackend {};

TEST_P(DenseDecode, SmallGrid) {
  for (bool causal : {false, true}) {
    // (b, s_q, h_q, h_kv, s_k, page)
    check_dense_decode(make_dense_decode(1, 1, 16, 1, 20, 64, causal));
    check_dense_decode(make_dense_decode(1, 4, 64, 2, 140, 61, causal));
    check_dense_decode(make_dense_decode(6, 2, 16, 2, 140, 64, causal, true));
    check_dense_decode(make_dense_decode(6, 4, 64, 1, 20, 61, causal, true));
  }
}

TEST_P(DenseDecode, CausalRowsWithoutKeysAndSinks) {
  // s_q > s_k: the first causal rows see no key (out 0, lse +inf).
  check_dense_decode(make_dense_decode(2, 4, 16, 1, 2, 64, true));
  check_dense_decode(make_dense_decode(3, 2, 32, 2, 100, 16, false, true, true));
  check_dense_decode(make_dense_decode(2, 3, 16, 1, 70, 7, true, false, true));
}

TEST_P(DenseDecode, OneLongRequestSplitsTheKeys) {
  check_dense_decode(make_dense_decode(1, 1, 16, 1, 1500, 64, false));
  check_dense_decode(make_dense_decode(1, 2, 16, 2, 1000, 61, true));
}

TEST_P(DenseDecode, ScheduleIsReusableOnlyForTheSameConfiguration) {
  const DenseDecodeProblem p = make_dense_decode(3, 2, 16, 1, 140, 64, true);
  mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
  const mla::KvcacheResult first = run_dense_decode(p, meta);
  EXPECT_TRUE(meta.filled());
  EXPECT_TRUE(bitwise_equal(run_dense_decode(p, meta).out, first.out));
  DenseDecodeProblem longer = p;  // another cache_seqlens
  longer.cache_seqlens = p.cache_seqlens.clone();
  longer.cache_seqlens.data<int32_t>()[2] -= 1;
  EXPECT_THROW(run_dense_decode(longer, meta), Error);
  DenseDecodeProblem not_causal = p;
  not_causal.causal = false;
  EXPECT_THROW(run_dense_decode(not_causal, meta), Error);
}

TEST_P(DenseDecode, DeterministicModeGivesTheSameBitsForAnyThreadCount) {
  const DenseDecodeProblem p = make_dense_decode(1, 2, 16, 1, 2000, 64, true);  // split keys
  const auto [one, two] = run_with_one_and_many_threads([&] {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    return run_dense_decode(p, meta);
  });
  EXPECT_TRUE(bitwise_equal(one.out, two.out)) << seed_note();
  EXPECT_TRUE(bitwise_equal(one.lse, two.lse)) << seed_note();
}

DSK_INSTANTIATE_PER_BACKEND(DenseDecode);

}  // namespace
}  // namespace dsk::mla_test
