// dsk::model::Model: the DeepSeek-V3.2 forward on the library's kernels (spec/attention.md §5.3,
// docs/model.md). Every linear layer is act_quant + FP8 GEMM on weights packed once; attention is
// the absorbed MLA form over the paged FP8 cache with the indexer choosing the keys; the MoE runs
// the routed experts as two grouped GEMMs over tk's fused mapping, or, with expert parallelism,
// over the rows an ep::Buffer dispatch brought from every rank.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/core/timer.hpp>
#include <dsk/ep.hpp>
#include <dsk/gemm.hpp>
#include <dsk/kernels/numeric.hpp>
#include <dsk/mla.hpp>
#include <dsk/model.hpp>
#include <dsk/select.hpp>
#include <dsk/tk.hpp>

#include "model/kv_cache.hpp"

namespace dsk::model {

namespace {

constexpr const char* kFn = "model::Model";
constexpr int kQuantBlock = 128;  // act_quant's block and the weights' scale block

std::string layer_prefix(int layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

// ---- linear layers --------------------------------------------------------------------------

// An FP8 linear weight [N, K] with its 128 x 128 block scales, packed for the GEMM kernels.
struct Linear {
  gemm::PackedWeight w;
  int64_t n = 0;
};

gemm::Fp8Tensor fp8_weight(const Weights& weights, const std::string& name) {
  const std::string base = name.substr(0, name.size() - std::string(".weight").size());
  return {weights.get(name), weights.get(base + ".weight_scale_inv")};
}

Linear pack_linear(const gemm::Fp8Tensor& w) {
  return {gemm::pack_weight(w, gemm::OperandRecipe{kQuantBlock, kQuantBlock}), w.data.size(0)};
}

Linear pack_linear(const Weights& weights, const std::string& name) {
  return pack_linear(fp8_weight(weights, name));
}

// Rows of several FP8 weights stacked into one [sum N, K] weight (w1 and w3 as one GEMM whose
// output is SwiGLU's [gate | up]); every N must be a multiple of the scale block.
gemm::Fp8Tensor stack_rows(const std::vector<gemm::Fp8Tensor>& parts) {
  int64_t n = 0, sf_rows = 0;
  for (const auto& p : parts) {
    n += p.data.size(0);
    sf_rows += p.sf.size(0);
  }
  const int64_t k = parts[0].data.size(1), sf_cols = parts[0].sf.size(1);
  gemm::Fp8Tensor out{Tensor::empty({n, k}, DType::e4m3),
                      Tensor::empty({sf_rows, sf_cols}, DType::f32)};
  int64_t row = 0, sf_row = 0;
  for (const auto& p : parts) {
    out.data.slice(0, row, row + p.data.size(0)).copy_(p.data);
    out.sf.slice(0, sf_row, sf_row + p.sf.size(0)).copy_(p.sf);
    row += p.data.size(0);
    sf_row += p.sf.size(0);
  }
  return out;
}

// act_quant(x) then the FP8 GEMM: bf16 [T, N].
Tensor linear(const Tensor& x, const Linear& l) {
  const auto q = tk::per_token_cast(x, "e4m3", kQuantBlock, false, /*round_sf=*/true);
  Tensor y = Tensor::empty({x.size(0), l.n}, DType::bf16);
  gemm::fp8_gemm_nt(q, l.w, y);
  return y;
}

// A norm's weight as f32 (checkpoints store bf16 or f32).
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t.contiguous();
  Tensor out = Tensor::empty(t.sizes(), DType::f32);
  const Tensor src = t.contiguous();
  convert_bf16_to_f32(src.data<bf16>(), out.data<float>(), static_cast<size_t>(t.numel()));
  return out;
}

// a + b in f32 (the residual stream before it is stored as bf16).
Tensor sum_f32(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.sizes(), DType::f32);
  const bf16* pa = a.data<bf16>();
  const bf16* pb = b.data<bf16>();
  float* po = out.data<float>();
  parallel_for(
      a.numel(),
      [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) po[i] = bf16_to_f32(pa[i]) + bf16_to_f32(pb[i]);
      },
      4096);
  return out;
}

Tensor to_bf16(const Tensor& x) {
  Tensor out = Tensor::empty(x.sizes(), DType::bf16);
  convert_f32_to_bf16(x.data<float>(), out.data<bf16>(), static_cast<size_t>(x.numel()));
  return out;
}

// The demo's RMSNorm(x, residual): the norm of the f32 sum x + residual, and the sum stored
// as the new bf16 residual. Without a residual (layer 0), the norm of x and x itself.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual,
                                       const Tensor& weight, double eps) {
  if (!residual.defined()) return {tk::rms_norm(x, weight, static_cast<float>(eps)), x};
  const Tensor sum = sum_f32(x, residual);
  return {tk::rms_norm(sum, weight, static_cast<float>(eps), DType::bf16), to_bf16(sum)};
}

// ---- the layers' weights --------------------------------------------------------------------

struct Attention {
  Linear wq_a, wq_b, wkv_a, wo;
  Tensor q_norm, kv_norm;   // f32
  gemm::PackedWeight w_uk;  // bf16 [h, 512, 128]: q_abs[h] = q_nope[h] . W_UK[h]
  gemm::PackedWeight w_uv;  // bf16 [h, v_head_dim, 512]: o[h] = W_UV[h] . o_lat[h]
  // The indexer.
  Linear idx_wq_b, idx_wk;
  Tensor idx_k_norm_w, idx_k_norm_b;  // f32 [128]
  Tensor idx_weights_proj;            // bf16 [index_heads, dim]
};

struct Ffn {
  bool moe = false;
  Linear w13, w2;                  // dense MLP, or the shared expert of a MoE layer
  Tensor gate;                     // bf16 [E, dim]
  Tensor gate_bias;                // f32 [E]
  gemm::PackedWeight experts_w13;  // [local experts, 2 * moe_inter, dim]
  gemm::PackedWeight experts_w2;   // [local experts, dim, moe_inter]
};

struct Layer {
  Tensor attn_norm, ffn_norm;  // f32 [dim]
  Attention attn;
  Ffn ffn;
};

