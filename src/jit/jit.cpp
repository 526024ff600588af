// dsk::jit's front door: the in-process map, the disk-cache lookup, compile-and-publish, the AOT
// registry and the fallback that get() takes when runtime compilation is off or impossible.
#include <dlfcn.h>

#include <atomic>
#include <cctype>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <dsk/core/timer.hpp>
#include <dsk/core/version.hpp>

#include "internal.hpp"

namespace dsk::jit {
namespace {

using namespace internal;

// One requested kernel in this process. Its mutex is held while the kernel is looked up or
// compiled, so threads asking for the same kernel at once wait for one compile.
struct Slot {
  std::mutex mutex;
  Entry entry = nullptr;
  std::string digest;
  fs::path path;
};

// A kernel loaded in this process, by digest: two requests that differ only in ways the key does
// not see (blanks in flags, another include directory with the same headers) share it.
struct LoadedKernel {
  Entry entry = nullptr;
  fs::path path;
};

struct Memory {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<Slot>> by_request;
  std::unordered_map<std::string, LoadedKernel> by_digest;
};

Memory& memory() {
  static Memory m;
  return m;
}

struct Counters {
  std::atomic<int64_t> memory_hits{0}, disk_hits{0}, compiles{0}, rebuilds{0};
};

Counters& counters() {
  static Counters c;
  return c;
}

struct AotRegistry {
  std::mutex mutex;
  std::unordered_map<std::string, Entry> entries;
};

AotRegistry& aot_registry() {
  static AotRegistry r;
  return r;
}

std::string without_blanks(std::string_view text) {
  std::string out;
  for (char c : text)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') out += c;
  return out;
}

// Everything the digest depends on except header contents and the compiler's identity, which a
// process takes as fixed: the second request for a kernel costs a map lookup, not a re-hash of
// its headers.
std::string request_key(const KernelSource& s, const Settings& settings) {
  std::string key;
  for (std::string_view part : {std::string_view(s.name), std::string_view(s.header),
                                std::string_view(s.instantiation), std::string_view(s.args_type),
                                backend_name(s.isa), std::string_view(s.dependency_signature),
                                std::string_view(settings.include_root.native())}) {
    key += part;
    key += '\0';
  }
  key += shell_join(settings.compiler) + '\0' + shell_join(settings.user_flags);
  return key;
}

std::shared_ptr<Slot> slot_for(const std::string& request) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  std::shared_ptr<Slot>& slot = m.by_request[request];
  if (!slot) slot = std::make_shared<Slot>();
  return slot;
}

std::optional<LoadedKernel> loaded_digest(const std::string& digest) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  auto it = m.by_digest.find(digest);
  if (it == m.by_digest.end()) return std::nullopt;
  return it->second;
}

void remember_digest(const std::string& digest, const LoadedKernel& kernel) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  m.by_digest.emplace(digest, kernel);
}

// dlopens kernel.so and finds its entry; the handle stays open for the life of the process.
Entry open_entry(const fs::path& library, std::string* error) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* message = dlerror();
    *error = message ? message : "dlopen failed";
    return nullptr;
  }
  void* symbol = dlsym(handle, "dsk_jit_entry");
  if (!symbol) {
    *error = "kernel.so has no dsk_jit_entry";
    dlclose(handle);
    return nullptr;
  }
  return reinterpret_cast<Entry>(symbol);
}

