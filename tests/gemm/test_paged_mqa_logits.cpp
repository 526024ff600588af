// gemm::fp8_paged_mqa_logits and get_paged_mqa_logits_metadata: against dsk::ref::mqa_logits on
// each batch item's gathered tokens, bit for bit against the dense kernel on the same tokens,
// random block tables, block_kv 32/64/128, next_n 1 and 2 with 1-D and 2-D lengths, the schedule,
// strides, -inf cleaning, repeatability, bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>

#include "../src/gemm/mqa_kernels.hpp"
#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

struct Paged {
  int64_t batch = 0, next_n = 0, heads = 0, d = 0, block_kv = 0, max_len = 0;
  Tensor q;                   // e4m3 [B, next_n, H, D]
  Tensor weights;             // f32 [B * next_n, H]
  Tensor lens;                // int32 [B] or [B, next_n]
  Tensor table;               // int32 [B, max_blocks]
  Tensor cache;               // u8 [blocks, block_kv, 1, D + 4]
  std::vector<Tensor> kv;     // per item: e4m3 [len, D]
  std::vector<Tensor> kv_sf;  // per item: f32 [len]
};

int64_t valid_len(const Paged& p, int64_t b, int64_t j) {
  const int32_t* l = p.lens.data<int32_t>();
  if (p.lens.dim() == 2) return l[b * p.next_n + j];
  return std::max<int64_t>(0, l[b] - p.next_n + j + 1);
}

Paged make_paged(int64_t batch, int64_t next_n, int64_t heads, int64_t d, int64_t block_kv,
                 int64_t max_ctx, bool lens_2d) {
  Paged p;
  p.batch = batch;
  p.next_n = next_n;
  p.heads = heads;
  p.d = d;
  p.block_kv = block_kv;
  std::mt19937_64 rng(fresh_seed());
  p.q = ref::randn({batch, next_n, heads, d}, DType::e4m3, fresh_seed());
  p.weights = randn_f32({batch * next_n, heads});
  p.lens =
      lens_2d ? Tensor::empty({batch, next_n}, DType::i32) : Tensor::empty({batch}, DType::i32);
  std::vector<int64_t> item_len(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len =
        next_n + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_ctx - next_n + 1));
    item_len[static_cast<size_t>(b)] = len;
    if (lens_2d)
      for (int64_t j = 0; j < next_n; ++j)
        p.lens.data<int32_t>()[b * next_n + j] = static_cast<int32_t>(len - (rng() % 3) * j);
    else
      p.lens.data<int32_t>()[b] = static_cast<int32_t>(len);
    p.max_len = std::max(p.max_len, len);
  }
  const int64_t max_blocks = (p.max_len + block_kv - 1) / block_kv + 1;
  int64_t total = 0;
  for (int64_t len : item_len) total += (len + block_kv - 1) / block_kv;
  const int64_t num_blocks = total + 3;  // a few unused blocks
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.table = Tensor::empty({batch, max_blocks}, DType::i32);
  std::fill(p.table.data<int32_t>(), p.table.data<int32_t>() + batch * max_blocks, -1);
  p.cache = ref::randint({num_blocks, block_kv, 1, d + 4}, DType::u8, fresh_seed(), 0, 256);
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = item_len[static_cast<size_t>(b)];
    Tensor kv = ref::randn({len, d}, DType::e4m3, fresh_seed(), 0.0f, 50.0f);
    Tensor sf = ref::rand_uniform({len}, DType::f32, fresh_seed(), 0.001f, 0.01f);
    for (int64_t blk = 0; blk * block_kv < len; ++blk) {
      const int32_t id = ids[next++];
      p.table.data<int32_t>()[b * max_blocks + blk] = id;
      uint8_t* block = p.cache.data<uint8_t>() + id * block_kv * (d + 4);
      for (int64_t t = blk * block_kv; t < std::min(len, (blk + 1) * block_kv); ++t) {
        const int64_t slot = t - blk * block_kv;
        std::memcpy(block + slot * d, kv.data<e4m3>() + t * d, static_cast<size_t>(d));
        std::memcpy(block + block_kv * d + 4 * slot, sf.data<float>() + t, 4);
      }
    }
    p.kv.push_back(kv);
    p.kv_sf.push_back(sf);
  }
  return p;
}

Tensor run_paged(const Paged& p, bool clean, int64_t sms = 0, DType dtype = DType::f32) {
  const Tensor meta =
      gemm::get_paged_mqa_logits_metadata(p.lens, p.block_kv, sms > 0 ? sms : get_num_threads());
  return gemm::fp8_paged_mqa_logits(p.q, p.cache, p.weights, p.lens, p.table, meta, p.max_len,
                                    clean, dtype);
}

