// flash_mla_sparse_fwd, get_mla_metadata and flash_mla_with_kvcache: argument checks, the key
// lists of every item (valid indices only, so the kernels never see an invalid one), the split of
// items over threads, then the kernels of include/dsk/kernels/mla/attention.hpp.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <dsk/core/check.hpp>
#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/mla.hpp>

#include "kernels.hpp"

namespace dsk::mla {

namespace k = kernels::mla;
using detail::KernelTable;

namespace {
std::optional<detail::Products> products_override;
}  // namespace

void detail::set_products_override(std::optional<Products> products) {
  products_override = products;
}

// ---- the schedule ----

struct FlashMLASchedMeta::Plan {
  bool filled = false;
  std::vector<int64_t> config;  // what the plan was made for
  int64_t parts = 1;            // splits per item
};

FlashMLASchedMeta::FlashMLASchedMeta() : plan(std::make_shared<Plan>()) {}
bool FlashMLASchedMeta::filled() const {
  return plan && plan->filled;
}

FlashMLASchedMeta get_mla_metadata() {
  return FlashMLASchedMeta{};
}

namespace {

const KernelTable& kernel_table() {
  using detail::Products;
  const Backend b = backend();
  const Products products = dsk::detail::products_for(b, products_override);
  if (b == Backend::generic) return detail::kernel_table_generic(products);
  if (b == Backend::amx && products == Products::tile_registers) return detail::kernel_table_amx();
  return detail::kernel_table_avx512(products);
}

// In deterministic mode the split is planned for this many threads whatever the real count, so
// results do not depend on it (splitting changes the order of the softmax sums).
constexpr int kDeterministicPlanThreads = 16;

// Splits per item: one when there are enough items for every thread; otherwise enough parts to
// occupy the threads, never more than the chunks of the longest list.
int plan_threads() {
  return get_deterministic_algorithms() ? kDeterministicPlanThreads : get_num_threads();
}

int64_t parts_per_item(int64_t items, int64_t max_keys) {
  const int threads = plan_threads();
  if (items >= threads || max_keys <= k::kChunk) return 1;
  const int64_t chunks = (max_keys + k::kChunk - 1) / k::kChunk;
  return std::min<int64_t>((threads + items - 1) / items, chunks);
}

// Keys [begin, end) of part j of `parts` over a list of n keys, in whole chunks.
std::pair<int64_t, int64_t> part_range(int64_t n, int64_t j, int64_t parts) {
  const int64_t chunks = (n + k::kChunk - 1) / k::kChunk;
  const int64_t c0 = chunks * j / parts, c1 = chunks * (j + 1) / parts;
  return {std::min(n, c0 * k::kChunk), std::min(n, c1 * k::kChunk)};
}

// Per-thread working memory, reused across calls.
struct Workspace {
  std::vector<bf16> bf16s;
  std::vector<float> floats, state;
  std::vector<int32_t> limits;
  std::vector<float> sink;
  k::Scratch scratch(const k::Problem& p) {
    bf16s.resize(static_cast<size_t>(k::scratch_bf16s(p)));
    floats.resize(static_cast<size_t>(k::scratch_floats(p)));
    return k::carve_scratch(p, bf16s.data(), floats.data());
  }
};

Workspace& workspace() {
  thread_local Workspace w;
  return w;
}

// The problem of items with `rows` query rows (d_v = 512).
k::Problem make_problem(int64_t rows, int64_t d_qk, float scale) {
  k::Problem p;
  p.rows = rows;
  p.rows_pad = k::round_up(rows, k::kRowAlign);
  p.d_qk = d_qk;
  p.d_v = k::kLatentDim;
  p.scale = scale;
  return p;
}

k::State state_at(float* base, const k::Problem& p) {
  return k::State{base, base + p.rows * p.d_v, base + p.rows * p.d_v + p.rows_pad};
}

// One item as the kernels see it: its query rows, outputs, sink per row and visibility.
struct Item {
  const bf16* q = nullptr;
  k::RowMap q_map;
  bf16* out = nullptr;
  k::RowMap out_map;
  float* lse = nullptr;
  k::RowMap lse_map;
  float* max_logits = nullptr;
  k::RowMap max_map;
  int64_t keys = 0;      // length of the key list
  bool limited = false;  // whether the key limits apply (else every key is visible)
};

// Runs every item: `describe(i)` gives item i and fills the per-row key limits (rows_pad ints,
// or leaves them empty), `attend(i, k0, k1, scratch, state)` runs keys [k0, k1) of its list.
// sink: f32 [h_q] or nullptr, with head_of(i, r) the head of row r.
template <class Describe, class Attend, class HeadOf>
void run_items(const k::Problem& base, int64_t items, int64_t parts, const float* sink,
               const Describe& describe, const Attend& attend, const HeadOf& head_of) {
  const KernelTable& kt = kernel_table();
  const int64_t jobs = items * parts;
  std::vector<float> part_states;
  if (parts > 1) part_states.resize(static_cast<size_t>(jobs * k::state_floats(base)));
  std::atomic<int64_t> next{0};
  // Prepares item i in the workspace: its problem (with key limits) and packed queries.
  const auto prepare = [&](Workspace& w, int64_t i, Item& item, k::Problem& p, k::Scratch& s) {
    p = base;
    w.limits.assign(static_cast<size_t>(p.rows_pad), 0);
    item = describe(i, w.limits.data());
    p.key_limit = item.limited ? w.limits.data() : nullptr;
    s = w.scratch(p);
    kt.pack_queries(p, item.q, item.q_map, s);
    w.sink.clear();
    if (sink)
      for (int64_t r = 0; r < p.rows; ++r) w.sink.push_back(sink[head_of(i, r)]);
  };
  const auto finish = [&](Workspace& w, const Item& item, const k::Problem& p, const k::State& st) {
    kt.finalize(p, st, sink ? w.sink.data() : nullptr, item.out, item.out_map, item.lse,
                item.lse_map, item.max_logits, item.max_map);
  };
  parallel_for(get_num_threads(), [&](int64_t, int64_t, int) {
    Workspace& w = workspace();
    for (int64_t job = next++; job < jobs; job = next++) {
      const int64_t i = job / parts, j = job % parts;
      Item item;
      k::Problem p;
      k::Scratch s;
      prepare(w, i, item, p, s);
      const auto [k0, k1] = part_range(item.keys, j, parts);
      k::State st;
      if (parts == 1) {
        w.state.resize(static_cast<size_t>(k::state_floats(p)));
        st = state_at(w.state.data(), p);
      } else {
        st = state_at(part_states.data() + job * k::state_floats(p), p);
      }
      kt.reset_state(p, st);
      if (k1 > k0) attend(i, p, k0, k1, s, st);
      if (parts == 1) finish(w, item, p, st);
    }
  });
  if (parts == 1) return;
  parallel_for(items, [&](int64_t i0, int64_t i1, int) {
    Workspace& w = workspace();
    for (int64_t i = i0; i < i1; ++i) {
      Item item;
      k::Problem p;
      k::Scratch s;
      prepare(w, i, item, p, s);
      std::vector<k::State> states;
      for (int64_t j = 0; j < parts; ++j)
        states.push_back(state_at(part_states.data() + (i * parts + j) * k::state_floats(p), p));
      k::merge_parts(p, states.data(), parts);
      finish(w, item, p, states[0]);
    }
  });
}

// ---- argument checks ----

// An optional contiguous 1-D tensor of `n` values of dtype T (null when absent).
template <class T>
const T* optional_vector(const char* fn, const char* arg, const std::optional<Tensor>& t,
                         DType dtype, int64_t n) {
  if (!t) return nullptr;
  check::defined(fn, arg, *t);
  check::dtype(fn, arg, *t, dtype);
  check::shape(fn, arg, *t, {n});
  check::contiguous(fn, arg, *t);
  return t->data<T>();
}

const float* sink_values(const char* fn, const std::optional<Tensor>& attn_sink, int64_t h_q) {
  return optional_vector<float>(fn, "attn_sink", attn_sink, DType::f32, h_q);
}

const int32_t* lengths(const char* fn, const std::optional<Tensor>& topk_length, int64_t rows) {
  return optional_vector<int32_t>(fn, "topk_length", topk_length, DType::i32, rows);
}

void check_bf16_rows(const char* fn, const char* arg, const Tensor& t, int dims) {
  check::defined(fn, arg, t);
  check::dtype(fn, arg, t, DType::bf16);
  check::dim(fn, arg, t, dims);
  check::last_dim_contiguous(fn, arg, t);
}

void check_d_qk(const char* fn, const char* arg, int64_t d_qk, bool allow_512) {
  const bool ok = d_qk == k::kQkDim || (allow_512 && d_qk == k::kLatentDim);
  DSK_CHECK_ARG(ok, fn, arg, allow_512 ? "last dimension d_qk 512 or 576" : "last dimension 576",
                d_qk);
}

// Compacts the valid entries of `count` index rows of length topk into `keys`, row r's at
// [begin[r], begin[r] + n[r]). valid(idx) says whether an index is used; entry j of row r is
// skipped when j >= limit[r] (when given).
template <class Valid>
void compact_rows(const int32_t* indices, int64_t row_stride_of_r, int64_t count, int64_t topk,
                  const int32_t* limit, const Valid& valid, std::vector<int32_t>& keys,
                  std::vector<int64_t>& begin, std::vector<int64_t>& n) {
  keys.clear();
  begin.assign(static_cast<size_t>(count), 0);
  n.assign(static_cast<size_t>(count), 0);
  for (int64_t r = 0; r < count; ++r) {
    begin[r] = static_cast<int64_t>(keys.size());
    const int64_t len = limit ? std::clamp<int64_t>(limit[r], 0, topk) : topk;
    const int32_t* row = indices + r * row_stride_of_r;
    for (int64_t j = 0; j < len; ++j)
      if (valid(row[j], r, j)) keys.push_back(row[j]);
    n[r] = static_cast<int64_t>(keys.size()) - begin[r];
  }
}

int64_t max_of(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

}  // namespace

// ---- sparse prefill ----

SparseFwdResult flash_mla_sparse_fwd(const Tensor& q, const Tensor& kv, const Tensor& indices,
                                     double sm_scale, int64_t d_v,
                                     const std::optional<Tensor>& attn_sink,
                                     const std::optional<Tensor>& topk_length) {
  constexpr const char* fn = "flash_mla_sparse_fwd";
  check_bf16_rows(fn, "q", q, 3);
  check_bf16_rows(fn, "kv", kv, 3);
  const int64_t s_q = q.size(0), h_q = q.size(1), d_qk = q.size(2), s_kv = kv.size(0);
  check_d_qk(fn, "q", d_qk, true);
  DSK_CHECK_ARG(kv.size(1) == 1, fn, "kv", "one KV head (h_kv = 1)", kv.size(1));
  DSK_CHECK_ARG(kv.size(2) == d_qk, fn, "kv",
                "the last dimension of q (" + std::to_string(d_qk) + ")", kv.size(2));
  DSK_CHECK_ARG(d_v == k::kLatentDim, fn, "d_v", "512", d_v);
  DSK_CHECK_ARG(h_q >= 1, fn, "q", "at least one head", h_q);
  check::defined(fn, "indices", indices);
  check::dtype(fn, "indices", indices, DType::i32);
  check::dim(fn, "indices", indices, 3);
  check::last_dim_contiguous(fn, "indices", indices);
  DSK_CHECK_ARG(indices.size(0) == s_q && indices.size(1) == 1, fn, "indices",
                "[s_q, 1, topk] with s_q = " + std::to_string(s_q), indices.describe());
  const int64_t topk = indices.size(2);
  DSK_CHECK_ARG(topk >= 1, fn, "indices", "topk >= 1", topk);
  DSK_CHECK_ARG(std::isfinite(sm_scale), fn, "sm_scale", "a finite number", sm_scale);
  const float* sink = sink_values(fn, attn_sink, h_q);
  const int32_t* limit = lengths(fn, topk_length, s_q);

  SparseFwdResult r{Tensor::empty({s_q, h_q, d_v}, DType::bf16),
                    Tensor::empty({s_q, h_q}, DType::f32), Tensor::empty({s_q, h_q}, DType::f32)};
  if (s_q == 0) return r;

  std::vector<int32_t> keys;
  std::vector<int64_t> begin, n;
  compact_rows(
      indices.data<int32_t>(), indices.stride(0), s_q, topk, limit,
      [&](int32_t idx, int64_t, int64_t) { return idx >= 0 && idx < s_kv; }, keys, begin, n);

  const k::Problem p = make_problem(h_q, d_qk, static_cast<float>(sm_scale));
  const int64_t parts = parts_per_item(s_q, max_of(n));
  const bf16* qd = q.data<bf16>();
  bf16* out = r.out.data<bf16>();
  float* lse = r.lse.data<float>();
  float* max_logits = r.max_logits.data<float>();
  const KernelTable& kt = kernel_table();
  run_items(
      p, s_q, parts, sink,
      [&](int64_t i, int32_t*) {
        Item it;
        it.q = qd + i * q.stride(0);
        it.q_map = {h_q, 0, q.stride(1)};
        it.out = out + i * h_q * d_v;
        it.out_map = {h_q, 0, d_v};
        it.lse = lse + i * h_q;
        it.lse_map = {h_q, 0, 1};
        it.max_logits = max_logits + i * h_q;
        it.max_map = it.lse_map;
        it.keys = n[i];
        return it;
      },
      [&](int64_t i, const k::Problem& pi, int64_t k0, int64_t k1, k::Scratch& s, k::State& st) {
        const k::GatherSource src{kv.data<bf16>(), kv.stride(0), keys.data() + begin[i]};
        kt.attend_gather(pi, src, k0, k1, s, st);
      },
      [](int64_t, int64_t row) { return row; });
  return r;
}

// ---- decode ----

namespace {

// The configuration a schedule is valid for (upstream's FlashMLASchedMeta.Config plus the
// lengths it was computed from).
std::vector<int64_t> plan_config(const Tensor& q, int64_t page, int64_t h_kv, int64_t topk,
                                 bool causal, bool fp8, const int32_t* seqlens, int64_t b,
                                 const int32_t* topk_len) {
  std::vector<int64_t> c{q.size(0), q.size(1), q.size(2), page,          h_kv,
                         topk,      causal,    fp8,       plan_threads()};
  for (int64_t i = 0; seqlens && i < b; ++i) c.push_back(seqlens[i]);
  c.push_back(-1);
  for (int64_t i = 0; topk_len && i < b; ++i) c.push_back(topk_len[i]);
  return c;
}

int64_t scheduled_parts(FlashMLASchedMeta& meta, std::vector<int64_t> config, int64_t items,
                        int64_t max_keys) {
  constexpr const char* fn = "flash_mla_with_kvcache";
  DSK_CHECK_ARG(meta.plan != nullptr, fn, "tile_scheduler_metadata",
                "an object from get_mla_metadata()", "an empty handle");
  FlashMLASchedMeta::Plan& plan = *meta.plan;
  if (!plan.filled) {
    plan.config = std::move(config);
    plan.parts = parts_per_item(items, max_keys);
    plan.filled = true;
  } else {
    DSK_CHECK_ARG(plan.config == config, fn, "tile_scheduler_metadata",
                  "the configuration it was filled for (shapes, page size, topk, causal, FP8, "
                  "thread count, cache_seqlens and topk_length unchanged)",
                  "a call with a different configuration; get a new one from get_mla_metadata()");
  }
  return plan.parts;
}

KvcacheResult sparse_decode(const Tensor& q, const Tensor& k_cache, const Tensor& indices,
                            float scale, FlashMLASchedMeta& meta, const float* sink,
                            const int32_t* topk_len) {
  constexpr const char* fn = "flash_mla_with_kvcache";
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), d_v = k::kLatentDim;
  DSK_CHECK_ARG(k_cache.dtype() == DType::u8 || k_cache.dtype() == DType::e4m3 ||
                    k_cache.dtype() == DType::i8,
                fn, "k_cache", "uint8, int8 or e4m3 656-byte tokens (is_fp8_kvcache)",
                dtype_name(k_cache.dtype()));
  check::dim(fn, "k_cache", k_cache, 4);
  DSK_CHECK_ARG(k_cache.size(2) == 1 && k_cache.size(3) == k::kTokenBytes, fn, "k_cache",
                "[num_blocks, page_block_size, 1, 656]", k_cache.describe());
  DSK_CHECK_ARG(k_cache.stride(3) == 1 && k_cache.stride(2) == k::kTokenBytes &&
                    k_cache.stride(1) == k::kTokenBytes,
                fn, "k_cache", "each page block contiguous (token stride 656)", k_cache.describe());
  const int64_t num_blocks = k_cache.size(0), page = k_cache.size(1);
  check::defined(fn, "indices", indices);
  check::dtype(fn, "indices", indices, DType::i32);
  check::dim(fn, "indices", indices, 3);
  check::last_dim_contiguous(fn, "indices", indices);
  DSK_CHECK_ARG(indices.size(0) == b && indices.size(1) == s_q, fn, "indices",
                "[b, s_q, topk] matching q", indices.describe());
  const int64_t topk = indices.size(2);
  DSK_CHECK_ARG(topk >= 1, fn, "indices", "topk >= 1", topk);
  const int64_t slots = num_blocks * page;

