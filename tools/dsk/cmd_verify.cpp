// `dsk verify [MODULE...] [--model] [--json F] [--quick] [--filter RE] [--list]`: runs every
// optimised kernel against its reference on fresh random data and prints a pass/fail table; exits 1
// when a case fails.
#include <memory>

#include <fmt/core.h>

#include "bench/runner.hpp"
#include "commands.hpp"
#include "shared.hpp"

namespace dsk::cli {
namespace {

void list_verify_cases() {
  for (const bench::VerifyCase& c : bench::registry().verify_cases())
    fmt::print("{:<10} {:<24} {}{}\n", c.module, c.name, c.shape,
               c.quick ? "" : "  (not in --quick)");
}

void run_verify_command(const CaseOptions& o) {
  if (o.list) return list_verify_cases();
  if (!o.json.empty()) bench::check_output_file(o.json, "verify", "--json");
  const bench::VerifyReport report =
      bench::run_verify(o.modules, {.quick = o.quick, .filter = o.filter});
  bench::print_verify_table(stdout, report);
  if (!o.json.empty()) bench::write_json_file(o.json, bench::to_json(report), "verify");
  if (report.failed() > 0) throw CLI::RuntimeError(1);
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto options = std::make_shared<CaseOptions>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "check every optimised kernel against dsk::ref; exit status 1 if any case fails");
  add_case_options(cmd, *options, false);
  auto model = std::make_shared<bool>(false);
  cmd->add_flag("--model", *model,
                "the model cross-check: dsk::model on v32-tiny against the fp32 reference model "
                "(the same as the module `model`)");
  cmd->callback([options, model] {
    if (*model) options->modules.push_back("model");
    run_verify_command(*options);
  });
}

}  // namespace dsk::cli
