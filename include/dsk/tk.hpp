// dsk::tk — TileKernels on CPU: MoE routing and mapping, quantisation (FP8 / FP4, fused SwiGLU and
// RMSNorm casts, cast back), RMSNorm / LayerNorm, RoPE with DeepSeek's YaRN frequencies, and the
// Walsh-Hadamard transform (docs/tk.md).
//
// Names, argument names, order and defaults follow upstream tile_kernels (moe, quant, transform)
// one to one (DESIGN §3); upstream's tuples are structs here. Every function checks its arguments
// and raises dsk::Error naming the function, the argument, the expectation and the value.
//
// Conventions shared by the whole module:
//   - Expert ids are int64 (int32 accepted wherever ids are read); -1 means "no expert" and is
//     skipped by every consumer (counts, mappings, reductions) and kept by mask_indices_by_tp.
//   - Routing tie rule: higher score first; equal scores pick the smaller expert (or group)
//     index; NaN ranks below every number; selections are written best first.
//   - Quantisation follows DeepGEMM's reference quantizers bit for bit (dsk/kernels/quant.hpp):
//     sf = max(amax, 1e-4) / fmt_max (448 for e4m3, 6 for e2m1), rounded up to a power of two
//     when round_sf; code = fmt(x * (1 / sf)). Non-finite values follow torch as DeepGEMM's
//     reference does: a NaN makes its block's amax and sf NaN (2^127 with round_sf) and the
//     block's codes NaN (with round_sf: the other codes about 0); an inf makes sf inf (2^127 with
//     round_sf), the other codes 0 and its own code NaN (e4m3 448 with round_sf).
//   - Scale layouts (sf of row r, block kb; "col-major" = MN-major, TMA-aligned):
//       f32, row-major:        Tensor f32 [rows, blocks]
//       f32, col-major:        the same shape, strides (1, align(rows, 4))
//       packed UE8M0:          Tensor i32 [rows, ceil(blocks / 4)], byte kb % 4 of word kb / 4
//                              (4 exponents per int32, unused bytes 127 = 1.0); col-major strides
//                              (1, align(rows, 4)) when use_tma_aligned_col_major_sf
//     exactly what dsk::gemm's FP8/FP4 GEMMs read.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include <dsk/core/tensor.hpp>
#include <dsk/gemm.hpp>

