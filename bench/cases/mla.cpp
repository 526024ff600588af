// The "mla" module of `dsk bench`: FlashMLA's sparse prefill, sparse FP8 decode and dense decode
// on the shapes, FLOPs and bytes counted as upstream's benchmarks count them
// (spec/attention.md §4): flop = 2 h_q (d_qk + d_v) per attended (query, key), bytes = the keys
// read once (valid indices / unique tokens) plus q and out. Each case names the roofline term that
// bounds it on this machine (the bf16 compute roof: amx_bf16 on AMX machines, avx512_bf16
// elsewhere; or DRAM read).
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/cpu.hpp>
#include <dsk/mla.hpp>
#include <dsk/ref.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

uint64_t fresh_seed() {
  static std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

constexpr int64_t kDv = 512;

// ---- sparse prefill ----

struct Prefill {
  Tensor q, kv, indices;
};

// Every query picks topk distinct random rows of kv (all valid).
Prefill prefill_problem(int64_t s_q, int64_t s_kv, int64_t h_q, int64_t topk, int64_t d_qk) {
  Prefill p;
  p.q = ref::randn({s_q, h_q, d_qk}, DType::bf16, fresh_seed(), 0.0f, 0.1f);
  p.kv = ref::randn({s_kv, 1, d_qk}, DType::bf16, fresh_seed(), 0.0f, 0.1f);
  p.indices = Tensor::empty({s_q, 1, topk}, DType::i32);
  std::mt19937_64 rng(fresh_seed());
  std::vector<int32_t> rows(static_cast<size_t>(s_kv));
  for (int64_t i = 0; i < s_kv; ++i) rows[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < s_q; ++i) {
    for (int64_t j = 0; j < topk; ++j)
      std::swap(rows[j], rows[j + static_cast<int64_t>(rng() % (s_kv - j))]);
    std::copy(rows.begin(), rows.begin() + topk, p.indices.data<int32_t>() + i * topk);
  }
  return p;
}

BenchCase prefill_case(int64_t s_q, int64_t s_kv, int64_t h_q, int64_t topk, bool quick) {
  constexpr int64_t d_qk = 576;
  return {.name = "flash_mla_sparse_fwd",
          .shape = fmt::format("s_q={} s_kv={} h_q={} topk={} d_qk={}", s_q, s_kv, h_q, topk, d_qk),
          .ceiling = bf16_roof(),
          .residency = Residency::hot,
          .quick = quick,
          .prepare = [=](const CaseContext&) {
            auto p = std::make_shared<Prefill>(prefill_problem(s_q, s_kv, h_q, topk, d_qk));
            Prepared prep;
            prep.kernel = [p](int) { mla::flash_mla_sparse_fwd(p->q, p->kv, p->indices, 0.1352); };
            const double attended = static_cast<double>(s_q * topk);
            prep.flops = 2.0 * attended * static_cast<double>(h_q * (d_qk + kDv));
            prep.bytes =
                attended * d_qk * 2.0 + static_cast<double>(s_q * h_q * (d_qk + kDv)) * 2.0;
            return prep;
          }};
}

// ---- sparse FP8 decode ----

struct SparseDecode {
  Tensor q, cache, indices;
  mla::FlashMLASchedMeta meta;
  double unique_tokens = 0;
};

// b requests of s_k tokens each in shuffled 64-token pages; every query position picks topk
// distinct tokens of its request.
SparseDecode sparse_decode_problem(int64_t b, int64_t s_q, int64_t h_q, int64_t s_k, int64_t topk) {
  constexpr int64_t page = 64;
  SparseDecode p;
  p.q = ref::randn({b, s_q, h_q, 576}, DType::bf16, fresh_seed(), 0.0f, 0.1f);
  const int64_t pages_per_request = (s_k + page - 1) / page, blocks = b * pages_per_request;
  const Tensor latent = ref::randn({blocks * page, 576}, DType::bf16, fresh_seed(), 0.0f, 0.1f);
  p.cache = mla::quantize_kv_tokens(latent).view({blocks, page, 1, 656});
  std::vector<int32_t> block_ids(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) block_ids[i] = static_cast<int32_t>(i);
  std::mt19937_64 rng(fresh_seed());
  std::shuffle(block_ids.begin(), block_ids.end(), rng);
  p.indices = Tensor::empty({b, s_q, topk}, DType::i32);
  std::vector<int32_t> positions(static_cast<size_t>(s_k));
  for (int64_t i = 0; i < b; ++i) {
    std::unordered_set<int32_t> seen;
    for (int64_t t = 0; t < s_q; ++t) {
      for (int64_t j = 0; j < s_k; ++j) positions[j] = static_cast<int32_t>(j);
      for (int64_t j = 0; j < topk; ++j)
        std::swap(positions[j], positions[j + static_cast<int64_t>(rng() % (s_k - j))]);
      int32_t* row = p.indices.data<int32_t>() + (i * s_q + t) * topk;
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t pos = positions[j];
        row[j] =
            static_cast<int32_t>(block_ids[i * pages_per_request + pos / page] * page + pos % page);
        seen.insert(row[j]);
      }
    }
    p.unique_tokens += static_cast<double>(seen.size());
  }
  p.meta = mla::get_mla_metadata();
  return p;
}

