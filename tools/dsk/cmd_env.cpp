// `dsk env [--json]`: what this build is and what it sees: version and git revision, compiler and
// flags, CPU model and features, the chosen and the supported backends, threads, every DSK_*
// variable in effect (unknown names flagged) and the known ones with their defaults, the JIT
// cache and the MPI library.
#define OMPI_SKIP_MPICXX 1  // the C API is all we need; the C++ bindings only add warnings
#define MPICH_SKIP_MPICXX 1

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/core.h>

#ifdef DSK_CLI_HAS_MPI
#include <mpi.h>
#endif

#include <dsk/core/env.hpp>
#include <dsk/jit.hpp>

#include "bench/environment.hpp"
#include "commands.hpp"
#include "shared.hpp"

namespace dsk::cli {
namespace {

// The JIT as an acceptance report records it: whether kernels compile at run time here (and why
// not), the cache roots in search order and the committed entries across them.
nlohmann::json jit_json() {
  const jit::Availability availability = jit::availability();
  std::vector<std::string> roots;
  for (const auto& root : jit::cache_roots()) roots.push_back(root.string());
  int64_t entries = 0;
  for (const auto& entry : jit::list_cache()) entries += entry.committed ? 1 : 0;
  return {{"available", availability.available},
          {"reason", availability.reason},
          {"roots", roots},
          {"entries", entries}};
}

// MPI_Get_library_version may be called before MPI_Init (MPI 3.0 §8.1.1).
std::string mpi_library_version() {
#ifdef DSK_CLI_HAS_MPI
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  std::string version(text, static_cast<size_t>(length));
  version = version.substr(0, version.find('\n'));
  while (!version.empty() && (version.back() == ' ' || version.back() == '\0')) version.pop_back();
  return version;
#else
  return "not linked (MPI was not found at build time)";
#endif
}

void print_variables(std::FILE* out, const nlohmann::json& report) {
  fmt::print(out, "variables in effect:\n");
  if (report["variables"].empty()) fmt::print(out, "  (none)\n");
  for (const auto& v : report["variables"])
    fmt::print(out, "  {}={}{}\n", v["name"].get<std::string>(), v["value"].get<std::string>(),
               v["known"].get<bool>() ? "" : "   (unknown)");
  size_t width = 0;
  for (const auto& v : report["known_variables"])
    width = std::max(width, v["name"].get<std::string>().size());
  fmt::print(out, "known variables (default; DSK_<MODULE>_<NAME> overrides where marked *):\n");
  for (const auto& v : report["known_variables"])
    fmt::print(
        out, "  {:<{}} {:1} {:<18} {}\n", v["name"].get<std::string>(), width,
        v["module_prefixable"].get<bool>() ? "*" : "",
        v["default"].get<std::string>().empty() ? "(empty)" : v["default"].get<std::string>(),
        v["description"].get<std::string>());
}

std::string joined(const nlohmann::json& list) {
  std::string out;
  for (const auto& item : list) out += (out.empty() ? "" : " ") + item.get<std::string>();
  return out;
}

}  // namespace

nlohmann::json environment_report() {
  nlohmann::json j = bench::environment_json();
  j["known_variables"] = nlohmann::json::array();
  for (const env::Variable& v : env::known_variables())
    j["known_variables"].push_back({{"name", v.name},
                                    {"default", v.default_text},
                                    {"description", v.description},
                                    {"module_prefixable", v.module_prefixable}});
  j["jit"] = jit_json();
  j["mpi"] = mpi_library_version();
  return j;
}

void print_environment(std::FILE* out, const nlohmann::json& r, bool brief) {
  auto s = [&](const char* key) { return r[key].get<std::string>(); };
  fmt::print(out, "dsk {} (git {}), {} build\n", s("version"), s("git"), s("build_type"));
  fmt::print(out, "  compiler  {}\n", s("compiler"));
  if (!brief) fmt::print(out, "  flags     {}\n", s("flags"));
  fmt::print(out, "cpu         {} ({}, family {} model {} stepping {})\n", s("cpu"),
             s("cpu_vendor"), r["cpu_family"].get<int>(), r["cpu_model"].get<int>(),
             r["cpu_stepping"].get<int>());
  fmt::print(out, "features    {}\n", joined(r["features"]));
  fmt::print(out, "backend     {} (supported: {})\n", s("backend"),
             joined(r["supported_backends"]));
  fmt::print(out, "threads     {}\n", r["threads"].get<int>());
  if (brief) return;
  const nlohmann::json& jit = r["jit"];
  fmt::print(out, "jit         {} ({} entries in {})\n",
             jit["available"].get<bool>() ? std::string("available")
                                          : "not available: " + jit["reason"].get<std::string>(),
             jit["entries"].get<int64_t>(), joined(jit["roots"]));
  fmt::print(out, "mpi         {}\n", s("mpi"));
  print_variables(out, r);
}

void add_env_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("env", "print the build, CPU, backend and DSK_* settings");
  cmd->add_flag("--json", *json, "print one JSON object instead of text");
  cmd->callback([json] {
    const nlohmann::json report = environment_report();
    if (*json)
      fmt::print("{}\n", report.dump(2));
    else
      print_environment(stdout, report, false);
  });
}

}  // namespace dsk::cli