namespace dsk::tk {

// A quantised tensor and its scale factors: upstream's QuantTensor (data, sf), the same struct
// dsk::gemm takes as an FP8 / FP4 operand.
using QuantTensor = gemm::Fp8Tensor;
// (rows, cols) of the block one scale factor covers.
using BlockSize = std::pair<int, int>;

// ================================================================================================
// MoE routing
// ================================================================================================

// The num_topk best experts of each row of scores (f32 [num_tokens, num_experts], row stride any,
// last dimension contiguous) -> int64 [num_tokens, num_topk], best first (tie rule above).
// 1 <= num_topk <= min(num_experts, 32), num_experts <= 1024. Any float values are allowed.
Tensor topk_gate(const Tensor& scores, int num_topk);

// The num_topk_groups best groups of each row of scores (f32 [num_tokens, num_groups,
// experts_per_group], finite), ranked by the sum of each group's num_topk_sum (1 or 2) largest
// scores -> int64 [num_tokens, num_topk_groups], best first.
Tensor topk_sum_and_topk_group_idx(const Tensor& scores, int num_topk_sum, int num_topk_groups);

struct GateResult {
  Tensor topk_idx;      // int64 [num_tokens, num_topk (+ num_shared_experts)]
  Tensor topk_weights;  // f32, same shape
};

// The DeepSeek group-limited gate with optional shared-as-routed experts, physical replicas and
// expert/tensor-parallel masking (upstream tile_kernels.moe.top2_sum_gate):
//   s = score(logits) with scoring_func "sigmoid" | "sqrtsoftplus" (sqrt(softplus(x))) | "softmax"
//   b = s + bias; with num_groups > 0 and num_topk_groups < num_groups, only the num_topk_groups
//   groups with the largest top-2 sums of b are eligible; the num_topk best experts by b are
//   selected, and their weights are s / (1e-20 + sum of the selected s) * routed_scaling_factor.
//   - mask (bool [num_tokens]): rows that are false are not routed (ids -1, weights 0).
//   - fix_routing_mask (bool [num_tokens], needs unmapped_topk_idx): rows that are true keep the
//     experts already in unmapped_topk_idx (weights recomputed from s).
//   - use_shared_as_routed: num_shared_experts (1 or 2) extra slots per token holding the shared
//     experts as logical ids num_routed_experts + j with weight 1.
//   - to_physical_map (int32 [num_logical_experts, num_duplicates]) with logical_count (int32
//     [num_logical_experts]): each id becomes replica (ep_rank + token * 23333) % count of it.
//   - expert parallelism: with num_experts_per_rank = (num_routed_experts + num_extra_experts) /
//     num_ep_ranks, ids on an EP rank whose index % num_tp_ranks != tp_rank become -1, the others
//     are renumbered to this TP rank's local experts (as mask_indices_by_tp).
//   - unmapped_topk_idx (int64 [num_tokens, num_topk], written): the selected logical ids.
// logits f32 [num_tokens, num_routed_experts] must be finite; num_routed_experts <= 1024,
// num_topk <= 32, num_groups <= 32.
GateResult top2_sum_gate(const Tensor& logits, const Tensor& bias, int num_topk,
                         int num_topk_groups, int num_groups, bool use_shared_as_routed,
                         int num_shared_experts, float routed_scaling_factor, int ep_rank,
                         int num_ep_ranks, int tp_rank, int num_tp_ranks,
                         std::string_view scoring_func,
                         const std::optional<Tensor>& mask = std::nullopt,
                         const std::optional<Tensor>& fix_routing_mask = std::nullopt,
                         const std::optional<Tensor>& to_physical_map = std::nullopt,
                         const std::optional<Tensor>& logical_count = std::nullopt,
                         const std::optional<Tensor>& unmapped_topk_idx = std::nullopt);

// DeepSeek-V3's Gate (inference/model.py, HF topk_method "noaux_tc") in one call: scores by
// scoring_func ("sigmoid", "softmax" or "sqrtsoftplus"), plus e_score_correction_bias when given;
// with n_group > 1 the topk_group best groups by the sum of their top 2 biased scores (by their top
// 1 without a bias, V2's group-limited greedy rule); the top num_topk experts by biased score;
// weights from the unbiased scores, normalised to sum 1 (+1e-20) when norm_topk_prob, times
// routed_scaling_factor. V3: noaux_tc_gate(logits, bias, 8, 8, 4, 2.5f).
GateResult noaux_tc_gate(const Tensor& logits, const std::optional<Tensor>& e_score_correction_bias,
                         int num_topk, int n_group, int topk_group,
                         float routed_scaling_factor = 1.0f,
                         std::string_view scoring_func = "sigmoid", bool norm_topk_prob = true);

// Tokens per expert: int32 [num_groups] counts of each id in group_idx (int64 / int32
// [num_tokens, num_topk]); -1 entries are skipped, other ids must lie in [0, num_groups).
Tensor group_count(const Tensor& group_idx, int num_groups);

struct NormalizedWeights {
  Tensor denominator;         // f32 [num_tokens]: 1e-20 + sum of the row, in slot order
  Tensor normalized_weights;  // f32 [num_tokens, num_topk]: each weight / denominator
};
NormalizedWeights normalize_weight(const Tensor& topk_weights);

// Keeps the expert ids this tensor-parallel rank owns: with per_gpu = n / num_ep_ranks and
// per_dp = num_tp_ranks * per_gpu, an id i >= 0 stays when (i / per_gpu) % num_tp_ranks ==
// tp_rank and becomes i - tp_rank * per_gpu - (i' / per_dp) * (per_dp - per_gpu) (i' the id after
// the first subtraction); other ids and -1 become -1. Same dtype and shape as indices.
Tensor mask_indices_by_tp(const Tensor& indices, int64_t n, int num_ep_ranks, int tp_rank,
                          int num_tp_ranks);

// ================================================================================================
// MoE mapping: token-major (token, slot) <-> expert-major fused rows
// ================================================================================================

// The fused layout: expert e owns rows [expert_start[e], expert_end[e]), its tokens first in
// ascending (token, slot) order, then -1 padding rows up to a multiple of the alignment; experts
// follow each other in id order. pos_to_expert is exactly the grouped_layout of
// gemm::m_grouped_*_gemm_nt_contiguous.
struct FusedMapping {
  Tensor pos_to_expert;          // int32 [num_expanded_tokens]: expert of each row, -1 padding
  Tensor pos_to_token;           // int32 [num_expanded_tokens]: token of each row, -1 padding
  Tensor pos_to_token_topk;      // int32 [num_expanded_tokens]: token * num_topk + slot, -1
  Tensor token_topk_to_pos;      // int32 [num_tokens, num_topk]: row of each slot, -1 for id -1
  Tensor expert_start;           // int32 [num_experts]
  Tensor expert_end;             // int32 [num_experts]
  Tensor num_tokens_per_expert;  // int32 [num_experts]: rows of each expert (aligned)
  // The same counts on the host when the size was computed here (num_expanded_tokens == 0 and
  // not force_no_sync), else empty.
  std::vector<int> num_tokens_per_expert_list;
};

// topk_idx: int64 / int32 [num_tokens, num_topk], ids in [-1, num_experts). num_expanded_tokens
// rows are allocated (rows past the last expert are padding); 0 sizes the buffer exactly (or to the
// upper bound align(num_tokens * num_topk + (alignment - 1) * num_experts, alignment) with
// force_no_sync). alignment defaults to gemm::get_mk_alignment_for_contiguous_layout().
FusedMapping get_fused_mapping(const Tensor& topk_idx, int num_experts,
                               int64_t num_expanded_tokens = 0,
                               std::optional<int> alignment = std::nullopt,
                               bool force_no_sync = false);

// Copies token rows to their fused rows: out [num_expanded_tokens, hidden] (x's dtype), row
// token_topk_to_pos[t, j] = x[t] for every j with a row, padding rows (pos_to_expert < 0) zero.
Tensor expand_to_fused(const Tensor& x, const Tensor& token_topk_to_pos,
                       const Tensor& pos_to_expert);

// The same for a quantised tensor and its scales (f32 [num_tokens, ceil(hidden /
// num_per_channels)], or packed int32 [num_tokens, ceil(blocks / 4)]); the scales of padding rows
// are 0. With use_tma_aligned_col_major_sf the output scales are col-major (required for packed).
QuantTensor expand_to_fused_with_sf(const QuantTensor& x, int num_per_channels,
                                    const Tensor& token_topk_to_pos, const Tensor& pos_to_expert,
                                    bool use_tma_aligned_col_major_sf = false);

// The combine: out[t] = sum over slots j with a row p of x[p] * topk_weights[t, j] (the weight
// is 1 without topk_weights), accumulated in f32 in slot order, times sf[0] when given, stored as
// x's dtype (bf16 / f32), or e4m3 with fp8_format "e4m3" (saturating). x: [num_expanded_tokens,
// hidden] bf16 / f32; out, when given, is written and returned.
Tensor reduce_fused(const Tensor& x, const std::optional<Tensor>& topk_weights,
                    const Tensor& token_topk_to_pos, std::string_view fp8_format = "",
                    const std::optional<Tensor>& sf = std::nullopt,
                    const std::optional<Tensor>& out = std::nullopt);
// With per-row scales: x.data bf16 / f32 / e4m3 [num_expanded_tokens, hidden], x.sf f32
// [num_expanded_tokens] multiplying each row's contribution (output bf16 unless fp8_format).
Tensor reduce_fused(const QuantTensor& x, const std::optional<Tensor>& topk_weights,
                    const Tensor& token_topk_to_pos, std::string_view fp8_format = "",
                    const std::optional<Tensor>& sf = std::nullopt,
                    const std::optional<Tensor>& out = std::nullopt);

// ================================================================================================
// Quantisation (x: bf16 / f32 [num_tokens, hidden], last dimension contiguous)
// ================================================================================================

// fmt "e4m3" (data e4m3 [num_tokens, hidden]) or "e2m1" (data fp4x2 [num_tokens, hidden / 2],
// hidden even). One scale per num_per_channels (16, 32, 64, 128 or hidden) consecutive values of a
// row; the last block of a row may be shorter. use_packed_ue8m0 needs round_sf.
QuantTensor per_token_cast(const Tensor& x, std::string_view fmt, int num_per_channels,
                           bool use_tma_aligned_col_major_sf = false, bool round_sf = false,
                           bool use_packed_ue8m0 = false);

// One scale per block_size (rows, cols) block: sf [ceil(num_tokens / rows), ceil(hidden / cols)]
// in the layouts above (rows of blocks take the place of tokens). 128 x 128 is the weight recipe.
QuantTensor per_block_cast(const Tensor& x, std::string_view fmt, BlockSize block_size,
                           bool use_tma_aligned_col_major_sf = false, bool round_sf = false,
                           bool use_packed_ue8m0 = false);

// One scale per column and num_per_tokens consecutive rows: sf f32 [ceil(num_tokens /
// num_per_tokens), hidden] (DeepGEMM's per_channel_cast_to_fp8, the k-grouped wgrad recipe).
QuantTensor per_channel_cast(const Tensor& x, std::string_view fmt, int num_per_tokens = 128,
                             bool round_sf = false);

// SwiGLU of x = [gate | up] (bf16 / f32 [num_rows, 2 * hidden]) into f32 [num_rows, hidden]:
//   g = min(gate, c), u = clamp(up, -c, c) when swiglu_clamp_value c is given,
//   y = silu(g) * u, times topk_weights.view(-1)[pos_to_token_topk[r]] when weights are given.
// Rows with pos_to_expert < 0 or pos_to_token_topk < 0 (when given) are zero.
Tensor swiglu_forward(const Tensor& x, const std::optional<Tensor>& pos_to_expert = std::nullopt,
                      std::optional<float> swiglu_clamp_value = std::nullopt,
                      const std::optional<Tensor>& pos_to_token_topk = std::nullopt,
                      const std::optional<Tensor>& topk_weights = std::nullopt);

// swiglu_forward fused with per_token_cast; bit-identical to per_token_cast(swiglu_forward(...)).
QuantTensor swiglu_forward_and_per_token_cast(
    const Tensor& x, std::string_view fmt, int num_per_channels,
    const std::optional<Tensor>& pos_to_expert = std::nullopt,
    std::optional<float> swiglu_clamp_value = std::nullopt,
    const std::optional<Tensor>& pos_to_token_topk = std::nullopt,
    const std::optional<Tensor>& topk_weights = std::nullopt,
    bool use_tma_aligned_col_major_sf = false, bool round_sf = false,
    bool use_packed_ue8m0 = false);

// rms_norm fused with per_token_cast; bit-identical to per_token_cast(rms_norm(x, weight, eps,
// f32)). weight: f32 / bf16 [hidden].
QuantTensor rmsnorm_forward_and_per_token_cast(const Tensor& x, const Tensor& weight, float eps,
                                               std::string_view fmt, int num_per_channels,
                                               bool use_tma_aligned_col_major_sf = false,
                                               bool round_sf = false,
                                               bool use_packed_ue8m0 = false);

// Dequantizes x (e4m3 or fp4x2 data with scales in any layout above, one per block_size block)
// into fmt "fp32" or "bf16": value(code) * sf, one f32 product per element.
Tensor cast_back(const QuantTensor& x, std::string_view fmt, BlockSize block_size);

// ================================================================================================
// Norms, RoPE, Hadamard
// ================================================================================================

// RMSNorm over the last dimension in f32: y = (x * rstd) * weight, rstd = 1 / sqrt(mean(x^2) +
// eps). x f32 / bf16 / f16 (rows may be strided), weight f32 / bf16 [hidden]; the output dtype
// defaults to x's.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f,
                std::optional<DType> out_dtype = std::nullopt);

