// `dsk demo`: the first command a new user runs. Until the DeepSeek-V3.2 layer stack exists it
// shows what there is: the environment, this machine's ceilings, the verification table and a
// short benchmark, ending in one throughput line. Runs in seconds (everything is --quick).
#include <algorithm>
#include <memory>

#include <fmt/core.h>

#include <dsk/core/timer.hpp>

#include "bench/runner.hpp"
#include "commands.hpp"
#include "shared.hpp"

namespace dsk::cli {
namespace {

// "convert_f32_to_bf16 n=4Mi (cold): 12.3 GB/s = 45% of DRAM read, 3.10x the scalar loop"
std::string throughput_text(const bench::BenchRow& r) {
  std::string text = fmt::format("{} {} ({}): ", r.name, r.shape,
                                 r.residency == bench::Residency::cold ? "cold" : "hot");
  if (!r.skipped.empty()) return text + "n/a (" + r.skipped + ")";
  text += r.gbs ? fmt::format("{:.1f} GB/s", *r.gbs)
                : fmt::format("{:.3g} TFLOPS", r.tflops.value_or(0));
  if (r.fraction_of_ceiling)
    text += fmt::format(" = {:.0f}% of {}", 100 * *r.fraction_of_ceiling,
                        bench::roof_term(r.ceiling).title);
  if (r.speedup_vs_peer) text += fmt::format(", {:.2f}x the {}", *r.speedup_vs_peer, r.peer);
  return text;
}

void run_demo() {
  Timer total;
  print_environment(stdout, environment_report(), true);

  fmt::print("\n== ceilings (dsk bench ceilings --quick) ==\n");
  const bench::BenchReport ceilings = bench::run_bench({"ceilings"}, {.quick = true});
  bench::print_ceilings(stdout, ceilings.ceilings);

  fmt::print("\n== verification (dsk verify --quick) ==\n");
  const bench::VerifyReport verify = bench::run_verify({}, {.quick = true});
  bench::print_verify_table(stdout, verify);

  fmt::print("\n== benchmark (dsk bench core --quick) ==\n");
  const bench::BenchReport bench =
      bench::run_bench({"core"}, {.quick = true, .ceilings = ceilings.ceilings});
  bench::print_bench_table(stdout, bench);

  fmt::print("\ndemo: {}; verify {}/{} passed; {:.1f} s\n", throughput_text(bench.rows.front()),
             verify.passed(), verify.rows.size(), total.seconds());
  if (verify.failed() > 0) throw CLI::RuntimeError(1);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "demo", "environment, ceilings, verification and a short benchmark, in seconds");
  cmd->callback(run_demo);
}

}  // namespace dsk::cli
