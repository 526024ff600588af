// The "layer" module of `dsk bench` (`dsk bench layer`, issue 8): one MoE layer of DeepSeek-V3.2
// (preset "v32-tiny" or "v32", random weights) run by dsk::model::Model, timed for decode at batch
// 1 over a cached context and for a chunked prefill, and split by op (Model::op_seconds). Decode is
// bounded by DRAM reads (the weights one token uses plus the KV cache it reads), prefill by the
// bf16 compute roof (amx_bf16, else avx512_bf16) over the layer's FLOPs. docs/model.md describes
// the cases and how their work is counted. With set_layer_checkpoint (`dsk bench --checkpoint
// DIR`), the preset of the checkpoint's dimensions reads its weights from that one-layer checkpoint
// (memory-mapped) instead of generating them, so a real-size layer fits in less memory.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/check.hpp>
#include <dsk/core/cpu.hpp>
#include <dsk/model.hpp>

#include "bench/cases/layer.hpp"
#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

// ---- what runs --------------------------------------------------------------------------------

// One preset's runs: decode steps at a context of [context, context + drift) cached tokens (the
// sequence is rebuilt, untimed, when it reaches the end of that window: the cache cannot be cut
// back), and a prefill of prefill_tokens in chunks of chunk_tokens (the Model's max_batch_tokens;
// --prefill-chunk overrides it). v32 prefills its 2048 tokens in one step by default: in chunks
// of 512 every chunk streams all 11.3 GB of routed-expert weights for about 16 rows per expert.
struct Plan {
  const char* preset;
  int64_t context;
  int64_t drift;
  int64_t prefill_tokens;
  int64_t chunk_tokens;
  bool quick;
};

constexpr Plan kPlans[] = {{"v32-tiny", 256, 32, 512, 512, true},
                           {"v32", 2048, 128, 2048, 2048, false}};

enum class Phase { decode, prefill };

const char* phase_name(Phase phase) {
  return phase == Phase::decode ? "decode" : "prefill";
}

// The ops of a MoE layer in forward order (Model::op_seconds names; "head" is outside the layer).
constexpr const char* kOps[] = {"norm",        "attn.q",      "attn.kv",    "indexer",
                                "attn.absorb", "attn.mla",    "attn.out",   "moe.gate",
                                "moe.shared",  "moe.experts", "moe.combine"};

// The preset's dimensions with one MoE layer. The vocabulary is cut to 4096: the embedding and the
// head are not part of the layer, and at the real size they would cost 3.7 GB.
model::Config preset_layer_config(const Plan& plan) {
  model::Config c = model::preset(plan.preset);
  c.n_layers = 1;
  c.n_dense_layers = 0;
  c.vocab_size = 4096;
  return c;
}

// The checkpoint set by set_layer_checkpoint and its configuration.
struct LayerCheckpoint {
  std::filesystem::path dir;
  model::Config config;
};
std::optional<LayerCheckpoint> g_checkpoint;
std::optional<int64_t> g_prefill_chunk;  // --prefill-chunk

// The prefill's tokens per step: the plan's, or --prefill-chunk (at most the whole prefill).
int64_t chunk_tokens(const Plan& plan) {
  return std::min(plan.prefill_tokens, g_prefill_chunk.value_or(plan.chunk_tokens));
}

// Whether `c` has the layer shapes of preset `plan` (the vocabulary aside).
bool same_layer(const model::Config& c, const Plan& plan) {
  model::Config want = preset_layer_config(plan), got = c;
  want.vocab_size = got.vocab_size = 0;
  want.name = got.name = "";
  return model::config_to_json(want) == model::config_to_json(got);
}

const LayerCheckpoint* checkpoint_for(const Plan& plan) {
  return g_checkpoint && same_layer(g_checkpoint->config, plan) ? &*g_checkpoint : nullptr;
}

model::Config layer_config(const Plan& plan) {
  if (const LayerCheckpoint* ck = checkpoint_for(plan)) return ck->config;
  return preset_layer_config(plan);
}

