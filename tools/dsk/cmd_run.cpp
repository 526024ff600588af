// `dsk run --checkpoint DIR --prompt-ids FILE|- [--max-new-tokens N] [--batch-tokens T]
// [--memory-gb G] [--temperature X --top-k K --top-p P --seed S] [--json F]`: token ids in, token
// ids out (no tokenizer). Each input line is one request (token ids separated by spaces or
// commas); each output line holds the generated ids of the request on the same input line. A
// progress bar goes to stderr, the latency and throughput summary to stdout (or --json).
//
// Under `mpirun -np R` the ranks serve together with expert parallelism: request i runs on rank
// i % R, each rank keeps 1/R of the routed experts, and rank 0 gathers and prints every output
// (the same lines as a single-rank run, in deterministic mode bit for bit).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/core/timer.hpp>
#include <dsk/ep.hpp>
#include <dsk/model.hpp>

#include "commands.hpp"

namespace dsk::cli {
namespace {

struct RunOptions {
  std::string checkpoint, prompt_ids, json;
  int64_t max_new_tokens = 32;
  int64_t batch_tokens = 512;
  double memory_gb = 0;
  model::Sampling sampling;
};

std::vector<std::vector<int32_t>> read_prompts(std::istream& in, const std::string& source) {
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream words(line);
    std::vector<int32_t> ids;
    std::string w;
    while (words >> w) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != w.size() || v < 0 || v > INT32_MAX)
        throw Error(fmt::format("dsk run: {} line {}: '{}' is not a token id", source, line_no, w));
      ids.push_back(static_cast<int32_t>(v));
    }
    if (!ids.empty()) prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) throw Error("dsk run: no prompt in " + source);
  return prompts;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1,
                    static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

// The expert-parallel group when started by mpirun with more than one rank.
std::optional<ep::Communicator> launch_group() {
  if (!ep::Communicator::launched_by_mpi()) return std::nullopt;
  ep::Communicator world = ep::Communicator::world();
  if (world.size() == 1) return std::nullopt;
  return world;
}

// Every rank's completions on rank 0 (others get theirs back unchanged), as doubles:
// id, n tokens, tokens, first-token seconds, n latencies, latencies.
std::map<int64_t, model::Completion> gather_on_rank0(
    const ep::Communicator& group, const std::map<int64_t, model::Completion>& mine) {
  std::vector<double> flat;
  for (const auto& [id, c] : mine) {
    flat.push_back(static_cast<double>(id));
    flat.push_back(static_cast<double>(c.tokens.size()));
    flat.insert(flat.end(), c.tokens.begin(), c.tokens.end());
    flat.push_back(c.first_token_seconds);
    flat.push_back(static_cast<double>(c.token_seconds.size()));
    flat.insert(flat.end(), c.token_seconds.begin(), c.token_seconds.end());
  }
  const int R = group.size();
  // Counts first (a fixed 8 bytes from every rank to rank 0), then the records.
  std::vector<int64_t> send_n(R, 0), recv_n(R, 0);
  send_n[0] = 8;
  if (group.rank() == 0) std::fill(recv_n.begin(), recv_n.end(), 8);
  const int64_t my_bytes = static_cast<int64_t>(flat.size() * sizeof(double));
  std::vector<int64_t> sizes(R, 0);
  group.alltoallv(&my_bytes, send_n, sizes.data(), recv_n);
  send_n[0] = my_bytes;
  if (group.rank() == 0) recv_n = sizes;
  int64_t total = 0;
  for (int64_t n : recv_n) total += n;
  std::vector<double> all(static_cast<size_t>(total) / sizeof(double));
  group.alltoallv(flat.data(), send_n, all.data(), recv_n);
  if (group.rank() != 0) return mine;
  std::map<int64_t, model::Completion> out;
  for (size_t i = 0; i < all.size();) {
    model::Completion c;
    c.id = static_cast<int64_t>(all[i++]);
    const auto n = static_cast<size_t>(all[i++]);
    for (size_t j = 0; j < n; ++j) c.tokens.push_back(static_cast<int32_t>(all[i++]));
    c.first_token_seconds = all[i++];
    const auto m = static_cast<size_t>(all[i++]);
    c.token_seconds.assign(all.begin() + static_cast<std::ptrdiff_t>(i),
                           all.begin() + static_cast<std::ptrdiff_t>(i + m));
    i += m;
    out[c.id] = std::move(c);
  }
  return out;
}

