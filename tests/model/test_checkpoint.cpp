// Random weights and safetensors checkpoints: determinism of random_tensor, the save / load round
// trip over several shards, every kind of corrupt, truncated or mismatched checkpoint rejected
// with an error naming the tensor and the file, and `dsk make-checkpoint` run as a user runs it.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dsk/model.hpp>
#include <dsk/ref.hpp>

#include "common/test_util.hpp"
#include "model/model_test_util.hpp"

namespace dsk {
namespace {

namespace fs = std::filesystem;
using model::Config;
using model::TensorSpec;
using model::Weights;
using nlohmann::json;

#ifdef DSK_TEST_PROGRAM
constexpr const char* kProgram = DSK_TEST_PROGRAM;
#else
constexpr const char* kProgram = nullptr;
#endif

// v32-tiny cut to two layers (one dense, one MoE): every tensor kind, 13 MB.
Config small_config() {
  Config c = model::preset("v32-tiny");
  c.n_layers = 2;
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

void expect_same_weights(const Weights& a, const Weights& b) {
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, t] : a.tensors()) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_TRUE(same_bytes(t, b.get(name))) << name;
  }
}

using model_test::expect_error_naming;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// A safetensors file as (header JSON, data), to corrupt one part and write it back.
struct RawFile {
  json header;
  std::string data;
};

RawFile read_raw(const fs::path& p) {
  const std::string bytes = read_bytes(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

void write_raw(const fs::path& p, const std::string& header_text, const std::string& data) {
  const uint64_t n = header_text.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  write_bytes(p, bytes + header_text + data);
}

// A saved small checkpoint shared by the tests of one suite (made once), copied per test.
class Checkpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new test::TempDir;
    weights_ = new Weights(model::random_weights(small_config(), 11));
    model::save_checkpoint(*weights_, golden_->path(), int64_t{4} << 20);  // 4 MB: 4+ shards
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete golden_;
  }
  // A fresh copy of the golden checkpoint to corrupt.
  fs::path copy() {
    fs::copy(golden_->path(), dir_.path() / "ckpt");
    return dir_.path() / "ckpt";
  }
  static std::string shard_of(const fs::path& dir, const std::string& tensor) {
    return json::parse(read_bytes(dir / "model.safetensors.index.json"))["weight_map"][tensor];
  }
  // A copy of the golden weights with `edit` applied, saved; returns the directory.
  fs::path save_edited(const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    std::map<std::string, Tensor> tensors = weights_->tensors();
    edit(tensors);
    Weights w(weights_->config());
    for (auto& [name, t] : tensors) w.set(name, t);
    const fs::path dir = dir_.path() / "edited";
    model::save_checkpoint(w, dir);
    return dir;
  }

  static test::TempDir* golden_;
  static Weights* weights_;
  test::TempDir dir_;
};
test::TempDir* Checkpoint::golden_ = nullptr;
Weights* Checkpoint::weights_ = nullptr;

// ---- random weights -------------------------------------------------------------------------

TEST(RandomWeights, DeterministicInSeedAndName) {
  const Config c = small_config();
  const Weights a = model::random_weights(c, 3);
  const std::vector<TensorSpec> specs = model::checkpoint_tensors(c);
  EXPECT_EQ(a.tensors().size(), specs.size());
  // Tensor by tensor, in reverse order, one at a time: the same bytes.
  for (auto it = specs.rbegin(); it != specs.rend(); ++it) {
    const Tensor t = model::random_tensor(c, *it, 3);
    EXPECT_EQ(t.dtype(), it->dtype) << it->name;
    EXPECT_EQ(t.sizes(), it->shape) << it->name;
    EXPECT_TRUE(same_bytes(t, a.get(it->name))) << it->name;
  }
  // Another seed changes every tensor (block scales may repeat: they are powers of two).
  const Weights b = model::random_weights(c, 4);
  for (const auto& [name, t] : a.tensors())
    if (!name.ends_with("_scale_inv")) {
      EXPECT_FALSE(same_bytes(t, b.get(name))) << name;
    }
}

TEST(RandomWeights, IndependentOfTheThreadCount) {
  const Config c = small_config();
  const int saved = get_num_threads();
  set_num_threads(1);
  const Weights one = model::random_weights(c, 5);
  set_num_threads(3);
  const Weights three = model::random_weights(c, 5);
  set_num_threads(saved);
  expect_same_weights(one, three);
}

