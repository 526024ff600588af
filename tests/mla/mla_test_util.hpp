// Helpers of the dsk::mla suites (test_*.cpp, slow_*.cpp): problems built the way FlashMLA's tests
// build them (sparse prefill, sparse FP8 decode with NaN in every unreferenced cache slot, dense
// decode over permuted pages), the tolerances of spec/attention.md §4.4, and the checks against
// dsk::ref::mla (allclose, then, unless the caller opts out, a second run that must repeat bit for
// bit).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/threads.hpp>
#include <dsk/mla.hpp>
#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::mla_test {

namespace kv_format = kernels::mla;

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- fresh data ----

// A base drawn once per process, so every run sees new data; failures print it (SCOPED_TRACE).
inline uint64_t base_seed() {
  static const uint64_t seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  return seed;
}
inline uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{0};
  return base_seed() + 0x9E3779B97F4A7C15ull * ++counter;
}
inline std::string seed_note() {
  return fmt::format("base seed {:#x}", base_seed());
}

// randn(0, std) + U(-spread, spread), rounded to bf16 (upstream's prefill data is randn / 10 +
// U(-0.05, 0.05)).
inline Tensor bf16_data(const Shape& shape, float std, float spread = 0.0f) {
  const Tensor n = ref::randn(shape, DType::f32, fresh_seed(), 0.0f, std);
  const Tensor u = ref::rand_uniform(shape, DType::f32, fresh_seed(), -spread, spread);
  Tensor out = Tensor::empty(shape, DType::bf16);
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<bf16>()[i] = numeric::f32_to_bf16(n.data<float>()[i] + u.data<float>()[i]);
  return out;
}

// randn(0, std) clamped to [-1, 1], rounded to bf16 (upstream's decode data: q std 1, the cache
// std 0.1), as f32 values.
inline Tensor clamped_randn_f32(const Shape& shape, float std) {
  Tensor t = ref::randn(shape, DType::f32, fresh_seed(), 0.0f, std);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = std::clamp(t.data<float>()[i], -1.0f, 1.0f);
  return t;
}
inline Tensor clamped_randn(const Shape& shape, float std) {
  const Tensor f = clamped_randn_f32(shape, std);
  Tensor out = Tensor::empty(shape, DType::bf16);
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<bf16>()[i] = numeric::f32_to_bf16(f.data<float>()[i]);
  return out;
}

inline Tensor i32_tensor(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// A copy of t in which only the last dimension is contiguous: every row sits in a wider row whose
// tail is poisoned (NaN for floats), so a kernel that assumes contiguity reads garbage.
inline Tensor strided_copy(const Tensor& t, int64_t pad = 24) {
  Shape wide = t.sizes();
  wide.back() += pad;
  Tensor buffer = Tensor::empty(wide, t.dtype());
  ref::poison(buffer);
  Tensor view = buffer.slice(t.dim() - 1, 0, t.size(-1));
  view.copy_(t);
  return view;
}

using test::bitwise_equal;

// Runs run() in deterministic mode with one thread and then with two or more; returns both
// results (the settings are restored even when run() throws).
template <class Run>
auto run_with_one_and_many_threads(const Run& run) {
  struct Restore {
    int threads = get_num_threads();
    bool deterministic = get_deterministic_algorithms();
    ~Restore() {
      set_num_threads(threads);
      use_deterministic_algorithms(deterministic);
    }
  } restore;
  use_deterministic_algorithms(true);
  set_num_threads(1);
  auto one = run();
  set_num_threads(std::max(2, restore.threads));
  return std::pair{one, run()};
}

// ---- tolerances (spec/attention.md §4.4, HEAD) ----

inline constexpr ref::AllcloseOptions kPrefillOut{
    .abs_tol = 8e-4, .rel_tol = 3.01 / 128, .cos_tol = 7e-6};
inline constexpr ref::AllcloseOptions kPrefillStats{
    .abs_tol = 1e-6, .rel_tol = 2.01 / 65536, .cos_tol = 1e-6};
inline constexpr ref::AllcloseOptions kDecodeOut{
    .abs_tol = 1e-3, .rel_tol = 2.01 / 128, .cos_tol = 5e-6};
inline constexpr ref::AllcloseOptions kDecodeLse{
    .abs_tol = 1e-6, .rel_tol = 8.01 / 65536, .cos_tol = 1e-6};

inline void expect_close(const Tensor& actual, const Tensor& expected,
                         const ref::AllcloseOptions& options, const char* what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const ref::AllcloseResult r = ref::allclose(actual, expected, options);
  EXPECT_TRUE(r.passed) << what << ": " << r.message;
}

// ---- random index rows ----

inline std::mt19937_64 make_rng() {
  return std::mt19937_64(fresh_seed());
}

// `count` distinct values of [0, n) in random order (count <= n).
inline std::vector<int32_t> distinct_positions(int64_t n, int64_t count, std::mt19937_64& rng) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < count; ++i)
    std::swap(all[i], all[i + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - i))]);
  all.resize(static_cast<size_t>(count));
  return all;
}