BenchCase sparse_decode_case(int64_t b, int64_t s_q, int64_t h_q, int64_t s_k, int64_t topk,
                             bool quick) {
  const auto cache_bytes = static_cast<size_t>(b * ((s_k + 63) / 64) * 64 * 656);
  return {.name = "flash_mla_with_kvcache sparse fp8",
          .shape = fmt::format("b={} s_q={} h_q={} s_k={} topk={}", b, s_q, h_q, s_k, topk),
          .ceiling = bf16_roof(),
          .residency = Residency::cold,
          .working_set_bytes = cache_bytes,
          .quick = quick,
          .prepare = [=](const CaseContext& ctx) {
            auto problems = std::make_shared<std::vector<SparseDecode>>();
            for (int c = 0; c < ctx.copies; ++c)
              problems->push_back(sparse_decode_problem(b, s_q, h_q, s_k, topk));
            Prepared prep;
            prep.kernel = [problems](int c) {
              SparseDecode& p = (*problems)[static_cast<size_t>(c)];
              mla::flash_mla_with_kvcache(p.q, p.cache, std::nullopt, std::nullopt, kDv, p.meta,
                                          std::nullopt, 0.1352, false, true, p.indices);
            };
            const double attended = static_cast<double>(b * s_q * topk);
            prep.flops = 2.0 * attended * static_cast<double>(h_q * (576 + kDv));
            prep.bytes = (*problems)[0].unique_tokens * 656.0 +
                         static_cast<double>(b * s_q * h_q * (576 + kDv)) * 2.0;
            return prep;
          }};
}

// ---- dense decode ----

struct DenseDecode {
  Tensor q, cache, block_table, seqlens;
  mla::FlashMLASchedMeta meta;
};

DenseDecode dense_decode_problem(int64_t b, int64_t s_q, int64_t h_q, int64_t s_k) {
  constexpr int64_t page = 64;
  DenseDecode p;
  const int64_t pages = (s_k + page - 1) / page;
  p.q = ref::randn({b, s_q, h_q, 576}, DType::bf16, fresh_seed(), 0.0f, 0.1f);
  p.cache = ref::randn({b * pages, page, 1, 576}, DType::bf16, fresh_seed(), 0.0f, 0.1f);
  p.block_table = Tensor::empty({b, pages}, DType::i32);
  std::vector<int32_t> ids(static_cast<size_t>(b * pages));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(fresh_seed()));
  std::copy(ids.begin(), ids.end(), p.block_table.data<int32_t>());
  p.seqlens = Tensor::empty({b}, DType::i32);
  for (int64_t i = 0; i < b; ++i) p.seqlens.data<int32_t>()[i] = static_cast<int32_t>(s_k);
  p.meta = mla::get_mla_metadata();
  return p;
}

BenchCase dense_decode_case(int64_t b, int64_t s_q, int64_t h_q, int64_t s_k, bool quick) {
  const auto cache_bytes = static_cast<size_t>(b * ((s_k + 63) / 64) * 64 * 576 * 2);
  // Flops per cache byte: 2 h_q s_q (576 + 512) / 1152; bound by DRAM when that is below the
  // machine's compute-to-bandwidth ratio (about 20 without AMX, well over 100 with it).
  const bool memory_bound = backend_supported(Backend::amx) ? h_q * s_q <= 64 : h_q * s_q <= 16;
  return {.name = "flash_mla_with_kvcache dense",
          .shape = fmt::format("b={} s_q={} h_q={} s_k={} causal", b, s_q, h_q, s_k),
          .ceiling = memory_bound ? "dram_read" : bf16_roof(),
          .residency = Residency::cold,
          .working_set_bytes = cache_bytes,
          .quick = quick,
          .prepare = [=](const CaseContext& ctx) {
            auto problems = std::make_shared<std::vector<DenseDecode>>();
            for (int c = 0; c < ctx.copies; ++c)
              problems->push_back(dense_decode_problem(b, s_q, h_q, s_k));
            Prepared prep;
            prep.kernel = [problems](int c) {
              DenseDecode& p = (*problems)[static_cast<size_t>(c)];
              mla::flash_mla_with_kvcache(p.q, p.cache, p.block_table, p.seqlens, kDv, p.meta,
                                          std::nullopt, 0.1352, true);
            };
            prep.flops = 2.0 * static_cast<double>(b * s_q * s_k * h_q * (576 + kDv));
            prep.bytes = static_cast<double>(cache_bytes) +
                         static_cast<double>(b * s_q * h_q * (576 + kDv)) * 2.0;
            return prep;
          }};
}

