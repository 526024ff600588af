// The subcommands of the `dsk` program. Each lives in its own cmd_<name>.cpp and adds itself to
// the CLI11 app; main.cpp calls every add_*_command and turns errors into one line + exit code 2.
#pragma once

#include <CLI/CLI.hpp>

namespace dsk::cli {

void add_env_command(CLI::App& app);  // dsk env [--json]
void add_bench_command(
    CLI::App& app);  // dsk bench ceilings|<module> [--json F] [--plot F] [--quick]
void add_verify_command(CLI::App& app);  // dsk verify [MODULE...] [--json F] [--quick]
void add_demo_command(CLI::App& app);    // dsk demo
void add_jit_command(CLI::App& app);     // dsk jit ls|clear|warmup
void add_model_commands(CLI::App& app);  // dsk make-checkpoint ... DIR, dsk model-info [DIR]
void add_run_command(CLI::App& app);     // dsk run --checkpoint DIR --prompt-ids FILE|-

}  // namespace dsk::cli
