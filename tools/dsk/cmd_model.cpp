// `dsk make-checkpoint`: writes a random, well-formed DeepSeek-V3.2 checkpoint (config.json,
// safetensors shards, index) from a preset or a config.json, optionally cut to fewer layers.
// `dsk model-info`: the configuration and size of a checkpoint, a preset or a config.json.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <fmt/core.h>

#include <dsk/core/timer.hpp>
#include <dsk/model.hpp>

#include "commands.hpp"

namespace dsk::cli {
namespace {

struct ModelSource {
  std::string preset = "v32-tiny";
  std::string config_file;  // overrides the preset when given
  int layers = 0;           // 0: as configured
};

// --layers L keeps the first L layers, at most L - 1 of them dense, so `--preset v32 --layers 1`
// is one real-size MoE layer.
model::Config config_of(const ModelSource& s) {
  model::Config c =
      s.config_file.empty() ? model::preset(s.preset) : model::load_config(s.config_file);
  if (s.layers > 0) {
    c.n_layers = s.layers;
    c.n_dense_layers = std::min(c.n_dense_layers, s.layers - 1);
  }
  c.validate();
  return c;
}

int64_t checkpoint_bytes(const model::Config& c) {
  int64_t total = 0;
  for (const model::TensorSpec& s : model::checkpoint_tensors(c)) {
    int64_t n = static_cast<int64_t>(element_size(s.dtype));
    for (int64_t d : s.shape) n *= d;
    total += n;
  }
  return total;
}

std::string gb(int64_t bytes) {
  return fmt::format("{:.3f} GB", static_cast<double>(bytes) / 1e9);
}

void print_config(const model::Config& c) {
  fmt::print("model {}: {} layer{} ({} dense), dim {}, vocab {}\n", c.name, c.n_layers,
             c.n_layers == 1 ? "" : "s", c.n_dense_layers, c.dim, c.vocab_size);
  fmt::print(
      "  attention: {} heads, q_lora {}, kv_lora {}, qk {} + {}, v {}, softmax scale {:.10f}\n",
      c.n_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
      c.v_head_dim, c.softmax_scale());
  fmt::print("  indexer: {} heads x {}, top-k {}\n", c.index_n_heads, c.index_head_dim,
             c.index_topk);
  fmt::print("  MoE: {} routed + {} shared experts of {}, {} active, {} groups (top {}), {} x{}\n",
             c.n_routed_experts, c.n_shared_experts, c.moe_inter_dim, c.n_activated_experts,
             c.n_expert_groups, c.n_limited_groups, c.score_func, c.route_scale);
  fmt::print("  dense MLP {}, RoPE theta {} max_seq_len {} (YaRN factor {}, original {})\n",
             c.inter_dim, c.rope.rope_theta, c.rope.max_seq_len, c.rope.rope_factor,
             c.rope.original_seq_len);
  fmt::print("  checkpoint: {} tensors, {}\n", model::checkpoint_tensors(c).size(),
             gb(checkpoint_bytes(c)));
}

void add_source_options(CLI::App* cmd, ModelSource& s) {
  cmd->add_option("--preset", s.preset, "built-in configuration")
      ->check(CLI::IsMember(model::preset_names()))
      ->capture_default_str();
  cmd->add_option("--config", s.config_file, "a Hugging Face config.json (instead of --preset)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--layers", s.layers, "keep the first L layers (at most L - 1 dense)")
      ->check(CLI::Range(1, 1024));
}

struct MakeOptions {
  ModelSource source;
  uint64_t seed = 0;
  double shard_gb = 4.0;
  bool dry_run = false;
  std::string dir;
};

void make_checkpoint(const MakeOptions& o) {
  const model::Config config = config_of(o.source);
  print_config(config);
  if (o.dry_run) return;
  const auto shard_bytes = static_cast<int64_t>(std::llround(o.shard_gb * 1e9));
  Timer timer;
  model::write_random_checkpoint(config, o.seed, o.dir, std::max<int64_t>(shard_bytes, 1));
  const double seconds = timer.seconds();
  const int64_t bytes = checkpoint_bytes(config);
  fmt::print("wrote {}: {} tensors, {} in {:.1f} s ({:.2f} GB/s), seed {}\n", o.dir,
             model::checkpoint_tensors(config).size(), gb(bytes), seconds,
             static_cast<double>(bytes) / 1e9 / std::max(seconds, 1e-9), o.seed);
}

// A checkpoint directory is loaded (and so checked) in full; a preset or config only described.
void model_info(const ModelSource& source, const std::string& dir) {
  if (dir.empty()) {
    print_config(config_of(source));
    return;
  }
  Timer timer;
  const model::Weights w = model::load_checkpoint(dir);
  print_config(w.config());
  fmt::print("loaded and checked {}: {} tensors, {} in {:.2f} s\n", dir, w.tensors().size(),
             gb(static_cast<int64_t>(w.nbytes())), timer.seconds());
}

}  // namespace

void add_model_commands(CLI::App& app) {
  auto make = std::make_shared<MakeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "make-checkpoint", "write a random DeepSeek-V3.2 checkpoint (config.json + safetensors)");
  add_source_options(cmd, make->source);
  cmd->add_option("--seed", make->seed, "random seed (the same seed gives the same bytes)")
      ->required();
  cmd->add_option("--shard-gb", make->shard_gb, "largest shard size in GB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--dry-run", make->dry_run, "print the configuration and size, write nothing");
  cmd->add_option("dir", make->dir, "output directory")->required();
  cmd->callback([make] { make_checkpoint(*make); });

  auto info = std::make_shared<std::pair<ModelSource, std::string>>();
  CLI::App* info_cmd = app.add_subcommand(
      "model-info", "print the configuration and size of a checkpoint DIR, a preset or a config");
  add_source_options(info_cmd, info->first);
  info_cmd->add_option("dir", info->second, "checkpoint directory (loaded and checked)");
  info_cmd->callback([info] { model_info(info->first, info->second); });
}

}  // namespace dsk::cli
