// `dsk jit ls|clear|warmup`: inspect and manage the JIT's kernel cache, and time a cold compile
// against a warm load in a new process.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/timer.hpp>
#include <dsk/jit.hpp>

#include "bench/cases/gemm_tuning.hpp"
#include "commands.hpp"

namespace dsk::cli {
namespace {

namespace fs = std::filesystem;

// The kernel `warmup` times: the tile layer's worked example for this machine's backend, which
// includes the whole tile layer as every real kernel does.
jit::KernelSource warmup_kernel(const std::string& module) {
  jit::KernelSource source = jit::tile_example_kernel(backend(), 256);
  source.module = module;
  return source;
}

std::string human_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024 * 1024));
}

std::string human_age(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 2 * 3600) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} d", seconds / 86400);
}

std::string human_seconds(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.1f} us", seconds * 1e6);
  if (seconds < 1) return fmt::format("{:.2f} ms", seconds * 1e3);
  return fmt::format("{:.2f} s", seconds);
}

std::string shell_quote(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void list_entries(const std::string& module) {
  const std::vector<jit::CacheEntry> entries = jit::list_cache(module);
  for (const fs::path& root : jit::cache_roots(module)) {
    fmt::print("{}\n", root.string());
    fmt::print("  {:<40} {:<32} {:>10} {:>8} {:>8}  {}\n", "name", "digest", "size", "age", "idle",
               "committed");
    uint64_t total = 0;
    for (const jit::CacheEntry& e : entries) {
      if (e.path.parent_path().parent_path() != root) continue;
      total += e.bytes;
      fmt::print("  {:<40} {:<32} {:>10} {:>8} {:>8}  {}\n", e.name, e.digest, human_bytes(e.bytes),
                 human_age(e.age_s), human_age(e.idle_s),
                 e.committed ? "yes" : "NO (rebuilt on use)");
    }
    fmt::print("  total {}\n", human_bytes(total));
  }
}

void clear_entries(const std::string& prefix, const std::string& module) {
  const jit::ClearResult r = jit::clear_cache(prefix, module);
  fmt::print("removed {} entr{} ({})\n", r.entries, r.entries == 1 ? "y" : "ies",
             human_bytes(r.bytes));
  DSK_CHECK(r.errors.empty(), "dsk jit clear",
            fmt::format("could not remove {} entr{}, e.g. {}", r.errors.size(),
                        r.errors.size() == 1 ? "y" : "ies", r.errors.empty() ? "" : r.errors[0]));
}

// Runs `dsk jit __load` in a new process, which loads the warmup kernel from the disk cache.
// Returns the child's stdout (its report line) and the wall time of the whole process.
std::pair<std::string, double> load_in_new_process(const fs::path& root,
                                                   const std::string& module) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  std::string command =
      shell_quote(self.string()) + " jit __load --root " + shell_quote(root.string());
  if (!module.empty()) command += " --module " + shell_quote(module);
  Timer timer;
  FILE* pipe = popen(command.c_str(), "r");  // its stderr (DSK_JIT_DEBUG) goes to ours
  DSK_CHECK(pipe != nullptr, "dsk jit warmup", "cannot start " + self.string());
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  const double seconds = timer.seconds();
  DSK_CHECK(status == 0, "dsk jit warmup", "the loading process failed: " + output);
  return {output, seconds};
}

void warmup(const std::string& module) {
  const jit::KernelSource source = warmup_kernel(module);
  const jit::Loaded cold = jit::load(source, {.force_compile = true});
  const jit::Loaded hit = jit::load(source);
  const fs::path root = cold.path.parent_path().parent_path();
  const auto [report, process_seconds] = load_in_new_process(root, module);
  double load_seconds = -1;
  char origin[32] = {};
  if (const size_t at = report.rfind("load_s="); at != std::string::npos)
    std::sscanf(report.c_str() + at, "load_s=%lf origin=%31s", &load_seconds, origin);

  fmt::print("kernel          {}.{}\n", source.name, cold.digest);
  fmt::print("entry           {}\n", cold.path.string());
  fmt::print("cold compile    {}  (generate, compile, publish, dlopen)\n",
             human_seconds(cold.seconds));
  fmt::print(
      "warm load       {}  in a new process (key, disk lookup, dlopen); {} with process "
      "start\n",
      human_seconds(load_seconds), human_seconds(process_seconds));
  fmt::print("in-process hit  {}\n", human_seconds(hit.seconds));
  if (std::string(origin) != "disk")
    fmt::print(stderr, "warning: the new process did not load from the disk cache ({})\n", report);
}

