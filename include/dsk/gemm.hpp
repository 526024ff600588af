// dsk::gemm — DeepGEMM on CPU (../shared/spec/gemm.md): FP8/FP4/BF16 dense and grouped GEMMs,
// scale-factor layouts, reference quantizers and weight pre-packing.
//
// Every GEMM computes D = C + A·Bᵀ with FP32 accumulation ("nt": A [M,K], B [N,K]); nn/tn/tt take
// transposed views and call nt. D is row-major BF16 or FP32; C, when given, has D's dtype and shape
// (it may be D itself). m = 0 or n = 0 does nothing; k = 0 gives D = C, or 0 without C.
// Names, argument names, order and defaults follow upstream deep_gemm one to one (DESIGN §3).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include <dsk/core/tensor.hpp>
#include <dsk/core/threads.hpp>

namespace dsk::gemm {

// (gran_m, gran_n, gran_k): one scale per gran_m x gran_k block of A and gran_n x gran_k of B.
using Recipe = std::tuple<int, int, int>;
// (gran_mn, gran_k) of one operand.
using OperandRecipe = std::tuple<int, int>;

// An FP8 or packed-FP4 operand with its scale factors: upstream's (x, x_sf) pair.
//   data: e4m3 [.., MN, K], or fp4x2 [.., MN, K/2] (two e2m1 per byte, even index in the low
//   nibble) sf:   f32 [.., ceil(MN/gran_mn), ceil(K/gran_k)] in any layout
//   transform_sf_into_required_layout
//         accepts, or int32 packed UE8M0 (4 per int32, MN-major), or int16 (Ascend: 2 per int16)
struct Fp8Tensor {
  Tensor data;
  Tensor sf;
};

// ---------------------------------------------------------------------------------------------
// Pre-packed weights: B [N,K] or [G,N,K] with its scales converted once into the kernels' layout.
// FP8/FP4 weights stay FP8/FP4 in memory (widened in registers or L1 by the kernels). Every GEMM
// below that takes B also takes a PackedWeight in its place.
class PackedWeight {
 public:
  struct Impl;
  PackedWeight() = default;
  explicit PackedWeight(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  int64_t num_groups() const;  // 1 for a 2-D weight
  int64_t n() const;
  int64_t k() const;
  DType dtype() const;    // bf16, e4m3 or fp4x2 (as given)
  size_t nbytes() const;  // bytes of packed data and scales
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// b: bf16 [N,K] or [G,N,K] (any strides; [K,N] views from .transpose() work too).
PackedWeight pack_weight(const Tensor& b);
// The groups of several packed weights (each [N,K] or [G,N,K], all of one N, K and dtype) as one
// grouped weight, in order. The packed data is shared, not copied: a model packs each expert on
// its own and groups them without ever holding a stacked [E,N,K] copy of the raw weights.
PackedWeight stack_packed_weights(const std::vector<PackedWeight>& parts);
// b: e4m3 / fp4x2 data with scales, as fp8_fp4_gemm_nt's b; recipe_b is (gran_n, gran_k) and
// defaults as in fp8_fp4_gemm_nt.
PackedWeight pack_weight(const Fp8Tensor& b, std::optional<OperandRecipe> recipe_b = std::nullopt,
                         bool disable_ue8m0_cast = false);

// ---------------------------------------------------------------------------------------------
// Dense FP8 / FP4 GEMM. Defaults: recipe (1,128,128) with FP32 scales, (1,1,128) with packed
// UE8M0 int scales; FP4 operands use UE8M0 scales with gran_k 32.
void fp8_fp4_gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c = std::nullopt,
                     std::optional<Recipe> recipe = std::nullopt,
                     std::optional<OperandRecipe> recipe_a = std::nullopt,
                     std::optional<OperandRecipe> recipe_b = std::nullopt,
                     std::string_view compiled_dims = "nk", bool disable_ue8m0_cast = false);
void fp8_fp4_gemm_nt(const Fp8Tensor& a, const PackedWeight& b, const Tensor& d,
                     const std::optional<Tensor>& c = std::nullopt,
                     std::optional<Recipe> recipe = std::nullopt,
                     std::optional<OperandRecipe> recipe_a = std::nullopt,
                     std::string_view compiled_dims = "nk", bool disable_ue8m0_cast = false);
void fp8_fp4_gemm_nn(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c = std::nullopt,
                     std::optional<Recipe> recipe = std::nullopt,
                     std::optional<OperandRecipe> recipe_a = std::nullopt,
                     std::optional<OperandRecipe> recipe_b = std::nullopt,
                     std::string_view compiled_dims = "nk", bool disable_ue8m0_cast = false);
void fp8_fp4_gemm_tn(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c = std::nullopt,
                     std::optional<Recipe> recipe = std::nullopt,
                     std::optional<OperandRecipe> recipe_a = std::nullopt,
                     std::optional<OperandRecipe> recipe_b = std::nullopt,
                     std::string_view compiled_dims = "mn", bool disable_ue8m0_cast = false);
void fp8_fp4_gemm_tt(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                     const std::optional<Tensor>& c = std::nullopt,
                     std::optional<Recipe> recipe = std::nullopt,
                     std::optional<OperandRecipe> recipe_a = std::nullopt,
                     std::optional<OperandRecipe> recipe_b = std::nullopt,
                     std::string_view compiled_dims = "mn", bool disable_ue8m0_cast = false);

// Upstream's legacy names.
template <class... Args>
void fp8_gemm_nt(Args&&... args) {
  fp8_fp4_gemm_nt(std::forward<Args>(args)...);
}
template <class... Args>
void fp8_gemm_nn(Args&&... args) {
  fp8_fp4_gemm_nn(std::forward<Args>(args)...);
}
template <class... Args>
void fp8_gemm_tn(Args&&... args) {
  fp8_fp4_gemm_tn(std::forward<Args>(args)...);
}
template <class... Args>
void fp8_gemm_tt(Args&&... args) {
  fp8_fp4_gemm_tt(std::forward<Args>(args)...);
}

// Dense BF16 GEMM.
void bf16_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& d,
                  const std::optional<Tensor>& c = std::nullopt,
                  std::string_view compiled_dims = "nk");
void bf16_gemm_nt(const Tensor& a, const PackedWeight& b, const Tensor& d,
                  const std::optional<Tensor>& c = std::nullopt,
                  std::string_view compiled_dims = "nk");
void bf16_gemm_nn(const Tensor& a, const Tensor& b, const Tensor& d,
                  const std::optional<Tensor>& c = std::nullopt,
                  std::string_view compiled_dims = "nk");
void bf16_gemm_tn(const Tensor& a, const Tensor& b, const Tensor& d,
                  const std::optional<Tensor>& c = std::nullopt,
                  std::string_view compiled_dims = "mn");
void bf16_gemm_tt(const Tensor& a, const Tensor& b, const Tensor& d,
                  const std::optional<Tensor>& c = std::nullopt,
                  std::string_view compiled_dims = "mn");

// ---------------------------------------------------------------------------------------------
// M-grouped GEMM (MoE experts), contiguous layout: A [M,K], B [G,N,K], D [M,N] bf16.
//   grouped_layout, non-psum: int32 [M], each row's group id, -1 for a padding row (D rows of -1
//     are written as zeros when ensure_zero_padding); segments start at multiples of
//     get_mk_alignment_for_contiguous_layout().
//   grouped_layout, psum (use_psum_layout): int32 [G], each group's end row; group g starts at
//     align(end[g-1], mk_alignment).
void m_grouped_fp8_fp4_gemm_nt_contiguous(
    const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d, const Tensor& grouped_layout,
    std::optional<Recipe> recipe = std::nullopt,
    std::optional<OperandRecipe> recipe_a = std::nullopt,
    std::optional<OperandRecipe> recipe_b = std::nullopt, std::string_view compiled_dims = "nk",
    bool disable_ue8m0_cast = false, bool use_psum_layout = false, bool ensure_zero_padding = true,
    std::optional<int> expected_m_for_psum_layout = std::nullopt);
void m_grouped_fp8_fp4_gemm_nt_contiguous(
    const Fp8Tensor& a, const PackedWeight& b, const Tensor& d, const Tensor& grouped_layout,
    std::optional<Recipe> recipe = std::nullopt,
    std::optional<OperandRecipe> recipe_a = std::nullopt, std::string_view compiled_dims = "nk",
    bool disable_ue8m0_cast = false, bool use_psum_layout = false, bool ensure_zero_padding = true,
    std::optional<int> expected_m_for_psum_layout = std::nullopt);
void m_grouped_bf16_gemm_nt_contiguous(
    const Tensor& a, const Tensor& b, const Tensor& d, const Tensor& grouped_layout,
    std::string_view compiled_dims = "nk", bool use_psum_layout = false,
    std::optional<int> expected_m_for_psum_layout = std::nullopt);
void m_grouped_bf16_gemm_nt_contiguous(
    const Tensor& a, const PackedWeight& b, const Tensor& d, const Tensor& grouped_layout,
    std::string_view compiled_dims = "nk", bool use_psum_layout = false,
    std::optional<int> expected_m_for_psum_layout = std::nullopt);
template <class... Args>
void m_grouped_fp8_gemm_nt_contiguous(Args&&... args) {
  m_grouped_fp8_fp4_gemm_nt_contiguous(std::forward<Args>(args)...);
}

// M-grouped GEMM, masked layout: A [G,Mmax,K], B [G,N,K], D [G,Mmax,N] bf16; only rows
// < masked_m[g] (int32 [G]) are computed; expected_m is a scheduling hint.
void m_grouped_fp8_fp4_gemm_nt_masked(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                                      const Tensor& masked_m, int expected_m,
                                      std::optional<Recipe> recipe = std::nullopt,
                                      std::optional<OperandRecipe> recipe_a = std::nullopt,
                                      std::optional<OperandRecipe> recipe_b = std::nullopt,
                                      std::string_view compiled_dims = "nk",
                                      bool disable_ue8m0_cast = false);
void m_grouped_fp8_fp4_gemm_nt_masked(const Fp8Tensor& a, const PackedWeight& b, const Tensor& d,
                                      const Tensor& masked_m, int expected_m,
                                      std::optional<Recipe> recipe = std::nullopt,
                                      std::optional<OperandRecipe> recipe_a = std::nullopt,
                                      std::string_view compiled_dims = "nk",
                                      bool disable_ue8m0_cast = false);
void m_grouped_bf16_gemm_nt_masked(const Tensor& a, const Tensor& b, const Tensor& d,
                                   const Tensor& masked_m, int expected_m,
                                   std::string_view compiled_dims = "nk");
void m_grouped_bf16_gemm_nt_masked(const Tensor& a, const PackedWeight& b, const Tensor& d,
                                   const Tensor& masked_m, int expected_m,
                                   std::string_view compiled_dims = "nk");
template <class... Args>
void m_grouped_fp8_gemm_nt_masked(Args&&... args) {
  m_grouped_fp8_fp4_gemm_nt_masked(std::forward<Args>(args)...);
}

// K-grouped GEMM (weight gradients): A [ΣK, M], B [ΣK, N] (MN-major), D [G,M,N] f32, C required;
// D[g] = C[g] + A_gᵀ·B_g over group g's rows of K; ks (host) gives each K_g; empty groups allowed.
void k_grouped_fp8_gemm_tn_contiguous(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& d,
                                      const std::optional<std::vector<int>>& ks_cpu,
                                      const Tensor& grouped_layout, const std::optional<Tensor>& c,
                                      Recipe recipe = {1, 1, 128},
                                      std::string_view compiled_dims = "mn",
                                      bool use_psum_layout = false);

// ---------------------------------------------------------------------------------------------
// MQA logits of the V3.2 lightning indexer (docs/gemm.md, "MQA logits"):
//   logits[i, j] = sum_h relu(sum_d q[i, h, d] * kv[j, d] * kv_sf[j]) * weights[i, h]
// for j in [cu_seq_len_k_start[i], cu_seq_len_k_end[i]). q e4m3 [S, H, D] (last dimension
// contiguous; H a multiple of 4 up to 128, D in {32, 64, 128}), kv = {e4m3 [Skv, D], f32 [Skv]},
// weights f32 [S, H], starts / ends int32 [S] with 0 <= start <= end <= Skv.
//   - Output: logits_dtype (f32 or bf16) [S, Skv], a view whose row stride is upstream's
//     align(Skv + 256, 1024 bytes / element size); with clean_logits every entry outside a row's
//     range is -inf, without it those entries are left unwritten (as upstream).
//   - max_seqlen_k > 0: the compressed output [S, max_seqlen_k], column c = kv row start[i] + c
//     (row stride align(max_seqlen_k + 256, ...)); clean_logits must be false, end - start must
//     not exceed max_seqlen_k, and columns past a row's length are left unwritten.
Tensor fp8_mqa_logits(const Tensor& q, const Fp8Tensor& kv, const Tensor& weights,
                      const Tensor& cu_seq_len_k_start, const Tensor& cu_seq_len_k_end,
                      bool clean_logits = true, int64_t max_seqlen_k = 0,
                      DType logits_dtype = DType::f32);
// The same with q = {q, q_sf}: e4m3 q with no q_sf (as above), or FP4: q fp4x2 [S, H, D / 2]
// with q_sf int32 [S, H] and kv = {fp4x2 [Skv, D / 2], int32 [Skv]}, UE8M0 scales of 32 values
// packed 4 per int32 (byte g scales values [32g, 32g + 32)), D in {64, 128}, every scale within
// 2^-100 .. 2^100 (the kernels fold them into the widened values exactly).
Tensor fp8_fp4_mqa_logits(const Fp8Tensor& q, const Fp8Tensor& kv, const Tensor& weights,
                          const Tensor& cu_seq_len_k_start, const Tensor& cu_seq_len_k_end,
                          bool clean_logits = true, int64_t max_seqlen_k = 0,
                          DType logits_dtype = DType::f32);

// Paged (decode) MQA logits over the indexer's FP8 cache. kv_cache: uint8 [num_blocks, block_kv,
// 1, D + 4], block_kv in {32, 64, 128}; block bytes are block_kv * D e4m3 values, then block_kv
// f32 scales (token t of a block: values at t * D, scale at block_kv * D + 4 t). q e4m3
// [B, next_n, H, D]; weights f32 [B * next_n, H]; block_table int32 [B, max_blocks];
// context_lens int32 [B] (row b * next_n + j sees tokens t <= context_lens[b] - next_n + j) or
// [B, next_n] (row b * next_n + j sees t < context_lens[b, j]).
// get_paged_mqa_logits_metadata splits the work (cache blocks of every item) into num_sms equal
// parts: int32 [num_sms + 1, 2] of (item, block) starts, the last row (B, 0). The kernel runs one
// part per thread. Output: logits_dtype [B * next_n, max_context_len], row stride
// align(align(max_context_len, 256), 1024 bytes / element); tokens past a row's length are -inf
// with clean_logits (which needs 1-D context_lens, as upstream) and unwritten without.
Tensor get_paged_mqa_logits_metadata(const Tensor& context_lens, int64_t block_kv, int64_t num_sms);
Tensor fp8_paged_mqa_logits(const Tensor& q, const Tensor& kv_cache, const Tensor& weights,
                            const Tensor& context_lens, const Tensor& block_table,
                            const Tensor& schedule_meta, int64_t max_context_len,
                            bool clean_logits = false, DType logits_dtype = DType::f32);

// ---------------------------------------------------------------------------------------------
// Settings. The CPU default alignment is documented in docs/gemm.md with the measurement that
// chose it; a value set here is honoured by every contiguous-layout user (grouped GEMM, tk's
// fused mapping, ep's expand mode).
int get_mk_alignment_for_contiguous_layout();
void set_mk_alignment_for_contiguous_layout(int alignment);  // a positive multiple of 16
int get_theoretical_mk_alignment_for_contiguous_layout(
    std::optional<int> expected_m = std::nullopt);
inline int get_m_alignment_for_contiguous_layout() {
  return get_mk_alignment_for_contiguous_layout();
}
inline int get_k_alignment_for_contiguous_layout() {
  return get_mk_alignment_for_contiguous_layout();
}

// Upstream's set_num_sms / get_num_sms map to the compute thread count.
inline void set_num_sms(int n) {
  set_num_threads(n);
}
inline int get_num_sms() {
  return get_num_threads();
}
using dsk::get_deterministic_algorithms;
using dsk::use_deterministic_algorithms;

// ---------------------------------------------------------------------------------------------
// Scale-factor layouts (upstream csrc/apis/layout.hpp).
int64_t get_tma_aligned_size(int64_t x, int64_t element_size);  // align(x, 16 / element_size)
// sf [.., MN, SFK] -> the same values, MN-major with MN padded to get_tma_aligned_size
Tensor get_mn_major_tma_aligned_tensor(const Tensor& sf);
// f32 power-of-two sf [.., MN, SFK] -> int32 [.., MN, ceil(SFK/4)], 4 UE8M0 per int32, MN-major
Tensor get_mn_major_tma_aligned_packed_ue8m0_tensor(const Tensor& sf);
// Converts sf of an operand with `mn` rows and `k` columns into the layout the kernels read.
Tensor transform_sf_into_required_layout(const Tensor& sf, int64_t mn, int64_t k,
                                         std::optional<Recipe> recipe = std::nullopt,
                                         std::optional<OperandRecipe> recipe_ab = std::nullopt,
                                         std::optional<int64_t> num_groups = std::nullopt,
                                         std::optional<bool> is_sfa = std::nullopt,
                                         bool disable_ue8m0_cast = false);

// ---------------------------------------------------------------------------------------------
// Reference quantizers, bit-exact to deep_gemm/utils/math.py (rules in dsk/kernels/quant.hpp).
Fp8Tensor per_token_cast_to_fp8(const Tensor& x, bool use_ue8m0, int gran_k = 128,
                                bool use_packed_ue8m0 = false);
Fp8Tensor per_block_cast_to_fp8(const Tensor& x, bool use_ue8m0, int gran_k = 128);
Fp8Tensor per_channel_cast_to_fp8(const Tensor& x, bool use_ue8m0, int gran_k = 128);
Fp8Tensor per_token_cast_to_fp4(const Tensor& x, bool use_ue8m0, int gran_k = 128,
                                bool use_packed_ue8m0 = false);
Tensor cast_back_from_fp4(const Tensor& packed, const Tensor& sf, int gran_k = 128,
                          bool use_packed_ue8m0 = false);
Tensor ceil_to_ue8m0(const Tensor& x);               // f32 -> f32 powers of two
Tensor pack_ue8m0_to_int(const Tensor& sf);          // f32 [.., 4q] -> int32 [.., q]
Tensor unpack_ue8m0_from_int(const Tensor& packed);  // int32 [.., q] -> f32 [.., 4q]

}  // namespace dsk::gemm