TEST(RandomWeights, IndependentOfTheOtherTensors) {
  // Layer 1 of a 2-layer model equals layer 1 of the 4-layer preset: a tensor depends on its name
  // (and, for the projections into the residual stream, o_proj and down_proj, on the depth,
  // whose scaled initialisation they follow).
  const Config c = model::preset("v32-tiny");
  const TensorSpec spec = {
      "model.layers.1.mlp.experts.5.gate_proj.weight", DType::e4m3, {256, 512}};
  EXPECT_TRUE(
      same_bytes(model::random_tensor(c, spec, 9), model::random_tensor(small_config(), spec, 9)));
}

// Values in the advertised ranges: linear weights ~ N(0, 1/K) (per-block gains 1/2, 1, 2 times
// 1/sqrt(1.75)) with power-of-two block scales,
// norms near 1, small biases.
TEST(RandomWeights, ValuesAreScaledForTheForward) {
  const Config c = small_config();
  const Weights w = model::random_weights(c, 21);
  const std::string p = "model.layers.1.mlp.experts.0.gate_proj.";
  const Tensor q = w.get(p + "weight"), sf = w.get(p + "weight_scale_inv");
  const int64_t k = q.size(1);
  // Each 128 x 128 block has variance g^2 / K, g^2 one of the three block gains' squares.
  std::set<float> distinct;
  for (int64_t rb = 0; rb < sf.size(0); ++rb)
    for (int64_t cb = 0; cb < sf.size(1); ++cb) {
      const float s = sf.at<float>({rb, cb});
      EXPECT_EQ(std::exp2(std::round(std::log2(s))), s) << "scale is not a power of two";
      distinct.insert(s);
      double sum2 = 0;
      for (int64_t r = rb * 128; r < (rb + 1) * 128; ++r)
        for (int64_t j = cb * 128; j < (cb + 1) * 128; ++j)
          sum2 += std::pow(e4m3_to_f32(q.at<e4m3>({r, j})) * s, 2);
      const double g2 = sum2 / (128 * 128) * static_cast<double>(k) * 1.75;
      EXPECT_TRUE(std::abs(g2 - 0.25) < 0.02 || std::abs(g2 - 1) < 0.05 || std::abs(g2 - 4) < 0.2)
          << "block (" << rb << ", " << cb << "): gain^2 " << g2 << " is not 1/4, 1 or 4";
    }
  EXPECT_GE(distinct.size(), 2u) << "blocks should not share one scale";
  const Tensor norm = w.get("model.layers.0.input_layernorm.weight");
  double mean = 0;
  for (int64_t i = 0; i < norm.numel(); ++i) mean += bf16_to_f32(norm.data<bf16>()[i]);
  EXPECT_NEAR(mean / static_cast<double>(norm.numel()), 1.0, 0.03);
  const Tensor bias = w.get("model.layers.1.mlp.gate.e_score_correction_bias");
  for (int64_t i = 0; i < bias.numel(); ++i) EXPECT_LT(std::abs(bias.data<float>()[i]), 0.1f);
}

TEST(RandomWeights, ScalesOnTheirOwnMatchTheirWeight) {
  const Config c = small_config();
  const Weights w = model::random_weights(c, 2);
  const std::string name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv";
  const Tensor sf = model::random_tensor(c, {name, DType::f32, {5, 4}}, 2);
  EXPECT_TRUE(same_bytes(sf, w.get(name)));
  expect_error_naming(
      [&] {
        model::random_tensor(c, {"model.layers.0.nothing.weight", DType::bf16, {4}}, 2);
      },
      {"model.layers.0.nothing.weight"});
}

TEST(RandomWeights, GetNamesTheMissingTensorAndTheSource) {
  const Weights w = model::random_weights(small_config(), 1);
  EXPECT_GT(w.nbytes(), size_t{10} << 20);
  expect_error_naming([&] { w.get("lm_head.bias"); }, {"lm_head.bias", "seed 1"});
}

// ---- round trip -----------------------------------------------------------------------------