// `warmup --autotune`: every GEMM shape of `dsk bench gemm` once with DSK_AUTOTUNE=1, which times
// the candidate configs of each shape not tuned yet and caches the fastest next to the kernels.
void autotune_gemm(bool quick) {
  setenv("DSK_GEMM_AUTOTUNE", "1", 1);
  setenv("DSK_GEMM_PRINT_CONFIGS", "1", 1);  // the engine prints each shape's choice once
  Timer total;
  Timer shape;
  std::string current;
  const auto report = [&] {
    if (!current.empty()) fmt::print("  {:<56} {}\n", current, human_seconds(shape.seconds()));
  };
  fmt::print("autotuning the GEMM benchmark shapes (choices go to {}/autotune/gemm.json):\n",
             jit::writable_cache_root("GEMM").string());
  std::fflush(stdout);
  bench::warm_up_gemm_shapes(quick, [&](const std::string& what) {
    report();
    std::fflush(stdout);
    current = what;
    shape = Timer();
  });
  report();
  fmt::print("autotuned in {}\n", human_seconds(total.seconds()));
}

// The hidden half of warmup, run in the new process.
void load_for_warmup(const std::string& root, const std::string& module) {
  const std::string variable =
      module.empty() ? "DSK_JIT_CACHE_DIR" : "DSK_" + module + "_JIT_CACHE_DIR";
  setenv(variable.c_str(), root.c_str(), 1);
  const jit::Loaded loaded = jit::load(warmup_kernel(module));
  fmt::print("load_s={:.9f} origin={}\n", loaded.seconds, jit::origin_name(loaded.origin));
}

}  // namespace

void add_jit_command(CLI::App& app) {
  CLI::App* jit = app.add_subcommand("jit", "manage the JIT kernel cache");
  jit->require_subcommand(1);
  auto module = std::make_shared<std::string>();
  auto prefix = std::make_shared<std::string>();
  auto root = std::make_shared<std::string>();
  auto add_module_option = [&](CLI::App* sub) {
    sub->add_option("--module", *module, "read DSK_<MODULE>_JIT_* before DSK_JIT_* (e.g. GEMM)");
  };

  CLI::App* ls = jit->add_subcommand("ls", "list cache entries: name, digest, size, age");
  add_module_option(ls);
  ls->callback([module] { list_entries(*module); });

  CLI::App* clear = jit->add_subcommand("clear", "remove cache entries (all, or by name prefix)");
  clear->add_option("prefix", *prefix, "remove only entries whose name starts with this");
  add_module_option(clear);
  clear->callback([prefix, module] { clear_entries(*prefix, *module); });

  CLI::App* warm = jit->add_subcommand(
      "warmup", "compile a representative kernel cold, then time a warm load in a new process");
  add_module_option(warm);
  auto autotune = std::make_shared<bool>(false);
  auto quick = std::make_shared<bool>(false);
  warm->add_flag("--autotune", *autotune,
                 "then tune (DSK_AUTOTUNE=1) and compile every GEMM shape of `dsk bench gemm`");
  warm->add_flag("--quick", *quick, "with --autotune: only the shapes of `dsk bench gemm --quick`");
  warm->callback([module, autotune, quick] {
    warmup(*module);
    if (*autotune) autotune_gemm(*quick);
  });

  CLI::App* load = jit->add_subcommand("__load", "");
  load->group("");  // hidden: the new process of `warmup`
  load->add_option("--root", *root)->required();
  add_module_option(load);
  load->callback([root, module] { load_for_warmup(*root, *module); });
}

}  // namespace dsk::cli