// Sinks as upstream draws them: N(0, 1) per head, then +inf where a second N(0, 1) draw is above
// 0.5 and -inf where it is below -0.5.
inline Tensor make_sinks(int64_t h_q) {
  Tensor t = ref::randn({h_q}, DType::f32, fresh_seed());
  const Tensor mask = ref::randn({h_q}, DType::f32, fresh_seed());
  for (int64_t h = 0; h < h_q; ++h) {
    if (mask.data<float>()[h] > 0.5f) t.data<float>()[h] = kInf;
    if (mask.data<float>()[h] < -0.5f) t.data<float>()[h] = -kInf;
  }
  return t;
}

// topk_length: random in [0, topk] per row, with 0 and topk both present when there are rows
// enough.
inline Tensor make_lengths(int64_t rows, int64_t topk, std::mt19937_64& rng) {
  std::vector<int32_t> v(static_cast<size_t>(rows));
  for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(topk + 1));
  if (rows >= 2) v[0] = 0;
  if (rows >= 3) v[rows - 1] = static_cast<int32_t>(topk);
  return i32_tensor({rows}, v);
}

// ---- sparse prefill ----

struct SparseFwdOptions {
  bool invalid_mix = true;        // about one entry in eight invalid, of every kind
  bool all_invalid_rows = false;  // row 0 and about one in four others have no valid entry
  bool sinks = false;
  bool topk_length = false;
  bool strided = true;  // q, kv and indices with only the last dimension contiguous
  double sm_scale = 0.5;
};

struct SparseFwdProblem {
  Tensor q, kv, indices;
  std::optional<Tensor> attn_sink, topk_length;
  double sm_scale = 0.5;
  std::string note;
};

// The invalid values of upstream's prefill test: negative, at or past s_kv, the int32 extremes.
inline int32_t invalid_index(int64_t s_kv, std::mt19937_64& rng) {
  const int32_t kinds[] = {std::numeric_limits<int32_t>::min(),
                           -1,
                           -2,
                           static_cast<int32_t>(s_kv),
                           static_cast<int32_t>(s_kv + 17),
                           std::numeric_limits<int32_t>::max()};
  return kinds[rng() % 6];
}

inline SparseFwdProblem make_sparse_fwd(int64_t s_q, int64_t s_kv, int64_t h_q, int64_t d_qk,
                                        int64_t topk, const SparseFwdOptions& o = {}) {
  std::mt19937_64 rng = make_rng();
  SparseFwdProblem p;
  p.sm_scale = o.sm_scale;
  p.note = fmt::format(
      "s_q={} s_kv={} h_q={} d_qk={} topk={} mix={} empty_rows={} sinks={} "
      "topk_length={} {}",
      s_q, s_kv, h_q, d_qk, topk, o.invalid_mix, o.all_invalid_rows, o.sinks, o.topk_length,
      seed_note());
  const Tensor q = bf16_data({s_q, h_q, d_qk}, 0.1f, 0.05f);
  const Tensor kv = bf16_data({s_kv, 1, d_qk}, 0.1f, 0.05f);
  std::vector<int32_t> idx(static_cast<size_t>(s_q * topk));
  for (int64_t i = 0; i < s_q; ++i) {
    const bool empty = o.all_invalid_rows && (i == 0 || rng() % 4 == 0);
    const int64_t valid = empty ? 0 : std::min(topk, s_kv);
    std::vector<int32_t> row = distinct_positions(s_kv, valid, rng);
    row.resize(static_cast<size_t>(topk), -1);
    for (int64_t j = 0; j < topk; ++j)
      if (j >= valid || (o.invalid_mix && rng() % 8 == 0)) row[j] = invalid_index(s_kv, rng);
    std::shuffle(row.begin(), row.end(), rng);
    std::copy(row.begin(), row.end(), idx.begin() + i * topk);
  }
  const Tensor indices = i32_tensor({s_q, 1, topk}, idx);
  p.q = o.strided ? strided_copy(q) : q;
  p.kv = o.strided ? strided_copy(kv) : kv;
  p.indices = o.strided ? strided_copy(indices) : indices;
  if (o.sinks) p.attn_sink = make_sinks(h_q);
  if (o.topk_length) p.topk_length = make_lengths(s_q, topk, rng);
  return p;
}

