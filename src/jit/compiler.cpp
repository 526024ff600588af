// The JIT's compiler driver: running the host compiler without a shell, its identity
// (`--version`), the effective flags, what -march=native means here, and the trivial probe that
// tells a broken compiler from a broken kernel.
#include <cpuid.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include <fmt/core.h>

#include "internal.hpp"

extern char** environ;

namespace dsk::jit::internal {
namespace {

struct Remembered {
  bool ok = false;
  std::string text;
};

std::mutex g_compiler_mutex;
std::map<std::string, Remembered> g_identities;  // compiler command -> --version output
std::map<std::string, Remembered> g_probes;      // command + flags -> probe result

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return out;
    }
  }
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

std::string compute_target_identity() {
  const CpuFeatures& f = cpu_features();
  std::string id =
      fmt::format("{} family {} model {} stepping {}", f.vendor, f.family, f.model_id, f.stepping);
  auto add_leaf = [&](unsigned leaf, unsigned subleaf, bool with_ebx) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (static_cast<unsigned>(__get_cpuid_max(leaf & 0x80000000u, nullptr)) < leaf) return;
    __cpuid_count(leaf, subleaf, a, b, c, d);
    // Leaf 1's EBX holds the APIC id of the core that ran this, so it is left out.
    id += fmt::format(" {:x}.{:x}:{:08x}.{:08x}.{:08x}.{:08x}", leaf, subleaf, a, with_ebx ? b : 0,
                      c, d);
  };
  add_leaf(1, 0, false);
  add_leaf(7, 0, true);
  add_leaf(7, 1, true);
  add_leaf(0xD, 1, false);
  add_leaf(0x80000001u, 0, false);
  return id;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::optional<fs::path>& log) {
  ProcessResult result;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  int pipe_fds[2] = {-1, -1};
  if (!log && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    result.output = fmt::format("pipe: {}", std::strerror(errno));
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (log) {
    posix_spawn_file_actions_addopen(&actions, 1, log->c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  } else {
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  }
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (pipe_fds[1] >= 0) close(pipe_fds[1]);
  if (rc != 0) {
    if (pipe_fds[0] >= 0) close(pipe_fds[0]);
    result.output = fmt::format("{}: {}", argv[0], std::strerror(rc));
    return result;
  }
  result.started = true;
  if (pipe_fds[0] >= 0) {
    result.output = read_all(pipe_fds[0]);
    close(pipe_fds[0]);
  }
  result.exit_code = wait_exit_code(pid);
  return result;
}

std::string compiler_identity(const std::vector<std::string>& compiler) {
  const std::string command = shell_join(compiler);
  std::lock_guard lock(g_compiler_mutex);
  auto it = g_identities.find(command);
  if (it == g_identities.end()) {
    std::vector<std::string> argv = compiler;
    argv.push_back("--version");
    const ProcessResult r = run_process(argv);
    Remembered id{r.started && r.exit_code == 0, r.output};
    if (r.started && r.exit_code != 0)
      id.text = fmt::format("exit status {}: {}", r.exit_code, first_line(r.output));
    it = g_identities.emplace(command, id).first;
  }
  if (!it->second.ok)
    throw Unavailable{fmt::format("the JIT compiler '{}' cannot be run ({})", command,
                                  first_line(it->second.text))};
  return it->second.text;
}

std::vector<std::string> effective_flags(const Settings& settings, Backend isa) {
  // -ffp-contract=off: the same rounding as the library's own (AOT) instantiations, see
  // cmake/DskOptions.cmake.
  std::vector<std::string> flags = {
      "-O3",     "-march=native",       "-std=c++20", "-fPIC", "-ffp-contract=off",
      "-shared", "-fvisibility=hidden", "-Wl,-z,defs"};
  // The ISA's own flags (cmake/DskOptions.cmake), so that an avx512 or amx kernel compiles where
  // -march=native lacks them (tests and `dsk jit warmup` build such kernels on any host).
  const std::vector<std::string> isa_flags =
      split_words(isa == Backend::amx      ? DSK_JIT_AMX_FLAGS
                  : isa == Backend::avx512 ? DSK_JIT_AVX512_FLAGS
                                           : "");
  flags.insert(flags.end(), isa_flags.begin(), isa_flags.end());
  flags.insert(flags.end(), settings.user_flags.begin(), settings.user_flags.end());
  return flags;
}

const std::string& target_identity() {
  static const std::string id = compute_target_identity();
  return id;
}

std::optional<std::string> probe_failure(const std::vector<std::string>& compiler,
                                         const std::vector<std::string>& flags,
                                         const fs::path& dir) {
  const std::string key = shell_join(compiler) + "\n" + shell_join(flags);
  std::lock_guard lock(g_compiler_mutex);
  auto it = g_probes.find(key);
  if (it == g_probes.end() && dir.empty()) return std::nullopt;
  if (it == g_probes.end()) {
    const fs::path source = dir / "probe.cpp", library = dir / "probe.so", log = dir / "probe.log";
    write_file_synced(source, "extern \"C\" int dsk_jit_probe() { return 0; }\n");
    std::vector<std::string> argv = compiler;
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {source.string(), "-o", library.string()});
    const ProcessResult r = run_process(argv, log);
    Remembered probe{r.started && r.exit_code == 0 && fs::exists(library),
                     r.started ? read_text(log).value_or("") : r.output};
    std::error_code ec;
    for (const fs::path& p : {source, library, log}) fs::remove(p, ec);
    it = g_probes.emplace(key, probe).first;
  }
  if (it->second.ok) return std::nullopt;
  return it->second.text;
}

void forget_compilers() {
  std::lock_guard lock(g_compiler_mutex);
  g_identities.clear();
  g_probes.clear();
}

}  // namespace dsk::jit::internal
