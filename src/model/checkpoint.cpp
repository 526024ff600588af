// Checkpoints in the Hugging Face layout: config.json, safetensors shards and
// model.safetensors.index.json; saving, streaming random checkpoints, and checked loading.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dsk/model.hpp>

#include "model/safetensors.hpp"
#include "model/weights_internal.hpp"

namespace dsk::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kLoad = "dsk::model::load_checkpoint";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

std::string read_text(const fs::path& file, const char* fn) {
  std::ifstream in(file, std::ios::binary);
  DSK_CHECK(in.good(), fn, fmt::format("cannot open {}", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `text` to dir/name through a temporary file, so readers never see half a file.
void write_text(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path tmp = dir / (name + ".partial");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    DSK_CHECK(out.good(), "dsk::model::save_checkpoint",
              fmt::format("cannot write {}", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, dir / name, ec);
  DSK_CHECK(!ec, "dsk::model::save_checkpoint",
            fmt::format("cannot rename {} to {} ({})", tmp.string(), name, ec.message()));
}

int64_t spec_bytes(const TensorSpec& s) {
  return safetensors::data_bytes(s.dtype, s.shape);
}

// Writes the tensors of `specs` (in order) into shards of at most max_shard_bytes each (a larger
// tensor gets a shard of its own), then the index and config.json.
class CheckpointWriter {
 public:
  CheckpointWriter(const Config& config, fs::path dir, const std::vector<TensorSpec>& specs,
                   int64_t max_shard_bytes)
      : config_(config), dir_(std::move(dir)) {
    DSK_CHECK_ARG(max_shard_bytes >= 1, "dsk::model::save_checkpoint", "max_shard_bytes",
                  "a positive size", max_shard_bytes);
    std::error_code ec;
    fs::create_directories(dir_, ec);
    DSK_CHECK(!ec, "dsk::model::save_checkpoint",
              fmt::format("cannot create {} ({})", dir_.string(), ec.message()));
    int64_t in_shard = 0;
    for (const TensorSpec& s : specs) {
      if (shards_.empty() || (in_shard > 0 && in_shard + spec_bytes(s) > max_shard_bytes)) {
        shards_.emplace_back();
        in_shard = 0;
      }
      shards_.back().push_back(s);
      in_shard += spec_bytes(s);
      total_bytes_ += spec_bytes(s);
    }
  }

  // The next tensor of the plan.
  void write(const TensorSpec& spec, const Tensor& t) {
    if (!writer_) {
      DSK_CHECK(next_shard_ < shards_.size(), "dsk::model::save_checkpoint",
                fmt::format("tensor '{}' is not part of the checkpoint plan", spec.name));
      const std::string file = shard_name(next_shard_);
      writer_ = std::make_unique<safetensors::Writer>(
          dir_ / file, shards_[next_shard_], std::map<std::string, std::string>{{"format", "pt"}});
      for (const TensorSpec& s : shards_[next_shard_]) weight_map_[s.name] = file;
      ++next_shard_;
    }
    writer_->write(spec.name, t);
    if (writer_->done()) {
      writer_->finish();
      writer_.reset();
    }
  }

  void finish() {
    DSK_CHECK(!writer_ && next_shard_ == shards_.size(), "dsk::model::save_checkpoint",
              fmt::format("{}: finished before every shard was written", dir_.string()));
    write_text(dir_, "config.json", config_to_json(config_));
    const json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map_}};
    write_text(dir_, kIndexFile, index.dump(2) + "\n");
  }

 private:
  std::string shard_name(size_t i) const {
    return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards_.size());
  }

  const Config& config_;
  fs::path dir_;
  std::vector<std::vector<TensorSpec>> shards_;
  int64_t total_bytes_ = 0;
  size_t next_shard_ = 0;
  std::unique_ptr<safetensors::Writer> writer_;
  std::map<std::string, std::string> weight_map_;
};

// ---- loading --------------------------------------------------------------------------------

// name -> (tensor, file it came from).
struct Loaded {
  std::map<std::string, std::pair<Tensor, std::string>> tensors;
};

void add_file(Loaded& loaded, const fs::path& dir, const std::string& file) {
  safetensors::File f = safetensors::read(dir / file);
  for (auto& [name, t] : f.tensors) {
    const auto [it, inserted] = loaded.tensors.try_emplace(name, std::move(t), file);
    DSK_CHECK(inserted, kLoad,
              fmt::format("{}: tensor '{}' is in both {} and {}", dir.string(), name,
                          it->second.second, file));
  }
}

// A shard name from the index: a plain file name inside the checkpoint directory.
std::string shard_file(const fs::path& index_path, const std::string& name, const json& v) {
  const bool ok = v.is_string() && !v.get<std::string>().empty() &&
                  v.get<std::string>().find('/') == std::string::npos &&
                  v.get<std::string>() != "." && v.get<std::string>() != "..";
  DSK_CHECK(ok, kLoad,
            fmt::format("{}: tensor '{}': expected a file name in the checkpoint directory, got {}",
                        index_path.string(), name, v.dump()));
  return v.get<std::string>();
}

Loaded load_indexed(const fs::path& dir) {
  const fs::path index_path = dir / kIndexFile;
  const json index = json::parse(read_text(index_path, kLoad), nullptr, false);
  DSK_CHECK(
      !index.is_discarded() && index.is_object() && index.contains("weight_map") &&
          index["weight_map"].is_object(),
      kLoad,
      fmt::format("{}: expected a JSON object with a \"weight_map\" object", index_path.string()));
  std::map<std::string, std::string> weight_map;
  std::set<std::string> files;
  for (const auto& [name, v] : index["weight_map"].items()) {
    weight_map[name] = shard_file(index_path, name, v);
    files.insert(weight_map[name]);
  }
  Loaded loaded;
  for (const std::string& file : files) add_file(loaded, dir, file);
  // The index and the shards must agree, in both directions.
  for (const auto& [name, file] : weight_map) {
    const auto it = loaded.tensors.find(name);
    DSK_CHECK(it != loaded.tensors.end() && it->second.second == file, kLoad,
              fmt::format("{}: tensor '{}' is listed in {} but is not in {}", dir.string(), name,
                          kIndexFile, file));
  }
  for (const auto& [name, entry] : loaded.tensors)
    DSK_CHECK(weight_map.count(name), kLoad,
              fmt::format("{}: tensor '{}' in {} is not listed in {}", dir.string(), name,
                          entry.second, kIndexFile));
  return loaded;
}

// Norm weights and biases, the correction bias and the indexer's weights_proj are stored in
// bf16 or f32 depending on the converter; either is accepted.
bool dtype_accepted(const TensorSpec& spec, DType got) {
  if (got == spec.dtype) return true;
  const std::string& n = spec.name;
  const auto ends_with = [&](std::string_view s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  const bool either = ends_with("norm.weight") || ends_with("norm.bias") ||
                      ends_with("e_score_correction_bias") || ends_with("weights_proj.weight");
  return either && (got == DType::bf16 || got == DType::f32);
}

// Layers after the last one (the multi-token-prediction layers of a real checkpoint,
// num_nextn_predict_layers of them) are not part of the forward and are not loaded.
int mtp_layers(const fs::path& config_file) {
  const json j = json::parse(read_text(config_file, kLoad), nullptr, false);
  if (j.is_discarded() || !j.contains("num_nextn_predict_layers")) return 0;
  const json& v = j["num_nextn_predict_layers"];
  return v.is_number_unsigned() ? static_cast<int>(std::min<uint64_t>(v.get<uint64_t>(), 64)) : 0;
}

bool is_mtp_tensor(const std::string& name, const Config& c, int mtp) {
  for (int layer = c.n_layers; layer < c.n_layers + mtp; ++layer)
    if (name.rfind(fmt::format("model.layers.{}.", layer), 0) == 0) return true;
  return false;
}

Weights check_against_config(Loaded loaded, const Config& config, const fs::path& dir, int mtp) {
  Weights w(config);
  w.source = dir.string();
  for (const TensorSpec& spec : checkpoint_tensors(config)) {
    const auto it = loaded.tensors.find(spec.name);
    DSK_CHECK(it != loaded.tensors.end(), kLoad,
              fmt::format("{}: tensor '{}' ({}{}) is missing", dir.string(), spec.name,
                          dtype_name(spec.dtype), detail::to_text(spec.shape)));
    const auto& [t, file] = it->second;
    DSK_CHECK(dtype_accepted(spec, t.dtype()) && t.sizes() == spec.shape, kLoad,
              fmt::format("{}: tensor '{}' in {}: expected {}{}, got {}", dir.string(), spec.name,
                          file, dtype_name(spec.dtype), detail::to_text(spec.shape), t.describe()));
    w.set(spec.name, t);
    loaded.tensors.erase(it);
  }
  for (const auto& [name, entry] : loaded.tensors)
    DSK_CHECK(is_mtp_tensor(name, config, mtp), kLoad,
              fmt::format("{}: tensor '{}' in {} is not part of a checkpoint of this config",
                          dir.string(), name, entry.second));
  return w;
}

// The tensors of `weights` in checkpoint order; tensors the config does not name go last.
std::vector<TensorSpec> specs_of(const Weights& weights) {
  std::vector<TensorSpec> specs;
  std::set<std::string> listed;
  for (const TensorSpec& s : checkpoint_tensors(weights.config()))
    if (weights.contains(s.name)) {
      const Tensor& t = weights.get(s.name);
      specs.push_back({s.name, t.dtype(), t.sizes()});
      listed.insert(s.name);
    }
  for (const auto& [name, t] : weights.tensors())
    if (!listed.count(name)) specs.push_back({name, t.dtype(), t.sizes()});
  return specs;
}

}  // namespace

void save_checkpoint(const Weights& weights, const fs::path& dir, int64_t max_shard_bytes) {
  const std::vector<TensorSpec> specs = specs_of(weights);
  CheckpointWriter writer(weights.config(), dir, specs, max_shard_bytes);
  for (const TensorSpec& s : specs) writer.write(s, weights.get(s.name));
  writer.finish();
}

void write_random_checkpoint(const Config& config, uint64_t seed, const fs::path& dir,
                             int64_t max_shard_bytes) {
  CheckpointWriter writer(config, dir, checkpoint_tensors(config), max_shard_bytes);
  for_each_random_tensor_in_order(
      config, seed, [&](const TensorSpec& spec, const Tensor& t) { writer.write(spec, t); });
  writer.finish();
}

Weights load_checkpoint(const fs::path& dir) {
  const fs::path config_file = dir / "config.json";
  DSK_CHECK(fs::is_regular_file(config_file), kLoad,
            fmt::format("{}: no config.json in the checkpoint directory", config_file.string()));
  const Config config = load_config(config_file);
  Loaded loaded;
  if (fs::exists(dir / kIndexFile)) {
    loaded = load_indexed(dir);
  } else {
    DSK_CHECK(fs::is_regular_file(dir / kSingleFile), kLoad,
              fmt::format("{}: neither {} nor {} is in the checkpoint directory", dir.string(),
                          kIndexFile, kSingleFile));
    add_file(loaded, dir, kSingleFile);
  }
  return check_against_config(std::move(loaded), config, dir, mtp_layers(config_file));
}

}  // namespace dsk::model
