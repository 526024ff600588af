// dsk::model::Config: the presets, the checks the kernels need, and the Hugging Face config.json
// mapping (keys as in deepseek-ai/DeepSeek-V3.2's config.json).
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dsk/model.hpp>

namespace dsk::model {
namespace {

using nlohmann::json;

constexpr int64_t kBlock = 128;  // FP8 GEMM K granularity and weight block size

Config v32_preset() {
  return Config{};
}  // the struct's defaults are the real dimensions

Config v32_tiny_preset() {
  Config c;
  c.name = "v32-tiny";
  c.vocab_size = 4096;
  c.dim = 512;
  c.inter_dim = 1024;
  c.moe_inter_dim = 256;
  c.n_layers = 4;
  c.n_dense_layers = 1;
  c.n_heads = 16;
  c.q_lora_rank = 256;
  c.n_routed_experts = 32;
  c.n_shared_experts = 1;
  c.n_activated_experts = 8;
  c.index_n_heads = 8;
  c.index_topk = 64;
  return c;
}

// ---- validation -----------------------------------------------------------------------------

constexpr const char* kValidate = "dsk::model::Config::validate";

void check_positive_multiple(const char* field, int64_t value, int64_t multiple) {
  DSK_CHECK_ARG(value > 0 && value % multiple == 0, kValidate, field,
                fmt::format("a positive multiple of {} (FP8 GEMM blocks)", multiple), value);
}

void check_range(const char* field, int64_t value, int64_t lo, int64_t hi) {
  DSK_CHECK_ARG(value >= lo && value <= hi, kValidate, field, fmt::format("[{}, {}]", lo, hi),
                value);
}

void check_attention(const Config& c) {
  check_range("n_heads", c.n_heads, 1, 128);
  check_positive_multiple("q_lora_rank", c.q_lora_rank, kBlock);
  DSK_CHECK_ARG(c.kv_lora_rank == 512, kValidate, "kv_lora_rank", "512 (the 576/512 MLA contract)",
                c.kv_lora_rank);
  DSK_CHECK_ARG(c.qk_rope_head_dim == 64, kValidate, "qk_rope_head_dim",
                "64 (the 576/512 MLA contract)", c.qk_rope_head_dim);
  check_range("qk_nope_head_dim", c.qk_nope_head_dim, 1, 512);
  check_range("v_head_dim", c.v_head_dim, 1, 512);
  DSK_CHECK_ARG(c.n_heads * c.v_head_dim % kBlock == 0, kValidate, "v_head_dim",
                "n_heads * v_head_dim a multiple of 128 (o_proj K)", c.n_heads * c.v_head_dim);
  DSK_CHECK_ARG(c.index_n_heads >= 4 && c.index_n_heads <= 128 && c.index_n_heads % 4 == 0,
                kValidate, "index_n_heads", "a multiple of 4 in [4, 128]", c.index_n_heads);
  DSK_CHECK_ARG(c.index_head_dim == 128, kValidate, "index_head_dim",
                "128 (Hadamard size, rope 64 | nope 64)", c.index_head_dim);
  DSK_CHECK_ARG(c.index_topk >= 64 && c.index_topk % 64 == 0, kValidate, "index_topk",
                "a positive multiple of 64 (sparse decode)", c.index_topk);
}

void check_moe(const Config& c) {
  check_range("n_routed_experts", c.n_routed_experts, 1, 1024);
  check_range("n_shared_experts", c.n_shared_experts, 1, 2);
  check_range("n_activated_experts", c.n_activated_experts, 1,
              std::min<int64_t>(16, c.n_routed_experts));
  check_range("n_expert_groups", c.n_expert_groups, 1, 32);
  DSK_CHECK_ARG(c.n_routed_experts % c.n_expert_groups == 0, kValidate, "n_expert_groups",
                fmt::format("a divisor of n_routed_experts ({})", c.n_routed_experts),
                c.n_expert_groups);
  check_range("n_limited_groups", c.n_limited_groups, 1, c.n_expert_groups);
  const int64_t eligible = int64_t{c.n_limited_groups} * (c.n_routed_experts / c.n_expert_groups);
  DSK_CHECK_ARG(c.n_activated_experts <= eligible, kValidate, "n_activated_experts",
                fmt::format("at most the experts of n_limited_groups groups ({})", eligible),
                c.n_activated_experts);
  DSK_CHECK_ARG(std::isfinite(c.route_scale) && c.route_scale > 0.0, kValidate, "route_scale",
                "a positive finite factor", c.route_scale);
  DSK_CHECK_ARG(
      c.score_func == "sigmoid" || c.score_func == "softmax" || c.score_func == "sqrtsoftplus",
      kValidate, "score_func", "\"sigmoid\", \"softmax\" or \"sqrtsoftplus\"", c.score_func);
}

void check_rope(const Config& c) {
  const tk::RopeConfig& r = c.rope;
  DSK_CHECK_ARG(r.rot_dim == c.qk_rope_head_dim, kValidate, "rope.rot_dim",
                fmt::format("qk_rope_head_dim ({})", c.qk_rope_head_dim), r.rot_dim);
  check_range("rope.max_seq_len", r.max_seq_len, 1, int64_t{1} << 24);
  check_range("rope.original_seq_len", r.original_seq_len, 1, int64_t{1} << 24);
  DSK_CHECK_ARG(std::isfinite(r.rope_theta) && r.rope_theta > 1.0, kValidate, "rope.rope_theta",
                "a finite base above 1", r.rope_theta);
  DSK_CHECK_ARG(std::isfinite(r.rope_factor) && r.rope_factor >= 1.0, kValidate, "rope.rope_factor",
                "a finite factor of at least 1", r.rope_factor);
  DSK_CHECK_ARG(std::isfinite(r.beta_fast) && std::isfinite(r.beta_slow) &&
                    r.beta_fast > r.beta_slow && r.beta_slow > 0.0,
                kValidate, "rope.beta_fast", "beta_fast > beta_slow > 0",
                fmt::format("{} / {}", r.beta_fast, r.beta_slow));
  DSK_CHECK_ARG(std::isfinite(c.rope_mscale) && c.rope_mscale >= 0.0, kValidate, "rope_mscale",
                "a finite non-negative value", c.rope_mscale);
}

// ---- config.json ----------------------------------------------------------------------------

// Reads the keys of one JSON object, each error naming the key (with its parent) and the source.
class Reader {
 public:
  Reader(const json& object, std::string path, std::string source)
      : j_(object), path_(std::move(path)), source_(std::move(source)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t integer(const char* key) const {
    const json& v = required(key);
    if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>())
      return static_cast<int64_t>(v.get<double>());  // 32.0 written by a float-minded tool
    expect(v.is_number_integer(), key, "an integer", v);
    return v.get<int64_t>();
  }
  int small_integer(const char* key) const {
    const int64_t v = integer(key);
    expect(v >= 0 && v <= (int64_t{1} << 30), key, "an integer in [0, 2^30]", required(key));
    return static_cast<int>(v);
  }
  double number(const char* key) const {
    const json& v = required(key);
    expect(v.is_number(), key, "a number", v);
    return v.get<double>();
  }
  std::string string(const char* key) const {
    const json& v = required(key);
    expect(v.is_string(), key, "a string", v);
    return v.get<std::string>();
  }
  bool boolean(const char* key) const {
    const json& v = required(key);
    expect(v.is_boolean(), key, "true or false", v);
    return v.get<bool>();
  }
  Reader object(const char* key) const {
    const json& v = required(key);
    expect(v.is_object(), key, "an object", v);
    return Reader(v, name_of(key) + ".", source_);
  }
  const json& value(const char* key) const { return required(key); }

