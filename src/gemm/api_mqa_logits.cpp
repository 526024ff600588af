// gemm::fp8_mqa_logits: argument checks, the upstream output strides, kv widened once into
// panels, then blocks of queries over the threads, split by their amount of kv (causal prefill
// gives later queries more).
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <dsk/core/check.hpp>
#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/gemm.hpp>

#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm {
namespace {

using kernels::gemm::kMqaPanel;
using kernels::gemm::kMqaQueries;
using kernels::gemm::MqaArgs;
using kernels::gemm::MqaScratch;

constexpr const char* kFn = "gemm::fp8_mqa_logits";

std::optional<detail::Products> products_override;

const detail::MqaKernels& mqa_kernels() {
  using detail::Products;
  const Backend b = backend();
  const Products products = dsk::detail::products_for(b, products_override);
  if (b == Backend::generic) return detail::mqa_kernels_generic(products);
  if (b == Backend::amx && products == Products::tile_registers) return detail::mqa_kernels_amx();
  return detail::mqa_kernels_avx512(products);
}

// One thread's MqaScratch (and the paged kernel's two panels) carved from one 64-byte aligned
// tensor. The tile unit reads q and the panel and writes the block of scores in 64-byte rows; a row
// that straddles two cache lines (std::vector only promises 16-byte alignment) makes every tile
// load and store about twice as slow.
class ThreadScratch {
 public:
  ThreadScratch(int64_t queries, int64_t heads, int64_t d, int64_t panel_elems = 0) {
    const int64_t q = lines(kernels::gemm::mqa_q_rows(queries, heads) * d * 2);
    const int64_t tile = lines(kernels::gemm::kMqaTileFloats * 4);
    const int64_t logit = lines(queries * kMqaPanel * 4);
    memory_ = Tensor::empty({q + tile + logit + lines(panel_elems * 2)}, DType::u8);
    auto* base = memory_.data<uint8_t>();
    s_ = {reinterpret_cast<bf16*>(base), reinterpret_cast<float*>(base + q),
          reinterpret_cast<float*>(base + q + tile)};
    panel_ = reinterpret_cast<bf16*>(base + q + tile + logit);
  }
  MqaScratch& mqa() { return s_; }
  bf16* panels() { return panel_; }

