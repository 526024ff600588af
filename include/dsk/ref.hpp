// dsk::ref: the oracle every optimized kernel is tested against (DESIGN §6), and the harness that
// compares against it: the upstream metrics (calc_diff, FlashMLA's allclose rule, top-k set
// comparison), seeded counter-based random tensors, and NaN poisoning of outputs.
//
// Every function reads any float dtype (f64, f32, f16, bf16, e4m3, e5m2, ue8m0, fp4x2 as its two
// e2m1 values per byte) and integer dtype as values, walks any strides, and accumulates in fp64.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include <dsk/core/tensor.hpp>

namespace dsk::ref {

// ---- metrics ----

// Upstream's calc_diff: 1 - 2*sum(x*y) / sum(x*x + y*y) in fp64; 0 when both are all zero. 0 means
// identical, 1 unrelated; NaN or inf anywhere gives NaN. Shapes must match (dtypes may differ).
double calc_diff(const Tensor& x, const Tensor& y);

struct AllcloseOptions {
  double abs_tol = 1e-5;  // an element passes when |a - e| < abs_tol ...
  double rel_tol = 1e-2;  // ... or |a - e| / (|e| + 1e-6) < rel_tol, or a == e
  double cos_tol = 1e-7;  // and calc_diff over the finite elements must be <= cos_tol
};

struct AllcloseResult {
  bool passed = true;
  int64_t num_elements = 0;
  int64_t num_bad = 0;           // elements failing the special-value or tolerance rule
  int64_t first_bad_index = -1;  // row-major position of the first, -1 if none
  Shape first_bad_coords;        // its coordinates
  double first_bad_actual = 0;   // and its two values
  double first_bad_expected = 0;
  double max_abs_err = 0;  // over finite pairs
  double max_rel_err = 0;  // |a - e| / (|e| + 1e-6), over finite pairs
  double cos_diff = 0;     // calc_diff with non-finite pairs counted as 0
  std::string message;     // one line: the verdict and the numbers above

  explicit operator bool() const { return passed; }
};

// FlashMLA's check_is_allclose rule (spec/attention.md §4.4): (1) NaN, +inf and -inf at exactly
// the same positions; (2) every finite element within abs_tol or rel_tol; (3) cos_diff <= cos_tol.
// Shapes must match (dsk::Error otherwise); dtypes may differ.
AllcloseResult allclose(const Tensor& actual, const Tensor& expected,
                        const AllcloseOptions& options = {});

std::ostream& operator<<(std::ostream& os, const AllcloseResult& r);

// ---- top-k selections compared as sets ----

struct TopkCompareOptions {
  int64_t pad = -1;  // the index that fills rows with fewer than k selections
  // Per-row candidate range [start, end) of `values` (i32/i64 [b]); default the whole row.
  std::optional<Tensor> row_starts;
  std::optional<Tensor> row_ends;
};

struct TopkCompareResult {
  bool passed = true;
  int64_t num_rows = 0;
  int64_t num_bad_rows = 0;
  int64_t first_bad_row = -1;
  std::string message;  // one line: the first bad row and what is wrong with it