std::string utc_timestamp(time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string first_lines(const std::string& text, int count) {
  std::istringstream in(text);
  std::string line, out;
  for (int i = 0; i < count && std::getline(in, line); ++i) out += line + "\n";
  if (std::getline(in, line)) out += "[...]\n";
  return out;
}

// Removes a staging directory on every exit path unless the entry was published from it.
class StagingGuard {
 public:
  explicit StagingGuard(fs::path dir) : dir_(std::move(dir)) {}
  ~StagingGuard() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  void release() { dir_.clear(); }

 private:
  fs::path dir_;
};

std::vector<std::string> compile_command(const CacheKey& key, const fs::path& dir) {
  std::vector<std::string> argv = key.compiler;
  argv.insert(argv.end(), key.flags.begin(), key.flags.end());
  argv.insert(argv.end(), {"-I" + key.include_root.string(), (dir / "kernel.cpp").string(), "-o",
                           (dir / "kernel.so").string()});
  return argv;
}

std::string unusable_compiler(const CacheKey& key, const std::string& probe_output) {
  std::string output = first_lines(probe_output, 3);
  while (!output.empty() && std::isspace(static_cast<unsigned char>(output.back())))
    output.pop_back();
  return fmt::format("the JIT compiler '{}' fails to compile a trivial file with flags '{}'{}{}",
                     shell_join(key.compiler), shell_join(key.flags), output.empty() ? "" : ": ",
                     output);
}

// A failed compile is the kernel's fault when the compiler builds a trivial file with the same
// flags (dsk::Error with the compiler's message and the path of the full log); otherwise the
// compiler is unusable here and get() falls back.
[[noreturn]] void report_compile_failure(const KernelSource& source, const CacheKey& key,
                                         const fs::path& root, const fs::path& staged,
                                         const std::string& command, int exit_code) {
  const std::string log = read_text(staged / "compile.log").value_or("");
  if (auto failure = probe_failure(key.compiler, key.flags, staged))
    throw Unavailable{unusable_compiler(key, *failure)};
  const fs::path log_path = root / "failed" / (source.name + "." + key.digest + ".log");
  const fs::path log_tmp = log_path.string() + "." + std::to_string(getpid()) + ".tmp";
  std::string where = log_path.string();
  try {
    write_file_synced(log_tmp, "# " + command + "\n\n" + log);
    fs::rename(log_tmp, log_path);
  } catch (...) {
    where = "(could not be kept: " + log_tmp.string() + ")";
  }
  DSK_FAIL("dsk::jit::load",
           fmt::format("kernel {} does not compile (exit status {}). The compiler says:\n{}Full "
                       "log: {}\nCommand: {}",
                       source.name, exit_code, first_lines(log, 40), where, command));
}

nlohmann::json meta_json(const KernelSource& source, const CacheKey& key,
                         const std::string& command, double seconds, const fs::path& library) {
  const time_t now = std::time(nullptr);
  std::error_code ec;
  return {{"name", source.name},
          {"digest", key.digest},
          {"module", source.module},
          {"isa", std::string(backend_name(source.isa))},
          {"compiler", shell_join(key.compiler)},
          {"compiler_identity", key.compiler_identity},
          {"flags", key.flags},
          {"headers", key.headers},
          {"dependency_signature", source.dependency_signature},
          {"command", command},
          {"compile_seconds", seconds},
          {"created", utc_timestamp(now)},
          {"created_unix", static_cast<int64_t>(now)},
          {"dsk_version", std::string(build_info().version)},
          {"so_bytes", static_cast<uint64_t>(fs::file_size(library, ec))},
          {"so_xxh3", file_digest(library).value_or("")}};
}

Loaded compile(const KernelSource& source, const Settings& settings, const CacheKey& key) {
  if (auto failure = probe_failure(key.compiler, key.flags, {}))
    throw Unavailable{unusable_compiler(key, *failure)};
  const fs::path root = write_root(settings);
  const fs::path staged = make_staging_dir(root, source.name);
  StagingGuard guard(staged);
  write_file_synced(staged / "kernel.cpp", generate_source(source));
  const std::vector<std::string> argv = compile_command(key, staged);
  const std::string command = shell_join(argv);
  debug_log(settings, fmt::format("miss {}.{}: {}", source.name, key.digest, command));

  Timer timer;
  const ProcessResult r = run_process(argv, staged / "compile.log");
  const double seconds = timer.seconds();
  if (!r.started) throw Unavailable{"the JIT compiler cannot be run (" + r.output + ")"};
  std::error_code ec;
  if (r.exit_code != 0 || !fs::exists(staged / "kernel.so", ec))
    report_compile_failure(source, key, root, staged, command, r.exit_code);
  ++counters().compiles;
  debug_log(settings, fmt::format("compiled {} in {:.3f} s", source.name, seconds));

  fs::remove(staged / "compile.log", ec);
  fsync_path(staged / "kernel.so");
  write_file_synced(staged / "meta.json",
                    meta_json(source, key, command, seconds, staged / "kernel.so").dump(2) + "\n");
  write_file_synced(staged / ".committed", key.digest + "\n");
  fsync_path(staged);

  const fs::path final_dir = entry_dir(root, source.name, key.digest);
  const fs::path from = publish(staged, final_dir, settings);
  if (from == final_dir)
    guard.release();
  else
    warn(fmt::format("could not publish {}; this process uses its private copy",
                     final_dir.string()));
  std::string error;
  const Entry entry = open_entry(from / "kernel.so", &error);
  DSK_CHECK(entry != nullptr, "dsk::jit::load",
            fmt::format("the compiled kernel {} does not load: {}", source.name, error));
  return Loaded{entry, key.digest, final_dir, Origin::compiled, seconds};
}

// Searches every root; an entry that is not usable is reported and removed, and the kernel is
// then compiled into the write root.
Loaded find_or_compile(const KernelSource& source, const Settings& settings, const CacheKey& key) {
  for (const fs::path& root : settings.roots) {
    const fs::path dir = entry_dir(root, source.name, key.digest);
    EntryCheck check = check_entry(dir);
    if (!check.exists) continue;
    if (check.usable) {
      std::string error;
      if (const Entry entry = open_entry(dir / "kernel.so", &error)) {
        touch_committed(dir);
        ++counters().disk_hits;
        debug_log(settings, fmt::format("hit (disk) {}", dir.string()));
        return Loaded{entry, key.digest, dir, Origin::disk, 0};
      }
      check.problem = "has a kernel.so that does not load (" + error + ")";
    }
    ++counters().rebuilds;
    warn(fmt::format("the cache entry '{}' {}; rebuilding it", dir.string(), check.problem));
    remove_entry(root, dir);  // best effort: a read-only root keeps it, and is searched past
  }
  return compile(source, settings, key);
}

Loaded load_unchecked(const KernelSource& source, const LoadOptions& options) {
  Timer timer;
  const Settings settings = read_settings(source.module);
  if (!settings.enabled)
    throw Unavailable{fmt::format("runtime compilation is off ({}=0)", settings.disabled_by)};
  const std::shared_ptr<Slot> slot = slot_for(request_key(source, settings));
  std::lock_guard lock(slot->mutex);
  if (slot->entry && !options.force_compile) {
    ++counters().memory_hits;
    debug_log(settings, fmt::format("hit (memory) {}.{}", source.name, slot->digest));
    return Loaded{slot->entry, slot->digest, slot->path, Origin::memory, timer.seconds()};
  }
  const CacheKey key = compute_key(source, settings);
  Loaded loaded;
  const auto same = options.force_compile ? std::nullopt : loaded_digest(key.digest);
  if (same) {
    ++counters().memory_hits;
    loaded = Loaded{same->entry, key.digest, same->path, Origin::memory, 0};
  } else {
    loaded = options.force_compile ? compile(source, settings, key)
                                   : find_or_compile(source, settings, key);
  }
  slot->entry = loaded.entry;
  slot->digest = loaded.digest;
  slot->path = loaded.path;
  remember_digest(loaded.digest, LoadedKernel{loaded.entry, loaded.path});
  loaded.seconds = timer.seconds();
  if (loaded.origin == Origin::disk)
    debug_log(settings, fmt::format("loaded {} in {:.4f} s", source.name, loaded.seconds));
  return loaded;
}

}  // namespace