  // Item (request, position) = row i * s_q + t of the index table; -1 is invalid, anything else
  // must address the cache.
  std::vector<int32_t> keys;
  std::vector<int64_t> begin, n;
  std::vector<int32_t> row_limit;
  if (topk_len) {
    row_limit.resize(static_cast<size_t>(b * s_q));
    for (int64_t i = 0; i < b * s_q; ++i) row_limit[i] = topk_len[i / s_q];
  }
  std::vector<int32_t> flat;
  const int32_t* table = indices.data<int32_t>();
  if (indices.stride(0) != s_q * topk || indices.stride(1) != topk) {
    flat.resize(static_cast<size_t>(b * s_q * topk));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 0; t < s_q; ++t)
        std::memcpy(flat.data() + (i * s_q + t) * topk,
                    table + i * indices.stride(0) + t * indices.stride(1), 4 * topk);
    table = flat.data();
  }
  compact_rows(
      table, topk, b * s_q, topk, topk_len ? row_limit.data() : nullptr,
      [&](int32_t idx, int64_t row, int64_t j) {
        if (idx == -1) return false;
        DSK_CHECK_ARG(idx >= 0 && idx < slots, fn, "indices",
                      "-1 or a global slot in [0, num_blocks * page_block_size = " +
                          std::to_string(slots) + ")",
                      "indices[" + std::to_string(row / s_q) + ", " + std::to_string(row % s_q) +
                          ", " + std::to_string(j) + "] = " + std::to_string(idx));
        return true;
      },
      keys, begin, n);