TEST_F(Checkpoint, RoundTripOverSeveralShards) {
  const json index = json::parse(read_bytes(golden_->path() / "model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GE(shards.size(), 3u);
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), weights_->nbytes());
  EXPECT_TRUE(shards.count(fmt::format("model-00001-of-{:05d}.safetensors", shards.size())));

  const Weights loaded = model::load_checkpoint(golden_->path());
  EXPECT_EQ(loaded.source, golden_->path().string());
  EXPECT_EQ(model::config_to_json(loaded.config()), model::config_to_json(weights_->config()));
  expect_same_weights(*weights_, loaded);
}

TEST_F(Checkpoint, SingleFileWithoutIndex) {
  const Weights w = model::random_weights(small_config(), 8);
  const fs::path dir = dir_.path() / "single";
  model::save_checkpoint(w, dir);  // one shard (4 GB limit)
  fs::remove(dir / "model.safetensors.index.json");
  fs::rename(dir / "model-00001-of-00001.safetensors", dir / "model.safetensors");
  expect_same_weights(w, model::load_checkpoint(dir));
}

TEST_F(Checkpoint, NormsMayBeStoredInFloat32) {
  const std::string name = "model.layers.0.self_attn.kv_a_layernorm.weight";
  const fs::path dir = save_edited([&](std::map<std::string, Tensor>& t) {
    Tensor f = Tensor::empty(t[name].sizes(), DType::f32);
    convert_bf16_to_f32(t[name].data<bf16>(), f.data<float>(), static_cast<size_t>(f.numel()));
    t[name] = f;
  });
  EXPECT_EQ(model::load_checkpoint(dir).get(name).dtype(), DType::f32);
}

TEST_F(Checkpoint, MultiTokenPredictionLayersAreSkipped) {
  // A real checkpoint holds layer n_layers (MTP) when num_nextn_predict_layers is 1.
  const std::string mtp = "model.layers.2.eh_proj.weight";
  const fs::path dir = save_edited([&](std::map<std::string, Tensor>& t) {
    t[mtp] = ref::randn({4, 4}, DType::bf16, 1);
  });
  expect_error_naming([&] { model::load_checkpoint(dir); }, {mtp});
  json config = json::parse(read_bytes(dir / "config.json"));
  config["num_nextn_predict_layers"] = 1;
  write_bytes(dir / "config.json", config.dump());
  const Weights w = model::load_checkpoint(dir);
  EXPECT_FALSE(w.contains(mtp));
  EXPECT_EQ(w.tensors().size(), weights_->tensors().size());
}

// ---- rejected checkpoints -------------------------------------------------------------------

TEST_F(Checkpoint, TruncatedShard) {
  const fs::path dir = copy();
  const std::string file = shard_of(dir, "lm_head.weight");
  fs::resize_file(dir / file, fs::file_size(dir / file) - 1);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, "lm_head.weight", "truncated"});
  fs::resize_file(dir / file, 5);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, "8-byte"});
}

TEST_F(Checkpoint, HeaderLengthPastTheEnd) {
  const fs::path dir = copy();
  const std::string file = shard_of(dir, "model.norm.weight");
  std::string bytes = read_bytes(dir / file);
  const uint64_t huge = bytes.size();
  std::memcpy(bytes.data(), &huge, 8);
  write_bytes(dir / file, bytes);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, "header length"});
}

TEST_F(Checkpoint, GarbageHeader) {
  const fs::path dir = copy();
  const std::string file = shard_of(dir, "model.norm.weight");
  RawFile raw = read_raw(dir / file);
  std::string text = raw.header.dump();
  text = text.substr(0, text.size() / 2) + std::string(text.size() - text.size() / 2, ' ');
  write_raw(dir / file, text, raw.data);  // the same length, cut off halfway
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, "JSON"});
}

TEST_F(Checkpoint, UnknownDtype) {
  const fs::path dir = copy();
  const std::string name = "model.layers.0.input_layernorm.weight";
  const std::string file = shard_of(dir, name);
  RawFile raw = read_raw(dir / file);
  raw.header[name]["dtype"] = "F7_E3M3";
  write_raw(dir / file, raw.header.dump(), raw.data);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, name, "F7_E3M3"});
}