Attention load_attention(const Weights& w, const Config& c, const std::string& p) {
  Attention a;
  a.wq_a = pack_linear(w, p + "self_attn.q_a_proj.weight");
  a.wq_b = pack_linear(w, p + "self_attn.q_b_proj.weight");
  a.wkv_a = pack_linear(w, p + "self_attn.kv_a_proj_with_mqa.weight");
  a.wo = pack_linear(w, p + "self_attn.o_proj.weight");
  a.q_norm = as_f32(w.get(p + "self_attn.q_a_layernorm.weight"));
  a.kv_norm = as_f32(w.get(p + "self_attn.kv_a_layernorm.weight"));
  // kv_b_proj dequantized to bf16 as the demo's weight_dequant does, viewed per head as
  // [nope rows (W_UK) | v rows (W_UV)] x kv_lora.
  const gemm::Fp8Tensor kv_b = fp8_weight(w, p + "self_attn.kv_b_proj.weight");
  const Tensor wkv_b = tk::cast_back(kv_b, "bf16", {kQuantBlock, kQuantBlock})
                           .view({c.n_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank});
  a.w_uk = gemm::pack_weight(wkv_b.slice(1, 0, c.qk_nope_head_dim).transpose(1, 2));
  a.w_uv = gemm::pack_weight(wkv_b.slice(1, c.qk_nope_head_dim, c.qk_nope_head_dim + c.v_head_dim));
  a.idx_wq_b = pack_linear(w, p + "self_attn.indexer.wq_b.weight");
  a.idx_wk = pack_linear(w, p + "self_attn.indexer.wk.weight");
  a.idx_k_norm_w = as_f32(w.get(p + "self_attn.indexer.k_norm.weight"));
  a.idx_k_norm_b = as_f32(w.get(p + "self_attn.indexer.k_norm.bias"));
  a.idx_weights_proj = w.get(p + "self_attn.indexer.weights_proj.weight");
  return a;
}

std::pair<Linear, Linear> load_mlp(const Weights& w, const std::string& p) {
  const Linear w13 = pack_linear(
      stack_rows({fp8_weight(w, p + "gate_proj.weight"), fp8_weight(w, p + "up_proj.weight")}));
  return {w13, pack_linear(w, p + "down_proj.weight")};
}

// first_expert, num_experts: the routed experts this rank keeps (all of them on a single rank).
Ffn load_ffn(const Weights& w, const Config& c, int layer, int first_expert, int num_experts) {
  const std::string p = layer_prefix(layer) + "mlp.";
  Ffn f;
  f.moe = c.is_moe_layer(layer);
  if (!f.moe) {
    std::tie(f.w13, f.w2) = load_mlp(w, p);
    return f;
  }
  std::tie(f.w13, f.w2) = load_mlp(w, p + "shared_experts.");
  f.gate = w.get(p + "gate.weight");
  f.gate_bias = as_f32(w.get(p + "gate.e_score_correction_bias"));
  // Each expert packed on its own (w1 | w3 stacked), then grouped without a copy: the raw weights
  // are never held twice (one real MoE layer is 12 GB).
  std::vector<gemm::PackedWeight> w13, w2;
  for (int e = first_expert; e < first_expert + num_experts; ++e) {
    const std::string q = p + "experts." + std::to_string(e) + ".";
    w13.push_back(pack_linear(stack_rows({fp8_weight(w, q + "gate_proj.weight"),
                                          fp8_weight(w, q + "up_proj.weight")}))
                      .w);
    w2.push_back(pack_linear(w, q + "down_proj.weight").w);
  }
  f.experts_w13 = gemm::stack_packed_weights(w13);
  f.experts_w2 = gemm::stack_packed_weights(w2);
  return f;
}

}  // namespace

// ---- the model ------------------------------------------------------------------------------

struct Model::Impl {
  Config config;
  Tensor embed;       // bf16 [vocab, dim]
  Tensor final_norm;  // f32 [dim]
  Tensor head;        // bf16 [vocab, dim]
  Tensor cos_sin;     // f32 [max_seq_len, 64]
  std::vector<Layer> layers;
  KvCache cache;
  std::map<std::string, double> op_seconds;  // wall time per op since the last reset
  bool record_decisions = false;
  std::vector<LayerDecisions> decisions;  // of the latest forward, when recording
  // Expert parallelism: the group, its dispatch / combine buffer, and this rank's experts.
  std::optional<ep::Communicator> ep_group;
  std::unique_ptr<ep::Buffer> ep_buffer;
  int first_expert = 0, num_local_experts = 0;

  // Adds the lifetime of the object to op_seconds[name].
  struct OpTimer {
    Impl& impl;
    const char* name;
    Timer timer;
    OpTimer(Impl& i, const char* n) : impl(i), name(n) {}
    OpTimer(const OpTimer&) = delete;
    ~OpTimer() { impl.op_seconds[name] += timer.seconds(); }
  };
  OpTimer time(const char* name) { return OpTimer(*this, name); }

  Impl(const Weights& w, const Options& options)
      : config(w.config()),
        cache(w.config().n_layers, 1),
        max_batch_tokens(options.max_batch_tokens) {
    config.validate();
    DSK_CHECK_ARG(options.max_batch_tokens >= 1, kFn, "options.max_batch_tokens", ">= 1",
                  options.max_batch_tokens);
    place_experts(options);
    embed = w.get("model.embed_tokens.weight");
    final_norm = as_f32(w.get("model.norm.weight"));
    head = w.get("lm_head.weight");
    cos_sin = tk::yarn_cos_sin_cache(config.rope);
    for (int l = 0; l < config.n_layers; ++l) {
      const std::string p = layer_prefix(l);
      Layer layer;
      layer.attn_norm = as_f32(w.get(p + "input_layernorm.weight"));
      layer.ffn_norm = as_f32(w.get(p + "post_attention_layernorm.weight"));
      layer.attn = load_attention(w, config, p);
      layer.ffn = load_ffn(w, config, l, first_expert, num_local_experts);
      layers.push_back(std::move(layer));
    }
    if (ep_group) ep_buffer = std::make_unique<ep::Buffer>(*ep_group, ep_buffer_config());
    plan_memory(options);
  }

