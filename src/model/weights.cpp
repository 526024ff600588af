// The tensors of a DeepSeek-V3.2 checkpoint in the Hugging Face layout (names, dtypes, shapes),
// the Weights map, and random well-formed weights that are a pure function of (seed, tensor name).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <xxhash.h>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/gemm.hpp>
#include <dsk/model.hpp>
#include <dsk/tk.hpp>

#include "model/weights_internal.hpp"

namespace dsk::model {
namespace {

constexpr int64_t kBlock = 128;  // FP8 weights carry one f32 scale per 128 x 128 block
constexpr std::string_view kScaleSuffix = "_scale_inv";

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Appends the specs of one tensor list in checkpoint order.
class SpecList {
 public:
  explicit SpecList(std::vector<TensorSpec>& out) : out_(out) {}
  void plain(std::string name, DType dtype, Shape shape) {
    out_.push_back({std::move(name), dtype, std::move(shape)});
  }
  // An FP8 linear "<base>.weight" e4m3 [n, k] and its "<base>.weight_scale_inv" f32 block scales.
  void fp8_linear(const std::string& base, int64_t n, int64_t k) {
    plain(base + ".weight", DType::e4m3, {n, k});
    plain(base + ".weight_scale_inv", DType::f32, {ceil_div(n, kBlock), ceil_div(k, kBlock)});
  }

