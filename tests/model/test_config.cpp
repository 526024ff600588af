// dsk::model::Config: presets, validation, the softmax scale, the config.json mapping (round trip,
// the real DeepSeek-V3.2 file, bad keys) and the checkpoint tensor list.
#include <cmath>
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include <dsk/model.hpp>

#include "common/test_util.hpp"
#include "model/model_test_util.hpp"

namespace dsk {
namespace {

using model::Config;
using nlohmann::json;

// The deepseek-ai/DeepSeek-V3.2 config.json values (spec/attention.md §5.1 and the HF file).
constexpr const char* kRealV32Config = R"({
  "architectures": ["DeepseekV32ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "index_head_dim": 128,
  "index_n_heads": 64,
  "index_topk": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v32",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.44.2",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

// Every field of two configs, the name aside.
void expect_same_config(const Config& a, const Config& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.inter_dim, b.inter_dim);
  EXPECT_EQ(a.moe_inter_dim, b.moe_inter_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_dense_layers, b.n_dense_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.n_routed_experts, b.n_routed_experts);
  EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
  EXPECT_EQ(a.n_activated_experts, b.n_activated_experts);
  EXPECT_EQ(a.n_expert_groups, b.n_expert_groups);
  EXPECT_EQ(a.n_limited_groups, b.n_limited_groups);
  EXPECT_EQ(a.route_scale, b.route_scale);
  EXPECT_EQ(a.score_func, b.score_func);
  EXPECT_EQ(a.index_n_heads, b.index_n_heads);
  EXPECT_EQ(a.index_head_dim, b.index_head_dim);
  EXPECT_EQ(a.index_topk, b.index_topk);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope.rot_dim, b.rope.rot_dim);
  EXPECT_EQ(a.rope.max_seq_len, b.rope.max_seq_len);
  EXPECT_EQ(a.rope.rope_theta, b.rope.rope_theta);
  EXPECT_EQ(a.rope.rope_factor, b.rope.rope_factor);
  EXPECT_EQ(a.rope.original_seq_len, b.rope.original_seq_len);
  EXPECT_EQ(a.rope.beta_fast, b.rope.beta_fast);
  EXPECT_EQ(a.rope.beta_slow, b.rope.beta_slow);
  EXPECT_EQ(a.rope_mscale, b.rope_mscale);
}

using model_test::expect_error_naming;

TEST(ModelConfig, PresetsValidate) {
  ASSERT_EQ(model::preset_names(), (std::vector<std::string>{"v32", "v32-tiny"}));
  for (const std::string& name : model::preset_names()) {
    const Config c = model::preset(name);
    EXPECT_EQ(c.name, name);
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_EQ(c.qk_head_dim(), 192);
    EXPECT_GT(c.rope.max_seq_len, c.rope.original_seq_len) << name << ": YaRN is on";
  }
  const Config tiny = model::preset("v32-tiny");
  EXPECT_EQ(tiny.dim, 512);
  EXPECT_EQ(tiny.n_layers, 4);
  EXPECT_EQ(tiny.n_dense_layers, 1);
  EXPECT_FALSE(tiny.is_moe_layer(0));
  EXPECT_TRUE(tiny.is_moe_layer(1));
  expect_error_naming([] { model::preset("v4"); }, {"v4", "v32-tiny"});
}

TEST(ModelConfig, SoftmaxScaleFollowsYarn) {
  EXPECT_NEAR(model::preset("v32").softmax_scale(), 0.1352337789, 1e-10);
  EXPECT_NEAR(model::preset("v32-tiny").softmax_scale(), 0.1352337789, 1e-10);
  Config plain = model::preset("v32");
  plain.rope.max_seq_len = plain.rope.original_seq_len;  // YaRN off
  EXPECT_DOUBLE_EQ(plain.softmax_scale(), 1.0 / std::sqrt(192.0));
}

TEST(ModelConfig, JsonRoundTripIsExact) {
  Config odd = model::preset("v32-tiny");
  odd.route_scale = 2.123456789012345;
  odd.rms_norm_eps = 3.3e-7;
  odd.rope.rope_theta = 12345.678901;
  odd.rope.beta_fast = 31.5;
  odd.rope_mscale = 0.707;
  odd.score_func = "softmax";
  odd.index_n_heads = 12;
  for (const Config& c : {model::preset("v32"), model::preset("v32-tiny"), odd}) {
    const std::string text = model::config_to_json(c);
    const Config back = model::config_from_json(text, "round-trip");
    EXPECT_EQ(back.name, "round-trip");
    expect_same_config(c, back);
    EXPECT_EQ(model::config_to_json(back), text);
  }
}

TEST(ModelConfig, ConfigJsonUsesTheHuggingFaceKeys) {
  const json j = json::parse(model::config_to_json(model::preset("v32")));
  EXPECT_EQ(j["model_type"], "deepseek_v32");
  EXPECT_EQ(j["architectures"], json::array({"DeepseekV32ForCausalLM"}));
  EXPECT_EQ(j["hidden_size"], 7168);
  EXPECT_EQ(j["first_k_dense_replace"], 3);
  EXPECT_EQ(j["num_experts_per_tok"], 8);
  EXPECT_EQ(j["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 4096);
  EXPECT_EQ(j["quantization_config"]["scale_fmt"], "ue8m0");
  EXPECT_EQ(j["quantization_config"]["weight_block_size"], json::array({128, 128}));
}

TEST(ModelConfig, RealV32ConfigIsThePreset) {
  const Config c = model::config_from_json(kRealV32Config);
  EXPECT_EQ(c.name, "config.json");
  EXPECT_EQ(c.rope.max_seq_len, 163840);  // what the file says, not the demo's 16384
  Config expected = model::preset("v32");
  expected.rope.max_seq_len = 163840;
  expect_same_config(c, expected);
  EXPECT_NEAR(c.softmax_scale(), 0.1352337789, 1e-10);
}

TEST(ModelConfig, LoadConfigReadsAFile) {
  test::TempDir dir;
  const auto file = dir.path() / "config.json";
  std::ofstream(file) << kRealV32Config;
  const Config c = model::load_config(file);
  EXPECT_EQ(c.name, file.string());
  EXPECT_EQ(c.dim, 7168);
  expect_error_naming([&] { model::load_config(dir.path() / "absent.json"); }, {"absent.json"});
}

TEST(ModelConfig, RopeScalingAbsentMeansNoYarn) {
  json j = json::parse(kRealV32Config);
  j.erase("rope_scaling");
  const Config c = model::config_from_json(j.dump());
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  expect_same_config(model::config_from_json(model::config_to_json(c)), c);
}

// Each required key, removed, raises an error naming it (and the source).
TEST(ModelConfig, MissingKeysAreNamed) {
  for (const char* key : {"vocab_size",
                          "hidden_size",
                          "intermediate_size",
                          "moe_intermediate_size",
                          "num_hidden_layers",
                          "first_k_dense_replace",
                          "num_attention_heads",
                          "q_lora_rank",
                          "kv_lora_rank",
                          "qk_nope_head_dim",
                          "qk_rope_head_dim",
                          "v_head_dim",
                          "n_routed_experts",
                          "n_shared_experts",
                          "num_experts_per_tok",
                          "n_group",
                          "topk_group",
                          "routed_scaling_factor",
                          "scoring_func",
                          "index_n_heads",
                          "index_head_dim",
                          "index_topk",
                          "rms_norm_eps",
                          "rope_theta",
                          "max_position_embeddings"}) {
    json j = json::parse(kRealV32Config);
    j.erase(key);
    expect_error_naming([&] { model::config_from_json(j.dump(), "my.json"); },
                        {key, "my.json", "required"});
  }
  for (const char* key : {"factor", "original_max_position_embeddings", "beta_fast", "mscale"}) {
    json j = json::parse(kRealV32Config);
    j["rope_scaling"].erase(key);
    expect_error_naming([&] { model::config_from_json(j.dump()); },
                        {std::string("rope_scaling.") + key});
  }
}

TEST(ModelConfig, MistypedKeysAreNamed) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"hidden_size", "7168"},          {"hidden_size", 7168.5}, {"num_hidden_layers", -1},
      {"routed_scaling_factor", "2.5"}, {"scoring_func", 1},     {"rope_scaling", 40},
      {"quantization_config", "fp8"},   {"vocab_size", nullptr}, {"n_group", json::array({8})},
  };
  for (const auto& [key, value] : cases) {
    json j = json::parse(kRealV32Config);
    j[key] = value;
    expect_error_naming([&] { model::config_from_json(j.dump()); }, {key});
  }
}

