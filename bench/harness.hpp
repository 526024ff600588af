// The case API of `dsk bench` and `dsk verify`: what a module declares so the runner (runner.hpp)
// can time it against the machine's ceilings and a peer, or check it against dsk::ref.
//
// A module adds its cases in one function, `void register_<module>_cases(Registry&)`, listed once
// in bench/modules.cpp (docs/bench.md walks through it). Cases describe work; the runner owns
// timing, tables, JSON and plots, so no case prints anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <dsk/core/tensor.hpp>

namespace dsk::bench {

// ---- Roofline terms ----
// The ceilings a case can be bounded by. Compute terms are in TFLOPS (TOPS for int8), bandwidth
// terms in GB/s; `json_key` names the value in the "ceilings" object of the JSON output.
struct RoofTerm {
  std::string_view name;      // what BenchCase::ceiling holds: "amx_bf16", "dram_read", ...
  std::string_view json_key;  // "amx_bf16_tflops", "dram_read_gbs", ...
  std::string_view title;     // "AMX BF16", "DRAM read", ...
  bool bandwidth;             // GB/s (true) or TFLOPS (false)
};

inline constexpr RoofTerm kRoofTerms[] = {
    {"amx_bf16", "amx_bf16_tflops", "AMX BF16", false},
    {"amx_int8", "amx_int8_tops", "AMX INT8", false},
    {"fp32", "fp32_tflops", "AVX-512 FP32 FMA", false},
    {"avx512_bf16", "avx512_bf16_tflops", "AVX-512 BF16", false},
    {"l2_read", "l2_read_gbs", "L2 read", true},
    {"dram_read", "dram_read_gbs", "DRAM read", true},
    {"dram_write", "dram_write_gbs", "DRAM write", true},
    {"core_to_core", "core_to_core_gbs", "core to core", true},
};

// The term named `name`; raises dsk::Error for an unknown name.
const RoofTerm& roof_term(std::string_view name);

// Every member of the structs below has an initializer, so a case written with designated
// initializers may leave out any of them (g++ warns about members without one).

// ---- Context handed to every case ----
struct CaseContext {
  bool quick = false;  // a --quick run: keep the work small
  int copies = 1;      // working-set copies a cold bench case allocates and rotates through
  int threads = 1;     // dsk::get_num_threads() at the start of the run
};

// ---- Bench cases ----
// What a bench case's `prepare` returns: the calls the runner times, and the work of one call.
struct Prepared {
  std::function<void(int copy)> kernel{};  // one call on working-set copy `copy` (0..copies-1)
  std::function<void(int copy)> peer{};    // the same work done by the peer; empty when none
  // Instead of `kernel`: a call that times itself and returns its seconds, for calls that include
  // set-up that must not count (the ceilings wake pinned threads before their loops start).
  std::function<double(int copy)> timed_kernel{};
  double flops = 0;  // floating-point (or integer) operations of one call; 0 when not meaningful
  double bytes = 0;  // bytes one call must move to or from memory; 0 when not meaningful
};

// Whether the data a case reads is reused from cache between calls (compute-bound shapes) or
// rotated through copies larger than the last-level cache (memory-bound shapes).
enum class Residency { hot, cold };

struct BenchCase {
  std::string module{};   // filled in by Registry::add from the module table
  std::string name{};     // the kernel name, e.g. "convert_f32_to_bf16"
  std::string shape{};    // e.g. "n=4Mi"
  std::string ceiling{};  // the roofline term that bounds the case (kRoofTerms name)
  std::string peer{};     // what `Prepared::peer` runs: "oneDNN", "scalar loop", "dsk::ref", ""
  Residency residency = Residency::hot;
  size_t working_set_bytes = 0;  // bytes one copy occupies (sizes the cold rotation)
  bool quick = true;             // part of --quick runs
  // Ceiling cases only: the roofline term this case measures, and whether on one core or on
  // every thread. Other modules leave `measures` empty.
  std::string measures{};
  bool per_core = false;
  // Why this machine cannot run the case ("no AMX"), or "" when it can.
  std::function<std::string()> unavailable{};
  std::function<Prepared(const CaseContext&)> prepare{};
};

// ---- Verify cases ----
// A verify case runs a kernel on fresh random data against its reference and returns `metric`,
// where smaller is better (mismatching elements, calc_diff, max abs error); it passes when
// value <= tolerance (a NaN value fails).
struct VerifyCase {
  std::string module{};  // filled in by Registry::add
  std::string name{};
  std::string shape{};
  std::string metric{};  // "mismatches", "calc_diff", ...
  double tolerance = 0;
  bool quick = true;  // part of --quick runs
  std::function<std::string()> unavailable{};
  std::function<double(const CaseContext&)> run{};
};

// ---- Registry ----
class Registry {
 public:
  // Adds a case to the module whose register function is running.
  void add(BenchCase c);
  void add(VerifyCase c);

  const std::vector<BenchCase>& bench_cases() const { return bench_; }
  const std::vector<VerifyCase>& verify_cases() const { return verify_; }
  // Module names in table order, each listed once.
  std::vector<std::string> bench_modules() const;
  std::vector<std::string> verify_modules() const;

  // Used by the module table: cases added from now on belong to `module`.
  void begin_module(std::string module) { module_ = std::move(module); }

 private:
  std::string module_;
  std::vector<BenchCase> bench_;
  std::vector<VerifyCase> verify_;
};

// Every module's cases, built once (thread-safe) from the table in bench/modules.cpp.
const Registry& registry();

// ---- Helpers for cases ----
// A generator seeded from std::random_device: every run draws fresh data.
std::mt19937_64 fresh_rng();

// Fast deterministic-per-seed filler for large benchmark buffers (quality is irrelevant there,
// speed is not): values uniform in [-1, 1), never all zero.
void fill_uniform(float* data, size_t n, uint64_t seed);

// Elements whose bytes differ (exact comparison; NaN payloads included), or 1e30 when the shapes
// or dtypes differ: the "mismatches" metric of verify cases.
double mismatches(const Tensor& a, const Tensor& b);

// Bytes of the last-level cache (sysconf, then sysfs, else 32 MiB).
size_t last_level_cache_bytes();
// Bytes of one core's L2 (sysconf, then sysfs, else 1 MiB).
size_t l2_cache_bytes();

// The bf16 compute roof the kernels run against on this machine: amx_bf16 where the amx backend
// runs (the tile kernels), else avx512_bf16 (the dot tiles).
std::string bf16_roof();

}  // namespace dsk::bench