inline mla::SparseFwdResult run_sparse_fwd(const SparseFwdProblem& p) {
  return mla::flash_mla_sparse_fwd(p.q, p.kv, p.indices, p.sm_scale, 512, p.attn_sink,
                                   p.topk_length);
}

inline void check_sparse_fwd(const SparseFwdProblem& p, bool run_twice = true) {
  SCOPED_TRACE(p.note);
  const mla::SparseFwdResult got = run_sparse_fwd(p);
  ASSERT_EQ(got.out.dtype(), DType::bf16);
  ASSERT_EQ(got.lse.dtype(), DType::f32);
  ASSERT_EQ(got.max_logits.dtype(), DType::f32);
  const mla::SparseFwdResult want =
      ref::mla::sparse_fwd(p.q, p.kv, p.indices, p.sm_scale, 512, p.attn_sink, p.topk_length);
  expect_close(got.out, want.out, kPrefillOut, "out");
  expect_close(got.max_logits, want.max_logits, kPrefillStats, "max_logits");
  expect_close(got.lse, want.lse, kPrefillStats, "lse");
  if (!run_twice) return;
  const mla::SparseFwdResult again = run_sparse_fwd(p);
  EXPECT_TRUE(bitwise_equal(again.out, got.out)) << "out differs between two runs";
  EXPECT_TRUE(bitwise_equal(again.lse, got.lse)) << "lse differs between two runs";
  EXPECT_TRUE(bitwise_equal(again.max_logits, got.max_logits)) << "max_logits differs";
}

// ---- sparse FP8 decode ----

struct SparseDecodeOptions {
  bool all_invalid_rows = false;      // row (0, 0) and about one in five others all -1
  bool zero_length_requests = false;  // request 0 (and about one in four others) has no keys
  bool sinks = false;
  bool topk_length = false;
  bool strided_q = false;
};

struct SparseDecodeProblem {
  Tensor q;        // bf16 [b, s_q, h_q, 576]
  Tensor k_cache;  // u8 [num_blocks, page, 1, 656]; every slot no valid entry names is NaN
  Tensor indices;  // int32 [b, s_q, topk] global slots, -1 invalid
  std::optional<Tensor> attn_sink, topk_length;
  double sm_scale = std::pow(576.0, -0.55);  // upstream's decode test scale
  std::string note;
};

// Overwrites one token with NaN everywhere: NaN codes (0x7F and 0xFF alternating), NaN scales and
// NaN RoPE values.
inline void poison_token(uint8_t* token) {
  for (int64_t d = 0; d < kv_format::kLatentDim; ++d) token[d] = d % 2 ? 0xFF : 0x7F;
  std::memset(token + kv_format::kLatentDim, 0xFF, kv_format::kTokenBytes - kv_format::kLatentDim);
}