// ---- work of the layer --------------------------------------------------------------------------

struct Work {
  double flops = 0;
  double bytes = 0;
};
using OpWork = std::map<std::string, Work>;

constexpr double kMlaTokenBytes = 656;      // FP8 latent + scales + bf16 rope, per token
constexpr double kIndexerTokenBytes = 132;  // FP8 key + f32 scale, per token

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// The op that reads a checkpoint tensor of the layer; "" for those outside it (embedding, final
// norm, head) and for kv_b_proj, which the Model reads as the bf16 absorbed W_UK / W_UV.
std::string op_of_tensor(const std::string& name) {
  if (!contains(name, "model.layers.0.") || contains(name, "kv_b_proj")) return "";
  if (contains(name, "layernorm.weight") && !contains(name, "self_attn.")) return "norm";
  if (contains(name, "indexer.")) return "indexer";
  if (contains(name, "q_a_") || contains(name, "q_b_proj")) return "attn.q";
  if (contains(name, "kv_a_")) return "attn.kv";
  if (contains(name, "o_proj")) return "attn.out";
  if (contains(name, "mlp.gate.")) return "moe.gate";
  if (contains(name, "shared_experts.")) return "moe.shared";
  if (contains(name, "mlp.experts.")) return "moe.experts";
  return "";
}

double spec_bytes(const model::TensorSpec& s) {
  double n = 1;
  for (int64_t d : s.shape) n *= static_cast<double>(d);
  return n * static_cast<double>(element_size(s.dtype));
}

// Bytes of the layer's checkpoint tensors by the op that reads them (every routed expert counted).
std::map<std::string, double> weight_bytes_by_op(const model::Config& c) {
  std::map<std::string, double> bytes;
  for (const model::TensorSpec& s : model::checkpoint_tensors(c))
    if (const std::string op = op_of_tensor(s.name); !op.empty()) bytes[op] += spec_bytes(s);
  return bytes;
}

// The work of one forward pass of `tokens` tokens appended at positions [start, start + tokens)
// of one sequence, each weight read once (the routed experts: those the pass can route to, at
// most tokens x n_activated) and each cached token read at most once.
OpWork pass_work(const model::Config& c, int64_t start, int64_t tokens) {
  const double T = static_cast<double>(tokens), dim = static_cast<double>(c.dim);
  const double h = c.n_heads, q_lora = static_cast<double>(c.q_lora_rank);
  const double lat = static_cast<double>(c.kv_lora_rank), rope = c.qk_rope_head_dim;
  const double nope = static_cast<double>(c.qk_nope_head_dim), v = c.v_head_dim;
  const double hi = c.index_n_heads, di = static_cast<double>(c.index_head_dim);
  const double experts = c.n_routed_experts, k = c.n_activated_experts;
  const double inter = static_cast<double>(c.moe_inter_dim);
  // Causal keys: the indexer scores every earlier token, MLA attends to at most index_topk.
  double indexer_keys = 0, mla_keys = 0;
  for (int64_t p = start; p < start + tokens; ++p) {
    indexer_keys += static_cast<double>(p + 1);
    mla_keys += static_cast<double>(std::min(p + 1, c.index_topk));
  }
  const double cached = static_cast<double>(start + tokens);
  const double mla_read = std::min(cached, T * static_cast<double>(c.index_topk));
  const double experts_read = std::min(experts, T * k);

  std::map<std::string, double> w = weight_bytes_by_op(c);
  OpWork work;
  work["norm"] = {0, w["norm"] + 12 * T * dim};  // x, residual and sum in, out: bf16
  work["attn.q"] = {2 * T * (q_lora * dim + h * (nope + rope) * q_lora), w["attn.q"]};
  work["attn.kv"] = {2 * T * (lat + rope) * dim, w["attn.kv"] + T * kMlaTokenBytes};
  work["indexer"] = {2 * T * (hi * di * q_lora + di * dim + hi * dim) + 2 * hi * di * indexer_keys,
                     w["indexer"] + (cached + T) * kIndexerTokenBytes};
  work["attn.absorb"] = {2 * T * h * nope * lat, h * nope * lat * 2};
  work["attn.mla"] = {2 * h * (lat + rope + lat) * mla_keys, mla_read * kMlaTokenBytes};
  work["attn.out"] = {2 * T * h * (lat * v + v * dim), h * v * lat * 2 + w["attn.out"]};
  work["moe.gate"] = {2 * T * experts * dim, w["moe.gate"]};
  work["moe.experts"] = {2 * T * k * 3 * inter * dim, w["moe.experts"] * experts_read / experts};
  work["moe.shared"] = {2 * T * 3 * inter * c.n_shared_experts * dim, w["moe.shared"]};
  work["moe.combine"] = {0, 2 * (T * k + 2 * T) * dim};  // expert rows and shared in, out: bf16
  return work;
}