  explicit operator bool() const { return passed; }
};

// Compares two top-k selections row by row, ignoring order. indices_*: i32/i64 [b, k] of column
// indices, `pad` where a row selects fewer than k. A row of `indices_actual` passes when its
// entries are distinct, its number of selections equals the expected one, and:
//   - without `values`: it selects the same set as `indices_expected`;
//   - with `values` ([b, n], any float dtype, the scores the selection was made from): its indices
//     lie in the candidate range, every selected value is >= every unselected candidate value (NaN
//     ranking above every number, torch.topk's order), and it differs from the expected set only
//     by swapping equal values (ties are arbitrary).
TopkCompareResult compare_topk_sets(const Tensor& indices_actual, const Tensor& indices_expected,
                                    const std::optional<Tensor>& values = std::nullopt,
                                    const TopkCompareOptions& options = {});

std::ostream& operator<<(std::ostream& os, const TopkCompareResult& r);

// ---- GEMM (the oracle of dsk::gemm) ----

// D = C + A·Bᵀ with fp64 products and sums: a [m, k] and b [n, k], or batched a [g, m, k] and
// b [g, n, k]; any dtype except fp4x2 (dequantize FP4 operands first) and any strides; c, when
// given, has D's shape. Returns f64 [m, n] (or [g, m, n]). Every element is summed in increasing
// k, so the result is the same for any thread count.
Tensor gemm_nt(const Tensor& a, const Tensor& b, const std::optional<Tensor>& c = std::nullopt);

// The values an FP8/FP4 operand stands for: value(r, kk) * sf[r / gran_mn, kk / gran_k], the
// product rounded to f32 (upstream's dequantization). data: e4m3 [.., mn, k] (any strides) or
// fp4x2 [.., mn, k / 2] (K-major: two values per byte along K). sf: f32
// [.., ceil(mn / gran_mn), ceil(k / gran_k)] (any strides), or packed UE8M0 along the last
// dimension: i32 (4 per word, byte j of word q is scale 4q + j) or i16 (2 per word). Returns f32
// [.., mn, k].
Tensor dequantize(const Tensor& data, const Tensor& sf, int gran_mn, int gran_k);

// The indexer's MQA logits in fp64: logits[i, j] = sum_h max(0, kv_sf[j] * sum_d q[i, h, d] *
// kv[j, d]) * weights[i, h] for j in [ks[i], ke[i]), -inf elsewhere. q [S, H, D], kv [Skv, D] in
// any float dtype (e4m3 as its values), kv_sf f32 [Skv], weights [S, H], ks / ke int32 [S].
// Returns f64 [S, Skv].
Tensor mqa_logits(const Tensor& q, const Tensor& kv, const Tensor& kv_sf, const Tensor& weights,
                  const Tensor& ks, const Tensor& ke);

// ---- seeded random tensors ----
//
// Element i (row-major; fp4x2: value 2i and 2i+1 of byte i) depends only on (seed, i): the same
// seed gives the same tensor on every run and with any thread count, and generation is parallel.
// Float data is rounded to bf16 (then stored in the dtype), so references computed from it in
// f32 or f64 see exactly the values the kernels see.

// 64 random bits for (seed, counter): a splitmix64 stream keyed by the seed.
uint64_t random_u64(uint64_t seed, uint64_t counter);

// Normal(mean, std) for float dtypes (f64, f32, f16, bf16, e4m3, e5m2, fp4x2).
Tensor randn(const Shape& shape, DType dtype, uint64_t seed, float mean = 0.0f, float std = 1.0f);
// Uniform in [lo, hi) for the same dtypes (hi itself can appear after the bf16 rounding).
Tensor rand_uniform(const Shape& shape, DType dtype, uint64_t seed, float lo = 0.0f,
                    float hi = 1.0f);
// +-m * 2^e with m uniform in [1, 2), e uniform in [-max_exponent, max_exponent] and either sign,
// for the same dtypes: sums of a few of these round in f32, so an order of summation shows in the
// bits (values of like magnitude, as randn draws them, mostly add exactly).
Tensor rand_wide(const Shape& shape, DType dtype, uint64_t seed, int max_exponent = 20);
// Uniform integers in [lo, hi) for integer dtypes (i8, u8, i16, i32, i64, bool) and f32/f64.
Tensor randint(const Shape& shape, DType dtype, uint64_t seed, int64_t lo, int64_t hi);

// ---- poisoning outputs ----
//
// poison() sets every element of a tensor (or strided view) to a pattern no correct kernel
// writes, so a test can prove that every element was written. The pattern of each dtype is
// dsk::poison_byte (include/dsk/core/dtype.hpp: 0xFF in the float formats, 0x88 in fp4x2, 0x7F in
// integers and bool), the one DSK_POISON_NEW_TENSORS fills new tensors with.

using dsk::poison_byte;
void poison(const Tensor& t);
// Elements whose bytes all equal poison_byte(dtype).
int64_t count_poisoned(const Tensor& t);
inline bool all_written(const Tensor& t) {
  return count_poisoned(t) == 0;
}

}  // namespace dsk::ref