 private:
  std::vector<TensorSpec>& out_;
};

void add_attention(SpecList& s, const Config& c, const std::string& p) {
  const int64_t heads = c.n_heads;
  s.fp8_linear(p + "self_attn.q_a_proj", c.q_lora_rank, c.dim);
  s.plain(p + "self_attn.q_a_layernorm.weight", DType::bf16, {c.q_lora_rank});
  s.fp8_linear(p + "self_attn.q_b_proj", heads * c.qk_head_dim(), c.q_lora_rank);
  s.fp8_linear(p + "self_attn.kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, c.dim);
  s.plain(p + "self_attn.kv_a_layernorm.weight", DType::bf16, {c.kv_lora_rank});
  s.fp8_linear(p + "self_attn.kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim),
               c.kv_lora_rank);
  s.fp8_linear(p + "self_attn.o_proj", c.dim, heads * c.v_head_dim);
  s.fp8_linear(p + "self_attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
  s.fp8_linear(p + "self_attn.indexer.wk", c.index_head_dim, c.dim);
  s.plain(p + "self_attn.indexer.k_norm.weight", DType::bf16, {c.index_head_dim});
  s.plain(p + "self_attn.indexer.k_norm.bias", DType::bf16, {c.index_head_dim});
  s.plain(p + "self_attn.indexer.weights_proj.weight", DType::bf16, {c.index_n_heads, c.dim});
}

void add_mlp(SpecList& s, const std::string& p, int64_t dim, int64_t inter) {
  s.fp8_linear(p + "gate_proj", inter, dim);
  s.fp8_linear(p + "up_proj", inter, dim);
  s.fp8_linear(p + "down_proj", dim, inter);
}

void add_ffn(SpecList& s, const Config& c, int layer, const std::string& p) {
  if (!c.is_moe_layer(layer)) {
    add_mlp(s, p + "mlp.", c.dim, c.inter_dim);
    return;
  }
  s.plain(p + "mlp.gate.weight", DType::bf16, {c.n_routed_experts, c.dim});
  s.plain(p + "mlp.gate.e_score_correction_bias", DType::f32, {c.n_routed_experts});
  for (int e = 0; e < c.n_routed_experts; ++e)
    add_mlp(s, fmt::format("{}mlp.experts.{}.", p, e), c.dim, c.moe_inter_dim);
  add_mlp(s, p + "mlp.shared_experts.", c.dim, c.n_shared_experts * c.moe_inter_dim);
}

// ---- random values --------------------------------------------------------------------------

// How a tensor's values are drawn, from its name: Normal(mean, std).
struct Draw {
  float mean = 0.0f;
  float std = 1.0f;
};

Draw draw_for(const Config& c, const TensorSpec& spec) {
  const std::string& n = spec.name;
  const float inv_sqrt_dim = 1.0f / std::sqrt(static_cast<float>(c.dim));
  if (n == "model.embed_tokens.weight") return {0.0f, 1.0f};
  if (n == "lm_head.weight" || ends_with(n, "mlp.gate.weight") ||
      ends_with(n, "indexer.weights_proj.weight"))
    return {0.0f, inv_sqrt_dim};
  if (ends_with(n, "e_score_correction_bias")) return {0.0f, 0.01f};
  if (ends_with(n, "k_norm.bias")) return {0.0f, 0.1f};
  if (ends_with(n, "norm.weight")) return {1.0f, 0.1f};  // RMSNorm and LayerNorm gains
  DSK_FAIL("dsk::model::random_tensor",
           fmt::format("spec: no random initialisation is known for tensor '{}'", n));
}

// The seed of one tensor: the checkpoint seed mixed with the tensor's name, so a tensor does not
// depend on which other tensors exist or on the order they are made in.
uint64_t tensor_seed(uint64_t seed, std::string_view name) {
  return XXH3_64bits_withSeed(name.data(), name.size(), seed);
}

// NOTES: the real v32 MoE layer holds about 12 G weights, so drawing them must cost a few ns
// each. Element i of a tensor is a pure function of (tensor seed, i), counter-based like
// ref::randn's stream (splitmix64's output function of key + (i + 1) * golden ratio; the key is
// already a hash, so it needs no further mixing), and its four 16-bit parts are summed
// (Irwin-Hall, n = 4: mean 2, variance 1/3): close to normal, bounded at 2 * sqrt(3) ~ 3.46
// sigma, and much cheaper than Box-Muller. The values do not depend on how the work is split.
inline uint64_t counter_bits(uint64_t key, uint64_t i) {
  uint64_t z = key + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float standard_normal(uint64_t key, uint64_t i) {
  const uint64_t z = counter_bits(key, i);
  const uint64_t sum = (z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48);
  // Each part is (p + 0.5) / 65536, uniform in (0, 1): centre the sum, scale it to variance 1.
  constexpr float kScale = 1.7320508075688772f / 65536.0f;
  return (static_cast<float>(sum) - 131070.0f) * kScale;
}

// NOTES: with one gain for the whole tensor, every 128 x 128 block of a weight would get the same
// power-of-two scale, and a forward that applied the wrong block's scale would still match its
// reference. Each block is therefore multiplied by 1/2, 1 or 2 (chosen by the block's own draw),
// normalised so the tensor's variance stays 1/K: neighbouring blocks' scales differ.
float block_gain(uint64_t key, int64_t block) {
  constexpr float kNorm = 0.7559289460184544f;  // 1 / sqrt((1/4 + 1 + 4) / 3)
  constexpr float kGains[3] = {0.5f * kNorm, kNorm, 2.0f * kNorm};
  return kGains[counter_bits(~key, static_cast<uint64_t>(block)) % 3];
}

void fill_normal(float* out, int64_t begin, int64_t end, uint64_t seed, Draw d) {
  for (int64_t i = begin; i < end; ++i)
    out[i - begin] = d.mean + d.std * standard_normal(seed, static_cast<uint64_t>(i));
}

// A bf16 or f32 tensor of Normal(d.mean, d.std) values, made in parallel chunks.
Tensor random_float_tensor(const Shape& shape, DType dtype, uint64_t seed, Draw d) {
  Tensor t = Tensor::empty(shape, dtype);
  constexpr int64_t kChunk = 16384;
  parallel_for(
      t.numel(),
      [&](int64_t begin, int64_t end, int) {
        const auto buffer = std::make_unique_for_overwrite<float[]>(
            static_cast<size_t>(std::min(kChunk, end - begin)));
        for (int64_t b = begin; b < end; b += kChunk) {
          const int64_t e = std::min(end, b + kChunk);
          if (dtype == DType::f32) {
            fill_normal(static_cast<float*>(t.data_ptr()) + b, b, e, seed, d);
            continue;
          }
          fill_normal(buffer.get(), b, e, seed, d);
          convert_f32_to_bf16(buffer.get(), static_cast<bf16*>(t.data_ptr()) + b,
                              static_cast<size_t>(e - b));
        }
      },
      kChunk);
  return t;
}

// Rows [128 band, 128 band + rows) of an [n, k] weight, each block times its gain.
void fill_band(float* band, int64_t band_index, int64_t rows, int64_t k, uint64_t key, Draw d) {
  const int64_t r0 = band_index * kBlock, col_blocks = ceil_div(k, kBlock);
  fill_normal(band, r0 * k, (r0 + rows) * k, key, d);
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    const float g = block_gain(key, band_index * col_blocks + cb);
    const int64_t c0 = cb * kBlock, c1 = std::min(k, c0 + kBlock);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) band[r * k + c] *= g;
  }
}

// The layers' output projections (attention o_proj, every MLP's down_proj) write into the residual
// stream; their weights get the GPT-2 / Megatron scaled initialisation, std 1/sqrt(2 n_layers)
// of the rest. With unscaled random weights every layer rewrote the residual stream, and the
// model became chaotic: a last-bit difference in one layer (a bf16 or FP8 rounding decided the
// other way) grew to calc_diff > 1e-3 of the logits within four layers, where trained models,
// whose layers add small updates, stay close (docs/model.md, "Cross-check").
float residual_branch_gain(const Config& c, const std::string& name) {
  const bool writes_residual =
      ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight");
  return writes_residual ? 1.0f / std::sqrt(2.0f * static_cast<float>(c.n_layers)) : 1.0f;
}

// The FP8 weight of `weight` (an e4m3 [n, k] spec) and its block scales, made together because
// the scales follow from the values: Normal(0, 1/k) values (times a gain per block, see
// block_gain) quantized 128 rows at a time with
// tk::per_block_cast (DeepGEMM's per_block_cast_to_fp8 rule, power-of-two scales), so only a
// band of f32 values per thread is ever held.
gemm::Fp8Tensor random_fp8_linear(const Config& c, const TensorSpec& weight, uint64_t seed) {
  const int64_t n = weight.shape.at(0), k = weight.shape.at(1);
  const uint64_t s = tensor_seed(seed, weight.name);
  const Draw d{0.0f, residual_branch_gain(c, weight.name) / std::sqrt(static_cast<float>(k))};
  gemm::Fp8Tensor out{Tensor::empty({n, k}, DType::e4m3),
                      Tensor::empty({ceil_div(n, kBlock), ceil_div(k, kBlock)}, DType::f32)};
  const int64_t sf_cols = out.sf.size(1);
  parallel_for(ceil_div(n, kBlock), [&](int64_t band0, int64_t band1, int) {
    const auto band = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(kBlock * k));
    for (int64_t b = band0; b < band1; ++b) {
      const int64_t r0 = b * kBlock, rows = std::min(kBlock, n - r0);
      fill_band(band.get(), b, rows, k, s, d);
      const Tensor x = Tensor::from_blob(band.get(), {rows, k}, DType::f32);
      const tk::QuantTensor q = tk::per_block_cast(x, "e4m3", {kBlock, kBlock},
                                                   /*use_tma_aligned_col_major_sf=*/false,
                                                   /*round_sf=*/true);
      std::memcpy(static_cast<e4m3*>(out.data.data_ptr()) + r0 * k, q.data.data_ptr(),
                  static_cast<size_t>(rows * k));
      std::memcpy(out.sf.data<float>() + b * sf_cols, q.sf.data_ptr(),
                  static_cast<size_t>(sf_cols) * sizeof(float));
    }
  });
  return out;
}

// "<base>.weight_scale_inv" -> "<base>.weight"; nullopt for any other name.
std::optional<std::string> weight_of_scale(const std::string& name) {
  if (!ends_with(name, ".weight" + std::string(kScaleSuffix))) return std::nullopt;
  return name.substr(0, name.size() - kScaleSuffix.size());
}

void check_spec_shape(const TensorSpec& spec) {
  for (int64_t d : spec.shape)
    DSK_CHECK_ARG(d >= 0, "dsk::model::random_tensor", "spec.shape",
                  "non-negative sizes for '" + spec.name + "'", spec.shape);
}

// Makes every tensor of `config` in checkpoint order and hands it to sink(spec, tensor); an FP8
// weight's scales are made with it and handed over when their spec comes up (right after).
template <class Sink>
void for_each_random_tensor(const Config& config, uint64_t seed, Sink&& sink) {
  std::optional<std::pair<std::string, Tensor>> pending_scale;
  for (const TensorSpec& spec : checkpoint_tensors(config)) {
    if (pending_scale && pending_scale->first == spec.name) {
      sink(spec, std::move(pending_scale->second));
      pending_scale.reset();
      continue;
    }
    if (spec.dtype == DType::e4m3) {
      gemm::Fp8Tensor w = random_fp8_linear(config, spec, seed);
      pending_scale.emplace(spec.name + std::string(kScaleSuffix), std::move(w.sf));
      sink(spec, std::move(w.data));
      continue;
    }
    sink(spec, random_tensor(config, spec, seed));
  }
}

}  // namespace

void for_each_random_tensor_in_order(const Config& config, uint64_t seed,
                                     const std::function<void(const TensorSpec&, Tensor)>& sink) {
  for_each_random_tensor(config, seed, sink);
}

std::vector<TensorSpec> checkpoint_tensors(const Config& config) {
  config.validate();
  std::vector<TensorSpec> specs;
  SpecList s(specs);
  s.plain("model.embed_tokens.weight", DType::bf16, {config.vocab_size, config.dim});
  for (int i = 0; i < config.n_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    s.plain(p + "input_layernorm.weight", DType::bf16, {config.dim});
    add_attention(s, config, p);
    s.plain(p + "post_attention_layernorm.weight", DType::bf16, {config.dim});
    add_ffn(s, config, i, p);
  }
  s.plain("model.norm.weight", DType::bf16, {config.dim});
  s.plain("lm_head.weight", DType::bf16, {config.vocab_size, config.dim});
  return specs;
}

const Tensor& Weights::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  DSK_CHECK(it != tensors_.end(), "dsk::model::Weights::get",
            fmt::format("tensor '{}' is not in {}", name, source));
  return it->second;
}