  // This rank's share of the routed experts (all of them without expert parallelism).
  void place_experts(const Options& options) {
    num_local_experts = config.n_routed_experts;
    if (!options.expert_parallel) return;
    ep_group = *options.expert_parallel;
    const int ranks = ep_group->size();
    DSK_CHECK_ARG(
        config.n_routed_experts % ranks == 0, kFn, "options.expert_parallel",
        "a group whose size divides n_routed_experts = " + std::to_string(config.n_routed_experts),
        ranks);
    num_local_experts = config.n_routed_experts / ranks;
    first_expert = ep_group->rank() * num_local_experts;
  }
  // FP8 dispatch of up to max_batch_tokens tokens per rank; a single reduction in the combine
  // (in top-k slot order, whatever the placement), so results do not depend on the group size.
  ep::BufferConfig ep_buffer_config() const {
    return {.num_max_tokens_per_rank = max_batch_tokens,
            .hidden = config.dim,
            .num_topk = config.n_activated_experts,
            .num_experts = config.n_routed_experts,
            .use_fp8_dispatch = true,
            .deterministic = true,
            .allow_multiple_reduction = false};
  }

  MemoryBudget budget;
  int64_t max_batch_tokens;

  int64_t weight_bytes() const;
  // Fills budget and sizes the cache (options.kv_cache_pages, or what memory_limit leaves).
  void plan_memory(const Options& options);

  // The batch of one forward call: item i owns token rows [row[i], row[i] + n[i]) at positions
  // [start[i], start[i] + n[i]) of sequence seq[i].
  struct Batch {
    std::vector<int64_t> seq, row, n, start;
    Tensor positions;  // int32 [T]
    int64_t tokens = 0;
  };

  Tensor forward(std::span<const StepItem> items);
  Batch plan(std::span<const StepItem> items);
  Tensor embed_tokens(std::span<const StepItem> items, const Batch& b) const;
  Tensor attention(int l, const Tensor& x_n, const Batch& b);
  // o_lat bf16 [T, h, 512]: flash_mla_with_kvcache over the FP8 cache with the indexer's slots.
  Tensor sparse_attention(int l, const Tensor& q_mla, const Tensor& indices, const Batch& b);
  Tensor ffn(int l, const Tensor& x_n);
  tk::GateResult route(int l, const Tensor& x_n);
  // The MoE on this rank's experts alone, or across the expert-parallel group.
  Tensor moe_local(const Ffn& f, const Tensor& x_n, const tk::GateResult& gate);
  Tensor moe_expert_parallel(const Ffn& f, const Tensor& x_n, const tk::GateResult& gate);
  // A step without tokens of its own: every MoE layer's exchange, serving the peers' rows.
  void serve_peers();
  // The indexer's choice for every token: int32 [T, index_topk] global slots, -1 padded.
  Tensor indexer(int l, const Tensor& x_n, const Tensor& qr, const Batch& b);
  // The indexer's global slots as positions in each token's sequence (-1 stays -1).
  Tensor slots_to_positions(const Tensor& slots, const Batch& b) const;
};

int64_t Model::Impl::weight_bytes() const {
  int64_t bytes =
      static_cast<int64_t>(embed.nbytes() + final_norm.nbytes() + head.nbytes() + cos_sin.nbytes());
  const auto packed = [&](const gemm::PackedWeight& w) {
    if (w.defined()) bytes += static_cast<int64_t>(w.nbytes());
  };
  const auto tensor = [&](const Tensor& t) {
    if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  };
  for (const Layer& l : layers) {
    const Attention& a = l.attn;
    for (const Linear* x : {&a.wq_a, &a.wq_b, &a.wkv_a, &a.wo, &a.idx_wq_b, &a.idx_wk})
      packed(x->w);
    packed(a.w_uk);
    packed(a.w_uv);
    for (const Tensor* t : {&l.attn_norm, &l.ffn_norm, &a.q_norm, &a.kv_norm, &a.idx_k_norm_w,
                            &a.idx_k_norm_b, &a.idx_weights_proj, &l.ffn.gate, &l.ffn.gate_bias})
      tensor(*t);
    packed(l.ffn.w13.w);
    packed(l.ffn.w2.w);
    packed(l.ffn.experts_w13);
    packed(l.ffn.experts_w2);
  }
  return bytes;
}

// The bf16 buffers of the widest op of each kind live at once, the expanded expert rows with their
// worst-case alignment padding, and the prefill indexer's f32 logits over the longest context.
int64_t step_workspace_bytes(const Config& c, int64_t max_batch_tokens) {
  DSK_CHECK_ARG(max_batch_tokens >= 1, "model::step_workspace_bytes", "max_batch_tokens", ">= 1",
                max_batch_tokens);
  const int64_t T = max_batch_tokens, h = c.n_heads, lat = c.kv_lora_rank;
  const int64_t per_token =
      2 * (6 * c.dim + c.q_lora_rank + h * (c.qk_head_dim() + 2 * (lat + c.qk_rope_head_dim)) +
           2 * h * c.v_head_dim + 2 * c.index_n_heads * c.index_head_dim + 3 * c.inter_dim) +
      4 * (c.n_routed_experts + 2 * c.index_n_heads);
  const int64_t expert_rows =
      T * c.n_activated_experts +
      int64_t{c.n_routed_experts} * gemm::get_mk_alignment_for_contiguous_layout();
  const int64_t per_expert_row = c.dim + 4 * c.moe_inter_dim + c.moe_inter_dim + 2 * c.dim;
  const int64_t logits = T * (c.rope.max_seq_len + 256) * 4 + c.rope.max_seq_len * 132;
  return T * per_token + expert_rows * per_expert_row + logits;
}