// GoogleTest helpers: fail with the one-line description of the first difference.
//   DSK_EXPECT_ALLCLOSE(out, ref_out, {.abs_tol = 8e-4, .rel_tol = 2.01 / 128, .cos_tol = 5e-6});
#define DSK_EXPECT_ALLCLOSE(actual, expected, ...)                                               \
  do {                                                                                           \
    const ::dsk::ref::AllcloseResult dsk_allclose_ = ::dsk::ref::allclose(                       \
        (actual), (expected)__VA_OPT__(, ::dsk::ref::AllcloseOptions __VA_ARGS__));              \
    EXPECT_TRUE(dsk_allclose_.passed) << #actual " vs " #expected ": " << dsk_allclose_.message; \
  } while (0)

#define DSK_EXPECT_TOPK_SETS(actual, expected, ...)                                      \
  do {                                                                                   \
    const ::dsk::ref::TopkCompareResult dsk_topk_ =                                      \
        ::dsk::ref::compare_topk_sets((actual), (expected)__VA_OPT__(, ) __VA_ARGS__);   \
    EXPECT_TRUE(dsk_topk_.passed) << #actual " vs " #expected ": " << dsk_topk_.message; \
  } while (0)

// ================================================================================================
// ---- tk (the oracle of dsk::tk) ----
//
// Plain loops in fp64 with the same contracts as the dsk::tk functions of the same name
// (include/dsk/tk.hpp): the same tie rule for routing, the quantisation rules of
// dsk/kernels/quant.hpp, fp64 scores, sums, norms and rotations. Scale factors come back as f32
// [rows, blocks] (never packed, whatever layout the kernel produces); float results as f64.
#include <dsk/tk.hpp>

namespace dsk::ref::tk {

using dsk::tk::BlockSize;
using dsk::tk::FusedMapping;
using dsk::tk::GateResult;
using dsk::tk::NormalizedWeights;
using dsk::tk::QuantTensor;

// ---- routing ----
Tensor topk_gate(const Tensor& scores, int num_topk);
Tensor topk_sum_and_topk_group_idx(const Tensor& scores, int num_topk_sum, int num_topk_groups);
// The unbiased scores s of every expert (f64 [num_tokens, num_experts]) for a scoring function
// ("sigmoid", "sqrtsoftplus", "softmax"): what the gates select from, before the bias.
Tensor gate_scores(const Tensor& logits, std::string_view scoring_func);
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
GateResult noaux_tc_gate(const Tensor& logits, const std::optional<Tensor>& e_score_correction_bias,
                         int num_topk, int n_group, int topk_group,
                         float routed_scaling_factor = 1.0f,
                         std::string_view scoring_func = "sigmoid", bool norm_topk_prob = true);
Tensor group_count(const Tensor& group_idx, int num_groups);
NormalizedWeights normalize_weight(const Tensor& topk_weights);
Tensor mask_indices_by_tp(const Tensor& indices, int64_t n, int num_ep_ranks, int tp_rank,
                          int num_tp_ranks);

// ---- mapping ----
FusedMapping get_fused_mapping(const Tensor& topk_idx, int num_experts, int alignment);
Tensor expand_to_fused(const Tensor& x, const Tensor& token_topk_to_pos,
                       const Tensor& pos_to_expert);
// f64 [num_tokens, hidden]: sum over slots of x[p] * weight (* x_sf[p]), times sf when given.
Tensor reduce_fused(const Tensor& x, const std::optional<Tensor>& topk_weights,
                    const Tensor& token_topk_to_pos,
                    const std::optional<Tensor>& x_sf = std::nullopt,
                    std::optional<float> sf = std::nullopt);

// ---- quantisation (data as dsk::tk produces it, scales f32 [rows, blocks]) ----
QuantTensor per_token_cast(const Tensor& x, std::string_view fmt, int num_per_channels,
                           bool round_sf = false);
QuantTensor per_block_cast(const Tensor& x, std::string_view fmt, BlockSize block_size,
                           bool round_sf = false);
QuantTensor per_channel_cast(const Tensor& x, std::string_view fmt, int num_per_tokens = 128,
                             bool round_sf = false);
// f32 [rows, cols]: value(code) * sf of its block (x.sf f32 [row blocks, col blocks] or packed).
Tensor cast_back(const QuantTensor& x, BlockSize block_size);
// f64 [rows, hidden] (the SwiGLU of dsk::tk::swiglu_forward, zero rows included).
Tensor swiglu_forward(const Tensor& x, const std::optional<Tensor>& pos_to_expert = std::nullopt,
                      std::optional<float> swiglu_clamp_value = std::nullopt,
                      const std::optional<Tensor>& pos_to_token_topk = std::nullopt,
                      const std::optional<Tensor>& topk_weights = std::nullopt);
// Scale factors of a tk cast in any layout (f32 row- or col-major, packed int32), as f32
// [rows, blocks]: what to compare against the references above.
Tensor unpack_scales(const Tensor& sf, int64_t rows, int64_t blocks);

// ---- norms and positions (f64 results) ----
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                  double eps = 1e-6);
// DeepSeek's frequencies, written from inference/model.py (precompute_freqs_cis) in fp64.
std::vector<double> rope_frequencies(const dsk::tk::RopeConfig& config = {});
// The rotated copy of x ([tokens, heads, rot_dim] or [batch, seqlen, heads, rot_dim]) as f64.
Tensor apply_rotary(const Tensor& x, const Tensor& cos_sin_cache,
                    const std::optional<Tensor>& positions = std::nullopt, bool interleaved = false,
                    bool conjugate = false, int64_t seqlen_offset = 0);
