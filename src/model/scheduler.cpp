// dsk::model::Scheduler and sample_token: continuous batching with chunked prefill over a Model,
// admission against the paged cache's pages, and greedy / temperature / top-k / top-p sampling.
#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <dsk/core/check.hpp>
#include <dsk/core/timer.hpp>
#include <dsk/model.hpp>
#include <dsk/select.hpp>

#include "model/kv_cache.hpp"

namespace dsk::model {

namespace {

constexpr const char* kFn = "model::Scheduler";

// splitmix64: a well-mixed 64-bit value of x.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int64_t pages_for(int64_t tokens) {
  return (tokens + kPageTokens - 1) / kPageTokens;
}

}  // namespace

int32_t sample_token(const Tensor& logits, const Sampling& s, uint64_t stream) {
  constexpr const char* fn = "model::sample_token";
  check::defined(fn, "logits", logits);
  check::dtype(fn, "logits", logits, DType::f32);
  check::dim(fn, "logits", logits, 1);
  DSK_CHECK_ARG(logits.size(0) >= 1, fn, "logits", "at least one entry", logits.describe());
  DSK_CHECK_ARG(s.temperature >= 0 && std::isfinite(s.temperature), fn, "sampling.temperature",
                "finite and >= 0", s.temperature);
  DSK_CHECK_ARG(s.top_k >= 0, fn, "sampling.top_k", ">= 0", s.top_k);
  DSK_CHECK_ARG(s.top_p > 0 && s.top_p <= 1, fn, "sampling.top_p", "in (0, 1]", s.top_p);
  const Tensor x = logits.contiguous();
  const float* v = x.data<float>();
  const int64_t n = x.size(0);
  if (s.temperature == 0) return static_cast<int32_t>(std::max_element(v, v + n) - v);

  // Candidates: the top_k largest (select::topk), or all.
  std::vector<int32_t> cand;
  if (s.top_k > 0 && s.top_k < n && s.top_k <= select::kMaxTopk) {
    const Tensor idx = select::topk(x.view({1, n}), s.top_k).indices;
    cand.assign(idx.data<int32_t>(), idx.data<int32_t>() + s.top_k);
  } else {
    cand.resize(static_cast<size_t>(n));
    std::iota(cand.begin(), cand.end(), 0);
  }
  // The largest first (ties: the lower id), then softmax(x / T) over them.
  std::sort(cand.begin(), cand.end(),
            [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  if (s.top_k > 0 && static_cast<int64_t>(cand.size()) > s.top_k)
    cand.resize(static_cast<size_t>(s.top_k));
  std::vector<double> p(cand.size());
  const double top = v[cand[0]];
  double sum = 0;
  for (size_t i = 0; i < cand.size(); ++i)
    sum += p[i] = std::exp((v[cand[i]] - top) / s.temperature);
  // Nucleus: the shortest prefix whose probability reaches top_p.
  size_t keep = cand.size();
  double cum = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    cum += p[i] / sum;
    if (cum >= s.top_p) {
      keep = i + 1;
      break;
    }
  }
  const double kept = std::accumulate(p.begin(), p.begin() + static_cast<int64_t>(keep), 0.0);
  const double u = static_cast<double>(mix(s.seed ^ mix(stream)) >> 11) * 0x1.0p-53 * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return cand[i];
  }
  return cand[keep - 1];
}

struct Scheduler::Impl {
  struct Waiting {
    Request request;
    Timer since_submit;
  };
  struct Running {
    Request request;
    Timer since_submit;
    int64_t seq = 0;
    int64_t pages = 0;
    int64_t prefilled = 0;  // prompt tokens in the cache
    Completion done;
  };

  Model& model;
  std::deque<Waiting> waiting;
  std::vector<Running> running;  // in admission order
  std::set<int64_t> ids;         // submitted and not finished
  int64_t reserved = 0;

  void admit();
  std::vector<StepItem> plan_step();
  std::vector<Completion> finish_step(const Tensor& logits, double seconds);
};

Scheduler::Scheduler(Model& model) : impl_(std::make_unique<Impl>(Impl{model, {}, {}, {}, 0})) {}
Scheduler::~Scheduler() = default;

void Scheduler::submit(Request r) {
  const Config& c = impl_->model.config();
  const std::string who = "request " + std::to_string(r.id);
  DSK_CHECK_ARG(!impl_->ids.count(r.id), kFn, "request.id", "not already submitted", r.id);
  DSK_CHECK_ARG(!r.prompt.empty(), kFn, "request.prompt", "at least one token (" + who + ")", 0);
  DSK_CHECK_ARG(r.max_new_tokens >= 1, kFn, "request.max_new_tokens", ">= 1 (" + who + ")",
                r.max_new_tokens);
  for (int32_t t : r.prompt)
    DSK_CHECK_ARG(t >= 0 && t < c.vocab_size, kFn, "request.prompt",
                  "token ids in [0, " + std::to_string(c.vocab_size) + ") (" + who + ")", t);
  const int64_t length = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  DSK_CHECK_ARG(length <= c.rope.max_seq_len, kFn, "request",
                "prompt + max_new_tokens <= max_seq_len = " + std::to_string(c.rope.max_seq_len) +
                    " (" + who + ")",
                length);
  const int64_t pages = pages_for(length);
  DSK_CHECK(pages <= impl_->model.total_pages(), kFn,
            who + " needs " + std::to_string(pages) + " KV pages (" + std::to_string(length) +
                " tokens) but the whole cache holds " + std::to_string(impl_->model.total_pages()) +
                "; raise the memory limit or shorten the request");
  impl_->ids.insert(r.id);
  impl_->waiting.push_back({std::move(r), Timer{}});
}