 private:
  static int64_t lines(int64_t bytes) { return (bytes + 63) / 64 * 64; }
  Tensor memory_;
  MqaScratch s_{};
  bf16* panel_ = nullptr;
};

int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

const int32_t* check_bounds(const char* arg, const Tensor& t, int64_t s) {
  check::defined(kFn, arg, t);
  check::dtype(kFn, arg, t, DType::i32);
  check::shape(kFn, arg, t, {s});
  check::contiguous(kFn, arg, t);
  return t.data<int32_t>();
}

struct Shapes {
  int64_t s, h, d, skv;
  bool fp4;
};

// Every UE8M0 exponent byte a row of d values uses stays within 127 +- 100, so folding the scales
// into the widened e2m1 values is exact (dsk/kernels/gemm/mqa_logits.hpp, widen_row).
void check_fp4_scales(const char* arg, const Tensor& sf, int64_t d) {
  const int32_t* w = sf.data<int32_t>();
  for (int64_t r = 0; r < sf.size(0); ++r)
    for (int64_t c = 0; c < (sf.dim() == 2 ? sf.size(1) : 1); ++c) {
      const auto word = static_cast<uint32_t>(w[r * sf.stride(0) + (sf.dim() == 2 ? c : 0)]);
      for (int64_t g = 0; g < d / 32; ++g) {
        const int e = static_cast<int>((word >> (8 * g)) & 0xFFu) - 127;
        DSK_CHECK_ARG(e >= -100 && e <= 100, kFn, arg, "UE8M0 scales 2^-100 to 2^100",
                      "2^" + std::to_string(e) + " at row " + std::to_string(r));
      }
    }
}

Shapes check_inputs(const Fp8Tensor& q, const Fp8Tensor& kv, const Tensor& weights) {
  check::defined(kFn, "q", q.data);
  check::dtype_in(kFn, "q", q.data, {DType::e4m3, DType::fp4x2});
  check::dim(kFn, "q", q.data, 3);
  check::last_dim_contiguous(kFn, "q", q.data);
  const bool fp4 = q.data.dtype() == DType::fp4x2;
  const Shapes sh{q.data.size(0), q.data.size(1), q.data.size(2) * (fp4 ? 2 : 1),
                  kv.data.defined() ? kv.data.size(0) : 0, fp4};
  DSK_CHECK_ARG(sh.h >= 4 && sh.h <= 128 && sh.h % 4 == 0, kFn, "q",
                "a multiple of 4 heads, 4 to 128", sh.h);
  if (fp4)
    DSK_CHECK_ARG(sh.d == 64 || sh.d == 128, kFn, "q", "FP4 head dim 64 or 128", sh.d);
  else
    DSK_CHECK_ARG(sh.d == 32 || sh.d == 64 || sh.d == 128, kFn, "q", "head dim 32, 64 or 128",
                  sh.d);
  check::defined(kFn, "kv", kv.data);
  check::dtype(kFn, "kv", kv.data, q.data.dtype());
  check::dim(kFn, "kv", kv.data, 2);
  check::size(kFn, "kv", kv.data, 1, q.data.size(2));
  check::last_dim_contiguous(kFn, "kv", kv.data);
  DSK_CHECK_ARG(sh.skv < std::numeric_limits<int32_t>::max(), kFn, "kv", "fewer than 2^31 rows",
                sh.skv);
  check::defined(kFn, "kv_sf", kv.sf);
  check::dtype(kFn, "kv_sf", kv.sf, fp4 ? DType::i32 : DType::f32);
  check::shape(kFn, "kv_sf", kv.sf, {sh.skv});
  check::contiguous(kFn, "kv_sf", kv.sf);
  if (fp4) {
    check::defined(kFn, "q_sf", q.sf);
    check::dtype(kFn, "q_sf", q.sf, DType::i32);
    check::shape(kFn, "q_sf", q.sf, {sh.s, sh.h});
    check::last_dim_contiguous(kFn, "q_sf", q.sf);
    check_fp4_scales("q_sf", q.sf, sh.d);
    check_fp4_scales("kv_sf", kv.sf, sh.d);
  } else {
    DSK_CHECK_ARG(!q.sf.defined(), kFn, "q_sf", "none with e4m3 q (it is unscaled)",
                  q.sf.describe());
  }
  check::defined(kFn, "weights", weights);
  check::dtype(kFn, "weights", weights, DType::f32);
  check::shape(kFn, "weights", weights, {sh.s, sh.h});
  check::last_dim_contiguous(kFn, "weights", weights);
  return sh;
}

// Query blocks [b0, b1) of each thread, with about equal kv rows each.
std::vector<int64_t> balanced_split(const int32_t* ks, const int32_t* ke, int64_t s, int parts) {
  const int64_t blocks = (s + kMqaQueries - 1) / kMqaQueries;
  std::vector<int64_t> cost(static_cast<size_t>(blocks) + 1, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t c = kMqaPanel;  // a block with nothing to do still costs its set-up
    for (int64_t i = b * kMqaQueries; i < std::min(s, (b + 1) * kMqaQueries); ++i)
      c += ke[i] - ks[i];
    cost[static_cast<size_t>(b) + 1] = cost[static_cast<size_t>(b)] + c;
  }
  std::vector<int64_t> bounds(static_cast<size_t>(parts) + 1, blocks);
  bounds[0] = 0;
  for (int p = 1; p < parts; ++p) {
    const int64_t target = cost.back() * p / parts;
    bounds[static_cast<size_t>(p)] =
        std::lower_bound(cost.begin(), cost.end(), target) - cost.begin();
  }
  return bounds;
}

}  // namespace

Tensor fp8_mqa_logits(const Tensor& q, const Fp8Tensor& kv, const Tensor& weights,
                      const Tensor& cu_seq_len_k_start, const Tensor& cu_seq_len_k_end,
                      bool clean_logits, int64_t max_seqlen_k, DType logits_dtype) {
  return fp8_fp4_mqa_logits({q, Tensor{}}, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                            clean_logits, max_seqlen_k, logits_dtype);
}