// ---- verify: FlashMLA's allclose rule against dsk::ref on fresh data ----

// Elements of out and lse failing the rule (spec/attention.md §4.4): out abs 8e-4 / rel 3.01/128
// (prefill) or 1e-3 / 2.01/128 (decode), cosine 7e-6 / 5e-6; lse abs 1e-6 / rel 2.01/65536
// (prefill) or 8.01/65536 (decode). A failed cosine check counts as one more bad element.
double mismatches(const Tensor& out, const Tensor& out_ref, const Tensor& lse,
                  const Tensor& lse_ref, bool prefill) {
  const ref::AllcloseResult o = ref::allclose(
      out, out_ref, {prefill ? 8e-4 : 1e-3, (prefill ? 3.01 : 2.01) / 128, prefill ? 7e-6 : 5e-6});
  const ref::AllcloseResult l =
      ref::allclose(lse, lse_ref, {1e-6, (prefill ? 2.01 : 8.01) / 65536, 1.0});
  return static_cast<double>(o.num_bad + l.num_bad + (o.passed || o.num_bad ? 0 : 1));
}

void register_verify_cases(Registry& r) {
  r.add(VerifyCase{.name = "flash_mla_sparse_fwd",
                   .shape = "s_q=16 s_kv=1521 h_q=64 topk=512 d_qk=576",
                   .metric = "mismatches",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     const Prefill p = prefill_problem(16, 1521, 64, 512, 576);
                     const auto got = mla::flash_mla_sparse_fwd(p.q, p.kv, p.indices, 0.5);
                     const auto want = ref::mla::sparse_fwd(p.q, p.kv, p.indices, 0.5);
                     return mismatches(got.out, want.out, got.lse, want.lse, true);
                   }});
  r.add(VerifyCase{.name = "flash_mla_with_kvcache sparse fp8",
                   .shape = "b=4 s_q=2 h_q=128 s_k=1024 topk=576",
                   .metric = "mismatches",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     SparseDecode p = sparse_decode_problem(4, 2, 128, 1024, 576);
                     const auto got = mla::flash_mla_with_kvcache(
                         p.q, p.cache, std::nullopt, std::nullopt, kDv, p.meta, std::nullopt,
                         0.1352, false, true, p.indices);
                     const auto want = ref::mla::sparse_decode(p.q, p.cache, p.indices, 0.1352);
                     return mismatches(got.out, want.out, got.lse, want.lse, false);
                   }});
  r.add(VerifyCase{.name = "flash_mla_with_kvcache dense",
                   .shape = "b=6 s_q=4 h_q=64 s_k=140 causal",
                   .metric = "mismatches",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     DenseDecode p = dense_decode_problem(6, 4, 64, 140);
                     const auto got =
                         mla::flash_mla_with_kvcache(p.q, p.cache, p.block_table, p.seqlens, kDv,
                                                     p.meta, std::nullopt, 0.1352, true);
                     const auto want = ref::mla::dense_decode(p.q, p.cache, p.block_table,
                                                              p.seqlens, 0.1352, kDv, true);
                     return mismatches(got.out, want.out, got.lse, want.lse, false);
                   }});
}

}  // namespace

void register_mla_cases(Registry& r) {
  r.add(prefill_case(64, 8192, 128, 2048, true));
  r.add(prefill_case(512, 8192, 128, 2048, false));
  r.add(prefill_case(512, 32768, 128, 2048, false));
  r.add(sparse_decode_case(16, 2, 128, 4096, 2048, true));
  r.add(sparse_decode_case(64, 2, 128, 4096, 2048, false));
  r.add(dense_decode_case(32, 1, 128, 4096, true));
  r.add(dense_decode_case(32, 1, 16, 4096, true));
  register_verify_cases(r);
}

}  // namespace dsk::bench
