// The upstream correctness grids of FlashMLA scaled to two cores, on every backend, against
// dsk::ref::mla: sparse prefill d_qk {512, 576} x h_q {64, 128} x (s_kv, topk) {(128, 128),
// (592, 128), (1840, 256), (1521, 512), (95, 128), (114, 384)} x s_q {1, 62} plus the corner
// cases; sparse FP8 decode with b = 74 and topk 2048; dense decode at s_k = 4096.
#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

// Each case runs once: the test_*.cpp suites check that every path repeats bit for bit.
void check_once(const SparseFwdProblem& p) {
  check_sparse_fwd(p, false);
}
void check_once(const SparseDecodeProblem& p) {
  check_sparse_decode(p, false);
}
void check_once(const DenseDecodeProblem& p) {
  check_dense_decode(p, false);
}

class SparseFwdGrid : public dsk::test::PerBackend {};

TEST_P(SparseFwdGrid, UpstreamGrid) {
  const std::pair<int64_t, int64_t> kv_topk[] = {{128, 128},  {592, 128}, {1840, 256},
                                                 {1521, 512}, {95, 128},  {114, 384}};
  for (int64_t d_qk : {512, 576})
    for (int64_t h_q : {64, 128})
      for (const auto& [s_kv, topk] : kv_topk)
        for (int64_t s_q : {1, 62}) check_once(make_sparse_fwd(s_q, s_kv, h_q, d_qk, topk));
}

TEST_P(SparseFwdGrid, UpstreamCorners) {
  // All-invalid rows at upstream's small corners and a scaled (4096, 2048, 2048) one.
  check_once(make_sparse_fwd(1, 128, 128, 576, 128, {.all_invalid_rows = true}));
  check_once(make_sparse_fwd(1, 256, 128, 576, 256, {.all_invalid_rows = true}));
  check_once(make_sparse_fwd(16, 2048, 128, 576, 2048, {.all_invalid_rows = true}));
  // topk far above s_kv.
  check_once(make_sparse_fwd(62, 32, 128, 576, 2048));
  check_once(make_sparse_fwd(8, 64, 64, 512, 8192));
  // Sinks and topk_length over the larger shapes.
  check_once(make_sparse_fwd(62, 1592, 128, 576, 384, {.sinks = true, .topk_length = true}));
  check_once(make_sparse_fwd(62, 153, 64, 512, 256, {.sinks = true, .topk_length = true}));
}

class SparseDecodeGrid : public dsk::test::PerBackend {};

TEST_P(SparseDecodeGrid, LargeBatchAndLongTopk) {
  // (b, s_q, h_q, topk, page, max_s_k)
  for (int64_t page : {2, 61, 64, 69})
    check_once(make_sparse_decode(74, 1, 128, 64, page, 512, {.sinks = true}));
  check_once(make_sparse_decode(74, 1, 64, 576, 61, 1024, {.topk_length = true}));
  for (int64_t page : {2, 576})
    check_once(make_sparse_decode(4, 3, 128, 2048, page, 2046, {.sinks = true}));
  // Upstream's corner shape (650, 576, 53) with every corner option.
  check_once(
      make_sparse_decode(74, 3, 64, 576, 53, 650,
                         {.all_invalid_rows = true, .zero_length_requests = true, .sinks = true}));
}

class DenseDecodeGrid : public dsk::test::PerBackend {};

TEST_P(DenseDecodeGrid, LongContexts) {
  for (bool causal : {false, true}) {
    check_once(make_dense_decode(1, 4, 64, 1, 4096, 64, causal));
    check_once(make_dense_decode(6, 2, 16, 2, 4096, 64, causal, true));
    check_once(make_dense_decode(6, 1, 64, 2, 4096, 61, causal, false, true));
  }
}

DSK_INSTANTIATE_PER_BACKEND(SparseFwdGrid);
DSK_INSTANTIATE_PER_BACKEND(SparseDecodeGrid);
DSK_INSTANTIATE_PER_BACKEND(DenseDecodeGrid);

}  // namespace
}  // namespace dsk::mla_test
