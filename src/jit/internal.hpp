// Internals of dsk::jit shared by its translation units: settings, the compiler driver, the cache
// key and the disk cache. Not installed.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <dsk/jit.hpp>

namespace dsk::jit::internal {

namespace fs = std::filesystem;

// Raised inside the JIT when runtime compilation cannot work in this process (off, no usable
// compiler, no kernel headers, no writable directory): get() falls back to the AOT path, load()
// turns it into dsk::Error.
struct Unavailable {
  std::string reason;
};

// The JIT settings of one module, read from the environment on every call (getenv is cheap, and
// tests change the environment between calls).
struct Settings {
  std::string module;
  bool enabled = true;
  std::string disabled_by;  // the variable that turned the JIT off
  // DSK_JIT=1: get() compiles generic kernels too. The default (auto) compiles the avx512 and amx
  // ones only: a shape-specialised generic kernel took 8-36 s to compile on an AMD Zen 3 and ran
  // 0.8-1.5x its runtime-shape variant (docs/jit.md).
  bool compile_generic = false;
  std::vector<std::string> compiler;  // program and leading arguments
  std::vector<std::string> user_flags;
  std::vector<fs::path> roots;
  fs::path include_root;  // empty when no tree with dsk/kernels was found
  bool debug = false;
};
Settings read_settings(std::string_view module);

// Splits at blank characters; runs of blanks count as one.
std::vector<std::string> split_words(std::string_view text);
// A command line for logs and meta.json, quoting words that need it for a POSIX shell.
std::string shell_join(const std::vector<std::string>& words);

// Prints "dsk::jit: <message>" on stderr, once per process for each distinct message.
void warn_once(const std::string& message);
void warn(const std::string& message);
void debug_log(const Settings& settings, const std::string& message);
void forget_warnings();

// ---- compiler.cpp ----

struct ProcessResult {
  bool started = false;
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout + stderr when captured; the spawn error when !started
};
// Runs argv (PATH search) with stdin from /dev/null; stdout and stderr go to `log` when given,
// else are captured into `output`.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::optional<fs::path>& log = std::nullopt);

// The `--version` output of the compiler, run once per compiler per process. Raises Unavailable
// when it cannot be run.
std::string compiler_identity(const std::vector<std::string>& compiler);
// -O3 -march=native -std=c++20 -fPIC -shared ... + ISA flags + the user's flags.
std::vector<std::string> effective_flags(const Settings& settings, Backend isa);
// What -march=native means on this CPU: vendor, family/model and the CPUID feature words, so
// nodes with different CPUs sharing a cache root do not share binaries.
const std::string& target_identity();
// Whether the compiler builds a trivial shared object with these flags (asked once per
// compiler and flags per process); `dir` is a scratch directory, or empty to only recall an
// earlier answer. Returns the compiler's output on failure.
std::optional<std::string> probe_failure(const std::vector<std::string>& compiler,
                                         const std::vector<std::string>& flags,
                                         const fs::path& dir);
void forget_compilers();

// ---- key.cpp ----

// Validates every field of `source`; raises dsk::Error naming `function` and the field.
void validate(const char* function, const KernelSource& source);
// Raises Unavailable when the include root has no dsk/kernels.
void check_include_root(const Settings& settings);
// The key of `source` under `settings`; raises Unavailable when the compiler or the kernel
// headers are missing.
CacheKey compute_key(const KernelSource& source, const Settings& settings);
// XXH3-128 of a file's bytes as 32 hex digits; nullopt when it cannot be read.
std::optional<std::string> file_digest(const fs::path& path);

// ---- cache.cpp ----

struct EntryCheck {
  bool exists = false;
  bool usable = false;
  std::string problem;  // why an existing entry is not usable
};
// Whether <dir> is a committed entry whose kernel.so matches the size and digest in meta.json.
EntryCheck check_entry(const fs::path& dir);
// <root>/cache/<name>.<digest>
fs::path entry_dir(const fs::path& root, const std::string& name, const std::string& digest);
// The first root if it is writable, else a private temporary root (one warning). Raises
// Unavailable when neither works.
fs::path write_root(const Settings& settings);
// A fresh <root>/tmp/<name>.<pid>.<random> directory.
fs::path make_staging_dir(const fs::path& root, const std::string& name);
// Writes a file and fsyncs it; raises Unavailable on failure.
void write_file_synced(const fs::path& path, std::string_view content);
std::optional<std::string> read_text(const fs::path& path);
void fsync_path(const fs::path& path);
// Publishes a staged entry at `final_dir`; returns the directory to load from (ours or a
// committed winner). See the NOTES in cache.cpp.
fs::path publish(const fs::path& staged, const fs::path& final_dir, const Settings& settings);
// Marks a cache hit (the mtime of .committed is the entry's last use); read-only roots are fine.
void touch_committed(const fs::path& dir);
// Moves `dir` out of the cache namespace atomically, then deletes it. Returns false if it could
// not be moved or deleted.
bool remove_entry(const fs::path& root, const fs::path& dir);
void forget_write_roots();
// The entries of one root, sorted by path.
std::vector<CacheEntry> list_root(const fs::path& root);
// Deletes failed-compile logs and the staging directories of dead processes.
void remove_leftovers(const fs::path& root);

}  // namespace dsk::jit::internal