  const int64_t parts = scheduled_parts(
      meta, plan_config(q, page, 1, topk, false, true, nullptr, b, topk_len), b * s_q, topk);
  KvcacheResult r{Tensor::empty({b, s_q, h_q, d_v}, DType::bf16),
                  Tensor::empty({b, h_q, s_q}, DType::f32)};
  if (b * s_q == 0) return r;
  const k::Problem p = make_problem(h_q, k::kQkDim, scale);
  const bf16* qd = q.data<bf16>();
  bf16* out = r.out.data<bf16>();
  float* lse = r.lse.data<float>();
  const KernelTable& kt = kernel_table();
  const auto* cache = static_cast<const uint8_t*>(k_cache.data_ptr());
  const int64_t block_stride = k_cache.stride(0);  // bytes: one-byte elements
  run_items(
      p, b * s_q, parts, sink,
      [&](int64_t item, int32_t*) {
        const int64_t i = item / s_q, t = item % s_q;
        Item it;
        it.q = qd + i * q.stride(0) + t * q.stride(1);
        it.q_map = {h_q, 0, q.stride(2)};
        it.out = out + item * h_q * d_v;
        it.out_map = {h_q, 0, d_v};
        it.lse = lse + i * h_q * s_q + t;
        it.lse_map = {h_q, 0, s_q};
        it.keys = n[item];
        return it;
      },
      [&](int64_t item, const k::Problem& pi, int64_t k0, int64_t k1, k::Scratch& s, k::State& st) {
        const k::Fp8Slots src{cache, page, block_stride, keys.data() + begin[item]};
        kt.attend_fp8(pi, src, k0, k1, s, st);
      },
      [](int64_t, int64_t row) { return row; });
  return r;
}

KvcacheResult dense_decode(const Tensor& q, const Tensor& k_cache, const Tensor& block_table,
                           const Tensor& cache_seqlens, float scale, bool causal,
                           FlashMLASchedMeta& meta, const float* sink) {
  constexpr const char* fn = "flash_mla_with_kvcache";
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), d_v = k::kLatentDim;
  check_bf16_rows(fn, "k_cache", k_cache, 4);
  check_d_qk(fn, "k_cache", k_cache.size(3), false);
  const int64_t num_blocks = k_cache.size(0), page = k_cache.size(1), h_kv = k_cache.size(2);
  DSK_CHECK_ARG(page >= 1 && h_kv >= 1, fn, "k_cache",
                "[num_blocks, page_block_size >= 1, h_kv >= 1, 576]", k_cache.describe());
  DSK_CHECK_ARG(h_q % h_kv == 0, fn, "q", "h_q a multiple of h_kv = " + std::to_string(h_kv), h_q);
  check::defined(fn, "block_table", block_table);
  check::dtype(fn, "block_table", block_table, DType::i32);
  check::dim(fn, "block_table", block_table, 2);
  check::last_dim_contiguous(fn, "block_table", block_table);
  DSK_CHECK_ARG(block_table.size(0) == b, fn, "block_table",
                "[b, max_blocks] with b = " + std::to_string(b), block_table.describe());
  check::defined(fn, "cache_seqlens", cache_seqlens);
  check::dtype(fn, "cache_seqlens", cache_seqlens, DType::i32);
  check::shape(fn, "cache_seqlens", cache_seqlens, {b});
  check::contiguous(fn, "cache_seqlens", cache_seqlens);
  const int32_t* seqlens = cache_seqlens.data<int32_t>();
  const int32_t* bt = block_table.data<int32_t>();
  int64_t max_len = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = seqlens[i];
    DSK_CHECK_ARG(len >= 0 && len <= block_table.size(1) * page, fn, "cache_seqlens",
                  "0 <= cache_seqlens[i] <= max_blocks * page_block_size = " +
                      std::to_string(block_table.size(1) * page),
                  "cache_seqlens[" + std::to_string(i) + "] = " + std::to_string(len));
    for (int64_t blk = 0; blk * page < len; ++blk) {
      const int32_t id = bt[i * block_table.stride(0) + blk];
      DSK_CHECK_ARG(id >= 0 && id < num_blocks, fn, "block_table",
                    "block ids in [0, num_blocks = " + std::to_string(num_blocks) + ")",
                    "block_table[" + std::to_string(i) + ", " + std::to_string(blk) +
                        "] = " + std::to_string(id));
    }
    max_len = std::max(max_len, len);
  }

  const int64_t group = h_q / h_kv;
  const int64_t items = b * h_kv;
  const int64_t parts = scheduled_parts(
      meta, plan_config(q, page, h_kv, 0, causal, false, seqlens, b, nullptr), items, max_len);
  KvcacheResult r{Tensor::empty({b, s_q, h_q, d_v}, DType::bf16),
                  Tensor::empty({b, h_q, s_q}, DType::f32)};
  if (items == 0 || s_q == 0) return r;
  const k::Problem p = make_problem(s_q * group, k::kQkDim, scale);
  const bf16* qd = q.data<bf16>();
  bf16* out = r.out.data<bf16>();
  float* lse = r.lse.data<float>();
  const KernelTable& kt = kernel_table();
  run_items(
      p, items, parts, sink,
      [&](int64_t item, int32_t* limits) {
        const int64_t i = item / h_kv, kvh = item % h_kv, len = seqlens[i];
        // Row r is (query position t, head kvh * group + g); bottom-right causal visibility.
        for (int64_t row = 0; row < p.rows; ++row) {
          const int64_t t = row / group;
          limits[row] =
              static_cast<int32_t>(causal ? std::clamp<int64_t>(len - s_q + t + 1, 0, len) : len);
        }
        Item it;
        it.q = qd + i * q.stride(0) + kvh * group * q.stride(2);
        it.q_map = {group, q.stride(1), q.stride(2)};
        it.out = out + (i * s_q * h_q + kvh * group) * d_v;
        it.out_map = {group, h_q * d_v, d_v};
        it.lse = lse + (i * h_q + kvh * group) * s_q;
        it.lse_map = {group, 1, s_q};
        it.keys = len;
        it.limited = true;
        return it;
      },
      [&](int64_t item, const k::Problem& pi, int64_t k0, int64_t k1, k::Scratch& s, k::State& st) {
        const int64_t i = item / h_kv, kvh = item % h_kv;
        const k::PagedSource src{k_cache.data<bf16>() + kvh * k_cache.stride(2), page,
                                 k_cache.stride(0), k_cache.stride(1),
                                 bt + i * block_table.stride(0)};
        kt.attend_paged(pi, src, k0, k1, s, st);
      },
      [&](int64_t item, int64_t row) { return (item % h_kv) * group + row % group; });
  return r;
}

}  // namespace