  // A key that, when present, must have one of the supported values.
  template <class T>
  void expect_if_present(const char* key, const T& supported, const char* what) const {
    if (has(key)) expect(j_.at(key) == json(supported), key, what, j_.at(key));
  }
  void expect(bool ok, const char* key, const std::string& expected, const json& got) const {
    DSK_CHECK_ARG(ok, fmt::format("dsk::model::config_from_json ({})", source_).c_str(),
                  name_of(key).c_str(), expected, got.dump());
  }

 private:
  std::string name_of(const char* key) const { return path_ + key; }
  const json& required(const char* key) const {
    DSK_CHECK_ARG(has(key), fmt::format("dsk::model::config_from_json ({})", source_).c_str(),
                  name_of(key).c_str(), "a value (the key is required)", "nothing");
    return j_.at(key);
  }

  const json& j_;
  std::string path_;
  std::string source_;
};

void read_dimensions(const Reader& r, Config& c) {
  c.vocab_size = r.integer("vocab_size");
  c.dim = r.integer("hidden_size");
  c.inter_dim = r.integer("intermediate_size");
  c.moe_inter_dim = r.integer("moe_intermediate_size");
  c.n_layers = r.small_integer("num_hidden_layers");
  c.n_dense_layers = r.small_integer("first_k_dense_replace");
  c.n_heads = r.small_integer("num_attention_heads");
  c.q_lora_rank = r.integer("q_lora_rank");
  c.kv_lora_rank = r.integer("kv_lora_rank");
  c.qk_nope_head_dim = r.integer("qk_nope_head_dim");
  c.qk_rope_head_dim = r.integer("qk_rope_head_dim");
  c.v_head_dim = r.integer("v_head_dim");
  c.index_n_heads = r.small_integer("index_n_heads");
  c.index_head_dim = r.integer("index_head_dim");
  c.index_topk = r.integer("index_topk");
  c.rms_norm_eps = r.number("rms_norm_eps");
}

void read_moe(const Reader& r, Config& c) {
  c.n_routed_experts = r.small_integer("n_routed_experts");
  c.n_shared_experts = r.small_integer("n_shared_experts");
  c.n_activated_experts = r.small_integer("num_experts_per_tok");
  c.n_expert_groups = r.small_integer("n_group");
  c.n_limited_groups = r.small_integer("topk_group");
  c.route_scale = r.number("routed_scaling_factor");
  c.score_func = r.string("scoring_func");
  // What the gate implements: DeepSeek's noaux_tc with normalised top-k weights, every layer
  // after the dense ones an MoE layer, SiLU experts, an untied head.
  r.expect_if_present("topk_method", "noaux_tc", "\"noaux_tc\"");
  r.expect_if_present("norm_topk_prob", true, "true");
  r.expect_if_present("moe_layer_freq", 1, "1");
  r.expect_if_present("hidden_act", "silu", "\"silu\"");
  r.expect_if_present("tie_word_embeddings", false, "false");
}

// rope_scaling absent or null: plain RoPE (no YaRN), which the config expresses as factor 1 and
// an original length equal to max_seq_len.
void read_rope(const Reader& r, Config& c) {
  c.rope.rot_dim = static_cast<int>(c.qk_rope_head_dim);
  c.rope.rope_theta = r.number("rope_theta");
  c.rope.max_seq_len = r.integer("max_position_embeddings");
  if (!r.has("rope_scaling")) {
    c.rope.rope_factor = 1.0;
    c.rope.original_seq_len = c.rope.max_seq_len;
    c.rope_mscale = 1.0;
    return;
  }
  const Reader s = r.object("rope_scaling");
  const char* type_key = s.has("type") ? "type" : "rope_type";
  s.expect(s.string(type_key) == "yarn", type_key, "\"yarn\"", s.value(type_key));
  c.rope.rope_factor = s.number("factor");
  c.rope.original_seq_len = s.integer("original_max_position_embeddings");
  c.rope.beta_fast = s.number("beta_fast");
  c.rope.beta_slow = s.number("beta_slow");
  c.rope_mscale = s.number("mscale");
  // The softmax scale uses mscale_all_dim and the cos/sin tables mscale / mscale_all_dim; the
  // kernels apply no cos/sin factor, so the two must agree.
  if (s.has("mscale_all_dim"))
    s.expect(s.number("mscale_all_dim") == c.rope_mscale, "mscale_all_dim",
             fmt::format("equal to mscale ({})", c.rope_mscale), s.value("mscale_all_dim"));
}

void read_quantization(const Reader& r) {
  if (!r.has("quantization_config")) return;
  const Reader q = r.object("quantization_config");
  q.expect(q.string("quant_method") == "fp8", "quant_method", "\"fp8\"", q.value("quant_method"));
  q.expect_if_present("fmt", "e4m3", "\"e4m3\"");
  q.expect(q.value("weight_block_size") == json::array({kBlock, kBlock}), "weight_block_size",
           "[128, 128]", q.value("weight_block_size"));
  q.expect_if_present("scale_fmt", "ue8m0", "\"ue8m0\" (or no scale_fmt)");
}

}  // namespace

double Config::softmax_scale() const {
  const double base = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.max_seq_len <= rope.original_seq_len) return base;
  const double m = tk::yarn_mscale(rope.rope_factor, rope_mscale);
  return base * m * m;
}