// scale * H x with H[i][j] = (-1)^popcount(i & j) (Sylvester order), f64.
Tensor hadamard_transform(const Tensor& x, double scale = 1.0);

}  // namespace dsk::ref::tk

// ================================================================================================
// ---- select (the oracle of dsk::select) ----
//
// A stable sort of each row's candidates: larger value first, NaN above every number, equal values
// in increasing position; the first k are the selection, in that order (rows with fewer than k
// candidates are padded). The same contract as dsk::select::topk (include/dsk/select.hpp) up to
// the order of the output and the choice among equal values.
#include <dsk/select.hpp>

namespace dsk::ref::select {

using dsk::select::TopkResult;

// Indices int32 [b, k] (positions + offset, or fill), values f64 [b, k] (-inf for fills).
TopkResult topk(const Tensor& x, int64_t k, const std::optional<Tensor>& ends = std::nullopt,
                const std::optional<Tensor>& starts = std::nullopt,
                const std::optional<Tensor>& output_idx_offset = std::nullopt,
                int32_t idx_oob_fill_value = -1);

// Each selected position j of row i as the slot page_table[i, j / p] * p + j % p; fills -1.
Tensor topk_page_table_transform(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                                 const Tensor& page_table, int64_t page_block_size,
                                 const std::optional<Tensor>& starts = std::nullopt);

}  // namespace dsk::ref::select

// ================================================================================================
// ---- mla (the oracle of dsk::mla) ----
//
// FlashMLA's tests/ref.py as fp64 loops (spec/attention.md §4.1-§4.3): scores scale * q . k over
// all d_qk dims, softmax over the valid keys, out = softmax(P) . V with V the first d_v dims of
// each key, and no bf16 rounding of P (the kernels round P to bf16; the test tolerances cover
// it). A row with no valid key gives out 0, lse +inf, max_logits -inf. attn_sink[h] scales out by
// 1 / (1 + exp(sink - lse)) and leaves lse alone (+inf: out 0, -inf: no effect). Results come
// back as f32 in the kernels' shapes; inputs may be any float dtype and any strides.
#include <dsk/mla.hpp>