// Item b's rows as a dense problem: q [next_n, H, D], ranges [0, valid_len).
struct ItemRows {
  Tensor q, weights, ks, ke;
};
ItemRows item_rows(const Paged& p, int64_t b) {
  ItemRows r;
  r.q = p.q.select(0, b).contiguous();
  r.weights = p.weights.slice(0, b * p.next_n, (b + 1) * p.next_n).contiguous();
  r.ks = Tensor::zeros({p.next_n}, DType::i32);
  r.ke = Tensor::empty({p.next_n}, DType::i32);
  for (int64_t j = 0; j < p.next_n; ++j)
    r.ke.data<int32_t>()[j] = static_cast<int32_t>(valid_len(p, b, j));
  return r;
}

class PagedMqaLogits : public dsk::test::PerBackend {};

// Bit for bit against the dense kernel on every item, and against the fp64 reference (< 5e-6,
// -inf masks equal) on the first ref_items items (the reference is slow on long contexts).
void check_paged(const Paged& p, int64_t ref_items = 1 << 30) {
  SCOPED_TRACE(fmt::format("B={} next_n={} H={} D={} block_kv={} lens_2d={} {}", p.batch, p.next_n,
                           p.heads, p.d, p.block_kv, p.lens.dim() == 2, seed_note()));
  const bool clean = p.lens.dim() == 1;
  const Tensor logits = run_paged(p, clean);
  ASSERT_EQ(logits.size(0), p.batch * p.next_n);
  ASSERT_EQ(logits.size(1), p.max_len);
  EXPECT_EQ(logits.stride(0), (p.max_len + 255) / 256 * 256);
  double worst = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const ItemRows r = item_rows(p, b);
    const int64_t len = p.kv[static_cast<size_t>(b)].size(0);
    const Tensor dense =
        gemm::fp8_mqa_logits(r.q, {p.kv[static_cast<size_t>(b)], p.kv_sf[static_cast<size_t>(b)]},
                             r.weights, r.ks, r.ke, false);
    const bool with_ref = b < ref_items;
    const Tensor want =
        with_ref ? ref::mqa_logits(r.q, p.kv[static_cast<size_t>(b)],
                                   p.kv_sf[static_cast<size_t>(b)], r.weights, r.ks, r.ke)
                 : Tensor::zeros({p.next_n, len}, DType::f64);
    Tensor got = Tensor::empty({p.next_n, len}, DType::f64), exp = want.clone();
    for (int64_t j = 0; j < p.next_n; ++j) {
      const int64_t row = b * p.next_n + j, valid = valid_len(p, b, j);
      for (int64_t t = 0; t < len; ++t) {
        const float v = logits.data<float>()[row * logits.stride(0) + t];
        if (t < valid) {
          ASSERT_EQ(std::memcmp(&v, &dense.data<float>()[j * dense.stride(0) + t], 4), 0)
              << "paged vs dense kernel: item " << b << " row " << j << " token " << t;
          got.data<double>()[j * len + t] = v;
        } else {
          if (clean) {
            ASSERT_EQ(v, -std::numeric_limits<float>::infinity()) << b << "," << j;
          }
          got.data<double>()[j * len + t] = exp.data<double>()[j * len + t] = 0;
        }
      }
      for (int64_t t = len; clean && t < p.max_len; ++t)
        ASSERT_EQ(logits.data<float>()[row * logits.stride(0) + t],
                  -std::numeric_limits<float>::infinity());
    }
    if (with_ref) worst = std::max(worst, ref::calc_diff(got, exp));
  }
  EXPECT_LT(worst, 5e-6) << "vs the dequantised reference";
}

TEST_P(PagedMqaLogits, MatchesReferenceAndDenseKernel) {
  for (int64_t block_kv : {32, 64, 128})
    check_paged(make_paged(4, 1, 32, 64, block_kv, 700, false));
  check_paged(make_paged(4, 2, 32, 128, 64, 900, false));
  check_paged(make_paged(5, 2, 12, 32, 64, 300, true));
}

// The tile-register path (the amx default; emulated on avx512 and generic) likewise.
TEST_P(PagedMqaLogits, TilePathMatchesReferenceAndDenseKernel) {
  const dsk::test::ScopedOverride<gemm::detail::Products> tiles(
      gemm::detail::set_mqa_products_override, gemm::detail::Products::tile_registers);
  check_paged(make_paged(4, 2, 32, 128, 64, 900, false));
  check_paged(make_paged(5, 2, 12, 32, 32, 300, true));
  // Each panel packed during the previous one's products (two panels per block), and packed just
  // before its own (96 query rows: gemm::mqa_pack_ahead is false).
  check_paged(make_paged(3, 1, 64, 128, 128, 600, false));
  check_paged(make_paged(3, 3, 32, 64, 128, 500, true));
}