void Model::Impl::plan_memory(const Options& options) {
  budget.weights = weight_bytes();
  budget.workspace = step_workspace_bytes(config, max_batch_tokens);
  budget.communication = ep_buffer ? ep_buffer->num_bytes() + ep_buffer->output_bytes() : 0;
  const int64_t fixed = budget.weights + budget.workspace;
  budget.reserve = std::max<int64_t>(int64_t{64} << 20, fixed / 20);
  const int64_t page_bytes = KvCache::page_bytes(config.n_layers);
  int64_t pages = options.kv_cache_pages;
  if (options.memory_limit > 0) {
    const int64_t left = options.memory_limit - fixed - budget.reserve;
    const MemoryBudget fixed_part{budget.weights, 0, budget.workspace, 0, budget.reserve};
    DSK_CHECK_ARG(left >= page_bytes, kFn, "options.memory_limit",
                  "room for at least one KV page after " + fixed_part.describe(),
                  options.memory_limit);
    pages = left / page_bytes;
  }
  cache = KvCache(config.n_layers, pages);
  budget.kv_cache = pages * page_bytes;
}

Model::Impl::Batch Model::Impl::plan(std::span<const StepItem> items) {
  DSK_CHECK_ARG(!items.empty(), kFn, "items",
                "at least one item (none only with options.expert_parallel)", 0);
  Batch b;
  int64_t pages = 0;
  std::vector<int64_t> seen;
  for (const StepItem& it : items) {
    DSK_CHECK_ARG(cache.has_sequence(it.seq), kFn, "items.seq", "a live sequence id", it.seq);
    DSK_CHECK_ARG(std::find(seen.begin(), seen.end(), it.seq) == seen.end(), kFn, "items.seq",
                  "each sequence at most once per step", it.seq);
    seen.push_back(it.seq);
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    DSK_CHECK_ARG(n >= 1, kFn, "items.tokens", "at least one token", n);
    for (int32_t t : it.tokens)
      DSK_CHECK_ARG(t >= 0 && t < config.vocab_size, kFn, "items.tokens",
                    "ids in [0, " + std::to_string(config.vocab_size) + ")", t);
    const int64_t start = cache.length(it.seq);
    DSK_CHECK_ARG(start + n <= config.rope.max_seq_len, kFn, "items.tokens",
                  "a sequence of at most max_seq_len = " + std::to_string(config.rope.max_seq_len) +
                      " tokens",
                  start + n);
    pages += cache.pages_needed(it.seq, start + n);
    b.seq.push_back(it.seq);
    b.row.push_back(b.tokens);
    b.n.push_back(n);
    b.start.push_back(start);
    b.tokens += n;
  }
  DSK_CHECK_ARG(b.tokens <= max_batch_tokens, kFn, "items",
                "at most options.max_batch_tokens = " + std::to_string(max_batch_tokens) +
                    " tokens in one step (the workspace is planned for it)",
                b.tokens);
  DSK_CHECK(pages <= cache.free_pages(), kFn,
            "the KV cache cannot hold this step: " + std::to_string(pages) + " pages needed, " +
                std::to_string(cache.free_pages()) + " free");
  b.positions = Tensor::empty({b.tokens}, DType::i32);
  int32_t* pos = b.positions.data<int32_t>();
  for (size_t i = 0; i < b.seq.size(); ++i) {
    for (int64_t j = 0; j < b.n[i]; ++j) pos[b.row[i] + j] = static_cast<int32_t>(b.start[i] + j);
    cache.grow(b.seq[i], b.start[i] + b.n[i]);
  }
  return b;
}

Tensor Model::Impl::embed_tokens(std::span<const StepItem> items, const Batch& b) const {
  Tensor h = Tensor::empty({b.tokens, config.dim}, DType::bf16);
  for (size_t i = 0; i < items.size(); ++i)
    for (int64_t j = 0; j < b.n[i]; ++j)
      h.select(0, b.row[i] + j).copy_(embed.select(0, items[i].tokens[static_cast<size_t>(j)]));
  return h;
}

Tensor Model::Impl::forward(std::span<const StepItem> items) {
  if (items.empty() && ep_buffer) {
    decisions.clear();
    serve_peers();
    return Tensor::empty({0, config.vocab_size}, DType::f32);
  }
  const Batch b = plan(items);
  decisions.assign(record_decisions ? static_cast<size_t>(config.n_layers) : 0, {});
  Tensor h = embed_tokens(items, b);
  Tensor res, x_n;
  for (int l = 0; l < config.n_layers; ++l) {
    const Layer& layer = layers[static_cast<size_t>(l)];
    {
      const auto t = time("norm");
      std::tie(x_n, res) = add_rms_norm(h, res, layer.attn_norm, config.rms_norm_eps);
    }
    const Tensor attn_out = attention(l, x_n, b);
    {
      const auto t = time("norm");
      std::tie(x_n, res) = add_rms_norm(attn_out, res, layer.ffn_norm, config.rms_norm_eps);
    }
    h = ffn(l, x_n);
  }
  const auto t = time("head");
  // The last token of every item: final norm, then the f32 head.
  const int64_t n_items = static_cast<int64_t>(items.size());
  Tensor last_h = Tensor::empty({n_items, config.dim}, DType::bf16);
  Tensor last_res = Tensor::empty({n_items, config.dim}, DType::bf16);
  for (int64_t i = 0; i < n_items; ++i) {
    const int64_t row = b.row[static_cast<size_t>(i)] + b.n[static_cast<size_t>(i)] - 1;
    last_h.select(0, i).copy_(h.select(0, row));
    last_res.select(0, i).copy_(res.select(0, row));
  }
  const Tensor x = add_rms_norm(last_h, last_res, final_norm, config.rms_norm_eps).first;
  Tensor logits = Tensor::empty({n_items, config.vocab_size}, DType::f32);
  gemm::bf16_gemm_nt(x, head, logits);
  return logits;
}