void Config::validate() const {
  DSK_CHECK_ARG(vocab_size >= 1 && vocab_size <= (int64_t{1} << 31) - 1, kValidate, "vocab_size",
                "[1, 2^31 - 1] (int32 token ids)", vocab_size);
  check_positive_multiple("dim", dim, kBlock);
  check_positive_multiple("inter_dim", inter_dim, kBlock);
  check_positive_multiple("moe_inter_dim", moe_inter_dim, kBlock);
  check_range("n_layers", n_layers, 1, 1024);
  check_range("n_dense_layers", n_dense_layers, 0, n_layers);
  check_attention(*this);
  check_moe(*this);
  check_rope(*this);
  DSK_CHECK_ARG(std::isfinite(rms_norm_eps) && rms_norm_eps > 0.0, kValidate, "rms_norm_eps",
                "a positive finite epsilon", rms_norm_eps);
}

Config preset(std::string_view name) {
  if (name == "v32") return v32_preset();
  if (name == "v32-tiny") return v32_tiny_preset();
  DSK_FAIL("dsk::model::preset", fmt::format("name: expected one of {}, got \"{}\"",
                                             detail::to_text(preset_names()), name));
}

std::vector<std::string> preset_names() {
  return {"v32", "v32-tiny"};
}

Config config_from_json(std::string_view json_text, std::string_view source) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  DSK_CHECK(!j.is_discarded() && j.is_object(), "dsk::model::config_from_json",
            fmt::format("{}: expected a JSON object, got text that does not parse as one", source));
  const Reader r(j, "", std::string(source));
  r.expect_if_present("model_type", "deepseek_v32", "\"deepseek_v32\"");
  Config c;
  c.name = std::string(source);
  read_dimensions(r, c);
  read_moe(r, c);
  read_rope(r, c);
  read_quantization(r);
  c.validate();
  return c;
}

