// Helpers the subcommands share: the environment report (cmd_env.cpp) that `dsk env` and
// `dsk demo` print, and the options of the commands that run cases.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace dsk::cli {

// The full `dsk env --json` object: bench::environment_json() plus "known_variables", "jit" and
// "mpi" (docs/bench.md).
nlohmann::json environment_report();
// The report as text; `brief` keeps the build, CPU, backend and thread lines only.
void print_environment(std::FILE* out, const nlohmann::json& report, bool brief);

// What `dsk bench` and `dsk verify` take.
struct CaseOptions {
  std::vector<std::string> modules;
  std::string json, plot, filter;
  bool quick = false;
  bool list = false;
};

// Adds [MODULE...] --json --quick --filter --list (and --plot when `with_plot`) to `cmd`.
void add_case_options(CLI::App* cmd, CaseOptions& options, bool with_plot);

}  // namespace dsk::cli