// Values the kernels or the forward do not support, in the file or after reading it.
TEST(ModelConfig, UnsupportedValuesAreNamed) {
  const std::vector<std::tuple<std::string, std::function<void(json&)>, std::string>> cases = {
      {"kv_lora_rank", [](json& j) { j["kv_lora_rank"] = 256; }, "kv_lora_rank"},
      {"qk_rope_head_dim", [](json& j) { j["qk_rope_head_dim"] = 32; }, "qk_rope_head_dim"},
      {"index_head_dim", [](json& j) { j["index_head_dim"] = 64; }, "index_head_dim"},
      {"index_n_heads", [](json& j) { j["index_n_heads"] = 6; }, "index_n_heads"},
      {"hidden_size", [](json& j) { j["hidden_size"] = 7000; }, "dim"},
      {"scoring_func", [](json& j) { j["scoring_func"] = "relu"; }, "score_func"},
      {"n_group", [](json& j) { j["n_group"] = 7; }, "n_expert_groups"},
      {"topk_group", [](json& j) { j["topk_group"] = 9; }, "n_limited_groups"},
      {"first_k_dense_replace", [](json& j) { j["first_k_dense_replace"] = 62; }, "n_dense_layers"},
      {"model_type", [](json& j) { j["model_type"] = "llama"; }, "model_type"},
      {"topk_method", [](json& j) { j["topk_method"] = "greedy"; }, "topk_method"},
      {"norm_topk_prob", [](json& j) { j["norm_topk_prob"] = false; }, "norm_topk_prob"},
      {"rope type", [](json& j) { j["rope_scaling"]["type"] = "linear"; }, "rope_scaling.type"},
      {"mscale_all_dim", [](json& j) { j["rope_scaling"]["mscale_all_dim"] = 0.707; },
       "rope_scaling.mscale_all_dim"},
      {"quant_method", [](json& j) { j["quantization_config"]["quant_method"] = "int4"; },
       "quantization_config.quant_method"},
      {"fmt", [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; }, "quantization_config.fmt"},
      {"block",
       [](json& j) {
         j["quantization_config"]["weight_block_size"] = {64, 64};
       },
       "quantization_config.weight_block_size"},
      {"scale_fmt", [](json& j) { j["quantization_config"]["scale_fmt"] = "f32"; },
       "quantization_config.scale_fmt"},
  };
  for (const auto& [what, edit, named] : cases) {
    json j = json::parse(kRealV32Config);
    edit(j);
    SCOPED_TRACE(what);
    expect_error_naming([&] { model::config_from_json(j.dump()); }, {named});
  }
  expect_error_naming([] { model::config_from_json("{\"hidden_size\": ", "broken.json"); },
                      {"broken.json"});
  expect_error_naming([] { model::config_from_json("[1, 2]", "list.json"); }, {"list.json"});
}

