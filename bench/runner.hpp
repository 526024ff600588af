// The runner behind `dsk bench` and `dsk verify`: times bench cases (warm-up, median over
// repetitions, cold rotation), relates them to the ceilings measured in the same process and to
// their peer, checks verify cases, and renders the results as a table, JSON (DESIGN §7, schema in
// docs/bench.md) or a roofline plot.
#pragma once

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {

// The roofline of this machine: term name -> TFLOPS (compute) or GB/s (bandwidth). A term is
// missing when it could not be measured here (no AMX, say).
struct Ceilings {
  int threads = 1;
  std::map<std::string, double> total{};             // every thread
  std::map<std::string, double> per_core{};          // one pinned thread
  std::map<std::string, std::string> unavailable{};  // term -> why ("no AMX")

  std::optional<double> get(const std::string& term) const;
};

struct RunOptions {
  bool quick = false;    // only cases marked quick, shorter timing
  std::string filter{};  // POSIX extended regex searched in "module/name"; "" selects all
  bool progress = true;  // draw a progress bar on stderr when it is a terminal
  // Bench only: how many times every selected case is timed, in passes over the whole selection
  // (so a case's passes are minutes apart on a long run). Each case keeps its fastest pass, as
  // each ceiling does: on a shared machine a pass can land in a busy moment.
  int passes = 1;
  // Ceilings measured earlier in this process, reused instead of measuring them again (bench
  // runs that do not list "ceilings" only).
  std::optional<Ceilings> ceilings{};
};

struct BenchRow {
  std::string module{}, name{}, shape{}, ceiling{}, peer{};
  Residency residency = Residency::hot;
  std::string measures{};  // ceiling cases: the term they measure
  bool per_core = false;
  std::string skipped{};  // why the case did not run ("no AMX"); "" when it ran
  int repetitions = 0;
  double flops = 0, bytes = 0;
  double median_s = 0;  // the fastest pass's median
  std::optional<double> peer_median_s{};
  std::vector<double> pass_medians_s{};  // every pass's median, in run order
  // Derived by the runner (add_rates, add_fraction): rates, the fraction of the ceiling and the
  // peer ratio.
  std::optional<double> tflops{}, gbs{}, fraction_of_ceiling{}, speedup_vs_peer{};
};

struct BenchReport {
  bool quick = false;
  int passes = 1;
  Ceilings ceilings;
  std::vector<BenchRow> rows{};  // the requested modules' cases, in registry order
};

// Runs the bench cases of `modules` (all modules when empty) that pass the filter. The ceilings
// are measured first in the same process (all of them, unless options.ceilings holds them
// already), and appear as rows when the "ceilings" module is selected. Raises dsk::Error for an
// unknown module, a selection without cases or options.passes outside 1..kMaxPasses.
inline constexpr int kMaxPasses = 100;
BenchReport run_bench(const std::vector<std::string>& modules, const RunOptions& options);

struct VerifyRow {
  std::string module{}, name{}, shape{}, metric{}, backend{};
  double tolerance = 0;
  std::optional<double> value{};  // empty when skipped or when the case raised an error
  bool passed = false;
  std::string skipped{};  // why the case did not run; skipped cases count as neither
  std::string error{};    // the exception message when the case raised one (a failure)
  double seconds = 0;
};

struct VerifyReport {
  bool quick = false;
  std::vector<VerifyRow> rows{};
  int failed() const;
  int passed() const;
};

VerifyReport run_verify(const std::vector<std::string>& modules, const RunOptions& options);

// Human-readable output.
void print_ceilings(std::FILE* out, const Ceilings& c);
void print_bench_table(std::FILE* out, const BenchReport& report);
void print_verify_table(std::FILE* out, const VerifyReport& report);

// Machine-readable output (docs/bench.md): {"env", "ceilings", "results"} / {"env", "results"}.
nlohmann::json to_json(const BenchReport& report);
nlohmann::json to_json(const VerifyReport& report);
nlohmann::json to_json(const Ceilings& c);
// Raises dsk::Error naming `command` and `option` unless `path` can be written; run before a long
// run, so a typo in an output path does not cost the results.
void check_output_file(const std::string& path, const char* command, const char* option);
// Writes `j` (indented) to `path`; raises dsk::Error naming `command` and --json when it cannot.
void write_json_file(const std::string& path, const nlohmann::json& j, const char* command);

// Raises dsk::Error unless gnuplot runs and `path` can be written.
void check_can_plot(const std::string& path);
// Draws the roofline (the ceilings as roofs, each case with work and traffic as a point) into the
// PNG `path` with gnuplot; raises dsk::Error when gnuplot is missing or fails.
void plot_roofline(const BenchReport& report, const std::string& path);

// "12.3 ms", "850 ns": a duration with a unit that keeps 3 significant digits.
std::string format_seconds(double s);

}  // namespace dsk::bench
