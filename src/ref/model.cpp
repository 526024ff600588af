// dsk::ref::model::Reference: the weights dequantized once, the layer loop (pre-norms and
// residuals), the FFN half (dense MLP or noaux_tc-routed experts plus the shared expert), the
// final norm and the f32 head (spec/attention.md §5.3 steps 1, 6-8).
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>

#include "model_impl.hpp"

namespace dsk::ref::model {
namespace {

using detail::Matrix;
using detail::MlpWeights;

constexpr const char* kForward = "dsk::ref::model::Reference::forward";

// ---- weights ----

// A linear weight NAME ("....weight") as f32, with NAME_scale_inv when it is FP8.
Matrix linear(const dsk::model::Weights& weights, const std::string& name) {
  const std::string scale_name = name + "_scale_inv";
  const Tensor* scale = weights.contains(scale_name) ? &weights.get(scale_name) : nullptr;
  return detail::dequantize_weight(weights.get(name), scale);
}

MlpWeights mlp(const dsk::model::Weights& weights, const std::string& prefix) {
  return {linear(weights, prefix + "gate_proj.weight"),
          linear(weights, prefix + "down_proj.weight"), linear(weights, prefix + "up_proj.weight")};
}

// W_UK and W_UV from kv_b_proj ([heads * (nope + v), lora]: per head nope rows of W_UK, then v
// rows of W_UV), dequantized and rounded to bf16 as the demo's weight_dequant stores them.
void absorbed_weights(const dsk::model::Config& config, Matrix kv_b, detail::LayerWeights& w) {
  detail::round_to_bf16(kv_b);
  const int64_t nope = config.qk_nope_head_dim, v = config.v_head_dim, lora = config.kv_lora_rank;
  for (int64_t h = 0; h < config.n_heads; ++h) {
    const float* head = kv_b.row(h * (nope + v));
    w.w_uk.insert(w.w_uk.end(), head, head + nope * lora);
    w.w_uv.insert(w.w_uv.end(), head + nope * lora, head + (nope + v) * lora);
  }
}

detail::LayerWeights layer_weights(const dsk::model::Weights& weights, int layer) {
  const dsk::model::Config& config = weights.config();
  const std::string p = fmt::format("model.layers.{}.", layer);
  const std::string attn = p + "self_attn.", idx = attn + "indexer.";
  detail::LayerWeights w;
  w.attn_norm = detail::values_f32(weights.get(p + "input_layernorm.weight"));
  w.ffn_norm = detail::values_f32(weights.get(p + "post_attention_layernorm.weight"));
  w.wq_a = linear(weights, attn + "q_a_proj.weight");
  w.q_norm = detail::values_f32(weights.get(attn + "q_a_layernorm.weight"));
  w.wq_b = linear(weights, attn + "q_b_proj.weight");
  w.wkv_a = linear(weights, attn + "kv_a_proj_with_mqa.weight");
  w.kv_norm = detail::values_f32(weights.get(attn + "kv_a_layernorm.weight"));
  absorbed_weights(config, linear(weights, attn + "kv_b_proj.weight"), w);
  w.wo = linear(weights, attn + "o_proj.weight");
  w.index_wq_b = linear(weights, idx + "wq_b.weight");
  w.index_wk = linear(weights, idx + "wk.weight");
  w.index_k_norm_weight = detail::values_f32(weights.get(idx + "k_norm.weight"));
  w.index_k_norm_bias = detail::values_f32(weights.get(idx + "k_norm.bias"));
  w.index_weights_proj = linear(weights, idx + "weights_proj.weight");
  if (!config.is_moe_layer(layer)) {
    w.mlp = mlp(weights, p + "mlp.");
    return w;
  }
  w.gate = linear(weights, p + "mlp.gate.weight");
  const std::vector<float> bias =
      detail::values_f32(weights.get(p + "mlp.gate.e_score_correction_bias"));
  w.gate_bias = Tensor::empty({static_cast<int64_t>(bias.size())}, DType::f32);
  std::copy(bias.begin(), bias.end(), w.gate_bias.data<float>());
  w.experts.resize(static_cast<size_t>(config.n_routed_experts));
  // One expert per task: dequantization is serial per tensor and the experts are most weights.
  parallel_for(config.n_routed_experts, [&](int64_t e0, int64_t e1, int) {
    for (int64_t e = e0; e < e1; ++e)
      w.experts[e] = mlp(weights, fmt::format("{}mlp.experts.{}.", p, e));
  });
  w.shared = mlp(weights, p + "mlp.shared_experts.");
  return w;
}

// ---- FFN ----

// w2(bf16(silu(w1 x) * w3 x * weight)): the SiLU and the product in f32 as the demo computes
// them; a routed expert's row is scaled by its routing weight before the down projection (the
// kernels' order, DeepEP's and TileKernels': the combine then only sums).
Matrix run_mlp(const MlpWeights& w, const Matrix& x,
               const std::vector<float>* row_weights = nullptr) {
  const Matrix a = detail::fp8_linear(x, w.w1), b = detail::fp8_linear(x, w.w3);
  Matrix g(a.rows, a.cols);
  for (size_t i = 0; i < g.values.size(); ++i) {
    const double ai = a.values[i];
    const auto silu = static_cast<float>(ai / (1.0 + std::exp(-ai)));
    g.values[i] = silu * b.values[i];
    if (row_weights) g.values[i] *= (*row_weights)[i / static_cast<size_t>(g.cols)];
  }
  detail::round_to_bf16(g);
  return detail::fp8_linear(g, w.w2);
}

Matrix gather_rows(const Matrix& x, const std::vector<int64_t>& rows) {
  Matrix out(static_cast<int64_t>(rows.size()), x.cols);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(x.row(rows[i]), x.row(rows[i]) + x.cols, out.row(static_cast<int64_t>(i)));
  return out;
}

}  // namespace

// Replaces the gate's choice with the model's (replayed), judging each token's expert set: a
// swapped pair is a near-tie when the biased scores, or the top-2 sums of their groups, differ by
// at most 0.05. The weights follow the gate rule on the replayed set.
void Reference::Impl::replay_experts(int layer, const Tensor& logits, const Tensor& bias,
                                     dsk::tk::GateResult& gate) const {
  const Tensor& forced = (*replay)[static_cast<size_t>(layer)].experts;
  const Tensor scores = dsk::ref::tk::gate_scores(logits, config.score_func);
  const int64_t experts = logits.size(1), k = gate.topk_idx.size(1);
  const int64_t group_size = experts / config.n_expert_groups;
  for (int64_t t = 0; t < logits.size(0); ++t) {
    std::vector<double> biased(static_cast<size_t>(experts)), group(config.n_expert_groups);
    for (int64_t e = 0; e < experts; ++e)
      biased[e] = scores.at<double>({t, e}) + bias.data<float>()[e];
    for (int g = 0; g < config.n_expert_groups; ++g) {
      std::vector<double> v(biased.begin() + g * group_size, biased.begin() + (g + 1) * group_size);
      std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
      group[g] = v[0] + v[1];
    }
    std::vector<int64_t> own, chosen;
    for (int64_t j = 0; j < k; ++j) {
      own.push_back(gate.topk_idx.at<int64_t>({t, j}));
      chosen.push_back(forced.at<int64_t>({t, j}));
    }
    judge(layer, own, chosen, [&](int64_t a, int64_t b) {
      return std::abs(biased[a] - biased[b]) <= 0.05 ||
             std::abs(group[a / group_size] - group[b / group_size]) <= 0.05;
    });
    double sum = 1e-20;
    for (int64_t e : chosen) sum += scores.at<double>({t, e});
    for (int64_t j = 0; j < k; ++j) {
      gate.topk_idx.at<int64_t>({t, j}) = chosen[j];
      gate.topk_weights.at<float>({t, j}) =
          static_cast<float>(scores.at<double>({t, chosen[j]}) / sum * config.route_scale);
    }
  }
}

Matrix Reference::Impl::ffn(int layer, const Matrix& x_n) const {
  const detail::LayerWeights& w = layers[layer];
  if (!config.is_moe_layer(layer)) return run_mlp(w.mlp, x_n);

  // The gate on f32 logits x_n . Wg^T (dsk::ref::tk's noaux_tc reference).
  const Matrix logits = detail::matmul_nt(x_n, w.gate);
  Tensor logits_tensor = Tensor::empty({logits.rows, logits.cols}, DType::f32);
  std::copy(logits.values.begin(), logits.values.end(), logits_tensor.data<float>());
  dsk::tk::GateResult gate = dsk::ref::tk::noaux_tc_gate(
      logits_tensor, w.gate_bias, config.n_activated_experts, config.n_expert_groups,
      config.n_limited_groups, static_cast<float>(config.route_scale), config.score_func);
  const int64_t slots = gate.topk_idx.size(1);
  if (replay) replay_experts(layer, logits_tensor, w.gate_bias, gate);

  // Each expert on its tokens, one expert per task (its linears then run serially).
  struct Routed {
    std::vector<int64_t> rows;
    std::vector<float> weight;
    Matrix out;
  };
  std::vector<Routed> routed(static_cast<size_t>(config.n_routed_experts));
  for (int64_t t = 0; t < x_n.rows; ++t)
    for (int64_t j = 0; j < slots; ++j) {
      Routed& r = routed[gate.topk_idx.at<int64_t>({t, j})];
      r.rows.push_back(t);
      r.weight.push_back(gate.topk_weights.at<float>({t, j}));
    }
  parallel_for(config.n_routed_experts, [&](int64_t e0, int64_t e1, int) {
    for (int64_t e = e0; e < e1; ++e)
      if (!routed[e].rows.empty())
        routed[e].out = run_mlp(w.experts[e], gather_rows(x_n, routed[e].rows), &routed[e].weight);
  });
  // The shared expert's output, plus each slot's weighted expert output in top-k slot order (bf16
  // outputs, f32 sums), rounded once: ep::Buffer::combine's single reduction.
  std::vector<size_t> next(routed.size(), 0);  // each expert's next row, in token order
  Matrix out = run_mlp(w.shared, x_n);
  for (int64_t t = 0; t < x_n.rows; ++t)
    for (int64_t j = 0; j < slots; ++j) {
      const int64_t e = gate.topk_idx.at<int64_t>({t, j});
      const float* row = routed[e].out.row(static_cast<int64_t>(next[e]++));
      for (int64_t c = 0; c < out.cols; ++c) out.row(t)[c] += row[c];
    }
  detail::round_to_bf16(out);
  return out;
}

Reference::Reference(const dsk::model::Weights& weights) : Reference(weights, Options{}) {}

Reference::Reference(const dsk::model::Weights& weights, Options options)
    : impl_(std::make_unique<Impl>()) {
  constexpr const char* fn = "dsk::ref::model::Reference";
  Impl& m = *impl_;
  m.options = options;
  m.config = weights.config();
  m.config.validate();
  DSK_CHECK_ARG(m.config.rope.rot_dim == m.config.qk_rope_head_dim, fn, "weights.config().rope",
                fmt::format("rot_dim == qk_rope_head_dim ({})", m.config.qk_rope_head_dim),
                m.config.rope.rot_dim);
  m.embed = detail::values_f32(weights.get("model.embed_tokens.weight"));
  m.final_norm = detail::values_f32(weights.get("model.norm.weight"));
  m.head = linear(weights, "lm_head.weight");
  for (int layer = 0; layer < m.config.n_layers; ++layer)
    m.layers.push_back(layer_weights(weights, layer));
  m.cos_sin = dsk::tk::yarn_cos_sin_cache(m.config.rope);
}

Reference::~Reference() = default;
Reference::Reference(Reference&&) noexcept = default;
Reference& Reference::operator=(Reference&&) noexcept = default;

const dsk::model::Config& Reference::config() const {
  return impl_->config;
}

int64_t Reference::add_sequence() {
  detail::Sequence seq;
  seq.layers.resize(static_cast<size_t>(impl_->config.n_layers));
  impl_->sequences.push_back(std::move(seq));
  return static_cast<int64_t>(impl_->sequences.size()) - 1;
}

int64_t Reference::sequence_length(int64_t seq) const {
  check::in_range("dsk::ref::model::Reference::sequence_length", "seq", seq, 0,
                  static_cast<int64_t>(impl_->sequences.size()) - 1);
  return impl_->sequences[seq].length;
}

std::vector<int64_t> Reference::last_selection(int64_t seq, int layer) const {
  constexpr const char* fn = "dsk::ref::model::Reference::last_selection";
  check::in_range(fn, "seq", seq, 0, static_cast<int64_t>(impl_->sequences.size()) - 1);
  check::in_range(fn, "layer", layer, 0, impl_->config.n_layers - 1);
  return impl_->sequences[seq].layers[layer].last_selection;
}

Tensor Reference::forward(int64_t seq, std::span<const int32_t> tokens,
                          const std::vector<dsk::model::LayerDecisions>& replay,
                          DecisionCheck& check) {
  DSK_CHECK_ARG(static_cast<int64_t>(replay.size()) == impl_->config.n_layers, kForward, "replay",
                "one entry per layer", replay.size());
  for (int l = 0; l < impl_->config.n_layers; ++l) {
    const dsk::model::LayerDecisions& d = replay[static_cast<size_t>(l)];
    DSK_CHECK_ARG(
        d.positions.defined() && d.positions.size(0) == static_cast<int64_t>(tokens.size()),
        kForward, "replay.positions", "one row per token", l);
    DSK_CHECK_ARG(
        !impl_->config.is_moe_layer(l) ||
            (d.experts.defined() && d.experts.size(0) == static_cast<int64_t>(tokens.size())),
        kForward, "replay.experts", "one row per token in MoE layers", l);
  }
  impl_->replay = &replay;
  impl_->check = &check;
  struct Reset {
    Impl& m;
    ~Reset() {
      m.replay = nullptr;
      m.check = nullptr;
    }
  } reset{*impl_};
  return forward(seq, tokens);
}

Tensor Reference::forward(int64_t seq, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  const dsk::model::Config& config = m.config;
  check::in_range(kForward, "seq", seq, 0, static_cast<int64_t>(m.sequences.size()) - 1);
  const auto n = static_cast<int64_t>(tokens.size());
  DSK_CHECK_ARG(n > 0, kForward, "tokens", "at least one token", "none");
  for (int64_t t = 0; t < n; ++t)
    DSK_CHECK_ARG(tokens[t] >= 0 && tokens[t] < config.vocab_size, kForward, "tokens",
                  fmt::format("token ids in [0, {})", config.vocab_size),
                  fmt::format("{} at index {}", tokens[t], t));
  detail::Sequence& s = m.sequences[seq];
  DSK_CHECK_ARG(
      s.length + n <= config.rope.max_seq_len, kForward, "tokens",
      fmt::format("at most {} positions in all (rope.max_seq_len)", config.rope.max_seq_len),
      fmt::format("{} new tokens after {} cached", n, s.length));

  const int64_t dim = config.dim;
  Matrix h(n, dim);
  for (int64_t t = 0; t < n; ++t) std::copy_n(m.embed.data() + tokens[t] * dim, dim, h.row(t));
  // Each layer: res = h (layer 0) or bf16(h + res); x_n = RMSNorm(the f32 sum); the attention
  // half; res = bf16(attn + res); x_n = RMSNorm(the f32 sum); h = FFN(x_n).
  Matrix res;
  for (int layer = 0; layer < config.n_layers; ++layer) {
    const detail::LayerWeights& w = m.layers[layer];
    Matrix sum = layer == 0 ? h : detail::add(h, res);
    res = sum;
    detail::round_to_bf16(res);
    const Matrix attn =
        m.attention(layer, s, s.length, detail::rms_norm(sum, w.attn_norm, config.rms_norm_eps));
    sum = detail::add(attn, res);
    res = sum;
    detail::round_to_bf16(res);
    h = m.ffn(layer, detail::rms_norm(sum, w.ffn_norm, config.rms_norm_eps));
  }
  s.length += n;

  // The final norm of the last token's h + res only, then the f32 head.
  Matrix last(1, dim);
  for (int64_t c = 0; c < dim; ++c) last.row(0)[c] = h.row(n - 1)[c] + res.row(n - 1)[c];
  const Matrix logits =
      detail::matmul_nt(detail::rms_norm(last, m.final_norm, config.rms_norm_eps), m.head);
  Tensor out = Tensor::empty({config.vocab_size}, DType::f32);
  std::copy(logits.values.begin(), logits.values.end(), out.data<float>());
  return out;
}

double CrossCheck::max_diff() const {
  return diffs.empty() ? 0.0 : *std::max_element(diffs.begin(), diffs.end());
}

CrossCheck cross_check(dsk::model::Model& model, Reference& reference,
                       std::span<const int32_t> prompt, int steps, bool replay_decisions) {
  constexpr const char* fn = "dsk::ref::model::cross_check";
  DSK_CHECK_ARG(steps >= 0, fn, "steps", "a number >= 0", steps);
  DSK_CHECK_ARG(model.config().vocab_size == reference.config().vocab_size, fn, "reference",
                fmt::format("the model's vocab_size {}", model.config().vocab_size),
                reference.config().vocab_size);
  const int64_t seq = model.add_sequence(), ref_seq = reference.add_sequence();
  model.set_record_decisions(replay_decisions);
  CrossCheck result;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  for (int step = 0; step <= steps; ++step) {
    const dsk::model::StepItem item{seq, tokens};
    const Tensor got = model.forward({&item, 1}).select(0, 0).contiguous();
    const Tensor want =
        replay_decisions
            ? reference.forward(ref_seq, tokens, model.last_decisions(), result.decisions)
            : reference.forward(ref_seq, tokens);
    result.diffs.push_back(calc_diff(got, want));
    const float* logits = got.data<float>();
    tokens = {static_cast<int32_t>(std::max_element(logits, logits + got.numel()) - logits)};
  }
  model.set_record_decisions(false);
  model.free_sequence(seq);
  return result;
}

}  // namespace dsk::ref::model