// LayerNorm over the last dimension in f32: y = ((x - mean) * rstd) * weight + bias.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                  float eps = 1e-6f, std::optional<DType> out_dtype = std::nullopt);

// DeepSeek's RoPE frequencies (inference/model.py precompute_freqs_cis): freq_i =
// rope_theta^(-2i / rot_dim); when max_seq_len > original_seq_len (YaRN), with the correction
// range [low, high] of beta_fast / beta_slow and ramp_i = clamp((i - low) / (high - low), 0, 1),
// freq_i = freq_i / rope_factor * ramp_i + freq_i * (1 - ramp_i).
struct RopeConfig {
  int rot_dim = 64;
  int64_t max_seq_len = 16384;
  double rope_theta = 10000.0;
  double rope_factor = 40.0;
  int64_t original_seq_len = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// (low, high) of the YaRN correction range (10, 23 for DeepSeek-V3).
std::pair<int, int> yarn_correction_range(const RopeConfig& config = {});
// The rot_dim / 2 frequencies (fp64).
std::vector<double> rope_frequencies(const RopeConfig& config = {});
// cos_sin_cache f32 [max_seq_len, rot_dim]: cos(pos * freq_i) in column i, sin in rot_dim / 2 + i
// (angles and functions in fp64, then rounded), the table apply_rotary reads.
Tensor yarn_cos_sin_cache(const RopeConfig& config = {});
// YaRN's attention-scale factor 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1); DeepSeek's
// softmax scale is qk_head_dim^-0.5 * yarn_mscale(40)^2.
double yarn_mscale(double factor, double mscale = 1.0);

// Rotates query (and key) in place (upstream tile_kernels.transform.apply_rotary): shapes
// [num_tokens, num_heads, rot_dim] or [batch, seqlen, num_heads, rot_dim] (f32 / bf16 / f16, last
// dimension contiguous, rot_dim in {32, 64, 128, 256}); cos_sin_cache f32 [seqlen_ro, rot_dim].
// Token t uses row positions[t] + seqlen_offset (positions int32 / int64 [num_tokens] or [batch,
// seqlen]), or t's index in its sequence + seqlen_offset. interleaved pairs (2i, 2i + 1) (MLA),
// otherwise (i, i + rot_dim / 2) (indexer); conjugate rotates backwards.
void apply_rotary(const Tensor& query, const Tensor& cos_sin_cache,
                  const std::optional<Tensor>& key = std::nullopt,
                  const std::optional<Tensor>& positions = std::nullopt, bool interleaved = false,
                  bool conjugate = false, int64_t seqlen_offset = 0);

// scale * H x over the last dimension (a power of two in [16, 1024]; 128 for the indexer), H the
// Sylvester-ordered Walsh-Hadamard matrix (fast_hadamard_transform's hadamard_transform); the
// orthonormal transform is scale = n^-0.5. x f32 / bf16 / f16; the output has x's dtype.
Tensor hadamard_transform(const Tensor& x, float scale = 1.0f);

}  // namespace dsk::tk
