// The `dsk` program: environment report, benchmarks against this machine's roofline,
// verification against dsk::ref, the demo and JIT cache management (DESIGN §7).
//
// Every error, whether a bad command line (CLI11) or a dsk::Error raised by a command, ends as one
// line "dsk: <message>" on stderr and exit status 2. `--help` prints help and exits 0; commands
// that finish with another status (verify: 1 when a case fails) throw CLI::RuntimeError(status).
#include <cstdio>
#include <exception>
#include <string>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace {

constexpr int kErrorStatus = 2;

int fail(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  while (!message.empty() && message.back() == ' ') message.pop_back();
  std::fflush(stdout);
  fmt::print(stderr, "dsk: {}\n", message);
  return kErrorStatus;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsk: DeepSeek's inference kernels on x86 CPUs (DSKernels)", "dsk"};
  app.require_subcommand(1);
  try {
    dsk::cli::add_env_command(app);
    dsk::cli::add_bench_command(app);
    dsk::cli::add_verify_command(app);
    dsk::cli::add_demo_command(app);
    dsk::cli::add_model_commands(app);
    dsk::cli::add_run_command(app);
#ifdef DSK_CLI_HAS_JIT
    dsk::cli::add_jit_command(app);
#endif
    app.parse(argc, argv);  // runs the chosen command's callback
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    return fail(std::string(e.what()) + " (see dsk --help)");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
