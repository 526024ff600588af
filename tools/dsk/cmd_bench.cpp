// `dsk bench [MODULE...] [--json F] [--plot F] [--quick] [--filter RE] [--list]`: measures the
// ceilings, then times each case of the chosen modules against them and against its peer.
#include <memory>

#include <fmt/core.h>

#include "bench/runner.hpp"
#include "commands.hpp"
#include "shared.hpp"

namespace dsk::cli {
namespace {

void list_bench_cases() {
  for (const bench::BenchCase& c : bench::registry().bench_cases())
    fmt::print("{:<10} {:<24} {}{}\n", c.module, c.name, c.shape,
               c.quick ? "" : "  (not in --quick)");
}

void run_bench_command(const CaseOptions& o) {
  if (o.list) return list_bench_cases();
  if (!o.json.empty()) bench::check_output_file(o.json, "bench", "--json");
  if (!o.plot.empty()) bench::check_can_plot(o.plot);
  const bench::BenchReport report =
      bench::run_bench(o.modules, {.quick = o.quick, .filter = o.filter});
  bench::print_ceilings(stdout, report.ceilings);
  fmt::print("\n");
  bench::print_bench_table(stdout, report);
  if (!o.json.empty()) bench::write_json_file(o.json, bench::to_json(report), "bench");
  if (!o.plot.empty()) bench::plot_roofline(report, o.plot);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<CaseOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "time kernels against this machine's ceilings (measured first) and a peer");
  add_case_options(cmd, *options, true);
  cmd->callback([options] { run_bench_command(*options); });
}

}  // namespace dsk::cli
