// `dsk run --checkpoint DIR --prompt-ids FILE|- [--max-new-tokens N] [--batch-tokens T]
// [--memory-gb G] [--temperature X --top-k K --top-p P --seed S] [--json F]`: token ids in, token
// ids out (no tokenizer). Each input line is one request (token ids separated by spaces or
// commas); each output line holds the generated ids of the request on the same input line. A
// progress bar goes to stderr, the latency and throughput summary to stdout (or --json).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <dsk/core/error.hpp>
#include <dsk/core/timer.hpp>
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
  const model::Weights weights = model::load_checkpoint(o.checkpoint);
  model::Model::Options options{.max_batch_tokens = o.batch_tokens};
  if (o.memory_gb > 0) options.memory_limit = static_cast<int64_t>(o.memory_gb * (1 << 30));
  model::Model m(weights, options);
  fmt::print(stderr, "dsk run: {} loaded in {:.1f} s; memory budget: {}\n", o.checkpoint,
             load.seconds(), m.memory_budget().describe());

  model::Scheduler scheduler(m);
  for (size_t i = 0; i < prompts.size(); ++i)
    scheduler.submit({static_cast<int64_t>(i), prompts[i], o.max_new_tokens, o.sampling});
  Timer serve;
  const bool progress = isatty(fileno(stderr));  // a bar on a terminal, nothing in a log
  std::map<int64_t, model::Completion> done;
  while (!scheduler.idle()) {
    for (model::Completion& c : scheduler.step()) done[c.id] = std::move(c);
    if (!progress) continue;
    const size_t width = 30, filled = width * done.size() / prompts.size();
    fmt::print(stderr, "\r[{}{}] {}/{} requests", std::string(filled, '#'),
               std::string(width - filled, ' '), done.size(), prompts.size());
  }
  if (progress) fmt::print(stderr, "\n");
  const double seconds = serve.seconds();

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