// Decode: one step at the middle of the context window. Prefill: the chunks of one sequence.
OpWork phase_work(const model::Config& c, const Plan& plan, Phase phase) {
  if (phase == Phase::decode) return pass_work(c, plan.context + plan.drift / 2, 1);
  OpWork total;
  for (int64_t start = 0; start < plan.prefill_tokens; start += chunk_tokens(plan))
    for (const auto& [op, w] :
         pass_work(c, start, std::min(chunk_tokens(plan), plan.prefill_tokens - start))) {
      total[op].flops += w.flops;
      total[op].bytes += w.bytes;
    }
  return total;
}

Work layer_work(const OpWork& ops) {
  Work sum;
  for (const auto& [op, w] : ops) {
    sum.flops += w.flops;
    sum.bytes += w.bytes;
  }
  return sum;
}

// ---- memory ---------------------------------------------------------------------------------

// /proc/meminfo's MemAvailable in bytes; 0 when it cannot be read.
double available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}

// Peak memory of building the layer: the random weights (none from a checkpoint: its pages are
// memory-mapped and reclaimable), and the Model's packed copy of the experts
// (gemm::stack_packed_weights groups the experts packed one by one, so the raw weights are never
// stacked), the activations of one step of the prefill's chunk (the Model's own estimate), plus
// 1 GiB for the rest (attention packing, cache).
double build_bytes(const Plan& plan) {
  const model::Config c = layer_config(plan);
  double weights = 0;
  if (!checkpoint_for(plan))
    for (const model::TensorSpec& s : model::checkpoint_tensors(c)) weights += spec_bytes(s);
  return weights + weight_bytes_by_op(c)["moe.experts"] +
         double(model::step_workspace_bytes(c, chunk_tokens(plan))) + double(int64_t{1} << 30);
}

// ---- the shared model -----------------------------------------------------------------------

using OpSeconds = std::map<std::string, double>;

// Seconds of the layer's ops in one call (the head, outside the layer, is left out).
double layer_seconds(const OpSeconds& ops) {
  double s = 0;
  for (const char* op : kOps)
    if (auto it = ops.find(op); it != ops.end()) s += it->second;
  return s;
}

// One preset's model and decode sequence, shared by the cases of that preset, and the op seconds
// of every call the layer cases timed (the op cases report their medians).
class LayerRun {
 public:
  explicit LayerRun(const Plan& plan) : plan_(plan), rng_(fresh_rng()()) {
    const model::Config config = layer_config(plan);
    const int64_t pages = (plan.context + plan.drift + 63) / 64 + (plan.prefill_tokens + 63) / 64;
    const LayerCheckpoint* checkpoint = checkpoint_for(plan);
    model_ = std::make_unique<model::Model>(
        checkpoint ? model::load_checkpoint(checkpoint->dir)
                   : model::random_weights(config, rng_()),
        model::Model::Options{.kv_cache_pages = pages + 2, .max_batch_tokens = chunk_tokens(plan)});
  }

  const Plan& plan() const { return plan_; }
  std::vector<OpSeconds>& calls(Phase phase) { return calls_[phase]; }