namespace dsk::ref::mla {

using dsk::mla::KvcacheResult;
using dsk::mla::SparseFwdResult;

// flash_mla_sparse_fwd: q [s_q, h_q, d_qk], kv [s_kv, 1, d_qk], indices int32 [s_q, 1, topk];
// entry j of row i is invalid when idx < 0, idx >= s_kv or j >= topk_length[i] (int32 [s_q]).
// attn_sink: [h_q]. Returns out f32 [s_q, h_q, d_v], max_logits and lse f32 [s_q, h_q].
SparseFwdResult sparse_fwd(const Tensor& q, const Tensor& kv, const Tensor& indices,
                           double sm_scale, int64_t d_v = 512,
                           const std::optional<Tensor>& attn_sink = std::nullopt,
                           const std::optional<Tensor>& topk_length = std::nullopt);

// The bf16 [..., 576] values of 656-byte tokens (u8 / i8 / e4m3 [..., 656], any strides):
// upstream's dequantize_k_cache, e4m3 value times f32 scale in f32, stored as bf16; RoPE as stored.
Tensor dequantize_kv_tokens(const Tensor& tokens);

// Sparse FP8 decode: q [b, s_q, h_q, 576]; k_cache u8 / i8 / e4m3 [num_blocks, page, 1, 656]
// (tokens dequantized as dequantize_kv_tokens does); indices int32 [b, s_q, topk] of global slots,
// -1 invalid, and with topk_length (int32 [b]) entries j >= topk_length[i] invalid too; any other
// slot outside the cache raises dsk::Error. NaN values of a gathered token become 0 (upstream
// zeroes them after its gather). Returns out f32 [b, s_q, h_q, d_v] and lse f32 [b, h_q, s_q].
KvcacheResult sparse_decode(const Tensor& q, const Tensor& k_cache, const Tensor& indices,
                            double sm_scale, int64_t d_v = 512,
                            const std::optional<Tensor>& attn_sink = std::nullopt,
                            const std::optional<Tensor>& topk_length = std::nullopt);

// Dense decode over a paged cache: q [b, s_q, h_q, d_qk], k_cache [num_blocks, page, h_kv, d_qk],
// block_table int32 [b, max_blocks], cache_seqlens int32 [b]. Key s of request i is
// k_cache[block_table[i, s / page], s % page]; query head h reads kv head h / (h_q / h_kv); with
// causal, query t sees keys s < s_k - s_q + t + 1 (bottom-right). Block ids outside the cache or a
// table too short for cache_seqlens raise dsk::Error. attn_sink: [h_q], the rule above. Returns
// out f32 [b, s_q, h_q, d_v] and lse f32 [b, h_q, s_q].
KvcacheResult dense_decode(const Tensor& q, const Tensor& k_cache, const Tensor& block_table,
                           const Tensor& cache_seqlens, double sm_scale, int64_t d_v = 512,
                           bool causal = false,
                           const std::optional<Tensor>& attn_sink = std::nullopt);

}  // namespace dsk::ref::mla

// ================================================================================================
// ---- model (the oracle of dsk::model::Model) ----
//
// The DeepSeek-V3.2 forward of the upstream demo (inference/model.py with the 2025-11-17 fix,
// spec/attention.md §5.3 and §5.5) as plain loops, no dsk kernels: FP8 weights dequantized to f32
// once, every FP8 linear as act_quant (1 x 128 UE8M0 blocks) then an fp64-summed product rounded
// to bf16, bf16 activations wherever the demo stores them, MLA in the absorbed form for prefill
// and decode (q_nope . W_UK, softmax over the indexer's top-k, W_UV . o_lat; P not rounded unless
// asked), the latent cache through the 656-byte token's FP8 round trip, the indexer on FP8 codes
// with non-interleaved RoPE and an fp32 weights_proj, and the noaux_tc gate of dsk::ref::tk. A
// sequence's cache is plain per-layer vectors; memory is 4 bytes per parameter (sized for
// v32-tiny or a few real layers, not the whole 671B model).
#include <memory>
#include <span>
#include <vector>