TEST_F(Checkpoint, OffsetsOutOfRange) {
  const fs::path dir = copy();
  const std::string name = "model.norm.weight";
  const std::string file = shard_of(dir, name);
  RawFile raw = read_raw(dir / file);
  const uint64_t shift = raw.data.size();
  auto& offsets = raw.header[name]["data_offsets"];
  offsets = {offsets[0].get<uint64_t>() + shift, offsets[1].get<uint64_t>() + shift};
  write_raw(dir / file, raw.header.dump(), raw.data);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, name, "past the end"});
}

TEST_F(Checkpoint, OverlappingOffsets) {
  const fs::path dir = copy();
  const std::string a = "model.layers.1.self_attn.indexer.k_norm.weight";
  const std::string b = "model.layers.1.self_attn.indexer.k_norm.bias";
  const std::string file = shard_of(dir, a);
  ASSERT_EQ(file, shard_of(dir, b));
  RawFile raw = read_raw(dir / file);
  raw.header[b]["data_offsets"] = raw.header[a]["data_offsets"];
  write_raw(dir / file, raw.header.dump(), raw.data);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, "overlap"});
}

TEST_F(Checkpoint, OffsetsThatDisagreeWithTheShape) {
  const fs::path dir = copy();
  const std::string name = "model.norm.weight";
  const std::string file = shard_of(dir, name);
  RawFile raw = read_raw(dir / file);
  raw.header[name]["shape"] = {256};
  write_raw(dir / file, raw.header.dump(), raw.data);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file, name, "bytes"});
}

TEST_F(Checkpoint, MissingTensor) {
  const std::string name = "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv";
  const fs::path dir = save_edited([&](auto& t) { t.erase(name); });
  expect_error_naming([&] { model::load_checkpoint(dir); }, {name, "missing", dir.string()});
}

TEST_F(Checkpoint, ExtraTensor) {
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  const fs::path dir = save_edited([&](auto& t) { t[name] = ref::randn({8, 8}, DType::bf16, 2); });
  expect_error_naming([&] { model::load_checkpoint(dir); },
                      {name, "model-00001-of-00001.safetensors"});
}

TEST_F(Checkpoint, WrongDtype) {
  const std::string name = "model.layers.1.mlp.shared_experts.up_proj.weight";
  const fs::path dir =
      save_edited([&](auto& t) { t[name] = ref::randn(t[name].sizes(), DType::bf16, 2); });
  expect_error_naming([&] { model::load_checkpoint(dir); },
                      {name, "model-00001-of-00001.safetensors", "bfloat16"});
}

TEST_F(Checkpoint, WrongShape) {
  const std::string name = "model.layers.0.self_attn.o_proj.weight_scale_inv";
  const fs::path dir = save_edited([&](auto& t) {
    t[name] = ref::rand_uniform({4, 17}, DType::f32, 2, 0.5f, 1.0f);
  });
  expect_error_naming([&] { model::load_checkpoint(dir); },
                      {name, "model-00001-of-00001.safetensors", "[4, 17]"});
}

TEST_F(Checkpoint, MissingConfig) {
  const fs::path dir = copy();
  fs::remove(dir / "config.json");
  expect_error_naming([&] { model::load_checkpoint(dir); }, {"config.json"});
}

TEST_F(Checkpoint, IndexNamesAMissingShard) {
  const fs::path dir = copy();
  const std::string file = shard_of(dir, "lm_head.weight");
  fs::remove(dir / file);
  expect_error_naming([&] { model::load_checkpoint(dir); }, {file});
}

TEST_F(Checkpoint, IndexDisagreesWithTheShards) {
  const fs::path dir = copy();
  json index = json::parse(read_bytes(dir / "model.safetensors.index.json"));
  const std::string name = "model.norm.weight";
  const std::string other = shard_of(dir, "model.embed_tokens.weight");
  ASSERT_NE(index["weight_map"][name], other);
  index["weight_map"][name] = other;
  write_bytes(dir / "model.safetensors.index.json", index.dump());
  expect_error_naming([&] { model::load_checkpoint(dir); }, {name, other});
  index["weight_map"][name] = "../elsewhere.safetensors";
  write_bytes(dir / "model.safetensors.index.json", index.dump());
  expect_error_naming([&] { model::load_checkpoint(dir); }, {name, "elsewhere"});
}