KvcacheResult flash_mla_with_kvcache(const Tensor& q, const Tensor& k_cache,
                                     const std::optional<Tensor>& block_table,
                                     const std::optional<Tensor>& cache_seqlens, int64_t head_dim_v,
                                     FlashMLASchedMeta& tile_scheduler_metadata,
                                     const std::optional<Tensor>& num_splits,
                                     std::optional<double> softmax_scale, bool causal,
                                     bool is_fp8_kvcache, const std::optional<Tensor>& indices,
                                     const std::optional<Tensor>& attn_sink,
                                     const std::optional<Tensor>& topk_length) {
  constexpr const char* fn = "flash_mla_with_kvcache";
  check_bf16_rows(fn, "q", q, 4);
  check_d_qk(fn, "q", q.size(3), false);
  check::defined(fn, "k_cache", k_cache);
  DSK_CHECK_ARG(head_dim_v == k::kLatentDim, fn, "head_dim_v", "512", head_dim_v);
  DSK_CHECK_ARG(!num_splits, fn, "num_splits",
                "None (the split lives in tile_scheduler_metadata, as upstream HEAD)", "a tensor");
  const double scale = softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(k::kQkDim)));
  DSK_CHECK_ARG(std::isfinite(scale), fn, "softmax_scale", "a finite number", scale);
  const float* sink = sink_values(fn, attn_sink, q.size(2));
  if (indices) {
    DSK_CHECK_ARG(is_fp8_kvcache, fn, "is_fp8_kvcache",
                  "true with indices (sparse decode reads the FP8 cache)", "false");
    DSK_CHECK_ARG(!causal, fn, "causal", "false with indices (sparse decode has no mask)", "true");
    const int32_t* len = lengths(fn, topk_length, q.size(0));
    return sparse_decode(q, k_cache, *indices, static_cast<float>(scale), tile_scheduler_metadata,
                         sink, len);
  }
  DSK_CHECK_ARG(!is_fp8_kvcache, fn, "is_fp8_kvcache",
                "false without indices (dense FP8 decode is not supported, as upstream on SM90)",
                "true");
  DSK_CHECK_ARG(!topk_length, fn, "topk_length", "None without indices", "a tensor");
  DSK_CHECK_ARG(block_table.has_value() && cache_seqlens.has_value(), fn,
                "block_table/cache_seqlens", "both given for dense decode", "missing");
  return dense_decode(q, k_cache, *block_table, *cache_seqlens, static_cast<float>(scale), causal,
                      tile_scheduler_metadata, sink);
}

}  // namespace dsk::mla