size_t Weights::nbytes() const {
  size_t total = 0;
  for (const auto& [name, t] : tensors_) total += t.nbytes();
  return total;
}

Tensor random_tensor(const Config& config, const TensorSpec& spec, uint64_t seed) {
  constexpr const char* fn = "dsk::model::random_tensor";
  check_spec_shape(spec);
  if (spec.dtype == DType::e4m3) {
    DSK_CHECK_ARG(spec.shape.size() == 2, fn, "spec.shape",
                  "a 2-D shape for the FP8 weight '" + spec.name + "'", spec.shape);
    return random_fp8_linear(config, spec, seed).data;
  }
  if (const auto weight_name = weight_of_scale(spec.name)) {
    // The scales of an FP8 weight: remake the weight (its shape comes from the config).
    for (const TensorSpec& w : checkpoint_tensors(config))
      if (w.name == *weight_name) {
        Tensor sf = random_fp8_linear(config, w, seed).sf;
        DSK_CHECK_ARG(sf.sizes() == spec.shape && spec.dtype == DType::f32, fn, "spec",
                      fmt::format("float32{} for '{}'", detail::to_text(sf.sizes()), spec.name),
                      fmt::format("{}{}", dtype_name(spec.dtype), detail::to_text(spec.shape)));
        return sf;
      }
    DSK_FAIL(fn, fmt::format("spec: '{}' scales no FP8 weight of the config", spec.name));
  }
  DSK_CHECK_ARG(spec.dtype == DType::bf16 || spec.dtype == DType::f32, fn, "spec.dtype",
                "bfloat16 or float32 for '" + spec.name + "'", spec.dtype);
  return random_float_tensor(spec.shape, spec.dtype, tensor_seed(seed, spec.name),
                             draw_for(config, spec));
}

Weights random_weights(const Config& config, uint64_t seed) {
  Weights w(config);
  w.source = fmt::format("random weights ({}, seed {})", config.name, seed);
  for_each_random_tensor(config, seed,
                         [&](const TensorSpec& spec, Tensor t) { w.set(spec.name, std::move(t)); });
  return w;
}

}  // namespace dsk::model
