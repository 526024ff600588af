// dsk::jit — DeepJIT on CPU: a kernel is a function template in include/dsk/kernels/; at run time
// it is instantiated with compile-time shapes and knobs, compiled by the host compiler, cached on
// disk and loaded with dlopen (DESIGN §5; docs/jit.md has the cache layout, the key and the
// environment variables).
//
//   // JIT-compiled, else an ahead-of-time instantiation, else the runtime-shape variant:
//   auto rowsum = jit::get<RowsumArgs>(source, &rowsum_runtime_shape);
//   rowsum(args);
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>

namespace dsk::jit {

// The one exported function of a compiled kernel; `args` points to the kernel's Args struct.
using Entry = void (*)(const void* args);

// What to compile. The generated kernel.cpp includes `header` and exports
//   extern "C" void dsk_jit_entry(const void* a)
// which calls `instantiation` on *static_cast<const args_type*>(a). The instantiation names every
// knob by designated initializer, e.g.
//   dsk::kernels::jit_test::rowsum<dsk::kernels::jit_test::RowsumConfig{.cols = 64, ...}>
struct KernelSource {
  std::string name;           // "<op>_<dtypes>_<tile>_<isa>", [A-Za-z0-9_]+: the cache entry's name
  std::string module;         // env prefix: "GEMM" reads DSK_GEMM_JIT_* before DSK_JIT_*
  std::string header;         // "dsk/kernels/...": the kernel template's header
  std::string instantiation;  // the instantiated function template, fully qualified
  std::string args_type;      // the kernel's argument struct, fully qualified
  Backend isa = Backend::generic;    // avx512 / amx add their ISA flags (docs/jit.md)
  std::string dependency_signature;  // anything else the kernel's code depends on
};

// The kernel.cpp the JIT compiles for `source` (part of the cache key).
std::string generate_source(const KernelSource& source);

// Everything the cache key covers, computed without compiling. Raises dsk::Error for an invalid
// source, a kernel header that includes a dsk/ header outside dsk/kernels (or uses a quoted
// include), or a compiler that cannot be run.
struct CacheKey {
  std::string digest;                  // 32 hex digits: XXH3-128 over the components below
  std::vector<std::string> compiler;   // program and leading arguments ("ccache g++")
  std::string compiler_identity;       // first line of `<compiler> --version`
  std::vector<std::string> flags;      // effective flags, without -I
  std::filesystem::path include_root;  // where <dsk/kernels/...> resolves; not in the key
  std::vector<std::string> headers;    // tracked headers ("dsk/kernels/..."), sorted
};
CacheKey cache_key(const KernelSource& source);

// Where load() found a kernel.
enum class Origin { memory, disk, compiled };
std::string_view origin_name(Origin origin);

struct Loaded {
  Entry entry = nullptr;
  std::string digest;
  std::filesystem::path path;  // the cache entry directory
  Origin origin = Origin::memory;
  double seconds = 0;  // wall time of the call
};

struct LoadOptions {
  bool force_compile = false;  // compile even on a hit (the result is published only on a miss)
};

// In-process map -> disk cache -> compile. Raises dsk::Error when the kernel does not compile (the
// message carries the compiler's first lines and the path of the full log) and when runtime
// compilation is off or impossible here (get() falls back instead).
Loaded load(const KernelSource& source, const LoadOptions& options = {});
inline Entry build(const KernelSource& source) {
  return load(source).entry;
}

// Ahead-of-time kernels compiled into libdsk, found by their instantiation text (whitespace
// ignored), so that a host module names a kernel the same way for the JIT and the AOT path.
void register_aot(std::string_view instantiation, Entry entry);
Entry find_aot(std::string_view instantiation);

// The Entry of an instantiation compiled into the library: aot_entry<RowsumArgs, &rowsum<...>>.
template <class Args, void (*kKernel)(const Args&)>
void aot_entry(const void* args) {
  kKernel(*static_cast<const Args*>(args));
}

// Where a Kernel's code comes from: compiled at run time, an ahead-of-time instantiation, or the
// caller's runtime-shape variant (the same template with 0 = "runtime" knobs).
enum class Provider { jit, aot, runtime };
std::string_view provider_name(Provider provider);

namespace detail {
struct Resolved {
  Entry entry = nullptr;  // nullptr: use the runtime-shape variant
  Provider provider = Provider::runtime;
};
// load(), or when runtime compilation is off or impossible here, the AOT registry; prints one
// warning per reason per process.
Resolved resolve(const KernelSource& source);
// For tests: forgets loaded kernels (without unloading them), compiler identities, probes, cache
// root choices and one-time warnings, as if the process had just started.
void reset_process_state();
}  // namespace detail

// A callable kernel: a JIT or AOT entry, or the caller's runtime-shape variant.
template <class Args>
class Kernel {
 public:
  using RuntimeVariant = void (*)(const Args&);

