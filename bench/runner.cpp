// Running cases: selection, timing (warm-up, batching, median, cold rotation), ceilings and the
// derived rates. Rendering lives in report.cpp and plot.cpp.
#include "bench/runner.hpp"

#include <regex.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/tensor.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/core/timer.hpp>

namespace dsk::bench {
namespace {

// ---- selection ----

std::vector<std::string> checked_modules(const std::vector<std::string>& requested,
                                         const std::vector<std::string>& known,
                                         const char* command) {
  for (const std::string& m : requested)
    DSK_CHECK_ARG(std::find(known.begin(), known.end(), m) != known.end(), command, "module",
                  "one of " + detail::to_text(known), m);
  return requested.empty() ? known : requested;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// POSIX extended regular expressions (<regex.h>): std::regex trips g++ 12's -Wmaybe-uninitialized
// in sanitizer builds, and a filter needs nothing more.
class Selector {
 public:
  Selector(const RunOptions& options, const char* command) : quick_(options.quick) {
    if (options.filter.empty()) return;
    const int rc = regcomp(&filter_, options.filter.c_str(), REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
      char why[256];
      regerror(rc, &filter_, why, sizeof(why));
      DSK_CHECK_ARG(false, command, "--filter", "an extended regular expression",
                    options.filter + " (" + why + ")");
    }
    has_filter_ = true;
  }
  ~Selector() {
    if (has_filter_) regfree(&filter_);
  }
  Selector(const Selector&) = delete;
  Selector& operator=(const Selector&) = delete;

  bool operator()(const std::string& module, const std::string& name, bool quick_case) const {
    if (quick_ && !quick_case) return false;
    const std::string path = module + "/" + name;
    return !has_filter_ || regexec(&filter_, path.c_str(), 0, nullptr, 0) == 0;
  }

 private:
  bool quick_;
  bool has_filter_ = false;
  regex_t filter_{};
};

// ---- progress ----

// "[######..........] 3/12 core/convert_f32_to_bf16 n=4Mi" redrawn in place on stderr, only when
// stderr is a terminal (logs and pipes get nothing).
class Progress {
 public:
  Progress(size_t total, bool wanted) : total_(total), on_(wanted && isatty(STDERR_FILENO)) {}
  ~Progress() { clear(); }
  void step(const std::string& label) {
    ++done_;
    if (!on_) return;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * (done_ - 1) / std::max<size_t>(total_, 1));
    // Short enough for one terminal line: a wrapped line cannot be redrawn with \r.
    fmt::print(stderr, "\r\033[K[{}{}] {}/{} {}", std::string(filled, '#'),
               std::string(kWidth - filled, '.'), done_, total_, label.substr(0, 40));
    std::fflush(stderr);
  }
  void clear() {
    if (on_ && done_ > 0) fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    on_ = false;
  }

 private:
  size_t total_, done_ = 0;
  bool on_;
};

// ---- timing ----

struct Timing {
  double median_s = 0;
  int repetitions = 0;
};

// A call that returns its own duration.
using TimedCall = std::function<double(int copy)>;

TimedCall timed_by_caller(const std::function<void(int)>& call) {
  return [&call](int copy) {
    Timer t;
    call(copy);
    return t.seconds();
  };
}

// Warm-up, then `reps` samples of `batch` calls each (batching keeps a sample above the timer's
// noise for microsecond kernels); calls rotate through the working-set copies.
Timing time_calls(const TimedCall& call, int copies, bool quick) {
  const double warmup_s = quick ? 0.02 : 0.1;
  const double min_sample_s = quick ? 1e-3 : 5e-3;
  const double budget_s = quick ? 0.5 : 4.0;
  int next_copy = 0;
  auto one_call = [&] {
    const double s = call(next_copy);
    next_copy = (next_copy + 1) % copies;
    return s;
  };

  Timer warmup;
  double last_call_s = 0;
  // At least one pass over every copy: the first read of a freshly written buffer is slower than
  // the next ones (seen with oneDNN's reordered weights), and that belongs to set-up, not to a
  // call.
  const int min_calls = std::max(2, copies);
  for (int calls = 0; calls < min_calls || (warmup.seconds() < warmup_s && calls < 1000); ++calls)
    last_call_s = std::max(one_call(), 1e-9);
  const int batch = static_cast<int>(std::clamp(std::ceil(min_sample_s / last_call_s), 1.0, 1e6));
  const double sample_s = last_call_s * batch;
  int reps = quick ? 5 : 15;
  reps = std::clamp(static_cast<int>(budget_s / sample_s), 3, reps);

  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    double total = 0;
    for (int b = 0; b < batch; ++b) total += one_call();
    samples.push_back(total / batch);
  }
  std::nth_element(samples.begin(), samples.begin() + reps / 2, samples.end());
  return {samples[reps / 2], reps};
}

int cold_copies(const BenchCase& c) {
  if (c.residency != Residency::cold || c.working_set_bytes == 0) return 1;
  // Twice the LLC, so even a cache that does not evict in LRU order holds no useful line.
  const double needed = 2.0 * static_cast<double>(last_level_cache_bytes());
  return std::max(1,
                  static_cast<int>(std::ceil(needed / static_cast<double>(c.working_set_bytes))));
}

BenchRow run_bench_case(const BenchCase& c, CaseContext ctx) {
  BenchRow row{.module = c.module,
               .name = c.name,
               .shape = c.shape,
               .ceiling = c.ceiling,
               .peer = c.peer,
               .residency = c.residency,
               .measures = c.measures,
               .per_core = c.per_core};
  if (c.unavailable) row.skipped = c.unavailable();
  if (!row.skipped.empty()) return row;
  ctx.copies = cold_copies(c);
  const Prepared p = c.prepare(ctx);
  const Timing t = time_calls(p.timed_kernel ? p.timed_kernel : timed_by_caller(p.kernel),
                              ctx.copies, ctx.quick);
  row.median_s = t.median_s;
  row.repetitions = t.repetitions;
  row.flops = p.flops;
  row.bytes = p.bytes;
  if (p.peer)
    row.peer_median_s = time_calls(timed_by_caller(p.peer), ctx.copies, ctx.quick).median_s;
  return row;
}

void add_rates(BenchRow& row) {
  if (!row.skipped.empty() || row.median_s <= 0) return;
  if (row.flops > 0) row.tflops = row.flops / row.median_s * 1e-12;
  if (row.bytes > 0) row.gbs = row.bytes / row.median_s * 1e-9;
  if (row.peer_median_s) row.speedup_vs_peer = *row.peer_median_s / row.median_s;
}

void record_ceiling(Ceilings& c, const BenchRow& row) {
  if (row.measures.empty()) return;
  if (!row.skipped.empty()) {
    c.unavailable[row.measures] = row.skipped;
    return;
  }
  const std::optional<double> rate = roof_term(row.measures).bandwidth ? row.gbs : row.tflops;
  if (!rate) return;
  // Over several passes the best one: what the machine can do when its neighbours let it.
  double& best = (row.per_core ? c.per_core : c.total)[row.measures];
  best = std::max(best, *rate);
}

// Seconds per unit of the work a call declares: the ceilings size their calls anew in every
// pass, so their passes compare by rate; other cases do the same work in each.
double seconds_per_unit(const BenchRow& row) {
  return row.median_s / (row.bytes > 0 ? row.bytes : row.flops > 0 ? row.flops : 1.0);
}

// Keeps in `kept` the faster of its pass and `row`'s, two passes of one case (or `row` when it
// is the first), and the peer's faster pass; `kept->pass_medians_s` gains the new pass's median.
void keep_fastest_pass(std::optional<BenchRow>& kept, BenchRow row) {
  if (!row.skipped.empty()) {  // then every pass is skipped, for the same reason
    if (!kept) kept = std::move(row);
    return;
  }
  std::vector<double> passes = kept ? std::move(kept->pass_medians_s) : std::vector<double>{};
  passes.push_back(row.median_s);
  std::optional<double> peer = kept ? kept->peer_median_s : std::nullopt;
  if (row.peer_median_s) peer = std::min(peer.value_or(*row.peer_median_s), *row.peer_median_s);
  if (!kept || seconds_per_unit(row) < seconds_per_unit(*kept)) kept = std::move(row);
  kept->pass_medians_s = std::move(passes);
  kept->peer_median_s = peer;
  add_rates(*kept);
}

void add_fraction(BenchRow& row, const Ceilings& c) {
  const std::optional<double> roof = c.get(row.ceiling);
  const std::optional<double> rate = roof_term(row.ceiling).bandwidth ? row.gbs : row.tflops;
  if (roof && rate && *roof > 0) row.fraction_of_ceiling = *rate / *roof;
}

}  // namespace