// Requests of random length in [1, max_s_k] whose pages are a random permutation of the cache's
// blocks (plus two blocks no request owns); each row picks min(topk, length) distinct positions of
// its request, maps them through the block table to global slots and pads with -1.
inline SparseDecodeProblem make_sparse_decode(int64_t b, int64_t s_q, int64_t h_q, int64_t topk,
                                              int64_t page, int64_t max_s_k,
                                              const SparseDecodeOptions& o = {}) {
  std::mt19937_64 rng = make_rng();
  SparseDecodeProblem p;
  p.note = fmt::format(
      "b={} s_q={} h_q={} topk={} page={} max_s_k={} empty_rows={} "
      "zero_length={} sinks={} topk_length={} {}",
      b, s_q, h_q, topk, page, max_s_k, o.all_invalid_rows, o.zero_length_requests, o.sinks,
      o.topk_length, seed_note());
  std::vector<int64_t> length(static_cast<size_t>(b)), first_block(static_cast<size_t>(b));
  int64_t num_blocks = 2;
  for (int64_t i = 0; i < b; ++i) {
    const bool zero = o.zero_length_requests && (i == 0 || rng() % 4 == 0);
    length[i] = zero ? 0 : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_s_k));
    first_block[i] = num_blocks - 2;
    num_blocks += (length[i] + page - 1) / page;
  }
  const std::vector<int32_t> physical = distinct_positions(num_blocks, num_blocks, rng);
  const Tensor kv = clamped_randn_f32({num_blocks * page, kv_format::kQkDim}, 0.1f);
  Tensor tokens = mla::quantize_kv_tokens(kv);
  std::vector<char> referenced(static_cast<size_t>(num_blocks * page), 0);
  if (o.topk_length) p.topk_length = make_lengths(b, topk, rng);
  std::vector<int32_t> idx(static_cast<size_t>(b * s_q * topk), -1);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < s_q; ++t) {
      const bool empty = o.all_invalid_rows && ((i == 0 && t == 0) || rng() % 5 == 0);
      const int64_t n = empty ? 0 : std::min(topk, length[i]);
      std::vector<int32_t> row = distinct_positions(std::max<int64_t>(length[i], 1), n, rng);
      for (int32_t& pos : row)
        pos = static_cast<int32_t>(
            kv_format::global_slot(physical[first_block[i] + pos / page], pos % page, page));
      row.resize(static_cast<size_t>(topk), -1);
      std::shuffle(row.begin(), row.end(), rng);
      const int64_t used = o.topk_length ? p.topk_length->data<int32_t>()[i] : topk;
      for (int64_t j = 0; j < used; ++j)
        if (row[j] != -1) referenced[row[j]] = 1;
      std::copy(row.begin(), row.end(), idx.begin() + (i * s_q + t) * topk);
    }
  for (int64_t slot = 0; slot < num_blocks * page; ++slot)
    if (!referenced[slot]) poison_token(tokens.data<uint8_t>() + slot * kv_format::kTokenBytes);
  p.k_cache = tokens.view({num_blocks, page, 1, kv_format::kTokenBytes});
  p.indices = i32_tensor({b, s_q, topk}, idx);
  const Tensor q = clamped_randn({b, s_q, h_q, kv_format::kQkDim}, 1.0f);
  p.q = o.strided_q ? strided_copy(q) : q;
  if (o.sinks) p.attn_sink = make_sinks(h_q);
  return p;
}

inline mla::KvcacheResult run_sparse_decode(const SparseDecodeProblem& p,
                                            mla::FlashMLASchedMeta& meta) {
  return mla::flash_mla_with_kvcache(p.q, p.k_cache, std::nullopt, std::nullopt, 512, meta,
                                     std::nullopt, p.sm_scale, false, true, p.indices, p.attn_sink,
                                     p.topk_length);
}

inline void check_sparse_decode(const SparseDecodeProblem& p, bool run_twice = true) {
  SCOPED_TRACE(p.note);
  mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
  const mla::KvcacheResult got = run_sparse_decode(p, meta);
  ASSERT_EQ(got.out.dtype(), DType::bf16);
  ASSERT_EQ(got.lse.dtype(), DType::f32);
  const mla::KvcacheResult want = ref::mla::sparse_decode(p.q, p.k_cache, p.indices, p.sm_scale,
                                                          512, p.attn_sink, p.topk_length);
  expect_close(got.out, want.out, kDecodeOut, "out");
  expect_close(got.lse, want.lse, kDecodeLse, "lse");
  if (!run_twice) return;
  const mla::KvcacheResult again = run_sparse_decode(p, meta);  // the filled schedule, reused
  EXPECT_TRUE(bitwise_equal(again.out, got.out)) << "out differs between two runs";
  EXPECT_TRUE(bitwise_equal(again.lse, got.lse)) << "lse differs between two runs";
}

// ---- dense decode ----