Tensor fp8_fp4_mqa_logits(const Fp8Tensor& q, const Fp8Tensor& kv, const Tensor& weights,
                          const Tensor& cu_seq_len_k_start, const Tensor& cu_seq_len_k_end,
                          bool clean_logits, int64_t max_seqlen_k, DType logits_dtype) {
  const Shapes sh = check_inputs(q, kv, weights);
  const int32_t* ks = check_bounds("cu_seq_len_k_start", cu_seq_len_k_start, sh.s);
  const int32_t* ke = check_bounds("cu_seq_len_k_end", cu_seq_len_k_end, sh.s);
  DSK_CHECK_ARG(logits_dtype == DType::f32 || logits_dtype == DType::bf16, kFn, "logits_dtype",
                "float32 or bfloat16", dtype_name(logits_dtype));
  DSK_CHECK_ARG(max_seqlen_k >= 0, kFn, "max_seqlen_k", ">= 0", max_seqlen_k);
  DSK_CHECK_ARG(max_seqlen_k == 0 || !clean_logits, kFn, "clean_logits",
                "false with a compressed output (max_seqlen_k > 0)", "true");
  for (int64_t i = 0; i < sh.s; ++i) {
    DSK_CHECK_ARG(0 <= ks[i] && ks[i] <= ke[i] && ke[i] <= sh.skv, kFn, "cu_seq_len_k_start/end",
                  "0 <= start <= end <= " + std::to_string(sh.skv),
                  "row " + std::to_string(i) + ": [" + std::to_string(ks[i]) + ", " +
                      std::to_string(ke[i]) + ")");
    DSK_CHECK_ARG(max_seqlen_k == 0 || ke[i] - ks[i] <= max_seqlen_k, kFn, "max_seqlen_k",
                  "at least every row's end - start",
                  std::to_string(max_seqlen_k) + " < " + std::to_string(ke[i] - ks[i]) + " (row " +
                      std::to_string(i) + ")");
  }
  // Upstream's strides: align(cols + 256, 1024 bytes / element size) elements.
  const int64_t cols = max_seqlen_k > 0 ? max_seqlen_k : sh.skv;
  const int64_t stride =
      align_up(cols + 256, 1024 / static_cast<int64_t>(element_size(logits_dtype)));
  Tensor storage = Tensor::empty({sh.s, stride}, logits_dtype);
  Tensor logits = storage.slice(1, 0, cols);
  if (sh.s == 0) return logits;

  const detail::MqaKernels& k = mqa_kernels();
  const int64_t panels = std::max<int64_t>(1, (sh.skv + kMqaPanel - 1) / kMqaPanel);
  // Every element is written by pack_kv (the last panel zero-padded), so the panels need no
  // zeroing; a Tensor also reuses the cached blocks of earlier calls instead of faulting fresh
  // pages in (a std::vector zeroed the whole KV copy on every call).
  Tensor kv_panels_memory = Tensor::empty({panels * kMqaPanel, sh.d}, DType::bf16);
  bf16* kv_panels = kv_panels_memory.data<bf16>();
  // FP8: kv_sf scales the scores in the epilogue. FP4: the scales are folded into the panels.
  std::vector<float> kv_sf(static_cast<size_t>(panels * kMqaPanel), 0.0f);
  if (sh.fp4)
    std::fill_n(kv_sf.begin(), sh.skv, 1.0f);
  else
    std::copy_n(kv.sf.data<float>(), sh.skv, kv_sf.begin());
  parallel_for(panels, [&](int64_t p0, int64_t p1, int) {
    std::vector<bf16> rows(static_cast<size_t>(kMqaPanel * sh.d));
    k.pack_kv(static_cast<const uint8_t*>(kv.data.data_ptr()), kv.data.stride(0), sh.fp4,
              sh.fp4 ? kv.sf.data<int32_t>() : nullptr, sh.skv, sh.d, p0, p1, kv_panels,
              rows.data());
  });

  MqaArgs a;
  a.kv_panels = kv_panels;
  a.kv_sf = kv_sf.data();
  a.skv = sh.skv;
  a.d = sh.d;
  a.heads = sh.h;
  a.q = static_cast<const uint8_t*>(q.data.data_ptr());
  a.q_stride_s = q.data.stride(0);
  a.q_stride_h = q.data.stride(1);
  a.fp4 = sh.fp4;
  if (sh.fp4) {
    a.q_sf = q.sf.data<int32_t>();
    a.q_sf_stride = q.sf.stride(0);
  }
  a.w = weights.data<float>();
  a.w_stride = weights.stride(0);
  a.ks = ks;
  a.ke = ke;
  a.out = storage.data_ptr();
  a.out_stride = stride;
  a.out_bf16 = logits_dtype == DType::bf16;
  a.compressed = max_seqlen_k > 0;

  const int parts = get_num_threads();
  const std::vector<int64_t> bounds = balanced_split(ks, ke, sh.s, parts);
  parallel_for(parts, [&](int64_t t0, int64_t t1, int) {
    ThreadScratch memory(kMqaQueries, sh.h, sh.d);
    MqaScratch& scratch = memory.mqa();
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t b = bounds[static_cast<size_t>(t)]; b < bounds[static_cast<size_t>(t) + 1];
           ++b) {
        const int64_t i0 = b * kMqaQueries, nq = std::min(kMqaQueries, sh.s - i0);
        k.block(a, i0, nq, scratch);
        if (!clean_logits) continue;
        for (int64_t i = i0; i < i0 + nq; ++i)
          for (int64_t j = 0; j < sh.skv; ++j) {
            if (j == ks[i]) j = ke[i];
            if (j >= sh.skv) break;
            kernels::gemm::mqa_detail::store_logit(a, i, j,
                                                   -std::numeric_limits<float>::infinity());
          }
      }
    }
  });
  return logits;
}

