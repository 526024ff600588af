// dsk::model — the DeepSeek-V3.2 layer path on the library's kernels (spec/attention.md §5):
// configuration, weights in the upstream (Hugging Face) checkpoint layout, safetensors checkpoints,
// the paged KV cache and the model forward (docs/model.md).
//
// Tensor names, dtypes and shapes are those of the Hugging Face DeepSeek-V3.2 checkpoint
// ("model.layers.3.self_attn.q_a_proj.weight", FP8 e4m3 linear weights with f32
// "...weight_scale_inv" of one scale per 128 x 128 block), so a real checkpoint and one written by
// `dsk make-checkpoint` are read by the same code.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <dsk/core/tensor.hpp>
#include <dsk/ep.hpp>
#include <dsk/tk.hpp>

namespace dsk::model {

// ---- configuration --------------------------------------------------------------------------

// The model's dimensions (spec/attention.md §5.1) under the demo's ModelArgs names; the Hugging
// Face config.json keys are mapped in config_from_json / config_to_json.
struct Config {
  std::string name = "v32";  // preset name, or the file it was read from
  int64_t vocab_size = 129280;
  int64_t dim = 7168;
  int64_t inter_dim = 18432;     // dense MLP of the first n_dense_layers layers
  int64_t moe_inter_dim = 2048;  // each routed and shared expert
  int n_layers = 61;
  int n_dense_layers = 3;
  int n_heads = 128;
  int64_t q_lora_rank = 1536;
  int64_t kv_lora_rank = 512;  // must be 512: the 576/512 attention contract
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;  // must be 64
  int64_t v_head_dim = 128;
  int n_routed_experts = 256;
  int n_shared_experts = 1;
  int n_activated_experts = 8;
  int n_expert_groups = 8;
  int n_limited_groups = 4;
  double route_scale = 2.5;
  std::string score_func = "sigmoid";
  int index_n_heads = 64;        // a multiple of 4, at most 128
  int64_t index_head_dim = 128;  // must be 128 (Hadamard size; rope 64 | nope 64)
  int64_t index_topk = 2048;
  double rms_norm_eps = 1e-6;
  tk::RopeConfig rope;  // YaRN: theta 10000, factor 40, original 4096, beta 32 / 1, max_seq_len
  double rope_mscale = 1.0;  // rope_scaling.mscale: softmax mscale = 0.1 * this * ln(factor) + 1

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // 192^-0.5 * mscale^2 when YaRN is on (max_seq_len > original_seq_len), else 192^-0.5.
  double softmax_scale() const;
  bool is_moe_layer(int layer) const { return layer >= n_dense_layers; }
  // Raises dsk::Error naming the field when a dimension is outside what the kernels support.
  void validate() const;
};

// "v32": the real 671B dimensions. "v32-tiny": the same structure (MLA 576/512, indexer, dense
// first layer, group-limited MoE with a shared expert) small enough for a decode step of the whole
// model well under a second on 2 cores.
Config preset(std::string_view name);
std::vector<std::string> preset_names();

// A Hugging Face config.json (text) -> Config; unknown keys are ignored, a missing or mistyped
// required key raises dsk::Error naming it and `source`.
Config config_from_json(std::string_view json_text, std::string_view source = "config.json");
Config load_config(const std::filesystem::path& file);
std::string config_to_json(const Config& config);

// ---- weights --------------------------------------------------------------------------------

// One tensor of a checkpoint: name, dtype and shape as the upstream checkpoint stores them.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};
// Every tensor a checkpoint of `config` holds, in a fixed order (embedding, layers, norm, head).
std::vector<TensorSpec> checkpoint_tensors(const Config& config);

// Named tensors in the upstream layout, owning (random_weights) or memory-mapped
// (load_checkpoint); copies share the tensors.
class Weights {
 public:
  Weights() = default;
  explicit Weights(Config config) : config_(std::move(config)) {}
  const Config& config() const { return config_; }
  // dsk::Error naming the tensor (and the checkpoint) when absent.
  const Tensor& get(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  void set(const std::string& name, Tensor tensor) { tensors_[name] = std::move(tensor); }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  size_t nbytes() const;
  std::string source = "(in memory)";  // the checkpoint directory, for error messages

 private:
  Config config_;
  std::map<std::string, Tensor> tensors_;
};

// The tensor `spec` of a random, well-formed checkpoint: deterministic in (seed, spec.name), scaled
// so activations stay O(1) through the layers (linear weights ~ N(0, 1/fan_in) quantized to FP8
// with 128 x 128 block scales, norm weights near 1, small correction biases).
Tensor random_tensor(const Config& config, const TensorSpec& spec, uint64_t seed);
Weights random_weights(const Config& config, uint64_t seed);

// ---- checkpoints (safetensors) --------------------------------------------------------------

// Writes config.json, model-0000k-of-0000n.safetensors shards of at most max_shard_bytes and
// model.safetensors.index.json. write_random_checkpoint makes each tensor with random_tensor and
// writes it before making the next, so a checkpoint larger than memory can be written.
void save_checkpoint(const Weights& weights, const std::filesystem::path& dir,
                     int64_t max_shard_bytes = int64_t{4} << 30);
void write_random_checkpoint(const Config& config, uint64_t seed, const std::filesystem::path& dir,
                             int64_t max_shard_bytes = int64_t{4} << 30);
// Reads dir/config.json and the shards (memory-mapped), and checks them against
// checkpoint_tensors: a missing or extra tensor, a wrong dtype or shape, a truncated or corrupt
// file raises dsk::Error naming the tensor and the file.
Weights load_checkpoint(const std::filesystem::path& dir);

// ---- the model on the kernels ---------------------------------------------------------------

// One forward step's work for one sequence: `tokens` are appended at positions
// [cached length, cached length + tokens.size()) (prefill: many, decode: one).
struct StepItem {
  int64_t seq = 0;
  std::span<const int32_t> tokens;
};

// An upper estimate of the activations of one forward step of `max_batch_tokens` tokens through a
// model of `config` (MemoryBudget::workspace): what a caller must leave free besides the weights.
int64_t step_workspace_bytes(const Config& config, int64_t max_batch_tokens);

// The memory a served model needs: M_total = weights + KV cache + workspace + communication +
// reserve (seeds/000: the budget a deployment plans before admitting requests).
struct MemoryBudget {
  int64_t weights = 0;        // packed weights and the tensors the forward keeps
  int64_t kv_cache = 0;       // the paged cache's pages (all layers)
  int64_t workspace = 0;      // activations of the largest step (max_batch_tokens)
  int64_t communication = 0;  // EP buffers (0 on one rank)
  int64_t reserve = 0;        // allocator slack and small tensors
  int64_t total() const { return weights + kv_cache + workspace + communication + reserve; }
  // "weights 1.2 GiB + KV 0.5 GiB (256 pages) + ... = 2.0 GiB"
  std::string describe() const;
};

// The discrete choices of one forward step in one layer, rows in the order of the step's tokens:
// what a cross-check compares as sets (with a tie tolerance) and can replay in the reference.
struct LayerDecisions {
  Tensor experts;    // int64 [T, n_activated_experts]: the routed experts (MoE layers only)
  Tensor positions;  // int32 [T, index_topk]: the positions the indexer chose, -1 padded
};

// The V3.2 forward on dsk's kernels: weights pre-packed once, a paged FP8 KV cache (pages of 64
// tokens: 656-byte MLA tokens and 132-byte indexer tokens per layer), sequences added and freed.
class Model {
 public:
  struct Options {
    int64_t kv_cache_pages = 256;  // pages of 64 tokens, shared by all sequences
    // When > 0, the cache gets every page that fits in memory_limit once the rest of the budget
    // (for steps of up to max_batch_tokens tokens) is counted, instead of kv_cache_pages; a limit
    // that leaves no page raises dsk::Error.
    int64_t memory_limit = 0;
    int64_t max_batch_tokens = 512;
    // Expert parallelism over a group of ranks (data-parallel attention, DeepSeek's serving
    // layout): every rank keeps the attention, the dense layers and the shared experts, and rank r
    // of R keeps the routed experts [r * E / R, (r + 1) * E / R). Each MoE layer dispatches its
    // tokens with an ep::Buffer (FP8, expand mode), runs the shared expert while the rows travel,
    // and combines with the shared expert's output as the bias, reducing once in top-k slot order:
    // a rank's logits equal those of a single-rank Model given the same sequences, bit for bit.
    // Constructing the Model and every forward call are then collective over the group: all ranks
    // call forward equally often, a rank with no work passing no items. The Model keeps a copy.
    const ep::Communicator* expert_parallel = nullptr;
  };
  Model(const Weights& weights, Options options);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const Config& config() const;
  // A new, empty sequence; its cache pages are taken as tokens arrive and given back by free.
  int64_t add_sequence();
  void free_sequence(int64_t seq);
  int64_t sequence_length(int64_t seq) const;
  int64_t free_pages() const;
  int64_t total_pages() const;
  int64_t max_batch_tokens() const;  // the step size the workspace was planned for
  const MemoryBudget& memory_budget() const;