Config load_config(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  DSK_CHECK(in.good(), "dsk::model::load_config", fmt::format("cannot open {}", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  return config_from_json(text.str(), file.string());
}

std::string config_to_json(const Config& c) {
  json j = {
      {"architectures", json::array({"DeepseekV32ForCausalLM"})},
      {"model_type", "deepseek_v32"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.dim},
      {"intermediate_size", c.inter_dim},
      {"moe_intermediate_size", c.moe_inter_dim},
      {"num_hidden_layers", c.n_layers},
      {"first_k_dense_replace", c.n_dense_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_heads},
      {"q_lora_rank", c.q_lora_rank},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"n_routed_experts", c.n_routed_experts},
      {"n_shared_experts", c.n_shared_experts},
      {"num_experts_per_tok", c.n_activated_experts},
      {"n_group", c.n_expert_groups},
      {"topk_group", c.n_limited_groups},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", c.route_scale},
      {"scoring_func", c.score_func},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"index_topk", c.index_topk},
      {"rms_norm_eps", c.rms_norm_eps},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"num_nextn_predict_layers", 0},
      {"torch_dtype", "bfloat16"},
      {"rope_theta", c.rope.rope_theta},
      {"max_position_embeddings", c.rope.max_seq_len},
      {"rope_scaling",
       {{"type", "yarn"},
        {"factor", c.rope.rope_factor},
        {"original_max_position_embeddings", c.rope.original_seq_len},
        {"beta_fast", c.rope.beta_fast},
        {"beta_slow", c.rope.beta_slow},
        {"mscale", c.rope_mscale},
        {"mscale_all_dim", c.rope_mscale}}},
      {"quantization_config",
       {{"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"activation_scheme", "dynamic"},
        {"weight_block_size", json::array({kBlock, kBlock})},
        {"scale_fmt", "ue8m0"}}},
  };
  return j.dump(2) + "\n";
}

}  // namespace dsk::model
