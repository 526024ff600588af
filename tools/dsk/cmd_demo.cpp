// `dsk demo`: the first command a new user runs. Builds DeepSeek-V3.2 "v32-tiny" with random
// weights in memory, serves a batch of requests through the continuous-batching scheduler (prefill,
// then decode), checks the model's logits against the fp32 reference model, and prints throughput,
// per-token latency, the memory budget and where the time went. Well under a minute on 2 cores.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>

#include <dsk/core/timer.hpp>
#include <dsk/model.hpp>
#include <dsk/ref.hpp>

#include "commands.hpp"
#include "shared.hpp"

namespace dsk::cli {
namespace {

struct DemoOptions {
  int requests = 8;
  int64_t new_tokens = 24;
  uint64_t seed = 1;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Prompts of mixed lengths (some longer than index_topk, so the indexer chooses), every second
// request sampled (temperature 0.8, top-k 40, top-p 0.95), the others greedy.
std::vector<model::Request> demo_requests(const DemoOptions& o, const model::Config& c) {
  std::vector<model::Request> rs;
  for (int i = 0; i < o.requests; ++i) {
    const int64_t len = 16 + (i * 53) % 180;
    const Tensor t =
        ref::randint({len}, DType::i32, o.seed * 1000 + static_cast<uint64_t>(i), 0, c.vocab_size);
    model::Request r;
    r.id = i;
    r.prompt.assign(t.data<int32_t>(), t.data<int32_t>() + len);
    r.max_new_tokens = o.new_tokens;
    if (i % 2 == 1) r.sampling = {.temperature = 0.8, .top_k = 40, .top_p = 0.95, .seed = o.seed};
    rs.push_back(std::move(r));
  }
  return rs;
}

void print_op_split(const model::Model& m) {
  const std::map<std::string, double> seconds = m.op_seconds();
  std::vector<std::pair<std::string, double>> ops(seconds.begin(), seconds.end());
  double total = 0;
  for (const auto& [name, s] : ops) total += s;
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  fmt::print("time per op (all steps):");
  for (const auto& [name, s] : ops) fmt::print(" {} {:.0f}%", name, 100 * s / total);
  fmt::print("\n");
}

void run_demo(const DemoOptions& o) {
  Timer total;
  print_environment(stdout, environment_report(), true);

  const model::Config config = model::preset("v32-tiny");
  fmt::print("\n== DeepSeek-V3.2 {}: random weights (seed {}) ==\n", config.name, o.seed);
  Timer build;
  const model::Weights weights = model::random_weights(config, o.seed);
  model::Model m(weights, {.kv_cache_pages = 64, .max_batch_tokens = 256});
  fmt::print(
      "{} layers ({} dense), dim {}, {} heads, MLA 576/512, indexer {} heads top-{}, {} experts "
      "(top-{}, {} groups) + {} shared; built and packed in {:.1f} s\n",
      config.n_layers, config.n_dense_layers, config.dim, config.n_heads, config.index_n_heads,
      config.index_topk, config.n_routed_experts, config.n_activated_experts,
      config.n_expert_groups, config.n_shared_experts, build.seconds());
  fmt::print("memory budget: {} ({} KV pages of 64 tokens)\n", m.memory_budget().describe(),
             m.total_pages());

  fmt::print("\n== serving {} requests, {} new tokens each ==\n", o.requests, o.new_tokens);
  model::Scheduler scheduler(m);
  int64_t prompt_tokens = 0;
  for (model::Request& r : demo_requests(o, config)) {
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    scheduler.submit(std::move(r));
  }
  Timer serve;
  std::vector<model::Completion> done;
  int steps = 0;
  while (!scheduler.idle()) {
    for (model::Completion& c : scheduler.step()) done.push_back(std::move(c));
    ++steps;
    if (isatty(fileno(stdout))) {
      fmt::print("\rstep {:4d}: {} running, {} waiting, {} of {} done", steps,
                 scheduler.num_running(), scheduler.num_waiting(), done.size(), o.requests);
      std::fflush(stdout);
    }
  }
  const double seconds = serve.seconds();
  std::vector<double> latency, ttft;
  int64_t generated = 0;
  for (const model::Completion& c : done) {
    generated += static_cast<int64_t>(c.tokens.size());
    latency.insert(latency.end(), c.token_seconds.begin(), c.token_seconds.end());
    ttft.push_back(c.first_token_seconds);
  }
  fmt::print(
      "\n{} prompt + {} generated tokens in {:.2f} s ({} steps): {:.0f} tokens/s in all, "
      "{:.1f} generated tokens/s\n",
      prompt_tokens, generated, seconds, steps,
      static_cast<double>(prompt_tokens + generated) / seconds,
      static_cast<double>(generated) / seconds);
  fmt::print("per-token latency P50 {:.1f} ms, P99 {:.1f} ms; time to first token P50 {:.0f} ms\n",
             1e3 * percentile(latency, 0.5), 1e3 * percentile(latency, 0.99),
             1e3 * percentile(ttft, 0.5));
  fmt::print("request 0 generated:");
  for (int32_t t : done.empty() ? std::vector<int32_t>{} : done.front().tokens)
    fmt::print(" {}", t);
  fmt::print("\n");
  print_op_split(m);

  fmt::print("\n== check against dsk::ref (fp32 reference model) ==\n");
  model::Model fresh(weights, {});
  ref::model::Reference reference(weights, {.round_p_to_bf16 = true});
  const std::vector<int32_t> prompt =
      demo_requests(o, config)[static_cast<size_t>(std::min(2, o.requests - 1))].prompt;
  const ref::model::CrossCheck check = ref::model::cross_check(fresh, reference, prompt, 8);
  const ref::model::Reference::DecisionCheck& d = check.decisions;
  const bool ok = check.max_diff() < 1e-3 && d.first_layer_differing == 0 &&
                  d.beyond_tolerance * 50 <= d.compared;
  fmt::print(
      "prefill of {} tokens + {} decode steps: largest calc_diff of the logits {:.2e} "
      "(bound 1e-3)\n",
      prompt.size(), check.diffs.size() - 1, check.max_diff());
  fmt::print(
      "expert and top-k sets: {} compared, layer 0 identical: {}, {} near-ties decided the "
      "other way, {} beyond the tie tolerance (at most 2%): {}\n",
      d.compared, d.first_layer_differing == 0 ? "yes" : "NO", d.differing, d.beyond_tolerance,
      ok ? "PASS" : "FAIL");
  fmt::print(
      "\ndemo: {:.1f} generated tokens/s, P50 {:.1f} ms per token, reference check {}; "
      "{:.1f} s\n",
      static_cast<double>(generated) / seconds, 1e3 * percentile(latency, 0.5),
      ok ? "passed" : "FAILED", total.seconds());
  if (!ok) throw CLI::RuntimeError(1);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "serve requests on DeepSeek-V3.2 v32-tiny and check it against dsk::ref");
  cmd->add_option("--requests", o->requests, "requests to serve")->check(CLI::Range(1, 256));
  cmd->add_option("--new-tokens", o->new_tokens, "tokens to generate per request")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", o->seed, "seed of the random weights and prompts");
  cmd->callback([o] { run_demo(*o); });
}

}  // namespace dsk::cli