std::optional<double> Ceilings::get(const std::string& term) const {
  if (auto it = total.find(term); it != total.end()) return it->second;
  return std::nullopt;
}

BenchReport run_bench(const std::vector<std::string>& modules, const RunOptions& options) {
  const Registry& reg = registry();
  const std::vector<std::string> selected = checked_modules(modules, reg.bench_modules(), "bench");
  const Selector select(options, "bench");
  DSK_CHECK_ARG(options.passes >= 1 && options.passes <= kMaxPasses, "bench", "--repeat",
                fmt::format("1 to {}", kMaxPasses), std::to_string(options.passes));
  auto reported = [&](const BenchCase& c) {
    return contains(selected, c.module) && select(c.module, c.name, c.quick);
  };

  // The ceilings run first. Each one is measured when it is reported, and all of them when other
  // cases need them as their reference and the caller has none to reuse.
  bool other_cases = false;
  for (const BenchCase& c : reg.bench_cases()) other_cases |= c.module != "ceilings" && reported(c);
  const bool need_reference = other_cases && !options.ceilings;
  std::vector<std::pair<const BenchCase*, bool>> plan;  // (case, reported)
  for (const BenchCase& c : reg.bench_cases())
    if (c.module == "ceilings" && (reported(c) || need_reference))
      plan.emplace_back(&c, reported(c));
  for (const BenchCase& c : reg.bench_cases())
    if (c.module != "ceilings" && reported(c)) plan.emplace_back(&c, true);
  DSK_CHECK(std::any_of(plan.begin(), plan.end(), [](const auto& p) { return p.second; }), "bench",
            "no case matches the modules, --filter and --quick given");

  BenchReport report;
  report.quick = options.quick;
  report.passes = options.passes;
  if (options.ceilings) report.ceilings = *options.ceilings;
  report.ceilings.threads = get_num_threads();
  const CaseContext ctx{.quick = options.quick, .copies = 1, .threads = get_num_threads()};
  const auto ceiling_cases = std::count_if(
      plan.begin(), plan.end(), [](const auto& p) { return p.first->module == "ceilings"; });
  Progress progress(
      plan.size() * options.passes + (need_reference ? static_cast<size_t>(ceiling_cases) : 0),
      options.progress);
  auto run_one = [&](const BenchCase& c, const std::string& label_end) {
    progress.step(c.module + "/" + c.name + " " + c.shape + label_end);
    BenchRow row = run_bench_case(c, ctx);
    // Each case starts from an empty tensor cache: blocks the earlier cases left cached (up to
    // DSK_TENSOR_CACHE_MB) otherwise fragment memory, so a later case's fresh outputs can miss
    // huge pages. expand_to_fused, whose rows scatter over a 150 MB output, ran at 31% of
    // dram_read after the other tk cases and at 67-73% alone.
    dsk::release_cached_tensor_memory();
    add_rates(row);
    record_ceiling(report.ceilings, row);
    return row;
  };
  std::vector<std::optional<BenchRow>> kept(plan.size());  // the reported cases' fastest passes
  for (int pass = 0; pass < options.passes; ++pass)
    for (size_t i = 0; i < plan.size(); ++i) {
      const auto& [c, is_reported] = plan[i];
      BenchRow row = run_one(
          *c, options.passes == 1 ? "" : fmt::format(" (pass {}/{})", pass + 1, options.passes));
      if (is_reported) keep_fastest_pass(kept[i], std::move(row));
    }
  // When the ceilings are the reference of other cases, they run once more after them and each
  // keeps its better pass: on a shared machine one pass can land in a busy moment and inflate
  // every ratio of the run.
  if (need_reference)
    for (const auto& [c, is_reported] : plan)
      if (c->module == "ceilings") run_one(*c, " (again)");
  for (std::optional<BenchRow>& row : kept)
    if (row) report.rows.push_back(std::move(*row));
  progress.clear();

  Ceilings& ceil = report.ceilings;
  if (ceil.threads == 1) ceil.total.insert(ceil.per_core.begin(), ceil.per_core.end());  // same
  for (BenchRow& row : report.rows) add_fraction(row, ceil);
  return report;
}