#include <dsk/model.hpp>

namespace dsk::ref::model {

class Reference {
 public:
  struct Options {
    // Rounds the attention probabilities exp(logit - max) to bf16 before P . V, the row sum taken
    // from the unrounded values, as FlashMLA does; off, the softmax stays fp64 (the model's
    // definition).
    bool round_p_to_bf16 = false;
  };

  // Dequantizes every weight of `weights` (dsk::Error naming a missing tensor).
  explicit Reference(const dsk::model::Weights& weights);
  Reference(const dsk::model::Weights& weights, Options options);
  ~Reference();
  Reference(Reference&&) noexcept;
  Reference& operator=(Reference&&) noexcept;

  const dsk::model::Config& config() const;
  // A new, empty sequence.
  int64_t add_sequence();
  int64_t sequence_length(int64_t seq) const;

  // Appends `tokens` to sequence `seq` at positions [length, length + tokens.size()) (prefill:
  // many, decode: one) and returns the f32 [vocab_size] logits of the last one. Token t attends
  // to the top-k of positions [0, its position]. Raises dsk::Error, changing nothing, for an
  // unknown seq, no tokens, a token id outside [0, vocab_size) or a sequence that would exceed
  // config().rope.max_seq_len.
  Tensor forward(int64_t seq, std::span<const int32_t> tokens);

  // How the reference judged decisions it was asked to replay: a decision (one token's expert
  // set, or its indexer top-k set, in one layer) that differs from the reference's own is within
  // tolerance when every swapped pair is a near-tie: indexer scores within 10% of the row's largest
  // |score|, biased expert scores (or their groups' top-2 sums) within 0.05. (Past the first layer
  // the runs differ by FP8 code flips; on v32-tiny the indexer scores of swapped pairs then differ
  // by up to ~7% of the largest. Layer 0, with identical inputs, decides identically.)
  struct DecisionCheck {
    int64_t compared = 0;
    int64_t differing = 0;
    int64_t beyond_tolerance = 0;
    int64_t first_layer_compared = 0;   // layer 0 alone: the same inputs on both sides, so
    int64_t first_layer_differing = 0;  // every set should be the same
  };
  // The same, replaying the model's decisions (Model::last_decisions() of a forward over exactly
  // these tokens): the reference takes those expert and key sets instead of its own and counts in
  // `check` how they compare with its own choices.
  Tensor forward(int64_t seq, std::span<const int32_t> tokens,
                 const std::vector<dsk::model::LayerDecisions>& replay, DecisionCheck& check);

