// Bad inputs to flash_mla_sparse_fwd and flash_mla_with_kvcache raise dsk::Error naming the
// function: dtypes, ranks, d_qk, d_v, h_kv, index / topk_length / attn_sink shapes, num_splits,
// is_fp8_kvcache and causal against the mode, block tables too short for cache_seqlens, block ids
// outside the cache, h_q not a multiple of h_kv. Empty batches return empty results.
#include <dsk/core/error.hpp>

#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

// Runs call(), which must raise dsk::Error whose message names `function`.
template <class Call>
void expect_error(const Call& call, const char* function, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no dsk::Error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(function), std::string::npos) << what << ": " << e.what();
  }
}

Tensor as_f32(const Tensor& bf) {
  Tensor t = Tensor::empty(bf.sizes(), DType::f32);
  const Tensor c = bf.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i)
    t.data<float>()[i] = numeric::bf16_to_f32(c.data<bf16>()[i]);
  return t;
}

TEST(MlaErrors, SparseFwdBadInputsRaise) {
  const SparseFwdProblem p = make_sparse_fwd(4, 64, 16, 576, 64, {.strided = false});
  const char* fn = "flash_mla_sparse_fwd";
  auto call = [&](const Tensor& q, const Tensor& kv, const Tensor& idx, int64_t d_v = 512,
                  std::optional<Tensor> sink = std::nullopt,
                  std::optional<Tensor> len = std::nullopt) {
    mla::flash_mla_sparse_fwd(q, kv, idx, 0.5, d_v, sink, len);
  };
  const Tensor &q = p.q, &kv = p.kv, &idx = p.indices;
  expect_error([&] { call(as_f32(q), kv, idx); }, fn, "f32 q");
  expect_error([&] { call(q, as_f32(kv), idx); }, fn, "f32 kv");
  expect_error([&] { call(q, kv, idx.reinterpret(DType::f32)); }, fn, "f32 indices");
  expect_error([&] { call(q.view({4, 16 * 576}), kv, idx); }, fn, "2-D q");
  expect_error([&] { call(q, kv.view({64, 576}), idx); }, fn, "2-D kv");
  expect_error([&] { call(q, kv, idx.view({4, 64})); }, fn, "2-D indices");
  for (int64_t d : {448, 128, 640}) {
    expect_error(
        [&] {
          call(bf16_data({4, 16, d}, 0.1f), bf16_data({64, 1, d}, 0.1f), idx);
        },
        fn, fmt::format("d_qk {}", d));
  }
  expect_error([&] { call(q, bf16_data({64, 1, 512}, 0.1f), idx); }, fn, "kv d_qk != q d_qk");
  expect_error([&] { call(q, kv, idx, 576); }, fn, "d_v 576");
  expect_error([&] { call(q, kv, idx, 256); }, fn, "d_v 256");
  expect_error(
      [&] {
        call(q, bf16_data({64, 2, 576}, 0.1f), i32_tensor({4, 2, 1}, {0, 1, 2, 3, 4, 5, 6, 7}));
      },
      fn, "h_kv 2");
  expect_error(
      [&] {
        call(q, kv, i32_tensor({3, 1, 2}, {0, 1, 2, 3, 4, 5}));
      },
      fn, "indices for 3 rows");
  expect_error([&] { call(q, kv, idx.transpose(0, 2)); }, fn, "indices [topk, 1, s_q]");
  Tensor wide = Tensor::zeros({4, 1, 128}, DType::i32);
  expect_error(
      [&] {
        call(q, kv, wide.view({4, 1, 64, 2}).select(3, 0));
      },
      fn, "indices with a strided last dimension");
  expect_error([&] { call(q, kv, idx, 512, Tensor::zeros({17}, DType::f32)); }, fn,
               "attn_sink [17]");
  expect_error([&] { call(q, kv, idx, 512, Tensor::zeros({16}, DType::bf16)); }, fn,
               "bf16 attn_sink");
  expect_error([&] { call(q, kv, idx, 512, std::nullopt, Tensor::zeros({5}, DType::i32)); }, fn,
               "topk_length [5]");
  expect_error([&] { call(q, kv, idx, 512, std::nullopt, Tensor::zeros({4}, DType::i64)); }, fn,
               "i64 topk_length");
  expect_error(
      [&] {
        call(q, kv, idx, 512, std::nullopt, Tensor::zeros({4, 1}, DType::i32));
      },
      fn, "topk_length [4, 1]");
}