// ---- paged ----

namespace {

using kernels::gemm::MqaPagedArgs;

constexpr const char* kPagedFn = "gemm::fp8_paged_mqa_logits";
constexpr const char* kMetaFn = "gemm::get_paged_mqa_logits_metadata";

// The lengths argument shared by both calls: int32 [B] or [B, next_n], values >= 0.
void check_context_lens(const char* fn, const Tensor& lens) {
  check::defined(fn, "context_lens", lens);
  check::dtype(fn, "context_lens", lens, DType::i32);
  DSK_CHECK_ARG(lens.dim() == 1 || lens.dim() == 2, fn, "context_lens", "[B] or [B, next_n]",
                lens.describe());
  check::contiguous(fn, "context_lens", lens);
  for (int64_t i = 0; i < lens.numel(); ++i)
    DSK_CHECK_ARG(lens.data<int32_t>()[i] >= 0, fn, "context_lens", "lengths >= 0",
                  "entry " + std::to_string(i) + ": " + std::to_string(lens.data<int32_t>()[i]));
}

void check_block_kv(const char* fn, int64_t block_kv) {
  DSK_CHECK_ARG(block_kv == 32 || block_kv == 64 || block_kv == 128, fn, "block_kv",
                "32, 64 or 128", block_kv);
}

// Cache blocks of every batch item (the units of work).
std::vector<int64_t> item_blocks(const MqaPagedArgs& a, int64_t batch) {
  std::vector<int64_t> blocks(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    blocks[static_cast<size_t>(b)] =
        (kernels::gemm::paged_item_len(a, b) + a.block_kv - 1) / a.block_kv;
  return blocks;
}

MqaPagedArgs lens_only(const Tensor& lens, int64_t next_n, int64_t block_kv) {
  MqaPagedArgs a;
  a.context_lens = lens.data<int32_t>();
  a.lens_2d = lens.dim() == 2;
  a.next_n = next_n;
  a.block_kv = block_kv;
  return a;
}

}  // namespace

Tensor get_paged_mqa_logits_metadata(const Tensor& context_lens, int64_t block_kv,
                                     int64_t num_sms) {
  check_context_lens(kMetaFn, context_lens);
  check_block_kv(kMetaFn, block_kv);
  DSK_CHECK_ARG(num_sms >= 1 && num_sms <= 65536, kMetaFn, "num_sms", "1 to 65536", num_sms);
  const int64_t batch = context_lens.size(0);
  const int64_t next_n = context_lens.dim() == 2 ? context_lens.size(1) : 1;
  const std::vector<int64_t> blocks = item_blocks(lens_only(context_lens, next_n, block_kv), batch);
  int64_t total = 0;
  for (int64_t n : blocks) total += n;
  Tensor meta = Tensor::empty({num_sms + 1, 2}, DType::i32);
  int32_t* m = meta.data<int32_t>();
  int64_t b = 0, before = 0;  // units in items [0, b)
  for (int64_t p = 0; p <= num_sms; ++p) {
    const int64_t start = total * p / num_sms;  // the first unit of part p
    while (b < batch && before + blocks[static_cast<size_t>(b)] <= start)
      before += blocks[static_cast<size_t>(b++)];
    m[2 * p] = static_cast<int32_t>(b);
    m[2 * p + 1] = static_cast<int32_t>(b < batch ? start - before : 0);
  }
  return meta;
}

Tensor fp8_paged_mqa_logits(const Tensor& q, const Tensor& kv_cache, const Tensor& weights,
                            const Tensor& context_lens, const Tensor& block_table,
                            const Tensor& schedule_meta, int64_t max_context_len, bool clean_logits,
                            DType logits_dtype) {
  const char* fn = kPagedFn;
  check::defined(fn, "q", q);
  check::dtype(fn, "q", q, DType::e4m3);
  check::dim(fn, "q", q, 4);
  check::last_dim_contiguous(fn, "q", q);
  const int64_t batch = q.size(0), next_n = q.size(1), heads = q.size(2), d = q.size(3);
  DSK_CHECK_ARG(next_n >= 1 && next_n <= 8, fn, "q", "next_n 1 to 8", next_n);
  DSK_CHECK_ARG(heads >= 4 && heads <= 128 && heads % 4 == 0, fn, "q",
                "a multiple of 4 heads, 4 to 128", heads);
  DSK_CHECK_ARG(d == 32 || d == 64 || d == 128, fn, "q", "head dim 32, 64 or 128", d);
  check::defined(fn, "kv_cache", kv_cache);
  check::dtype(fn, "kv_cache", kv_cache, DType::u8);
  check::dim(fn, "kv_cache", kv_cache, 4);
  check::contiguous(fn, "kv_cache", kv_cache);
  const int64_t num_blocks = kv_cache.size(0), block_kv = kv_cache.size(1);
  check_block_kv(fn, block_kv);
  check::size(fn, "kv_cache", kv_cache, 2, 1);
  check::size(fn, "kv_cache", kv_cache, 3, d + 4);
  check::defined(fn, "weights", weights);
  check::dtype(fn, "weights", weights, DType::f32);
  check::shape(fn, "weights", weights, {batch * next_n, heads});
  check::last_dim_contiguous(fn, "weights", weights);
  check_context_lens(fn, context_lens);
  check::size(fn, "context_lens", context_lens, 0, batch);
  if (context_lens.dim() == 2) check::size(fn, "context_lens", context_lens, 1, next_n);
  DSK_CHECK_ARG(!(clean_logits && context_lens.dim() == 2), fn, "clean_logits",
                "false with 2-D context_lens (as upstream)", "true");
  DSK_CHECK_ARG(logits_dtype == DType::f32 || logits_dtype == DType::bf16, fn, "logits_dtype",
                "float32 or bfloat16", dtype_name(logits_dtype));
  check::defined(fn, "block_table", block_table);
  check::dtype(fn, "block_table", block_table, DType::i32);
  check::dim(fn, "block_table", block_table, 2);
  check::size(fn, "block_table", block_table, 0, batch);
  check::last_dim_contiguous(fn, "block_table", block_table);

  MqaPagedArgs a = lens_only(context_lens, next_n, block_kv);
  a.kv_cache = kv_cache.data<uint8_t>();
  a.block_bytes = kernels::mla::indexer_block_bytes(block_kv, d);
  a.block_table = block_table.data<int32_t>();
  a.bt_stride = block_table.stride(0);
  const std::vector<int64_t> blocks = item_blocks(a, batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = kernels::gemm::paged_item_len(a, b);
    DSK_CHECK_ARG(len <= max_context_len, fn, "max_context_len", "at least every context length",
                  std::to_string(max_context_len) + " < " + std::to_string(len) + " (item " +
                      std::to_string(b) + ")");
    DSK_CHECK_ARG(blocks[static_cast<size_t>(b)] <= block_table.size(1), fn, "block_table",
                  "a block for every token of item " + std::to_string(b), block_table.size(1));
    for (int64_t blk = 0; blk < blocks[static_cast<size_t>(b)]; ++blk) {
      const int32_t id = a.block_table[b * a.bt_stride + blk];
      DSK_CHECK_ARG(id >= 0 && id < num_blocks, fn, "block_table",
                    "block ids in [0, " + std::to_string(num_blocks) + ")",
                    "block_table[" + std::to_string(b) + ", " + std::to_string(blk) +
                        "] = " + std::to_string(id));
    }
  }
  // The schedule: rows (item, block) in order, from (0, 0) to (B, 0).
  check::defined(fn, "schedule_meta", schedule_meta);
  check::dtype(fn, "schedule_meta", schedule_meta, DType::i32);
  check::dim(fn, "schedule_meta", schedule_meta, 2);
  check::size(fn, "schedule_meta", schedule_meta, 1, 2);
  check::contiguous(fn, "schedule_meta", schedule_meta);
  const int64_t parts = schedule_meta.size(0) - 1;
  const int32_t* meta = schedule_meta.data<int32_t>();
  DSK_CHECK_ARG(parts >= 1 && meta[0] == 0 && meta[1] == 0 && meta[2 * parts] == batch &&
                    meta[2 * parts + 1] == 0,
                fn, "schedule_meta",
                "get_paged_mqa_logits_metadata of these context_lens and block_kv",
                "rows from (" + std::to_string(meta[0]) + ", " + std::to_string(meta[1]) + ")");
  for (int64_t p = 1; p <= parts; ++p) {
    const int64_t b = meta[2 * p], blk = meta[2 * p + 1], pb = meta[2 * p - 2],
                  pblk = meta[2 * p - 1];
    DSK_CHECK_ARG(
        b >= pb && (b > pb || blk >= pblk) && b <= batch &&
            (b == batch ? blk == 0 : blk >= 0 && blk <= blocks[static_cast<size_t>(b)]),
        fn, "schedule_meta", "get_paged_mqa_logits_metadata of these context_lens",
        "row " + std::to_string(p) + " = (" + std::to_string(b) + ", " + std::to_string(blk) + ")");
  }

  const int64_t elems_per_kib = 1024 / static_cast<int64_t>(element_size(logits_dtype));
  const int64_t stride =
      align_up(align_up(std::max<int64_t>(max_context_len, 1), 256), elems_per_kib);
  Tensor storage = Tensor::empty({batch * next_n, stride}, logits_dtype);
  // q and the weights as the dense kernel sees them: rows b * next_n + j.
  const Tensor q_rows = q.contiguous();
  MqaArgs rows;
  rows.d = d;
  rows.heads = heads;
  rows.q = static_cast<const uint8_t*>(q_rows.data_ptr());
  rows.q_stride_s = heads * d;
  rows.q_stride_h = d;
  rows.w = weights.data<float>();
  rows.w_stride = weights.stride(0);
  rows.out = storage.data_ptr();
  rows.out_stride = stride;
  rows.out_bf16 = logits_dtype == DType::bf16;
  const detail::MqaKernels& k = mqa_kernels();
  parallel_for(parts, [&](int64_t p0, int64_t p1, int) {
    ThreadScratch memory(next_n, heads, d, 2 * kMqaPanel * d);
    MqaScratch& s = memory.mqa();
    for (int64_t p = p0; p < p1; ++p) {
      // Part p: blocks from (item, block) meta[p] up to meta[p + 1], item by item.
      const int64_t end_b = meta[2 * p + 2], end_blk = meta[2 * p + 3];
      for (int64_t b = meta[2 * p], blk = meta[2 * p + 1];
           b < end_b || (b == end_b && blk < end_blk); ++b, blk = 0) {
        const int64_t last = b < end_b ? blocks[static_cast<size_t>(b)] : end_blk;
        if (blk >= last) continue;
        k.widen_queries(rows, b * next_n, next_n, s);
        k.paged_blocks(a, rows, b, blk, last, s, memory.panels());
      }
    }
  });
  if (clean_logits)
    parallel_for(batch * next_n, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t t = kernels::gemm::paged_valid_len(a, r / next_n, r % next_n);
             t < max_context_len; ++t)
          kernels::gemm::mqa_detail::store_logit(rows, r, t,
                                                 -std::numeric_limits<float>::infinity());
    });
  return storage.slice(1, 0, max_context_len);
}

void detail::set_mqa_products_override(std::optional<Products> products) {
  products_override = products;
}

}  // namespace dsk::gemm
