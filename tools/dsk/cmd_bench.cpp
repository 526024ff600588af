// `dsk bench [MODULE...] [--json F] [--plot F] [--quick] [--filter RE] [--repeat N] [--preset P]
// [--checkpoint DIR] [--prefill-chunk N] [--list]`:
// measures the ceilings, then times each case of the chosen modules against them and against its
// peer.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <dsk/core/error.hpp>
#include <dsk/model.hpp>

#include "bench/cases/layer.hpp"
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

// The peers (oneDNN) thread with libgomp, whose barriers spin by default. On a 2-core machine a
// spinning thread holds its core while the thread it waits for is preempted, so one call of the
// peer costs a whole scheduler slice whenever anything else runs (measured: 2.3 ms vs 12 ms for
// one M = 1 matmul). dsk's own pool sleeps after a short spin; the peer gets the same policy.
// libgomp reads OMP_WAIT_POLICY once, when it is loaded, so the program restarts itself with it
// set (exec keeps the pid, so this also works under mpirun). A value the user set is kept.
void restart_with_sleeping_openmp_barriers() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t begin = 0; begin < cmdline.size();) {
    const size_t end = cmdline.find('\0', begin);
    args.push_back(cmdline.substr(begin, end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (args.empty()) return;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::error_code error;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  // The resolved path, not /proc/self/exe, so the process keeps its name in ps and top.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (!error) ::execv(self.c_str(), argv.data());  // returns only on failure: run as we are
}

void run_bench_command(const CaseOptions& o, int passes) {
  if (o.list) return list_bench_cases();
  restart_with_sleeping_openmp_barriers();
  if (!o.json.empty()) bench::check_output_file(o.json, "bench", "--json");
  if (!o.plot.empty()) bench::check_can_plot(o.plot);
  const bench::BenchReport report =
      bench::run_bench(o.modules, {.quick = o.quick, .filter = o.filter, .passes = passes});
  bench::print_ceilings(stdout, report.ceilings);
  fmt::print("\n");
  bench::print_bench_table(stdout, report);
  if (!o.json.empty()) bench::write_json_file(o.json, bench::to_json(report), "bench");
  if (!o.plot.empty()) bench::plot_roofline(report, o.plot);
}

// --preset P: the filter that keeps the layer module's cases of preset P ("decode v32-tiny",
// "prefill v32-tiny moe.gate", ...; bench/cases/layer.cpp).
std::string layer_preset_filter(const std::string& preset, const std::string& filter) {
  DSK_CHECK_ARG(filter.empty(), "bench", "--preset", "no --filter with it (it sets the filter)",
                filter);
  return "^layer/[a-z]+ " + preset + "( |$)";
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<CaseOptions>();
  auto preset = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "time kernels against this machine's ceilings (measured first) and a peer");
  add_case_options(cmd, *options, true);
  cmd->add_option("--preset", *preset, "run only the layer module's cases of model preset NAME")
      ->type_name("NAME")
      ->check(CLI::IsMember(model::preset_names()));
  auto passes = std::make_shared<int>(1);
  cmd->add_option(
         "--repeat", *passes,
         "time the selection N times over (passes minutes apart on a long run) and keep "
         "each case's fastest pass, as each ceiling keeps its own (default 1, at most 100)")
      ->type_name("N");
  auto checkpoint = std::make_shared<std::string>();
  cmd->add_option("--checkpoint", *checkpoint,
                  "the layer module reads the weights of the preset with these layer shapes from "
                  "this one-layer checkpoint (dsk make-checkpoint --preset v32 --layers 1 DIR)")
      ->type_name("DIR")
      ->check(CLI::ExistingDirectory);
  auto prefill_chunk = std::make_shared<int64_t>(0);
  CLI::Option* chunk_option =
      cmd->add_option("--prefill-chunk", *prefill_chunk,
                      "the layer module's prefill cases run in steps of N tokens (chunked "
                      "prefill; default: the preset's, one step of 2048 for v32)")
          ->type_name("N");
  cmd->callback([options, passes, preset, checkpoint, prefill_chunk, chunk_option] {
    if (chunk_option->count() > 0) bench::set_layer_prefill_chunk(*prefill_chunk);
    if (!checkpoint->empty()) bench::set_layer_checkpoint(*checkpoint);
    if (!preset->empty()) options->filter = layer_preset_filter(*preset, options->filter);
    run_bench_command(*options, *passes);
  });
}

}  // namespace dsk::cli