Tensor Model::Impl::slots_to_positions(const Tensor& slots, const Batch& b) const {
  Tensor pos = Tensor::empty(slots.sizes(), DType::i32);
  const int64_t k = slots.size(1);
  for (size_t i = 0; i < b.seq.size(); ++i) {
    std::map<int32_t, int64_t> logical;  // physical block -> its index in the sequence
    const auto& blocks = cache.blocks(b.seq[i]);
    for (size_t j = 0; j < blocks.size(); ++j) logical[blocks[j]] = static_cast<int64_t>(j);
    for (int64_t t = b.row[i]; t < b.row[i] + b.n[i]; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t slot = slots.data<int32_t>()[t * k + j];
        pos.data<int32_t>()[t * k + j] =
            slot < 0 ? -1
                     : static_cast<int32_t>(logical.at(slot / static_cast<int32_t>(kPageTokens)) *
                                                kPageTokens +
                                            slot % kPageTokens);
      }
  }
  return pos;
}

Tensor Model::Impl::indexer(int l, const Tensor& x_n, const Tensor& qr, const Batch& b) {
  const Attention& a = layers[static_cast<size_t>(l)].attn;
  const int64_t T = b.tokens, H = config.index_n_heads, D = config.index_head_dim;
  const int64_t rope = config.qk_rope_head_dim;
  // Queries and keys: rope on the first 64 dims (non-interleaved), Hadamard, FP8 per 128.
  Tensor q = linear(qr, a.idx_wq_b).view({T, H, D});
  tk::apply_rotary(q.slice(2, 0, rope), cos_sin, std::nullopt, b.positions, /*interleaved=*/false);
  Tensor k = tk::layer_norm(linear(x_n, a.idx_wk), a.idx_k_norm_w, a.idx_k_norm_b, 1e-6f);
  tk::apply_rotary(k.view({T, 1, D}).slice(2, 0, rope), cos_sin, std::nullopt, b.positions, false);
  const float hadamard_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  q = tk::hadamard_transform(q, hadamard_scale);
  k = tk::hadamard_transform(k, hadamard_scale);
  const auto q8 = tk::per_token_cast(q.view({T * H, D}), "e4m3", static_cast<int>(D), false, true);
  const auto k8 = tk::per_token_cast(k, "e4m3", static_cast<int>(D), false, true);
  for (size_t i = 0; i < b.seq.size(); ++i)
    for (int64_t j = 0; j < b.n[i]; ++j) {
      const int64_t t = b.row[i] + j, pos = b.start[i] + j;
      std::copy_n(static_cast<const uint8_t*>(k8.data.select(0, t).data_ptr()), D,
                  cache.indexer_codes(l, b.seq[i], pos));
      *cache.indexer_scale(l, b.seq[i], pos) = k8.sf.at<float>({t, 0});
    }
  // Head weights: weights_proj(x_n) * H^-0.5, times each head's query scale and D^-0.5 (the
  // kernels take the FP8 query codes without their scale).
  Tensor w = Tensor::empty({T, H}, DType::f32);
  gemm::bf16_gemm_nt(x_n, a.idx_weights_proj, w);
  const double head_scale = 1.0 / std::sqrt(static_cast<double>(H) * static_cast<double>(D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      w.at<float>({t, h}) *= static_cast<float>(head_scale) * q8.sf.at<float>({t * H + h, 0});
  const Tensor q_codes = q8.data.view({T, H, D});

  Tensor indices = Tensor::empty({T, config.index_topk}, DType::i32);
  const int64_t max_blocks = (config.rope.max_seq_len + kPageTokens - 1) / kPageTokens;
  // Decode items (one token): one paged-logits call for all of them.
  std::vector<size_t> decode;
  for (size_t i = 0; i < b.seq.size(); ++i)
    if (b.n[i] == 1) decode.push_back(i);
  if (!decode.empty()) {
    const int64_t B = static_cast<int64_t>(decode.size());
    Tensor qd = Tensor::empty({B, 1, H, D}, DType::e4m3), wd = Tensor::empty({B, H}, DType::f32);
    Tensor lens = Tensor::empty({B}, DType::i32),
           table = Tensor::zeros({B, max_blocks}, DType::i32);
    int64_t max_len = 0;
    for (int64_t r = 0; r < B; ++r) {
      const size_t i = decode[static_cast<size_t>(r)];
      qd.select(0, r).select(0, 0).copy_(q_codes.select(0, b.row[i]));
      wd.select(0, r).copy_(w.select(0, b.row[i]));
      const int64_t len = b.start[i] + 1;
      lens.data<int32_t>()[r] = static_cast<int32_t>(len);
      max_len = std::max(max_len, len);
      const auto& blocks = cache.blocks(b.seq[i]);
      std::copy(blocks.begin(), blocks.end(), table.data<int32_t>() + r * max_blocks);
    }
    const Tensor meta = gemm::get_paged_mqa_logits_metadata(lens, kPageTokens, get_num_threads());
    const Tensor logits = gemm::fp8_paged_mqa_logits(qd, cache.indexer_pages(l), wd, lens, table,
                                                     meta, max_len, /*clean_logits=*/true);
    const Tensor sel =
        select::topk_page_table_transform(logits, config.index_topk, lens, table, kPageTokens);
    for (int64_t r = 0; r < B; ++r)
      indices.select(0, b.row[decode[static_cast<size_t>(r)]]).copy_(sel.select(0, r));
  }
  // Prefill items: ragged logits over the sequence's keys gathered from the cache, causal.
  for (size_t i = 0; i < b.seq.size(); ++i) {
    if (b.n[i] == 1) continue;
    const int64_t n = b.n[i], len = b.start[i] + n;
    Tensor kv = Tensor::empty({len, D}, DType::e4m3), kv_sf = Tensor::empty({len}, DType::f32);
    for (int64_t s = 0; s < len; ++s) {
      std::copy_n(cache.indexer_codes(l, b.seq[i], s), D,
                  static_cast<uint8_t*>(kv.select(0, s).data_ptr()));
      kv_sf.data<float>()[s] = *cache.indexer_scale(l, b.seq[i], s);
    }
    Tensor ks = Tensor::zeros({n}, DType::i32), ke = Tensor::empty({n}, DType::i32);
    Tensor table = Tensor::zeros({n, max_blocks}, DType::i32);
    const auto& blocks = cache.blocks(b.seq[i]);
    for (int64_t j = 0; j < n; ++j) {
      ke.data<int32_t>()[j] = static_cast<int32_t>(b.start[i] + j + 1);
      std::copy(blocks.begin(), blocks.end(), table.data<int32_t>() + j * max_blocks);
    }
    const Tensor logits =
        gemm::fp8_mqa_logits(q_codes.slice(0, b.row[i], b.row[i] + n), {kv, kv_sf},
                             w.slice(0, b.row[i], b.row[i] + n), ks, ke, /*clean_logits=*/true);
    indices.slice(0, b.row[i], b.row[i] + n)
        .copy_(
            select::topk_page_table_transform(logits, config.index_topk, ke, table, kPageTokens));
  }
  return indices;
}

Tensor Model::Impl::attention(int l, const Tensor& x_n, const Batch& b) {
  const Attention& a = layers[static_cast<size_t>(l)].attn;
  const int64_t T = b.tokens, h = config.n_heads, nope = config.qk_nope_head_dim;
  const int64_t rope = config.qk_rope_head_dim, lat = config.kv_lora_rank;
  Tensor qr, q;
  {
    // Query: q = wq_b . RMSNorm(wq_a . x), interleaved rope on q_pe.
    const auto t = time("attn.q");
    qr = tk::rms_norm(linear(x_n, a.wq_a), a.q_norm, config.rms_norm_eps);
    q = linear(qr, a.wq_b).view({T, h, nope + rope});
    tk::apply_rotary(q.slice(2, nope, nope + rope), cos_sin, std::nullopt, b.positions, true);
  }
  {
    // Key: c = RMSNorm(kv[:512]), k_pe = rope(kv[512:]); into the cache as 656-byte tokens.
    const auto t = time("attn.kv");
    const Tensor kv = linear(x_n, a.wkv_a);
    Tensor ckv = Tensor::empty({T, lat + rope}, DType::bf16);
    ckv.slice(1, 0, lat).copy_(tk::rms_norm(kv.slice(1, 0, lat), a.kv_norm, config.rms_norm_eps));
    ckv.slice(1, lat, lat + rope).copy_(kv.slice(1, lat, lat + rope));
    tk::apply_rotary(ckv.slice(1, lat, lat + rope).unsqueeze(1), cos_sin, std::nullopt, b.positions,
                     true);
    const Tensor tokens = mla::quantize_kv_tokens(ckv);
    for (size_t i = 0; i < b.seq.size(); ++i)
      for (int64_t j = 0; j < b.n[i]; ++j)
        std::copy_n(static_cast<const uint8_t*>(tokens.select(0, b.row[i] + j).data_ptr()),
                    mla::kTokenBytes, cache.mla_token(l, b.seq[i], b.start[i] + j));
  }
  Tensor indices;
  {
    const auto t = time("indexer");
    indices = indexer(l, x_n, qr, b);
  }
  if (record_decisions)
    decisions[static_cast<size_t>(l)].positions = slots_to_positions(indices, b);
  // Every head shares the weights of the per-head GEMMs: one masked grouped GEMM over heads.
  Tensor masked = Tensor::empty({h}, DType::i32);
  for (int64_t i = 0; i < h; ++i) masked.data<int32_t>()[i] = static_cast<int32_t>(T);
  Tensor q_mla = Tensor::empty({T, h, lat + rope}, DType::bf16);
  {
    // Absorbed query [q_nope . W_UK | q_pe].
    const auto t = time("attn.absorb");
    // The GEMM reads q_nope [h, T, 128] and writes q_mla's first lat columns [h, T, lat] through
    // transposed views (it takes any group stride): no copies of either.
    gemm::m_grouped_bf16_gemm_nt_masked(q.slice(2, 0, nope).transpose(0, 1), a.w_uk,
                                        q_mla.slice(2, 0, lat).transpose(0, 1), masked,
                                        static_cast<int>(T));
    q_mla.slice(2, lat, lat + rope).copy_(q.slice(2, nope, nope + rope));
  }
  Tensor o_lat;
  {
    const auto t = time("attn.mla");
    o_lat = sparse_attention(l, q_mla, indices, b);
  }
  // o[h] = W_UV[h] . o_lat[h], then the output projection.
  const auto t = time("attn.out");
  // Heads as groups through transposed views of o_lat [T, h, 512] and o [T, h, v]: no copies.
  Tensor o = Tensor::empty({T, h, config.v_head_dim}, DType::bf16);
  gemm::m_grouped_bf16_gemm_nt_masked(o_lat.transpose(0, 1), a.w_uv, o.transpose(0, 1), masked,
                                      static_cast<int>(T));
  return linear(o.view({T, h * config.v_head_dim}), a.wo);
}

Tensor Model::Impl::sparse_attention(int l, const Tensor& q_mla, const Tensor& indices,
                                     const Batch& b) {
  const int64_t T = b.tokens, h = config.n_heads, lat = config.kv_lora_rank;
  Tensor o_lat = Tensor::empty({T, h, lat}, DType::bf16);
  const double scale = config.softmax_scale();
  const auto attend = [&](const Tensor& qb, const Tensor& ib) {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    return mla::flash_mla_with_kvcache(qb, cache.mla_pages(l), std::nullopt, std::nullopt, lat,
                                       meta, std::nullopt, scale, false, /*is_fp8_kvcache=*/true,
                                       ib)
        .out;
  };
  // Decode items (one token) as one batch.
  std::vector<int64_t> decode_rows;
  for (size_t i = 0; i < b.seq.size(); ++i)
    if (b.n[i] == 1) decode_rows.push_back(b.row[i]);
  if (!decode_rows.empty()) {
    const int64_t B = static_cast<int64_t>(decode_rows.size());
    Tensor qb = Tensor::empty({B, 1, h, q_mla.size(2)}, DType::bf16);
    Tensor ib = Tensor::empty({B, 1, config.index_topk}, DType::i32);
    for (int64_t r = 0; r < B; ++r) {
      qb.select(0, r).select(0, 0).copy_(q_mla.select(0, decode_rows[static_cast<size_t>(r)]));
      ib.select(0, r).select(0, 0).copy_(indices.select(0, decode_rows[static_cast<size_t>(r)]));
    }
    const Tensor out = attend(qb, ib);
    for (int64_t r = 0; r < B; ++r)
      o_lat.select(0, decode_rows[static_cast<size_t>(r)]).copy_(out.select(0, r).select(0, 0));
  }
  // Each prefill item on its own: its queries are one request's s_q.
  for (size_t i = 0; i < b.seq.size(); ++i) {
    if (b.n[i] == 1) continue;
    const int64_t r0 = b.row[i], r1 = r0 + b.n[i];
    const Tensor out =
        attend(q_mla.slice(0, r0, r1).unsqueeze(0), indices.slice(0, r0, r1).unsqueeze(0));
    o_lat.slice(0, r0, r1).copy_(out.select(0, 0));
  }
  return o_lat;
}

namespace {

// silu(gate) * up in f32 (times each row's routing weight when given), rounded to bf16 (spec §5.3
// step 7), then act_quant for the down projection. pos_to_expert (expert rows): padding rows are
// zero.
gemm::Fp8Tensor swiglu_quant(const Tensor& gate_up,
                             const std::optional<Tensor>& pos_to_expert = std::nullopt,
                             const std::optional<Tensor>& row_slot = std::nullopt,
                             const std::optional<Tensor>& slot_weights = std::nullopt) {
  const Tensor product =
      to_bf16(tk::swiglu_forward(gate_up, pos_to_expert, std::nullopt, row_slot, slot_weights));
  return tk::per_token_cast(product, "e4m3", kQuantBlock, false, /*round_sf=*/true);
}

// The dense MLP, or a shared expert: w2(silu(w1 x) * w3 x), the product quantized for w2.
Tensor mlp(const Tensor& x_n, const Linear& w13, const Linear& w2) {
  const auto act = swiglu_quant(linear(x_n, w13));
  Tensor y = Tensor::empty({x_n.size(0), w2.n}, DType::bf16);
  gemm::fp8_gemm_nt(act, w2.w, y);
  return y;
}

// The routed experts over expert rows in the contiguous grouped layout: w1|w3, SwiGLU times the
// row's routing weight (applied before the down projection, as DeepEP and TileKernels do, so the
// combine only sums), w2. xe FP8 [R, dim]; row_expert int32 [R], the local expert or -1 (padding);
// row_slot int32 [R], each row's index into slot_weights.view(-1), or -1. Returns bf16 [R, dim].
Tensor expert_rows(const Ffn& f, const gemm::Fp8Tensor& xe, const Tensor& row_expert,
                   const Tensor& row_slot, const Tensor& slot_weights, int64_t moe_inter_dim) {
  const int64_t rows = xe.data.size(0), dim = xe.data.size(1);
  if (rows == 0) return Tensor::empty({0, dim}, DType::bf16);
  Tensor he = Tensor::empty({rows, 2 * moe_inter_dim}, DType::bf16);
  gemm::m_grouped_fp8_gemm_nt_contiguous(xe, f.experts_w13, he, row_expert);
  const auto ae = swiglu_quant(he, row_expert, row_slot, slot_weights);
  Tensor ye = Tensor::empty({rows, dim}, DType::bf16);
  gemm::m_grouped_fp8_gemm_nt_contiguous(ae, f.experts_w2, ye, row_expert);
  return ye;
}

// The MoE output as ep::Buffer::combine computes it with a single reduction: the shared expert's
// output in f32, plus each weighted expert row in top-k slot order, rounded to bf16 once. rows
// bf16 [R, dim]; pos int32 [T, k], the row of each slot (-1: none); shared bf16 [T, dim].
Tensor sum_slots(const Tensor& rows, const Tensor& pos, const Tensor& shared) {
  const int64_t T = shared.size(0), dim = shared.size(1), k = pos.size(1);
  Tensor out = Tensor::empty({T, dim}, DType::bf16);
  parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    std::vector<float> acc(static_cast<size_t>(dim));
    for (int64_t t = t0; t < t1; ++t) {
      const bf16* s = shared.data<bf16>() + t * dim;
      for (int64_t c = 0; c < dim; ++c) acc[static_cast<size_t>(c)] = bf16_to_f32(s[c]);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = pos.data<int32_t>()[t * k + j];
        if (p < 0) continue;
        const bf16* x = rows.data<bf16>() + p * rows.stride(0);
        for (int64_t c = 0; c < dim; ++c) acc[static_cast<size_t>(c)] += bf16_to_f32(x[c]);
      }
      convert_f32_to_bf16(acc.data(), out.data<bf16>() + t * dim, static_cast<size_t>(dim));
    }
  });
  return out;
}

