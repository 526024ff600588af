// The state of dsk::ref::model::Reference: the dequantized weights of each layer and each
// sequence's cache, shared by model.cpp (weights, forward, FFN) and model_attention.cpp (MLA and
// the indexer). Private to src/ref.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include <dsk/ref.hpp>

#include "model_ops.hpp"

namespace dsk::ref::model {

namespace detail {

struct MlpWeights {
  Matrix w1, w2, w3;  // gate_proj, down_proj, up_proj
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // input_layernorm, post_attention_layernorm
  // MLA
  Matrix wq_a, wq_b, wkv_a, wo;
  std::vector<float> q_norm, kv_norm;
  std::vector<float> w_uk;  // bf16 values [n_heads, qk_nope_head_dim, kv_lora_rank]
  std::vector<float> w_uv;  // bf16 values [n_heads, v_head_dim, kv_lora_rank]
  // indexer
  Matrix index_wq_b, index_wk, index_weights_proj;  // weights_proj as f32
  std::vector<float> index_k_norm_weight, index_k_norm_bias;
  // FFN: a dense MLP, or the gate, its routed experts and the shared expert
  MlpWeights mlp;
  Matrix gate;       // f32 [n_routed_experts, dim]
  Tensor gate_bias;  // f32 [n_routed_experts]: e_score_correction_bias
  std::vector<MlpWeights> experts;
  MlpWeights shared;
};

// One layer's cache of one sequence, one entry per cached position.
struct LayerCache {
  std::vector<float> latent;       // [len, kv_lora_rank]: c after RMSNorm and the FP8 round trip
  std::vector<float> rope;         // [len, qk_rope_head_dim]: k_pe after RoPE (bf16 values)
  std::vector<float> index_codes;  // [len, index_head_dim]: e4m3 code values of the indexer key
  std::vector<float> index_scale;  // [len]: the key's UE8M0 scale
  std::vector<int64_t> last_selection;  // the latest forward's last token's top-k
};

struct Sequence {
  int64_t length = 0;
  std::vector<LayerCache> layers;
};

// The top-k positions of each new token: selections[t] for the token at position first + t.
using Selections = std::vector<std::vector<int64_t>>;

}  // namespace detail

struct Reference::Impl {
  dsk::model::Config config;
  Options options;
  std::vector<float> embed;       // [vocab_size, dim] (bf16 values)
  std::vector<float> final_norm;  // [dim]
  detail::Matrix head;            // [vocab_size, dim]
  std::vector<detail::LayerWeights> layers;
  Tensor cos_sin;  // f32 [max_seq_len, qk_rope_head_dim] (dsk::tk::yarn_cos_sin_cache)
  std::vector<detail::Sequence> sequences;
  // Set by the replaying forward for its duration: the decisions to take and the tally.
  const std::vector<dsk::model::LayerDecisions>* replay = nullptr;
  mutable Reference::DecisionCheck* check = nullptr;
  mutable std::mutex check_mutex;

  const float* cos_sin_row(int64_t position) const {
    return cos_sin.data<float>() + position * cos_sin.size(1);
  }
  // The attention half of one layer for tokens at positions [first, first + x_n.rows): appends
  // them to the layer's cache of `seq` and returns wo(attention) as bf16 [tokens, dim].
  detail::Matrix attention(int layer, detail::Sequence& seq, int64_t first,
                           const detail::Matrix& x_n) const;
  std::vector<int64_t> replayed_positions(int layer, int64_t t, int64_t visible,
                                          const std::vector<double>& score,
                                          const std::vector<int64_t>& own) const;
  detail::Selections indexer(int layer, detail::LayerCache& cache, int64_t first,
                             const detail::Matrix& x_n, const detail::Matrix& qr) const;
  detail::Matrix ffn(int layer, const detail::Matrix& x_n) const;
  void replay_experts(int layer, const Tensor& logits, const Tensor& bias,
                      dsk::tk::GateResult& gate) const;
  // Counts one replayed decision: `own` and `forced` as sets, near(a, b) says whether an element
  // the reference chose (a) and one it did not (b) are a near-tie.
  template <class Near>
  void judge(int layer, std::vector<int64_t> own, std::vector<int64_t> forced, Near near) const {
    std::sort(own.begin(), own.end());
    std::sort(forced.begin(), forced.end());
    bool differs = own != forced, beyond = false;
    for (int64_t a : own)
      if (!std::binary_search(forced.begin(), forced.end(), a))
        for (int64_t b : forced)
          if (!std::binary_search(own.begin(), own.end(), b)) beyond = beyond || !near(a, b);
    const std::lock_guard<std::mutex> lock(check_mutex);
    ++check->compared;
    check->differing += differs;
    check->beyond_tolerance += beyond;
    if (layer == 0) {
      ++check->first_layer_compared;
      check->first_layer_differing += differs;
    }
  }
};

}  // namespace dsk::ref::model
