// dsk::mla — FlashMLA on CPU: sparse prefill, sparse FP8 decode and dense decode of DeepSeek's
// multi-head latent attention, with upstream's current (2026) semantics (spec/attention.md §1-§3,
// docs/mla.md).
//
// Shared semantics:
//   - Scores P = scale * q . k over all d_qk dims (f32 accumulation of bf16 products); V is the
//     first d_v = 512 dims of each key row; out = softmax(P) . V with the probabilities rounded to
//     bf16 before the product and the row sum taken over the unrounded ones.
//   - lse is the natural log of the row sum of exp(P); a row with no valid key gives out = 0,
//     lse = +inf (and max_logits = -inf).
//   - attn_sink (f32 [h_q], optional): out *= exp(lse) / (exp(lse) + exp(sink[h])); lse unchanged.
//     A +inf sink gives out = 0, a -inf sink changes nothing.
//   - Results repeat bit for bit for the same inputs and thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <dsk/core/tensor.hpp>
#include <dsk/kernels/mla/kv_format.hpp>

namespace dsk::mla {

// The cache formats (one definition, in the kernel header): the 656-byte MLA token and the
// 132-byte indexer token.
using kernels::mla::kIndexerTokenBytes;
using kernels::mla::kLatentDim;
using kernels::mla::kQkDim;
using kernels::mla::kRopeDim;
using kernels::mla::kTokenBytes;

// ---- KV tokens ----

// kv: f32 or bf16 [n, 576] = [latent 512 | rope 64] (last dimension contiguous) -> uint8
// [n, 656] tokens (kernels/mla/kv_format.hpp; the rope part is rounded to bf16 when kv is f32).
Tensor quantize_kv_tokens(const Tensor& kv);
// tokens: uint8 / int8 / e4m3 [..., 656] (last dimension contiguous) -> bf16 [..., 576], the values
// the kernels compute with.
Tensor dequantize_kv_tokens(const Tensor& tokens);

// ---- sparse prefill ----

struct SparseFwdResult {
  Tensor out;         // bf16 [s_q, h_q, d_v]
  Tensor max_logits;  // f32 [s_q, h_q], natural units
  Tensor lse;         // f32 [s_q, h_q], natural log
};

// q bf16 [s_q, h_q, d_qk], kv bf16 [s_kv, 1, d_qk], indices int32 [s_q, 1, topk] (only the last
// dimension of each must be contiguous), d_qk in {512, 576}, d_v = 512, any h_q >= 1 and
// topk >= 1. Entry j of row i is invalid when indices < 0 or >= s_kv, or, with topk_length
// (int32 [s_q]), when j >= topk_length[i]. attn_sink: f32 [h_q].
SparseFwdResult flash_mla_sparse_fwd(const Tensor& q, const Tensor& kv, const Tensor& indices,
                                     double sm_scale, int64_t d_v = 512,
                                     const std::optional<Tensor>& attn_sink = std::nullopt,
                                     const std::optional<Tensor>& topk_length = std::nullopt);

// ---- decode ----

// Upstream's FlashMLASchedMeta: returned empty by get_mla_metadata(), filled by the first
// flash_mla_with_kvcache call that uses it (the split of each request's keys over the threads),
// and reusable only for calls of the same configuration (batch, s_q, h_q, h_kv, page size, topk,
// causal, FP8, thread count and the same cache_seqlens / topk_length values); another
// configuration raises dsk::Error. Copies share the same state.
class FlashMLASchedMeta {
 public:
  FlashMLASchedMeta();
  bool filled() const;
  struct Plan;
  std::shared_ptr<Plan> plan;  // internal
};

FlashMLASchedMeta get_mla_metadata();

struct KvcacheResult {
  Tensor out;  // bf16 [b, s_q, h_q, head_dim_v]
  Tensor lse;  // f32 [b, h_q, s_q] (upstream's layout)
};

// Sparse FP8 decode (indices given; is_fp8_kvcache = true, causal = false):
//   q bf16 [b, s_q, h_q, 576]; k_cache uint8 / e4m3 [num_blocks, page_block_size, 1, 656] (one
//   page block contiguous); indices int32 [b, s_q, topk] of global slots (block * page + offset),
//   -1 = invalid, any other value outside [0, num_blocks * page) raises dsk::Error; topk_length
//   int32 [b] (entries j >= topk_length[i] are invalid); block_table and cache_seqlens unused.
// Dense decode (no indices; is_fp8_kvcache = false):
//   q bf16 [b, s_q, h_q, 576]; k_cache bf16 [num_blocks, page_block_size, h_kv, 576]; block_table
//   int32 [b, max_blocks]; cache_seqlens int32 [b]; h_q a multiple of h_kv (query head h reads kv
//   head h / (h_q / h_kv)); causal: query t of s_q sees keys s < s_k - s_q + t + 1 (bottom-right).
// head_dim_v = 512; softmax_scale defaults to 576^-0.5 (V3.2 needs its model scale 0.1352...);
// num_splits must be empty (the split lives in tile_scheduler_metadata, as upstream HEAD).
KvcacheResult flash_mla_with_kvcache(const Tensor& q, const Tensor& k_cache,
                                     const std::optional<Tensor>& block_table,
                                     const std::optional<Tensor>& cache_seqlens, int64_t head_dim_v,
                                     FlashMLASchedMeta& tile_scheduler_metadata,
                                     const std::optional<Tensor>& num_splits = std::nullopt,
                                     std::optional<double> softmax_scale = std::nullopt,
                                     bool causal = false, bool is_fp8_kvcache = false,
                                     const std::optional<Tensor>& indices = std::nullopt,
                                     const std::optional<Tensor>& attn_sink = std::nullopt,
                                     const std::optional<Tensor>& topk_length = std::nullopt);

}  // namespace dsk::mla