// FIFO admission: the oldest waiting request first, and none past one that does not fit yet, so a
// long request is not starved by short ones behind it.
void Scheduler::Impl::admit() {
  while (!waiting.empty()) {
    Waiting& w = waiting.front();
    const int64_t pages =
        pages_for(static_cast<int64_t>(w.request.prompt.size()) + w.request.max_new_tokens);
    if (reserved + pages > model.total_pages()) break;
    Running r{std::move(w.request), w.since_submit, model.add_sequence(), pages, 0, {}};
    r.done.id = r.request.id;
    reserved += pages;
    running.push_back(std::move(r));
    waiting.pop_front();
  }
}

// One token for every decoding request, then prompt chunks up to max_batch_tokens in all.
std::vector<StepItem> Scheduler::Impl::plan_step() {
  std::vector<StepItem> items;
  int64_t budget = model.max_batch_tokens();
  for (const Running& r : running)
    if (r.prefilled == static_cast<int64_t>(r.request.prompt.size())) {
      items.push_back({r.seq, {&r.done.tokens.back(), 1}});
      --budget;
    }
  for (const Running& r : running) {
    const int64_t left = static_cast<int64_t>(r.request.prompt.size()) - r.prefilled;
    if (left == 0) continue;
    const int64_t n = std::min(left, budget);
    if (n <= 0) break;
    items.push_back({r.seq, {r.request.prompt.data() + r.prefilled, static_cast<size_t>(n)}});
    budget -= n;
  }
  return items;
}

std::vector<Completion> Scheduler::Impl::finish_step(const Tensor& logits, double seconds) {
  std::vector<Completion> finished;
  int64_t row = 0;
  // Rows follow plan_step's order: decoding requests, then prompt chunks.
  std::vector<Running*> order;
  for (Running& r : running)
    if (r.prefilled == static_cast<int64_t>(r.request.prompt.size())) order.push_back(&r);
  const size_t decoding = order.size();
  for (Running& r : running)
    if (r.prefilled < static_cast<int64_t>(r.request.prompt.size())) order.push_back(&r);
  for (size_t i = 0; i < order.size() && row < logits.size(0); ++i, ++row) {
    Running& r = *order[i];
    const int64_t index = static_cast<int64_t>(r.done.tokens.size());
    const auto draw = [&] {
      return sample_token(
          logits.select(0, row), r.request.sampling,
          static_cast<uint64_t>(r.request.id) * 0x100000001B3ull + static_cast<uint64_t>(index));
    };
    if (i < decoding) {
      r.done.tokens.push_back(draw());
      r.done.token_seconds.push_back(seconds);
      continue;
    }
    r.prefilled = model.sequence_length(r.seq);
    if (r.prefilled == static_cast<int64_t>(r.request.prompt.size())) {
      r.done.tokens.push_back(draw());
      r.done.first_token_seconds = r.since_submit.seconds();
    }
  }
  // Requests with all their tokens leave and give their pages back.
  for (auto it = running.begin(); it != running.end();) {
    if (static_cast<int64_t>(it->done.tokens.size()) < it->request.max_new_tokens) {
      ++it;
      continue;
    }
    model.free_sequence(it->seq);
    reserved -= it->pages;
    ids.erase(it->request.id);
    finished.push_back(std::move(it->done));
    it = running.erase(it);
  }
  return finished;
}

std::vector<Completion> Scheduler::step() {
  impl_->admit();
  const std::vector<StepItem> items = impl_->plan_step();
  // An expert-parallel rank with nothing to run still serves its peers' experts.
  if (items.empty() && !impl_->model.expert_parallel_group()) return {};
  Timer timer;
  const Tensor logits = impl_->model.forward(items);
  return impl_->finish_step(logits, timer.seconds());
}

std::vector<Completion> Scheduler::run() {
  const ep::Communicator* group = impl_->model.expert_parallel_group();
  const auto anyone_busy = [&] {
    const double busy = idle() ? 0.0 : 1.0;
    return (group ? group->allreduce_max(busy) : busy) > 0;
  };
  std::vector<Completion> all;
  while (anyone_busy())
    for (Completion& c : step()) all.push_back(std::move(c));
  return all;
}

bool Scheduler::idle() const {
  return impl_->waiting.empty() && impl_->running.empty();
}
int64_t Scheduler::num_waiting() const {
  return static_cast<int64_t>(impl_->waiting.size());
}
int64_t Scheduler::num_running() const {
  return static_cast<int64_t>(impl_->running.size());
}
int64_t Scheduler::reserved_pages() const {
  return impl_->reserved;
}

}  // namespace dsk::model