// The expert and the slot of each row a dispatch received in expand mode: expert e's rows are
// [align(psum[e - 1]), psum[e]); the rows between the blocks are padding (-1). The slot of a row
// is the row itself (its weight is recv_topk_weights[row]).
std::pair<Tensor, Tensor> received_row_layout(const Tensor& psum, int64_t rows, int alignment) {
  Tensor expert = Tensor::empty({rows}, DType::i32), slot = Tensor::empty({rows}, DType::i32);
  int32_t* e_of = expert.data<int32_t>();
  int32_t* s_of = slot.data<int32_t>();
  std::fill(e_of, e_of + rows, -1);
  std::fill(s_of, s_of + rows, -1);
  int64_t begin = 0;
  for (int64_t e = 0; e < psum.numel(); ++e) {
    const int64_t end = psum.data<int32_t>()[e];
    DSK_CHECK(begin <= end && end <= rows, kFn,
              "a dispatch returned an inconsistent expert layout");
    for (int64_t r = begin; r < end; ++r) {
      e_of[r] = static_cast<int32_t>(e);
      s_of[r] = static_cast<int32_t>(r);
    }
    begin = (end + alignment - 1) / alignment * alignment;
  }
  return {expert, slot};
}

}  // namespace

Tensor Model::Impl::ffn(int l, const Tensor& x_n) {
  const Ffn& f = layers[static_cast<size_t>(l)].ffn;
  if (!f.moe) {
    const auto t = time("ffn.dense");
    return mlp(x_n, f.w13, f.w2);
  }
  const tk::GateResult gate = route(l, x_n);
  return ep_buffer ? moe_expert_parallel(f, x_n, gate) : moe_local(f, x_n, gate);
}