  // One timed call of the phase: a decode step, or a whole prefill; returns its op seconds.
  OpSeconds run(Phase phase) { return phase == Phase::decode ? decode_step() : prefill(); }

 private:
  std::vector<int32_t> random_tokens(int64_t n) {
    std::uniform_int_distribution<int32_t> id(
        0, static_cast<int32_t>(model_->config().vocab_size) - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t& t : tokens) t = id(rng_);
    return tokens;
  }

  void append(int64_t seq, const std::vector<int32_t>& tokens) {
    for (size_t start = 0; start < tokens.size();
         start += static_cast<size_t>(chunk_tokens(plan_))) {
      const size_t n = std::min(tokens.size() - start, static_cast<size_t>(chunk_tokens(plan_)));
      const model::StepItem item{seq, {tokens.data() + start, n}};
      model_->forward({&item, 1});
    }
  }

  OpSeconds decode_step() {
    if (decode_seq_ < 0 || model_->sequence_length(decode_seq_) >= plan_.context + plan_.drift) {
      if (decode_seq_ >= 0) model_->free_sequence(decode_seq_);
      decode_seq_ = model_->add_sequence();
      append(decode_seq_, random_tokens(plan_.context));
    }
    model_->reset_op_seconds();
    append(decode_seq_, random_tokens(1));
    return model_->op_seconds();
  }

  OpSeconds prefill() {
    const int64_t seq = model_->add_sequence();
    const std::vector<int32_t> tokens = random_tokens(plan_.prefill_tokens);
    model_->reset_op_seconds();
    append(seq, tokens);
    model_->free_sequence(seq);
    return model_->op_seconds();
  }

  Plan plan_;
  std::mt19937_64 rng_;
  std::unique_ptr<model::Model> model_;
  int64_t decode_seq_ = -1;
  std::map<Phase, std::vector<OpSeconds>> calls_;
};

std::mutex g_run_mutex;
std::shared_ptr<LayerRun> g_run;  // the preset whose cases ran last; one real layer is 12 GB

std::shared_ptr<LayerRun> cached_run(const Plan& plan) {
  const std::lock_guard<std::mutex> lock(g_run_mutex);
  return g_run && std::strcmp(g_run->plan().preset, plan.preset) == 0 ? g_run : nullptr;
}

std::shared_ptr<LayerRun> layer_run(const Plan& plan) {
  if (auto run = cached_run(plan)) return run;
  const std::lock_guard<std::mutex> lock(g_run_mutex);
  g_run.reset();  // the previous preset's model goes before the next is built
  g_run = std::make_shared<LayerRun>(plan);
  return g_run;
}

// Why this machine cannot build the preset's layer, or "".
std::string memory_shortfall(const Plan& plan) {
  if (cached_run(plan)) return "";
  const double need = build_bytes(plan), have = available_memory_bytes();
  if (have <= 0 || need <= have) return "";
  return fmt::format("needs {:.0f} GB to build, {:.0f} GB free", need * 1e-9, have * 1e-9);
}

// The median of the op's seconds over the calls a layer case timed, its first two (the runner's
// least warm-up) left out when there are more.
double median_op_seconds(const std::vector<OpSeconds>& calls, const std::string& op) {
  std::vector<double> s;
  for (size_t i = calls.size() > 4 ? 2 : 0; i < calls.size(); ++i) {
    const auto it = calls[i].find(op);
    s.push_back(it == calls[i].end() ? 0.0 : it->second);
  }
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
  return s[s.size() / 2];
}

// ---- cases ------------------------------------------------------------------------------------

std::string shape_text(const Plan& plan, Phase phase) {
  if (phase == Phase::decode)
    return fmt::format("b=1 ctx={}..{}", plan.context, plan.context + plan.drift - 1);
  return fmt::format("tokens={} chunk={}", plan.prefill_tokens, chunk_tokens(plan));
}