TEST(PagedMqaLogitsLarge, ContextsUpTo8192) {
  DSK_SKIP_UNLESS_BACKEND(Backend::avx512);
  dsk::test::ScopedBackend scoped(Backend::avx512);
  check_paged(make_paged(32, 2, 64, 128, 64, 8192, false), 2);
}

TEST_P(PagedMqaLogits, ScheduleDoesNotChangeResults) {
  SCOPED_TRACE(seed_note());
  const Paged p = make_paged(7, 2, 16, 64, 32, 1000, false);
  const Tensor first = run_paged(p, true, 1);
  for (int64_t sms : {2, 3, 16, 200}) EXPECT_TRUE(bitwise_equal(run_paged(p, true, sms), first));
  const int threads = get_num_threads();
  for (int run = 0; run < 6; ++run) {
    set_num_threads(run % 2 == 0 ? 1 : std::max(2, threads));
    ASSERT_TRUE(bitwise_equal(run_paged(p, true), first)) << run;
  }
  set_num_threads(threads);
  const Tensor half = run_paged(p, true, 2, DType::bf16);
  // Upstream's row stride: align(align(max_context_len, 256), 1024 bytes / 2) for bf16 (the
  // random lengths decide max_context_len).
  EXPECT_EQ(half.stride(0), ((p.max_len + 255) / 256 * 256 + 511) / 512 * 512);
  for (int64_t r = 0; r < first.size(0); ++r)
    for (int64_t t = 0; t < first.size(1); ++t)
      ASSERT_EQ(half.data<bf16>()[r * half.stride(0) + t].bits,
                numeric::f32_to_bf16(first.data<float>()[r * first.stride(0) + t]).bits);
}

TEST(PagedMqaLogitsMetadata, SplitsBlocksEvenly) {
  Tensor lens = Tensor::empty({3}, DType::i32);
  lens.data<int32_t>()[0] = 640;  // 10 blocks of 64
  lens.data<int32_t>()[1] = 0;    // none
  lens.data<int32_t>()[2] = 65;   // 2 blocks
  const Tensor meta = gemm::get_paged_mqa_logits_metadata(lens, 64, 4);
  ASSERT_EQ(meta.size(0), 5);
  const std::vector<int32_t> want = {0, 0, 0, 3, 0, 6, 0, 9, 3, 0};
  EXPECT_EQ(std::vector<int32_t>(meta.data<int32_t>(), meta.data<int32_t>() + 10), want);
}

TEST(PagedMqaLogitsErrors, BadInputsRaise) {
  const Paged p = make_paged(3, 1, 8, 64, 64, 200, false);
  const Tensor meta = gemm::get_paged_mqa_logits_metadata(p.lens, 64, 2);
  auto raises = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << "no dsk::Error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mqa_logits"), std::string::npos) << e.what();
    }
  };
  auto run = [&](const Tensor& table, const Tensor& m, int64_t max_len) {
    gemm::fp8_paged_mqa_logits(p.q, p.cache, p.weights, p.lens, table, m, max_len, true);
  };
  Tensor bad_table = p.table.clone();
  bad_table.data<int32_t>()[0] = 1 << 20;
  raises([&] { run(bad_table, meta, p.max_len); }, "block id past the cache");
  bad_table.data<int32_t>()[0] = -1;
  raises([&] { run(bad_table, meta, p.max_len); }, "negative block id");
  raises([&] { run(p.table, meta, p.max_len - 1); }, "max_context_len too small");
  Tensor bad_meta = meta.clone();
  bad_meta.data<int32_t>()[2] = 7;
  raises([&] { run(p.table, bad_meta, p.max_len); }, "schedule past the batch");
  raises([&] { gemm::get_paged_mqa_logits_metadata(p.lens, 48, 2); }, "block_kv 48");
  raises([&] { gemm::get_paged_mqa_logits_metadata(p.lens, 64, 0); }, "num_sms 0");
  Tensor lens2 = Tensor::empty({3, 1}, DType::i32);
  std::copy_n(p.lens.data<int32_t>(), 3, lens2.data<int32_t>());
  raises(
      [&] {
        gemm::fp8_paged_mqa_logits(p.q, p.cache, p.weights, lens2, p.table, meta, p.max_len, true);
      },
      "clean with 2-D lengths");
}

DSK_INSTANTIATE_PER_BACKEND(PagedMqaLogits);

}  // namespace
}  // namespace dsk::gemm_test