TEST(ModelConfig, ValidateNamesTheField) {
  const std::vector<std::pair<std::string, std::function<void(Config&)>>> cases = {
      {"vocab_size", [](Config& c) { c.vocab_size = 0; }},
      {"dim", [](Config& c) { c.dim = 500; }},
      {"inter_dim", [](Config& c) { c.inter_dim = 1000; }},
      {"moe_inter_dim", [](Config& c) { c.moe_inter_dim = 0; }},
      {"n_layers", [](Config& c) { c.n_layers = 0; }},
      {"n_dense_layers", [](Config& c) { c.n_dense_layers = -1; }},
      {"n_heads", [](Config& c) { c.n_heads = 0; }},
      {"q_lora_rank", [](Config& c) { c.q_lora_rank = 100; }},
      {"kv_lora_rank", [](Config& c) { c.kv_lora_rank = 576; }},
      {"qk_rope_head_dim", [](Config& c) { c.qk_rope_head_dim = 128; }},
      {"v_head_dim", [](Config& c) { c.v_head_dim = 0; }},
      {"index_n_heads", [](Config& c) { c.index_n_heads = 132; }},
      {"index_head_dim", [](Config& c) { c.index_head_dim = 256; }},
      {"index_topk", [](Config& c) { c.index_topk = 100; }},
      {"n_routed_experts", [](Config& c) { c.n_routed_experts = 0; }},
      {"n_shared_experts", [](Config& c) { c.n_shared_experts = 0; }},
      {"n_activated_experts", [](Config& c) { c.n_activated_experts = 17; }},
      {"n_activated_experts", [](Config& c) { c.n_limited_groups = 1; }},  // 1 group of 4 < 8
      {"n_expert_groups", [](Config& c) { c.n_expert_groups = 3; }},
      {"n_limited_groups", [](Config& c) { c.n_limited_groups = 0; }},
      {"route_scale", [](Config& c) { c.route_scale = NAN; }},
      {"score_func", [](Config& c) { c.score_func = "tanh"; }},
      {"rms_norm_eps", [](Config& c) { c.rms_norm_eps = 0; }},
      {"rope.rot_dim", [](Config& c) { c.rope.rot_dim = 32; }},
      {"rope.max_seq_len", [](Config& c) { c.rope.max_seq_len = 0; }},
      {"rope.rope_factor", [](Config& c) { c.rope.rope_factor = 0.5; }},
      {"rope.beta_fast", [](Config& c) { c.rope.beta_fast = 0.5; }},
  };
  for (const auto& [field, edit] : cases) {
    Config c = model::preset("v32-tiny");
    edit(c);
    SCOPED_TRACE(field);
    expect_error_naming([&] { c.validate(); }, {field, "validate"});
  }
}