  Kernel() = default;
  Kernel(Entry entry, RuntimeVariant runtime_variant, Provider provider)
      : entry_(entry), runtime_variant_(runtime_variant), provider_(provider) {}

  void operator()(const Args& args) const {
    if (entry_)
      entry_(&args);
    else
      runtime_variant_(args);
  }
  Provider provider() const { return provider_; }
  explicit operator bool() const { return entry_ || runtime_variant_; }

 private:
  Entry entry_ = nullptr;
  RuntimeVariant runtime_variant_ = nullptr;
  Provider provider_ = Provider::runtime;
};

// The kernel for `source`: JIT-compiled when possible; else the AOT instantiation of the same
// text; else `runtime_variant`. Compile errors still raise dsk::Error.
template <class Args>
Kernel<Args> get(const KernelSource& source, void (*runtime_variant)(const Args&)) {
  DSK_CHECK_ARG(runtime_variant != nullptr, "dsk::jit::get", "runtime_variant", "a function",
                "nullptr");
  const detail::Resolved r = detail::resolve(source);
  return Kernel<Args>(r.entry, runtime_variant, r.provider);
}

// ---- Cache management (`dsk jit ls|clear|warmup`) ----

// DSK_<MODULE>_JIT_CACHE_DIR > DSK_JIT_CACHE_DIR > $HOME/.cache/dsk, split at ':', search order.
std::vector<std::filesystem::path> cache_roots(std::string_view module = "");
// Where misses are written: the first root, or this process's private temporary root when the
// first is not writable (with a warning).
std::filesystem::path writable_cache_root(std::string_view module = "");

struct CacheEntry {
  std::filesystem::path path;
  std::string name;
  std::string digest;
  uint64_t bytes = 0;
  double age_s = 0;        // since it was built
  double idle_s = 0;       // since it was last loaded from disk
  bool committed = false;  // false: never published completely; the next load rebuilds it
};
// Every entry of every root, sorted by root then name.
std::vector<CacheEntry> list_cache(std::string_view module = "");

struct ClearResult {
  int64_t entries = 0;
  uint64_t bytes = 0;
  std::vector<std::string> errors;  // entries that could not be removed (read-only roots)
};
// Removes the entries whose name starts with `name_prefix` from every root; with no prefix also
// failed-compile logs and temporary directories left by dead processes.
ClearResult clear_cache(std::string_view name_prefix = "", std::string_view module = "");

// Whether runtime compilation can work in this process for `module` (not off, the compiler runs,
// the kernel headers are found); `reason` says why not. Does not compile anything.
struct Availability {
  bool available = false;
  std::string reason;
};
Availability availability(std::string_view module = "");

// Counters since the process started (or detail::reset_process_state()).
struct Stats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t compiles = 0;  // kernels compiled successfully
  int64_t rebuilds = 0;  // damaged or uncommitted entries found and rebuilt
};
Stats stats();

// The sample kernel (dsk/kernels/jit_test/rowsum.hpp: y[r] = sum of row r) that the tests use and
// `dsk jit warmup` times. cols = 0 instantiates the runtime-shape variant. Configs (64, 4) and
// (256, 2) are also compiled into libdsk ahead of time.
KernelSource sample_kernel(int cols, int rows_per_step);

// The tile layer's worked example (dsk/kernels/examples/scaled_rowsum.hpp, docs/tile.md):
// y[r] = scale[r] * sum of bf16 row r, as tile multiplies for `isa`. cols = 0 instantiates the
// runtime-shape variant. `dsk jit warmup` times it: it includes the whole tile layer, like every
// real kernel.
KernelSource tile_example_kernel(Backend isa, int cols);

}  // namespace dsk::jit
