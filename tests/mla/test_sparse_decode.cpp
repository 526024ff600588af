// mla::flash_mla_with_kvcache in sparse FP8 mode against dsk::ref::mla::sparse_decode on every
// backend: caches built with quantize_kv_tokens in which every slot that no valid entry names is
// NaN (codes, scales and RoPE), page sizes {2, 61, 64, 69}, s_q {1, 3}, h_q {64, 128}, topk
// {64, 576} (b = 74 and topk 2048 are in slow_grid.cpp), all-invalid rows, topk_length,
// zero-length requests, sinks, strided q, schedule reuse, out-of-range slots.
#include <dsk/core/error.hpp>

#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

class SparseDecode : public dsk::test::PerBackend {};

TEST_P(SparseDecode, PageSizesAndShapes) {
  // (b, s_q, h_q, topk, page, max_s_k)
  check_sparse_decode(make_sparse_decode(4, 1, 64, 64, 2, 512));
  check_sparse_decode(make_sparse_decode(4, 3, 128, 64, 64, 512));
  check_sparse_decode(make_sparse_decode(4, 1, 128, 576, 61, 1024));
  check_sparse_decode(make_sparse_decode(4, 3, 64, 576, 69, 1024));
}

TEST_P(SparseDecode, InvalidRowsZeroLengthsTopkLengthAndSinks) {
  check_sparse_decode(make_sparse_decode(4, 3, 64, 64, 64, 300, {.all_invalid_rows = true}));
  check_sparse_decode(make_sparse_decode(5, 1, 64, 128, 61, 500, {.zero_length_requests = true}));
  check_sparse_decode(make_sparse_decode(4, 3, 64, 192, 2, 400, {.topk_length = true}));
  check_sparse_decode(make_sparse_decode(4, 1, 128, 64, 69, 256, {.sinks = true}));
  check_sparse_decode(make_sparse_decode(6, 2, 64, 128, 64, 200,
                                         {.all_invalid_rows = true,
                                          .zero_length_requests = true,
                                          .sinks = true,
                                          .topk_length = true,
                                          .strided_q = true}));
}

TEST_P(SparseDecode, FewQueriesSplitTheKeys) {
  // One request, one position, many keys: the split-KV path with its combine.
  check_sparse_decode(make_sparse_decode(1, 1, 64, 2048, 64, 4096, {.sinks = true}));
  check_sparse_decode(make_sparse_decode(1, 2, 16, 1000, 61, 1500, {.topk_length = true}));
}

TEST_P(SparseDecode, HeadsAndTopkOffTheTileSizes) {
  check_sparse_decode(make_sparse_decode(3, 2, 3, 100, 64, 150));
  check_sparse_decode(make_sparse_decode(2, 1, 20, 1, 5, 40));
}

TEST_P(SparseDecode, ScheduleIsReusableOnlyForTheSameConfiguration) {
  const SparseDecodeProblem p = make_sparse_decode(4, 2, 64, 64, 64, 256, {.topk_length = true});
  mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
  EXPECT_FALSE(meta.filled());
  const mla::KvcacheResult first = run_sparse_decode(p, meta);
  EXPECT_TRUE(meta.filled());
  mla::FlashMLASchedMeta copy = meta;  // copies share the state
  EXPECT_TRUE(copy.filled());
  EXPECT_TRUE(bitwise_equal(run_sparse_decode(p, copy).out, first.out));
  // Another topk_length, another batch size: a different configuration.
  SparseDecodeProblem other = p;
  other.topk_length = p.topk_length->clone();
  int32_t& length = other.topk_length->data<int32_t>()[1];
  length = length == 0 ? 1 : length - 1;
  EXPECT_THROW(run_sparse_decode(other, meta), Error);
  const SparseDecodeProblem smaller = make_sparse_decode(3, 2, 64, 64, 64, 256);
  EXPECT_THROW(run_sparse_decode(smaller, meta), Error);
  mla::FlashMLASchedMeta fresh = mla::get_mla_metadata();
  EXPECT_NO_THROW(run_sparse_decode(smaller, fresh));
}

TEST_P(SparseDecode, SlotsOutsideTheCacheRaise) {
  const SparseDecodeProblem p = make_sparse_decode(2, 1, 64, 64, 64, 100);
  const int64_t slots = p.k_cache.size(0) * p.k_cache.size(1);
  for (int64_t bad :
       {slots, slots + 1000, int64_t{-2}, int64_t{std::numeric_limits<int32_t>::min()},
        int64_t{std::numeric_limits<int32_t>::max()}}) {
    SparseDecodeProblem q = p;
    q.indices = p.indices.clone();
    q.indices.data<int32_t>()[5] = static_cast<int32_t>(bad);
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    EXPECT_THROW(run_sparse_decode(q, meta), Error) << bad;
  }
}

TEST_P(SparseDecode, DeterministicModeGivesTheSameBitsForAnyThreadCount) {
  const SparseDecodeProblem p = make_sparse_decode(1, 1, 64, 2048, 64, 3000);  // split keys
  const auto [one, two] = run_with_one_and_many_threads([&] {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    return run_sparse_decode(p, meta);
  });
  EXPECT_TRUE(bitwise_equal(one.out, two.out)) << seed_note();
  EXPECT_TRUE(bitwise_equal(one.lse, two.lse)) << seed_note();
}

DSK_INSTANTIATE_PER_BACKEND(SparseDecode);

}  // namespace
}  // namespace dsk::mla_test