  // The positions (ascending) the indexer of `layer` selected for the last token of seq's latest
  // forward: all of [0, position] when that is at most index_topk positions, else index_topk of
  // them.
  std::vector<int64_t> last_selection(int64_t seq, int layer) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Issue 8's cross-check of the kernel forward: prefills `prompt` into a new sequence of `model` and
// of `reference`, then runs `steps` greedy decode steps, each feeding both the argmax of the
// model's logits. diffs: calc_diff of the two last-position logits at every step (the prefill
// first: steps + 1 values). With replay_decisions the reference replays the model's expert and
// top-k choices (see DecisionCheck), so that a near-tie decided the other way — which two
// implementations that are not bit-identical cannot avoid — does not send the two runs apart;
// the decisions themselves are then judged as sets. The model's sequence is freed at the end.
struct CrossCheck {
  std::vector<double> diffs;
  Reference::DecisionCheck decisions;
  double max_diff() const;
};
CrossCheck cross_check(dsk::model::Model& model, Reference& reference,
                       std::span<const int32_t> prompt, int steps, bool replay_decisions = true);

}  // namespace dsk::ref::model

// ================================================================================================
// ---- ep (the oracle of dsk::ep) ----
//
// Upstream's refs.py, each field moved by one plain Communicator::alltoallv; collective, so every
// rank of the group calls it in the same order.
// dispatch: each token goes to every rank d that one of its top-k slots selects (d = expert /
// (E / R); -1 selects nothing), once; rank d receives the tokens ordered by source rank, then by
// source token. A received slot keeps its expert as a local id (expert - d * E / R) where it lives
// on d, else -1 and weight 0.
// combine: the inverse. Each received row goes back to its token's rank, which sums per token in
// f32, from 0 or from the biases (in order), each rank's row in the order of that rank's last
// top-k slot, rounded once to bf16; the top-k weights come back summed per slot over the ranks
// (the dispatched weight where the slot was routed, else 0).
#include <dsk/ep.hpp>

namespace dsk::ref::ep {

struct Dispatch {
  Tensor x;                              // [N, H] in x's dtype (bf16, or e4m3 with x_sf)
  std::optional<Tensor> x_sf;            // f32 [N, H / 128]
  Tensor topk_idx;                       // i64 [N, K]: local expert ids or -1
  std::optional<Tensor> topk_weights;    // f32 [N, K]: 0 where the slot is not local
  Tensor src_idx;                        // i32 [N]: the token's index on its own rank
  std::vector<int64_t> rows_per_rank;    // rows from each source rank
  std::vector<int64_t> rows_per_expert;  // rows that select each local expert
};

// x [T, H] bf16 or e4m3 (then x_sf f32 [T, H / 128]), topk_idx i32 / i64 [T, K], topk_weights
// f32 [T, K]; num_experts a multiple of the group's size.
Dispatch dispatch(const dsk::ep::Communicator& comm, const Tensor& x,
                  const std::optional<Tensor>& x_sf, const Tensor& topk_idx,
                  const std::optional<Tensor>& topk_weights, int num_experts);

struct Combine {
  Tensor x;                            // bf16 [T, H]
  std::optional<Tensor> topk_weights;  // f32 [T, K] when the dispatch carried weights
};

// y bf16 [N, H]: one row per row of `dispatched` (the experts' outputs, in its order);
// topk_idx this rank's [T, K] of that dispatch; bias 0, 1 or 2 bf16 [T, H].
Combine combine(const dsk::ep::Communicator& comm, const Tensor& y, const Dispatch& dispatched,
                const Tensor& topk_idx, const std::vector<Tensor>& bias, int num_experts);

// low_latency_dispatch: one row per (token, top-k slot) whose expert is not -1, to the expert's
// rank, where expert e's rows (local id e - rank * E / R) fill the masked layout
// [E_local, R * Tmax, H] by source rank, then by token; rows past the count are 0.
struct LowLatencyDispatch {
  Tensor x;                    // [E_local, R * Tmax, H] in x's dtype
  std::optional<Tensor> x_sf;  // f32 [E_local, R * Tmax, H / 128] when x_sf was given
  Tensor count;                // i32 [E_local]
  Tensor src_info;             // i32 [E_local, R * Tmax]: each row's token on its rank, else -1
  Tensor layout_range;         // i64 [E_local, R]: (first row << 32) | rows from source rank s
};

// x [T, H] bf16, or e4m3 with x_sf f32 [T, H / 128] (the sender's cast); T <= Tmax on every rank.
LowLatencyDispatch low_latency_dispatch(const dsk::ep::Communicator& comm, const Tensor& x,
                                        const std::optional<Tensor>& x_sf, const Tensor& topk_idx,
                                        int64_t num_max_dispatch_tokens_per_rank, int num_experts);

// y bf16 [E_local, R * Tmax, H]: the experts' outputs in that layout. Each valid row goes back to
// its token, whose result is bf16 of the sum from 0, over its slots in top-k order whose expert
// is not -1, of f32(topk_weights[t][k]) * f32(row), each product rounded (no FMA).
Tensor low_latency_combine(const dsk::ep::Communicator& comm, const Tensor& y,
                           const LowLatencyDispatch& dispatched, const Tensor& topk_idx,
                           const Tensor& topk_weights, int num_experts);

}  // namespace dsk::ref::ep