TEST(MlaErrors, SparseDecodeBadInputsRaise) {
  const SparseDecodeProblem p = make_sparse_decode(2, 2, 16, 64, 64, 100, {.topk_length = true});
  const char* fn = "flash_mla_with_kvcache";
  auto call = [&](const Tensor& q, const Tensor& cache, std::optional<Tensor> idx, bool fp8 = true,
                  bool causal = false, std::optional<Tensor> splits = {}, int64_t d_v = 512,
                  std::optional<Tensor> len = {}) {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    mla::flash_mla_with_kvcache(q, cache, std::nullopt, std::nullopt, d_v, meta, splits, p.sm_scale,
                                causal, fp8, idx, std::nullopt, len);
  };
  const Tensor &q = p.q, &cache = p.k_cache, &idx = p.indices;
  expect_error([&] { call(as_f32(q), cache, idx); }, fn, "f32 q");
  expect_error([&] { call(q.view({4, 16, 576}), cache, idx); }, fn, "3-D q");
  expect_error([&] { call(bf16_data({2, 2, 16, 512}, 1.0f), cache, idx); }, fn, "q d_qk 512");
  expect_error([&] { call(q, cache.view({-1, 656}), idx); }, fn, "2-D cache");
  expect_error(
      [&] {
        call(q, Tensor::zeros({4, 64, 1, 576}, DType::bf16), idx);
      },
      fn, "bf16 cache with indices");
  expect_error(
      [&] {
        call(q, Tensor::zeros({4, 64, 1, 600}, DType::u8), idx);
      },
      fn, "600-byte tokens");
  expect_error([&] { call(q, Tensor::zeros({4, 64, 2, 656}, DType::u8), idx); }, fn, "h_kv 2");
  expect_error([&] { call(q, cache, idx, false); }, fn, "indices without is_fp8_kvcache");
  expect_error([&] { call(q, cache, idx, true, true); }, fn, "causal with indices");
  expect_error([&] { call(q, cache, idx, true, false, Tensor::zeros({3}, DType::i32)); }, fn,
               "num_splits");
  expect_error([&] { call(q, cache, idx, true, false, {}, 576); }, fn, "head_dim_v 576");
  expect_error([&] { call(q, cache, idx.slice(0, 0, 1)); }, fn, "indices for 1 request");
  expect_error([&] { call(q, cache, idx.view({4, 64})); }, fn, "2-D indices");
  expect_error([&] { call(q, cache, idx.reinterpret(DType::f32)); }, fn, "f32 indices");
  expect_error([&] { call(q, cache, idx, true, false, {}, 512, Tensor::zeros({3}, DType::i32)); },
               fn, "topk_length [3]");
  expect_error(
      [&] {
        mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
        mla::flash_mla_with_kvcache(q, cache, std::nullopt, std::nullopt, 512, meta, std::nullopt,
                                    p.sm_scale, false, true, idx, Tensor::zeros({15}, DType::f32));
      },
      fn, "attn_sink [15]");
}

TEST(MlaErrors, DenseDecodeBadInputsRaise) {
  const DenseDecodeProblem p = make_dense_decode(2, 2, 16, 2, 100, 64, true);
  const char* fn = "flash_mla_with_kvcache";
  auto call = [&](const Tensor& q, const Tensor& cache, std::optional<Tensor> table,
                  std::optional<Tensor> lens, bool fp8 = false,
                  std::optional<Tensor> topk_length = {}) {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    mla::flash_mla_with_kvcache(q, cache, table, lens, 512, meta, std::nullopt, std::nullopt, true,
                                fp8, std::nullopt, std::nullopt, topk_length);
  };
  const Tensor &q = p.q, &cache = p.k_cache, &table = p.block_table, &lens = p.cache_seqlens;
  expect_error([&] { call(q, cache, table, lens, true); }, fn, "is_fp8_kvcache without indices");
  expect_error([&] { call(q, cache, std::nullopt, lens); }, fn, "no block_table");
  expect_error([&] { call(q, cache, table, std::nullopt); }, fn, "no cache_seqlens");
  expect_error([&] { call(q, cache, table, lens, false, Tensor::zeros({2}, DType::i32)); }, fn,
               "topk_length without indices");
  expect_error([&] { call(q, as_f32(cache), table, lens); }, fn, "f32 cache");
  expect_error([&] { call(q, cache.slice(3, 0, 512), table, lens); }, fn, "cache d 512");
  expect_error(
      [&] {
        call(bf16_data({2, 2, 15, 576}, 1.0f), cache, table, lens);
      },
      fn, "h_q 15 with h_kv 2");
  expect_error([&] { call(q, cache, table.slice(1, 0, 1), lens); }, fn,
               "block_table too short for cache_seqlens");
  expect_error([&] { call(q, cache, table.slice(0, 0, 1), lens); }, fn,
               "block_table for 1 request");
  expect_error([&] { call(q, cache, table.reinterpret(DType::f32), lens); }, fn, "f32 block_table");
  Tensor bad_table = table.clone();
  bad_table.data<int32_t>()[0] = static_cast<int32_t>(cache.size(0));
  expect_error([&] { call(q, cache, bad_table, lens); }, fn, "block id past the cache");
  bad_table.data<int32_t>()[0] = -1;
  expect_error([&] { call(q, cache, bad_table, lens); }, fn, "block id -1");
  Tensor bad_lens = lens.clone();
  bad_lens.data<int32_t>()[1] = -3;
  expect_error([&] { call(q, cache, table, bad_lens); }, fn, "negative cache_seqlens");
  expect_error([&] { call(q, cache, table, i32_tensor({3}, {1, 1, 1})); }, fn, "cache_seqlens [3]");
}

TEST(MlaErrors, EmptyBatchesGiveEmptyResults) {
  const SparseFwdProblem p = make_sparse_fwd(3, 64, 16, 576, 64, {.strided = false});
  const mla::SparseFwdResult r =
      mla::flash_mla_sparse_fwd(p.q.slice(0, 0, 0), p.kv, p.indices.slice(0, 0, 0), 0.5);
  EXPECT_EQ(r.out.sizes(), (Shape{0, 16, 512}));
  EXPECT_EQ(r.lse.sizes(), (Shape{0, 16}));
  const SparseDecodeProblem d = make_sparse_decode(2, 1, 16, 64, 64, 100);
  mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
  const mla::KvcacheResult k = mla::flash_mla_with_kvcache(
      d.q.slice(0, 0, 0), d.k_cache, std::nullopt, std::nullopt, 512, meta, std::nullopt,
      d.sm_scale, false, true, d.indices.slice(0, 0, 0));
  EXPECT_EQ(k.out.sizes(), (Shape{0, 1, 16, 512}));
  EXPECT_EQ(k.lse.sizes(), (Shape{0, 16, 1}));
}

}  // namespace
}  // namespace dsk::mla_test