std::string_view origin_name(Origin origin) {
  switch (origin) {
    case Origin::memory:
      return "memory";
    case Origin::disk:
      return "disk";
    case Origin::compiled:
      return "compiled";
  }
  return "?";
}

std::string_view provider_name(Provider provider) {
  switch (provider) {
    case Provider::jit:
      return "jit";
    case Provider::aot:
      return "aot";
    case Provider::runtime:
      return "runtime";
  }
  return "?";
}

Loaded load(const KernelSource& source, const LoadOptions& options) {
  validate("dsk::jit::load", source);
  try {
    return load_unchecked(source, options);
  } catch (const Unavailable& u) {
    DSK_FAIL("dsk::jit::load", u.reason);
  }
}

void register_aot(std::string_view instantiation, Entry entry) {
  DSK_CHECK_ARG(entry != nullptr, "dsk::jit::register_aot", "entry", "a function", "nullptr");
  AotRegistry& r = aot_registry();
  std::lock_guard lock(r.mutex);
  r.entries[without_blanks(instantiation)] = entry;
}

Entry find_aot(std::string_view instantiation) {
  AotRegistry& r = aot_registry();
  std::lock_guard lock(r.mutex);
  auto it = r.entries.find(without_blanks(instantiation));
  return it == r.entries.end() ? nullptr : it->second;
}

Availability availability(std::string_view module) {
  try {
    const Settings settings = read_settings(module);
    if (!settings.enabled)
      return {false, fmt::format("runtime compilation is off ({}=0)", settings.disabled_by)};
    compiler_identity(settings.compiler);
    check_include_root(settings);
    return {true, ""};
  } catch (const Unavailable& u) {
    return {false, u.reason};
  }
}

Stats stats() {
  const Counters& c = counters();
  return Stats{c.memory_hits.load(), c.disk_hits.load(), c.compiles.load(), c.rebuilds.load()};
}

namespace detail {

Resolved resolve(const KernelSource& source) {
  validate("dsk::jit::get", source);
  if (source.isa == Backend::generic) {
    const Settings settings = read_settings(source.module);
    if (settings.enabled && !settings.compile_generic) {  // DSK_JIT=auto: not worth compiling
      const Entry aot = find_aot(source.instantiation);
      debug_log(settings, fmt::format("{}: generic, not compiled (DSK_JIT=auto): {}", source.name,
                                      aot ? "ahead-of-time" : "runtime-shape variant"));
      return aot ? Resolved{aot, Provider::aot} : Resolved{nullptr, Provider::runtime};
    }
  }
  try {
    return Resolved{load_unchecked(source, {}).entry, Provider::jit};
  } catch (const Unavailable& u) {
    warn_once(u.reason +
              "; kernels come from ahead-of-time instantiations or their "
              "runtime-shape variants");
    const Entry aot = find_aot(source.instantiation);
    debug_log(read_settings(source.module),
              fmt::format("{}: {}", source.name, aot ? "ahead-of-time" : "runtime-shape variant"));
    return aot ? Resolved{aot, Provider::aot} : Resolved{nullptr, Provider::runtime};
  }
}

void reset_process_state() {
  {
    Memory& m = memory();
    std::lock_guard lock(m.mutex);
    m.by_request.clear();  // loaded libraries stay mapped: entries handed out remain valid
    m.by_digest.clear();
  }
  Counters& c = counters();
  c.memory_hits = c.disk_hits = c.compiles = c.rebuilds = 0;
  forget_warnings();
  forget_compilers();
  forget_write_roots();
}

}  // namespace detail
}  // namespace dsk::jit
