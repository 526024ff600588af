#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <dsk/core.hpp>

int main(int argc, char** argv) {
  CLI::App app{"DSKernels"};
  app.require_subcommand(1);
  app.add_subcommand("env", "print the environment");
  CLI11_PARSE(app, argc, argv);
  fmt::print("dsk {}\n", dsk::build_info().version);
  return 0;
}