void run_command(const RunOptions& o) {
  std::vector<std::vector<int32_t>> prompts;
  if (o.prompt_ids == "-") {
    prompts = read_prompts(std::cin, "stdin");
  } else {
    std::ifstream in(o.prompt_ids);
    if (!in) throw Error("dsk run: cannot open --prompt-ids " + o.prompt_ids);
    prompts = read_prompts(in, o.prompt_ids);
  }
  Timer load;
  const std::optional<ep::Communicator> group = launch_group();
  const int rank = group ? group->rank() : 0, ranks = group ? group->size() : 1;
  if (group) use_deterministic_algorithms(true);
  const model::Weights weights = model::load_checkpoint(o.checkpoint);
  model::Model::Options options{.max_batch_tokens = o.batch_tokens};
  if (group) options.expert_parallel = &*group;
  if (o.memory_gb > 0) options.memory_limit = static_cast<int64_t>(o.memory_gb * (1 << 30));
  model::Model m(weights, options);
  if (rank == 0)
    fmt::print(stderr, "dsk run: {} loaded in {:.1f} s{}; memory budget per rank: {}\n",
               o.checkpoint, load.seconds(),
               group ? fmt::format(", experts over {} ranks", ranks) : std::string(),
               m.memory_budget().describe());

  model::Scheduler scheduler(m);
  int64_t my_requests = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (static_cast<int>(i % static_cast<size_t>(ranks)) != rank) continue;
    scheduler.submit({static_cast<int64_t>(i), prompts[i], o.max_new_tokens, o.sampling});
    ++my_requests;
  }
  Timer serve;
  // A bar on a terminal (rank 0's own requests), nothing in a log.
  const bool progress = rank == 0 && isatty(fileno(stderr));
  std::map<int64_t, model::Completion> done;
  // Under mpirun every rank steps until the whole group is idle (Scheduler::run's rule).
  const auto anyone_busy = [&] {
    const double busy = scheduler.idle() ? 0.0 : 1.0;
    return (group ? group->allreduce_max(busy) : busy) > 0;
  };
  while (anyone_busy()) {
    for (model::Completion& c : scheduler.step()) done[c.id] = std::move(c);
    if (!progress || my_requests == 0) continue;
    const size_t width = 30, filled = width * done.size() / static_cast<size_t>(my_requests);
    fmt::print(stderr, "\r[{}{}] {}/{} requests", std::string(filled, '#'),
               std::string(width - filled, ' '), done.size(), my_requests);
  }
  if (progress) fmt::print(stderr, "\n");
  const double seconds = group ? group->allreduce_max(serve.seconds()) : serve.seconds();
  if (group) done = gather_on_rank0(*group, done);
  if (rank != 0) return;

  std::vector<double> latency, ttft;
  int64_t generated = 0, prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  for (const auto& [id, c] : done) {
    std::string line;
    for (int32_t t : c.tokens) line += (line.empty() ? "" : " ") + std::to_string(t);
    fmt::print("{}\n", line);
    generated += static_cast<int64_t>(c.tokens.size());
    latency.insert(latency.end(), c.token_seconds.begin(), c.token_seconds.end());
    ttft.push_back(c.first_token_seconds);
  }
  nlohmann::json summary = {
      {"requests", prompts.size()},
      {"prompt_tokens", prompt_tokens},
      {"generated_tokens", generated},
      {"seconds", seconds},
      {"generated_tokens_per_second", static_cast<double>(generated) / seconds},
      {"token_latency_p50_ms", 1e3 * percentile(latency, 0.5)},
      {"token_latency_p99_ms", 1e3 * percentile(latency, 0.99)},
      {"first_token_p50_ms", 1e3 * percentile(ttft, 0.5)},
      {"memory_budget_bytes", m.memory_budget().total()}};
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!(out << summary.dump(2) << "\n")) throw Error("dsk run: cannot write --json " + o.json);
  }
  fmt::print(stderr,
             "{} requests: {} prompt + {} generated tokens in {:.2f} s, {:.1f} generated "
             "tokens/s; per-token latency P50 {:.1f} ms P99 {:.1f} ms; first token P50 {:.0f} ms\n",
             prompts.size(), prompt_tokens, generated, seconds,
             static_cast<double>(generated) / seconds, 1e3 * percentile(latency, 0.5),
             1e3 * percentile(latency, 0.99), 1e3 * percentile(ttft, 0.5));
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "generate token ids with a checkpoint: token ids in (one request per line), ids out");
  cmd->add_option("--checkpoint", o->checkpoint, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt-ids", o->prompt_ids, "file of prompts, one per line, or - for stdin")
      ->required();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate per request")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--batch-tokens", o->batch_tokens, "tokens per forward step (chunked prefill)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--memory-gb", o->memory_gb,
                  "memory budget in GiB: the KV cache gets what weights and workspace leave");
  cmd->add_option("--temperature", o->sampling.temperature, "0: greedy")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", o->sampling.top_k, "sample among the k largest (0: all)");
  cmd->add_option("--top-p", o->sampling.top_p, "nucleus sampling threshold");
  cmd->add_option("--seed", o->sampling.seed, "sampling seed");
  cmd->add_option("--json", o->json, "also write the summary as JSON to FILE")->type_name("FILE");
  cmd->callback([o] { run_command(*o); });
}

}  // namespace dsk::cli
