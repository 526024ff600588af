// The "indexer" module of `dsk bench` / `dsk verify`: the lightning indexer's dense MQA logits
// (gemm::fp8_mqa_logits) and the paged decode logits (fp8_paged_mqa_logits) timed against the
// bf16 compute roof of the machine (AMX where it runs), and a verify case against
// dsk::ref::mqa_logits on fresh random data.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>

#include <fmt/format.h>

#include <dsk/core/threads.hpp>
#include <dsk/gemm.hpp>
#include <dsk/ref.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

uint64_t fresh_seed() {
  static std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

struct Logits {
  Tensor q;
  gemm::Fp8Tensor kv;
  Tensor weights, ks, ke;
  double kv_rows = 0;  // sum over queries of ke - ks
};

// Causal prefill without context parallelism (upstream's grid): ks = 0, ke = i + Skv - S.
Logits causal_problem(int64_t s, int64_t skv, int64_t h, int64_t d) {
  Logits p;
  p.q = ref::randn({s, h, d}, DType::e4m3, fresh_seed());
  p.kv.data = ref::randn({skv, d}, DType::e4m3, fresh_seed(), 0.0f, 100.0f);
  p.kv.sf = ref::rand_uniform({skv}, DType::f32, fresh_seed(), 0.001f, 0.01f);
  p.weights = ref::randn({s, h}, DType::f32, fresh_seed());
  p.ks = Tensor::zeros({s}, DType::i32);
  p.ke = Tensor::empty({s}, DType::i32);
  for (int64_t i = 0; i < s; ++i) {
    p.ke.data<int32_t>()[i] = static_cast<int32_t>(std::max<int64_t>(0, i + skv - s));
    p.kv_rows += static_cast<double>(p.ke.data<int32_t>()[i]);
  }
  return p;
}

BenchCase logits_case(int64_t s, int64_t skv, int64_t h, int64_t d, bool quick) {
  return {.name = "fp8_mqa_logits",
          .shape = fmt::format("S={} Skv={} H={} D={} causal", s, skv, h, d),
          .ceiling = bf16_roof(),
          .residency = Residency::hot,
          .quick = quick,
          .prepare = [=](const CaseContext&) {
            auto p = std::make_shared<Logits>(causal_problem(s, skv, h, d));
            Prepared prep;
            prep.kernel = [p](int) { gemm::fp8_mqa_logits(p->q, p->kv, p->weights, p->ks, p->ke); };
            prep.flops = 2.0 * p->kv_rows * static_cast<double>(h * d);
            // q, kv and its scales, weights, and the logits written (f32, full rows).
            prep.bytes = static_cast<double>(s * h * d + skv * d + 4 * skv + 4 * s * h) +
                         4.0 * static_cast<double>(s * skv);
            return prep;
          }};
}

// Decode: B items with `context` tokens each in a paged cache (blocks in shuffled order).
struct PagedLogits {
  Tensor q, cache, weights, lens, table, meta;
  int64_t context = 0;
};

PagedLogits paged_problem(int64_t batch, int64_t next_n, int64_t context, int64_t h, int64_t d,
                          int64_t block_kv) {
  PagedLogits p;
  p.context = context;
  const int64_t per_item = (context + block_kv - 1) / block_kv;
  p.q = ref::randn({batch, next_n, h, d}, DType::e4m3, fresh_seed());
  p.weights = ref::randn({batch * next_n, h}, DType::f32, fresh_seed());
  p.cache = ref::randint({batch * per_item, block_kv, 1, d + 4}, DType::u8, fresh_seed(), 0, 120);
  p.lens = Tensor::empty({batch}, DType::i32);
  p.table = Tensor::empty({batch, per_item}, DType::i32);
  std::vector<int32_t> ids(static_cast<size_t>(batch * per_item));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(fresh_seed()));
  std::copy(ids.begin(), ids.end(), p.table.data<int32_t>());
  for (int64_t b = 0; b < batch; ++b) p.lens.data<int32_t>()[b] = static_cast<int32_t>(context);
  // Scales: small positive floats (the random bytes above would be arbitrary floats).
  for (int64_t blk = 0; blk < batch * per_item; ++blk) {
    uint8_t* scales = p.cache.data<uint8_t>() + blk * block_kv * (d + 4) + block_kv * d;
    for (int64_t t = 0; t < block_kv; ++t) {
      const float sf = 0.004f;
      std::memcpy(scales + 4 * t, &sf, 4);
    }
  }
  p.meta = gemm::get_paged_mqa_logits_metadata(p.lens, block_kv, get_num_threads());
  return p;
}

BenchCase paged_case(int64_t batch, int64_t next_n, int64_t context, int64_t h, int64_t d,
                     bool quick) {
  const double tokens = static_cast<double>(batch * context);
  return {.name = "fp8_paged_mqa_logits",
          .shape = fmt::format("B={} next_n={} ctx={} H={} D={} block_kv=64", batch, next_n,
                               context, h, d),
          .ceiling = bf16_roof(),
          .residency = Residency::cold,
          .working_set_bytes = static_cast<size_t>(tokens * static_cast<double>(d + 4)),
          .quick = quick,
          .prepare = [=](const CaseContext& ctx) {
            auto problems = std::make_shared<std::vector<PagedLogits>>();
            for (int c = 0; c < ctx.copies; ++c)
              problems->push_back(paged_problem(batch, next_n, context, h, d, 64));
            Prepared prep;
            prep.kernel = [problems](int c) {
              const PagedLogits& p = (*problems)[static_cast<size_t>(c)];
              gemm::fp8_paged_mqa_logits(p.q, p.cache, p.weights, p.lens, p.table, p.meta,
                                         p.context, true);
            };
            prep.flops = 2.0 * tokens * static_cast<double>(next_n * h * d);
            prep.bytes =
                tokens * static_cast<double>(d + 4) + 4.0 * tokens * static_cast<double>(next_n);
            return prep;
          }};
}

}  // namespace

void register_indexer_cases(Registry& r) {
  r.add(paged_case(64, 1, 8192, 64, 128, true));
  r.add(paged_case(64, 2, 8192, 64, 128, false));
  r.add(logits_case(512, 8192, 64, 128, true));
  r.add(logits_case(4096, 8192, 64, 128, false));
  r.add(logits_case(512, 8192, 32, 64, false));
  r.add(VerifyCase{.name = "fp8_mqa_logits",
                   .shape = "S=128 Skv=2048 H=64 D=128 causal",
                   .metric = "calc_diff",
                   .tolerance = 5e-6,
                   .run = [](const CaseContext&) {
                     const Logits p = causal_problem(128, 2048, 64, 128);
                     const Tensor got = gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke);
                     Tensor want = ref::mqa_logits(p.q, p.kv.data, p.kv.sf, p.weights, p.ks, p.ke);
                     Tensor mine = Tensor::empty(want.sizes(), DType::f64);
                     double masks = 0;
                     for (int64_t i = 0; i < 128; ++i)
                       for (int64_t j = 0; j < 2048; ++j) {
                         double& w = want.data<double>()[i * 2048 + j];
                         double& m = mine.data<double>()[i * 2048 + j];
                         m = got.data<float>()[i * got.stride(0) + j];
                         masks += std::isinf(m) != std::isinf(w);
                         if (std::isinf(m) || std::isinf(w)) m = w = 0;
                       }
                     return masks > 0 ? std::numeric_limits<double>::infinity()
                                      : ref::calc_diff(mine, want);
                   }});
}

}  // namespace dsk::bench