// f32 logits of bf16 x and weight, DeepSeek-V3's noaux_tc rule.
tk::GateResult Model::Impl::route(int l, const Tensor& x_n) {
  const Ffn& f = layers[static_cast<size_t>(l)].ffn;
  tk::GateResult gate;
  {
    const auto t = time("moe.gate");
    Tensor logits = Tensor::empty({x_n.size(0), config.n_routed_experts}, DType::f32);
    gemm::bf16_gemm_nt(x_n, f.gate, logits);
    gate = tk::noaux_tc_gate(logits, f.gate_bias, config.n_activated_experts,
                             config.n_expert_groups, config.n_limited_groups,
                             static_cast<float>(config.route_scale), config.score_func);
  }
  if (record_decisions) decisions[static_cast<size_t>(l)].experts = gate.topk_idx.clone();
  return gate;
}

Tensor Model::Impl::moe_local(const Ffn& f, const Tensor& x_n, const tk::GateResult& gate) {
  Tensor shared;
  {
    const auto t = time("moe.shared");
    shared = mlp(x_n, f.w13, f.w2);
  }
  Tensor rows;
  tk::FusedMapping map;
  {
    // Token rows expanded into per-expert blocks, then the two grouped GEMMs.
    const auto t = time("moe.experts");
    map = tk::get_fused_mapping(gate.topk_idx, config.n_routed_experts);
    const auto xq = tk::per_token_cast(x_n, "e4m3", kQuantBlock, false, /*round_sf=*/true);
    const auto xe =
        tk::expand_to_fused_with_sf(xq, kQuantBlock, map.token_topk_to_pos, map.pos_to_expert);
    rows = expert_rows(f, xe, map.pos_to_expert, map.pos_to_token_topk, gate.topk_weights,
                       config.moe_inter_dim);
  }
  const auto t = time("moe.combine");
  return sum_slots(rows, map.token_topk_to_pos, shared);
}