  // The expert-parallel group (Options::expert_parallel), or null on a single rank.
  const ep::Communicator* expert_parallel_group() const;

  // Runs the items as one batch; returns f32 [items.size(), vocab_size], the logits of each item's
  // last token. Raises dsk::Error (and changes nothing) when the cache cannot hold the tokens.
  // Items may be empty only with expert parallelism (the rank then serves its peers' experts).
  Tensor forward(std::span<const StepItem> items);

  // Wall seconds spent in each op ("attn.q", "indexer", "attn.mla", "moe.experts", ...) by the
  // forward calls since the last reset: the per-op split of `dsk demo` and `dsk bench layer`.
  std::map<std::string, double> op_seconds() const;
  void reset_op_seconds();

  // With recording on, last_decisions() holds the decisions of the latest forward call (one entry
  // per layer); off (the default) it is empty and the forward does no extra work.
  void set_record_decisions(bool on);
  const std::vector<LayerDecisions>& last_decisions() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- serving --------------------------------------------------------------------------------

// How the next token is drawn from the logits: greedy (temperature 0), or softmax(logits / T)
// restricted to the top_k largest (0: all) and then to the smallest set whose probability reaches
// top_p, sampled with a generator seeded by (seed, request id, token index).
struct Sampling {
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
};

// Draws one token from f32 logits [vocab] (the top-k cut uses select::topk).
int32_t sample_token(const Tensor& logits, const Sampling& sampling, uint64_t stream);

struct Request {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  Sampling sampling;
};

struct Completion {
  int64_t id = 0;
  std::vector<int32_t> tokens;        // the generated tokens
  double first_token_seconds = 0;     // from submit to the first generated token
  std::vector<double> token_seconds;  // wall time of the step that produced each later token
};

// Continuous batching over a Model: requests wait in FIFO order and are admitted when the pages
// their whole length needs (prompt + max_new_tokens) are free, so a running request never runs out
// of cache; every step decodes one token of each running request and spends the rest of
// max_batch_tokens on prompt chunks (chunked prefill). A request that could never fit is refused
// by submit with a dsk::Error naming it.
class Scheduler {
 public:
  explicit Scheduler(Model& model);
  void submit(Request request);
  // Runs one forward step; returns the requests that finished in it.
  std::vector<Completion> step();
  // Steps until every submitted request has finished; returns them in finishing order. With an
  // expert-parallel model, step and run are collective: a rank keeps stepping (with empty batches)
  // until every rank of the group is idle.
  std::vector<Completion> run();
  bool idle() const;
  int64_t num_waiting() const;
  int64_t num_running() const;
  // Pages promised to running requests; never more than the cache holds.
  int64_t reserved_pages() const;

  struct Impl;
  ~Scheduler();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsk::model
