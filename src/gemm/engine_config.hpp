// How the engine blocks a GEMM: the problem as the heuristic sees it, the config it chooses (a
// pure, printable function), and the autotuner's on-disk cache of measured choices. Private to
// src/gemm. Configs change speed only: every config gives the same bits (kernels/gemm/args.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <dsk/core/cpu.hpp>
#include <dsk/kernels/gemm/args.hpp>

namespace dsk::gemm::engine {

namespace kg = dsk::kernels::gemm;

// One run of segments that share B's shape and every dtype.
struct ProblemShape {
  Backend isa = Backend::generic;
  kg::Elem a_type = kg::Elem::bf16, b_type = kg::Elem::bf16;
  kg::OutType d_type = kg::OutType::f32;
  int64_t n = 0, k = 0;
  int64_t segments = 1;
  int64_t m_total = 0, m_max = 0;  // rows over all segments, rows of the largest one
  int promotion_gran = 0;  // K granularity of promoted scales (0: none); block_k divides by it
  int threads = 1;
};

// Blocking of one kernel path: rows and columns per work item and K values per pass.
struct PathBlocks {
  int block_m = 0;  // small M: 0 (every row of a segment)
  int block_n = 0;  // a multiple of kPanelCols
  int block_k = 0;  // a multiple of kPanelKAlign and of the promotion granularity
};

struct KernelConfig {
  int small_m_max = 16;  // segments with at most this many rows take the small-M path
  PathBlocks large, small;
  std::string origin = "heuristic";  // "heuristic", "autotuned" or "cached" (from disk)
};

// The short name of an element type ("bf16", "e4m3", "e2m1"), for config lines and kernel names.
const char* elem_name(kg::Elem e);

// The heuristic: a pure function of the shape.
KernelConfig heuristic_config(const ProblemShape& shape);
// The configs the autotuner times (the heuristic's first).
std::vector<KernelConfig> candidate_configs(const ProblemShape& shape);

// One line each, for DSK_PRINT_CONFIGS and the autotuner's log.
std::string describe(const ProblemShape& shape);
std::string describe(const KernelConfig& config);

// The autotuner's cache: <first writable JIT root>/autotune/gemm.json (read from every root),
// keyed by autotune_key(shape). DSK_AUTOTUNE=1 measures shapes the cache lacks; unset, cached
// choices are still used; 0 ignores the cache.
enum class AutotuneMode { off, reuse, tune };
AutotuneMode autotune_mode();
std::string autotune_key(const ProblemShape& shape);
std::optional<KernelConfig> cached_config(const ProblemShape& shape);
void store_config(const ProblemShape& shape, const KernelConfig& config);

// For tests: while set, every run uses `config` (results do not depend on it, only speed does).
void set_config_override(std::optional<KernelConfig> config);

}  // namespace dsk::gemm::engine