// DeepEP's overlap (spec/ep.md §2.3): dispatch, the shared expert while the rows travel, the local
// experts on every rank's rows, combine with the shared expert's output as the bias.
Tensor Model::Impl::moe_expert_parallel(const Ffn& f, const Tensor& x_n,
                                        const tk::GateResult& gate) {
  const int64_t T = x_n.size(0);
  ep::DispatchResult d;
  {
    const auto t = time("moe.dispatch");
    const gemm::Fp8Tensor xq =
        T > 0 ? tk::per_token_cast(x_n, "e4m3", kQuantBlock, false, /*round_sf=*/true)
              : gemm::Fp8Tensor{Tensor::empty({0, config.dim}, DType::e4m3),
                                Tensor::empty({0, config.dim / kQuantBlock}, DType::f32)};
    d = ep_buffer->dispatch(xq, {.topk_idx = gate.topk_idx,
                                 .topk_weights = gate.topk_weights,
                                 .do_expand = true,
                                 .async_finish = true});
  }
  Tensor shared = Tensor::empty({0, config.dim}, DType::bf16);
  if (T > 0) {
    const auto t = time("moe.shared");
    shared = mlp(x_n, f.w13, f.w2);
  }
  {
    const auto t = time("moe.dispatch");
    d.wait();
  }
  Tensor rows;
  {
    const auto t = time("moe.experts");
    const auto [row_expert, row_slot] = received_row_layout(
        d.handle.psum_num_recv_tokens_per_expert, d.recv_x.size(0), d.handle.expert_alignment);
    rows = expert_rows(f, {d.recv_x, *d.recv_x_sf}, row_expert, row_slot, *d.recv_topk_weights,
                       config.moe_inter_dim);
  }
  const auto t = time("moe.combine");
  return ep_buffer->combine(rows, d.handle, {.bias = {shared}}).combined_x;
}

void Model::Impl::serve_peers() {
  const int K = config.n_activated_experts;
  const tk::GateResult none{.topk_idx = Tensor::empty({0, K}, DType::i64),
                            .topk_weights = Tensor::empty({0, K}, DType::f32)};
  const Tensor x_n = Tensor::empty({0, config.dim}, DType::bf16);
  for (const Layer& layer : layers)
    if (layer.ffn.moe) moe_expert_parallel(layer.ffn, x_n, none);
}

Model::Model(const Weights& weights, Options options)
    : impl_(std::make_unique<Impl>(weights, options)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const Config& Model::config() const {
  return impl_->config;
}
int64_t Model::add_sequence() {
  return impl_->cache.add_sequence();
}
void Model::free_sequence(int64_t seq) {
  impl_->cache.free_sequence(seq);
}
int64_t Model::sequence_length(int64_t seq) const {
  return impl_->cache.length(seq);
}
int64_t Model::free_pages() const {
  return impl_->cache.free_pages();
}
int64_t Model::max_batch_tokens() const {
  return impl_->max_batch_tokens;
}
int64_t Model::total_pages() const {
  return impl_->cache.num_pages();
}
const MemoryBudget& Model::memory_budget() const {
  return impl_->budget;
}
const ep::Communicator* Model::expert_parallel_group() const {
  return impl_->ep_group ? &*impl_->ep_group : nullptr;
}

namespace {
std::string gib(int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30));
}
}  // namespace

std::string MemoryBudget::describe() const {
  return fmt::format("weights {} + KV cache {} + workspace {} + communication {} + reserve {} = {}",
                     gib(weights), gib(kv_cache), gib(workspace), gib(communication), gib(reserve),
                     gib(total()));
}
void Model::set_record_decisions(bool on) {
  impl_->record_decisions = on;
  if (!on) impl_->decisions.clear();
}
const std::vector<LayerDecisions>& Model::last_decisions() const {
  return impl_->decisions;
}
std::map<std::string, double> Model::op_seconds() const {
  return impl_->op_seconds;
}
void Model::reset_op_seconds() {
  impl_->op_seconds.clear();
}
Tensor Model::forward(std::span<const StepItem> items) {
  return impl_->forward(items);
}

}  // namespace dsk::model