struct DenseDecodeProblem {
  Tensor q;              // bf16 [b, s_q, h_q, 576]
  Tensor k_cache;        // bf16 [num_blocks, page, h_kv, 576]; NaN past every request's length
  Tensor block_table;    // int32 [b, max_blocks], a permutation of the blocks
  Tensor cache_seqlens;  // int32 [b]
  bool causal = false;
  std::optional<Tensor> attn_sink;
  std::string note;
};

// Lengths uniform in [s_k / 2, s_k] (request 0 exactly s_k; request 1 empty when
// `one_empty_request`), pages a random permutation of all b * max_blocks blocks; every cache
// position no request covers (the tails of last pages, unowned blocks) holds NaN.
inline DenseDecodeProblem make_dense_decode(int64_t b, int64_t s_q, int64_t h_q, int64_t h_kv,
                                            int64_t s_k, int64_t page, bool causal,
                                            bool one_empty_request = false, bool sinks = false) {
  std::mt19937_64 rng = make_rng();
  DenseDecodeProblem p;
  p.causal = causal;
  p.note = fmt::format("b={} s_q={} h_q={} h_kv={} s_k={} page={} causal={} empty={} sinks={} {}",
                       b, s_q, h_q, h_kv, s_k, page, causal, one_empty_request, sinks, seed_note());
  const int64_t max_blocks = (s_k + page - 1) / page + 1, num_blocks = b * max_blocks;
  std::vector<int32_t> length(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i)
    length[i] = static_cast<int32_t>(
        i == 0 ? s_k : s_k / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(s_k / 2 + 1)));
  if (one_empty_request && b > 1) length[1] = 0;
  std::vector<int32_t> table = distinct_positions(num_blocks, num_blocks, rng);
  p.k_cache = clamped_randn({num_blocks, page, h_kv, kv_format::kQkDim}, 0.1f);
  std::vector<char> used(static_cast<size_t>(num_blocks * page), 0);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t s = 0; s < length[i]; ++s)
      used[table[i * max_blocks + s / page] * page + s % page] = 1;
  bf16* cache = p.k_cache.data<bf16>();
  for (int64_t slot = 0; slot < num_blocks * page; ++slot)
    if (!used[slot])
      std::fill_n(cache + slot * h_kv * kv_format::kQkDim, h_kv * kv_format::kQkDim, bf16{0x7FC0});
  // Columns past a request's length hold upstream's out-of-range filler: never read.
  for (int64_t i = 0; i < b; ++i)
    for (int64_t k = (length[i] + page - 1) / page; k < max_blocks; ++k)
      table[i * max_blocks + k] = 2147480000;
  p.block_table = i32_tensor({b, max_blocks}, table);
  p.cache_seqlens = i32_tensor({b}, length);
  p.q = clamped_randn({b, s_q, h_q, kv_format::kQkDim}, 1.0f);
  if (sinks) p.attn_sink = make_sinks(h_q);
  return p;
}

inline mla::KvcacheResult run_dense_decode(const DenseDecodeProblem& p,
                                           mla::FlashMLASchedMeta& meta) {
  // softmax_scale left to its default, 576^-0.5.
  return mla::flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta,
                                     std::nullopt, std::nullopt, p.causal, false, std::nullopt,
                                     p.attn_sink);
}

inline void check_dense_decode(const DenseDecodeProblem& p, bool run_twice = true) {
  SCOPED_TRACE(p.note);
  mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
  const mla::KvcacheResult got = run_dense_decode(p, meta);
  ASSERT_EQ(got.out.dtype(), DType::bf16);
  ASSERT_EQ(got.lse.dtype(), DType::f32);
  const mla::KvcacheResult want =
      ref::mla::dense_decode(p.q, p.k_cache, p.block_table, p.cache_seqlens, 1.0 / std::sqrt(576.0),
                             512, p.causal, p.attn_sink);
  expect_close(got.out, want.out, kDecodeOut, "out");
  expect_close(got.lse, want.lse, kDecodeLse, "lse");
  if (!run_twice) return;
  const mla::KvcacheResult again = run_dense_decode(p, meta);
  EXPECT_TRUE(bitwise_equal(again.out, got.out)) << "out differs between two runs";
  EXPECT_TRUE(bitwise_equal(again.lse, got.lse)) << "lse differs between two runs";
}

}  // namespace dsk::mla_test