BenchCase base_case(const Plan& plan, Phase phase, const std::string& op) {
  const model::Config config = layer_config(plan);
  const Work work = op.empty() ? layer_work(phase_work(config, plan, phase))
                               : phase_work(config, plan, phase).at(op);
  // Sparse MLA does 2 h (576 + 512) flops per 656-byte key read: compute-bound even in decode.
  const bool memory_bound = (phase == Phase::decode && op != "attn.mla") || op == "norm";
  // Weights beyond the last-level cache stream from DRAM on every call.
  double weights = 0;
  for (const auto& [name, bytes] : weight_bytes_by_op(config)) weights += bytes;
  const bool cold = weights > 2.0 * static_cast<double>(last_level_cache_bytes());
  std::string name = fmt::format("{} {}", phase_name(phase), plan.preset);
  if (!op.empty()) name += " " + op;
  return {.name = name,
          .shape = shape_text(plan, phase),
          .ceiling = memory_bound ? "dram_read" : bf16_roof(),
          .residency = cold ? Residency::cold : Residency::hot,
          .quick = plan.quick,
          .unavailable = [plan] { return memory_shortfall(plan); },
          .prepare =
              [work](const CaseContext&) {
                Prepared p;
                p.flops = work.flops;
                p.bytes = work.bytes;
                return p;
              }};
}

// The whole layer: every call is a real step (or prefill), timed by the runner; the op seconds of
// each call are kept for the op cases.
BenchCase layer_case(const Plan& plan, Phase phase) {
  BenchCase c = base_case(plan, phase, "");
  c.prepare = [plan, phase, prepare = c.prepare](const CaseContext& ctx) {
    Prepared p = prepare(ctx);
    const std::shared_ptr<LayerRun> run = layer_run(plan);
    run->calls(phase).clear();
    p.timed_kernel = [run, phase](int) {
      run->calls(phase).push_back(run->run(phase));
      return layer_seconds(run->calls(phase).back());
    };
    return p;
  };
  return c;
}

// One op of the layer: the median of its seconds over the calls the layer case just timed (so the
// split adds up over the same steps instead of timing every op again), or over five calls of its
// own when the layer case did not run (a --filter that left it out). The runner's repetitions of
// these rows only re-read that median.
BenchCase op_case(const Plan& plan, Phase phase, const std::string& op) {
  BenchCase c = base_case(plan, phase, op);
  c.prepare = [plan, phase, op, prepare = c.prepare](const CaseContext& ctx) {
    Prepared p = prepare(ctx);
    const std::shared_ptr<LayerRun> run = layer_run(plan);
    while (run->calls(phase).size() < 5) run->calls(phase).push_back(run->run(phase));
    const double seconds = median_op_seconds(run->calls(phase), op);
    p.timed_kernel = [seconds](int) { return seconds; };
    return p;
  };
  return c;
}

}  // namespace

void register_layer_cases(Registry& r) {
  for (const Plan& plan : kPlans)
    for (Phase phase : {Phase::decode, Phase::prefill}) {
      r.add(layer_case(plan, phase));
      for (const char* op : kOps) r.add(op_case(plan, phase, op));
    }
}

void set_layer_checkpoint(const std::filesystem::path& dir) {
  const model::Config config = model::load_config(dir / "config.json");
  bool known = false;
  for (const Plan& plan : kPlans) known = known || same_layer(config, plan);
  std::string presets;
  for (const Plan& plan : kPlans) presets += std::string(presets.empty() ? "" : ", ") + plan.preset;
  DSK_CHECK_ARG(known, "bench", "--checkpoint",
                "a checkpoint of one MoE layer of a preset (" + presets +
                    "): dsk make-checkpoint --preset v32 --layers 1 DIR",
                dir.string() + " (" + std::to_string(config.n_layers) + " layers, dim " +
                    std::to_string(config.dim) + ")");
  g_checkpoint = LayerCheckpoint{dir, config};
}

void set_layer_prefill_chunk(int64_t tokens) {
  DSK_CHECK_ARG(tokens >= 1, "bench", "--prefill-chunk", "a positive number of tokens", tokens);
  g_prefill_chunk = tokens;
}

}  // namespace dsk::bench