int VerifyReport::failed() const {
  return static_cast<int>(std::count_if(
      rows.begin(), rows.end(), [](const VerifyRow& r) { return r.skipped.empty() && !r.passed; }));
}

int VerifyReport::passed() const {
  return static_cast<int>(
      std::count_if(rows.begin(), rows.end(), [](const VerifyRow& r) { return r.passed; }));
}

VerifyReport run_verify(const std::vector<std::string>& modules, const RunOptions& options) {
  const Registry& reg = registry();
  const std::vector<std::string> selected =
      checked_modules(modules, reg.verify_modules(), "verify");
  const Selector select(options, "verify");
  std::vector<const VerifyCase*> cases;
  for (const VerifyCase& c : reg.verify_cases())
    if (contains(selected, c.module) && select(c.module, c.name, c.quick)) cases.push_back(&c);
  DSK_CHECK(!cases.empty(), "verify", "no case matches the modules, --filter and --quick given");

  VerifyReport report;
  report.quick = options.quick;
  const CaseContext ctx{.quick = options.quick, .copies = 1, .threads = get_num_threads()};
  const std::string backend_text(backend_name(backend()));
  Progress progress(cases.size(), options.progress);
  for (const VerifyCase* c : cases) {
    progress.step(c->module + "/" + c->name + " " + c->shape);
    VerifyRow row{.module = c->module,
                  .name = c->name,
                  .shape = c->shape,
                  .metric = c->metric,
                  .backend = backend_text,
                  .tolerance = c->tolerance};
    if (c->unavailable) row.skipped = c->unavailable();
    if (row.skipped.empty()) {
      Timer timer;
      try {
        row.value = c->run(ctx);
        row.passed = *row.value <= c->tolerance;  // false for NaN
      } catch (const std::exception& e) {
        row.error = e.what();
      }
      row.seconds = timer.seconds();
    }
    report.rows.push_back(std::move(row));
  }
  return report;
}

}  // namespace dsk::bench