TEST(ModelTensors, TheTinyCheckpointLayout) {
  const Config c = model::preset("v32-tiny");
  const std::vector<model::TensorSpec> specs = model::checkpoint_tensors(c);
  // 3 global; per layer 2 norms + 7 FP8 attention linears (x2) + 5 other attention tensors; the
  // dense MLP 3 linears, each MoE layer a gate (2), 32 + 1 experts of 3 linears.
  const size_t per_layer = 2 + 14 + 5;
  EXPECT_EQ(specs.size(), 3 + 4 * per_layer + 6 + 3 * (2 + 33 * 6));
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  std::map<std::string, model::TensorSpec> by_name;
  for (const auto& s : specs) EXPECT_TRUE(by_name.emplace(s.name, s).second) << s.name;
  const auto expect_spec = [&](const std::string& name, DType dtype, const Shape& shape) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name[name].dtype, dtype) << name;
    EXPECT_EQ(by_name[name].shape, shape) << name;
  };
  expect_spec("model.layers.0.self_attn.q_b_proj.weight", DType::e4m3, {16 * 192, 256});
  expect_spec("model.layers.0.self_attn.q_b_proj.weight_scale_inv", DType::f32, {24, 2});
  expect_spec("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", DType::e4m3, {576, 512});
  expect_spec("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv", DType::f32,
              {5, 4});  // ceil(576 / 128) = 5
  expect_spec("model.layers.0.self_attn.kv_b_proj.weight", DType::e4m3, {16 * 256, 512});
  expect_spec("model.layers.0.self_attn.o_proj.weight", DType::e4m3, {512, 16 * 128});
  expect_spec("model.layers.0.self_attn.indexer.wq_b.weight", DType::e4m3, {8 * 128, 256});
  expect_spec("model.layers.0.self_attn.indexer.wk.weight_scale_inv", DType::f32, {1, 4});
  expect_spec("model.layers.0.self_attn.indexer.k_norm.bias", DType::bf16, {128});
  expect_spec("model.layers.0.self_attn.indexer.weights_proj.weight", DType::bf16, {8, 512});
  expect_spec("model.layers.0.mlp.down_proj.weight", DType::e4m3, {512, 1024});
  expect_spec("model.layers.1.mlp.gate.weight", DType::bf16, {32, 512});
  expect_spec("model.layers.1.mlp.gate.e_score_correction_bias", DType::f32, {32});
  expect_spec("model.layers.3.mlp.experts.31.up_proj.weight", DType::e4m3, {256, 512});
  expect_spec("model.layers.3.mlp.shared_experts.down_proj.weight", DType::e4m3, {512, 256});
  EXPECT_FALSE(by_name.count("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(by_name.count("model.layers.1.mlp.gate_proj.weight"));
}

TEST(ModelTensors, TheRealV32LayerSizes) {
  Config c = model::preset("v32");
  c.n_layers = 1;
  c.n_dense_layers = 0;
  int64_t layer_bytes = 0;
  for (const auto& s : model::checkpoint_tensors(c)) {
    if (s.name.rfind("model.layers.0.", 0) != 0) continue;
    int64_t n = static_cast<int64_t>(element_size(s.dtype));
    for (int64_t d : s.shape) n *= d;
    layer_bytes += n;
  }
  // One MoE layer is about 11.5 GB (257 experts of 3 x 2048 x 7168 FP8 bytes plus attention).
  EXPECT_GT(layer_bytes, int64_t{11'000'000'000});
  EXPECT_LT(layer_bytes, int64_t{12'500'000'000});
}

}  // namespace
}  // namespace dsk