TEST_F(Checkpoint, NoWeightsAtAll) {
  const fs::path dir = dir_.path() / "empty";
  fs::create_directories(dir);
  write_bytes(dir / "config.json", model::config_to_json(small_config()));
  expect_error_naming([&] { model::load_checkpoint(dir); }, {"model.safetensors", dir.string()});
}

// ---- the dsk program ------------------------------------------------------------------------

TEST(MakeCheckpoint, WritesTheRandomWeights) {
  if (!kProgram) GTEST_SKIP() << "the dsk program is not built (DSK_BUILD_TOOLS=OFF)";
  test::TempDir dir;
  const fs::path out = dir.path() / "tiny";
  std::string output;
  ASSERT_EQ(test::run_command(fmt::format("{} make-checkpoint --preset v32-tiny --seed 17 "
                                          "--shard-gb 0.02 {}",
                                          kProgram, out.string()),
                              &output),
            0)
      << output;
  EXPECT_NE(output.find("693 tensors"), std::string::npos) << output;
  const Weights loaded = model::load_checkpoint(out);
  const Config tiny = model::preset("v32-tiny");
  EXPECT_EQ(model::config_to_json(loaded.config()), model::config_to_json(tiny));
  expect_same_weights(model::random_weights(tiny, 17), loaded);
  const json index = json::parse(read_bytes(out / "model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GE(shards.size(), 4u);  // 68 MB in shards of at most 20 MB

  ASSERT_EQ(test::run_command(fmt::format("{} model-info {}", kProgram, out.string()), &output), 0)
      << output;
  EXPECT_NE(output.find("loaded and checked"), std::string::npos) << output;
  // Four layers are not the one layer `dsk bench --checkpoint` takes.
  EXPECT_EQ(test::run_command(fmt::format("{{ {} bench layer --list --checkpoint {} >/dev/null; }}",
                                          kProgram, out.string()),
                              &output),
            2);
  EXPECT_NE(output.find("--checkpoint"), std::string::npos) << output;
  EXPECT_NE(output.find("4 layers"), std::string::npos) << output;
}

TEST(MakeCheckpoint, LayersCutsTheModel) {
  if (!kProgram) GTEST_SKIP() << "the dsk program is not built (DSK_BUILD_TOOLS=OFF)";
  test::TempDir dir;
  std::string output;
  ASSERT_EQ(test::run_command(fmt::format("{} make-checkpoint --preset v32-tiny --layers 1 "
                                          "--seed 1 {}",
                                          kProgram, dir.path().string()),
                              &output),
            0)
      << output;
  const Config c = model::load_checkpoint(dir.path()).config();
  EXPECT_EQ(c.n_layers, 1);
  EXPECT_EQ(c.n_dense_layers, 0);  // the one layer is an MoE layer
  // ... which `dsk bench layer` accepts in place of the preset's random weights.
  EXPECT_EQ(test::run_command(
                fmt::format("{} bench layer --list --checkpoint {}", kProgram, dir.path().string()),
                &output),
            0)
      << output;
  // --dry-run prints the real layer's size and writes nothing.
  ASSERT_EQ(test::run_command(fmt::format("{} make-checkpoint --preset v32 --layers 1 --seed 1 "
                                          "--dry-run {}/none",
                                          kProgram, dir.path().string()),
                              &output),
            0)
      << output;
  EXPECT_NE(output.find("1568 tensors"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(dir.path() / "none"));
}

TEST(MakeCheckpoint, BadArgumentsAreOneErrorLine) {
  if (!kProgram) GTEST_SKIP() << "the dsk program is not built (DSK_BUILD_TOOLS=OFF)";
  test::TempDir dir;
  for (const std::string args : {"make-checkpoint --preset v99 --seed 1 x",
                                 "make-checkpoint --preset v32-tiny x",  // no seed
                                 "model-info /nonexistent/checkpoint"}) {
    std::string output;
    EXPECT_EQ(test::run_command(fmt::format("{{ {} {} >/dev/null; }}", kProgram, args), &output), 2)
        << args;
    EXPECT_EQ(output.rfind("dsk: ", 0), 0u) << output;
    EXPECT_EQ(output.find('\n'), output.size() - 1) << output;
  }
}

}  // namespace
}  // namespace dsk
