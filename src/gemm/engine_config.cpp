// The GEMM heuristic (shape -> blocking), its printable form, the autotuner's candidates and the
// on-disk cache of the autotuner's choices.
#include "gemm/engine_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dsk/core/env.hpp>
#include <dsk/jit.hpp>

namespace dsk::gemm::engine {
namespace {

namespace fs = std::filesystem;

constexpr int kSmallMMax = 16;  // up to here the weights, not the products, bound the time
// On amx the dot path's VDPBF16PS is slow (about 0.13 TFLOPS on 2 cores, measured) next to the
// tiles, so past 4 rows the products bound it and the tile path (padded to 32 rows) is faster.
constexpr int kAmxSmallMMax = 4;
constexpr int kLargeBlockM = 96;   // 16 DotTile row tiles (avx512, generic)
constexpr int kLargeBlockN = 256;  // 4 panels: A block reused 4 times per widening
constexpr int kLargeBlockK = 256;  // 32 KiB of bf16 panel rows: one pass of B stays in L1
constexpr int kSmallBlockK = 256;  // with several row groups, a pass is re-read from L1
// amx: each 32 x 32 block reloads and stores its four C tiles once per pass, and a panel is
// widened (or copied) once per pass for every block of rows, which then reads it from L1, so long
// passes over many rows pay off. A/B on the AMX VM, M = 4096: 96 x 256 x 256 -> 192 x 512 x 512
// 1.04-1.47x (2 threads, five upstream shapes); 192 -> 384 rows 1.07-1.15x (BF16, one thread);
// 512 -> 256 columns 0.92x.
constexpr int kAmxBlockM = 384;     // 12 row tiles
constexpr int kAmxBlockN = 512;     // 8 panels
constexpr int kAmxBlockK = 512;     // A block 408 KiB, C block 792 KiB: L2; half a B pass: L1
constexpr int kItemsPerThread = 4;  // work items per thread: balance without tiny items

int64_t panels_of(int64_t n) {
  return kg::ceil_div(n, kg::kPanelCols);
}

// Row granularity of the large-M path: DotTile rows, or whole AMX tile pairs.
int row_step(Backend isa) {
  return isa == Backend::amx ? 32 : 6;
}

int64_t large_items(const ProblemShape& s, const PathBlocks& b) {
  const int64_t m_blocks =
      s.segments * kg::ceil_div(std::max<int64_t>(1, s.m_total / s.segments), b.block_m);
  return m_blocks * kg::ceil_div(panels_of(s.n), b.block_n / kg::kPanelCols);
}

PathBlocks large_blocks(const ProblemShape& s) {
  PathBlocks b;
  const int step = row_step(s.isa);
  const bool amx = s.isa == Backend::amx;
  const bool long_pass = amx && (s.promotion_gran == 0 || kAmxBlockK % s.promotion_gran == 0);
  b.block_m = static_cast<int>(
      std::min<int64_t>(amx ? kAmxBlockM : kLargeBlockM, kg::round_up(s.m_max, step)));
  b.block_n = amx ? kAmxBlockN : kLargeBlockN;
  b.block_k = long_pass ? kAmxBlockK : kLargeBlockK;
  // Enough items to keep every thread busy: narrower items before shorter ones.
  while (large_items(s, b) < 2 * s.threads && b.block_n > kg::kPanelCols) b.block_n /= 2;
  while (large_items(s, b) < 2 * s.threads && b.block_m > step) b.block_m -= step;
  return b;
}

PathBlocks small_blocks(const ProblemShape& s) {
  PathBlocks b;
  // Up to one row tile: the whole of K in one pass, so each panel streams once; more rows: passes
  // short enough for the other row tiles to find them in cache.
  const int64_t one_pass = kg::round_up(s.k, 128);
  b.block_k = static_cast<int>(
      std::min(s.m_max, s.m_total) <= 6 ? one_pass : std::min<int64_t>(kSmallBlockK, one_pass));
  const int64_t target_items = int64_t{kItemsPerThread} * s.threads;
  const int64_t per_segment = std::max<int64_t>(1, kg::ceil_div(target_items, s.segments));
  const int64_t panels = kg::ceil_div(panels_of(s.n), per_segment);
  b.block_n = static_cast<int>(std::max<int64_t>(1, panels) * kg::kPanelCols);
  return b;
}

}  // namespace

const char* elem_name(kg::Elem e) {
  switch (e) {
    case kg::Elem::bf16:
      return "bf16";
    case kg::Elem::e4m3:
      return "e4m3";
    case kg::Elem::e2m1:
      return "e2m1";
    default:
      return "any";
  }
}

KernelConfig heuristic_config(const ProblemShape& shape) {
  KernelConfig c;
  c.small_m_max = shape.isa == Backend::amx ? kAmxSmallMMax : kSmallMMax;
  c.large = large_blocks(shape);
  c.small = small_blocks(shape);
  return c;
}

std::vector<KernelConfig> candidate_configs(const ProblemShape& shape) {
  const KernelConfig base = heuristic_config(shape);
  std::vector<KernelConfig> out = {base};
  const auto add = [&](KernelConfig c) {
    for (const KernelConfig& o : out)
      if (o.large.block_m == c.large.block_m && o.large.block_n == c.large.block_n &&
          o.large.block_k == c.large.block_k && o.small.block_n == c.small.block_n &&
          o.small.block_k == c.small.block_k)
        return;
    out.push_back(c);
  };
  if (shape.m_max > base.small_m_max) {    // the large-M path runs: vary its blocks
    const int step = row_step(shape.isa);  // 96 and 192 are multiples of both
    for (int bm : {96, 192})
      for (int bn : {256, 512})
        for (int bk : {256, 512}) {
          KernelConfig c = base;
          c.large = {static_cast<int>(std::min<int64_t>(bm, kg::round_up(shape.m_max, step))), bn,
                     bk};
          if (shape.promotion_gran == 0 || bk % shape.promotion_gran == 0) add(c);
        }
  } else {
    for (int64_t bk : {int64_t{512}, kg::round_up(shape.k, 128)})
      for (int per_thread : {1, 4, 8}) {
        KernelConfig c = base;
        const int64_t items = std::max<int64_t>(1, per_thread * shape.threads / shape.segments);
        c.small.block_n =
            static_cast<int>(kg::ceil_div(panels_of(shape.n), items) * kg::kPanelCols);
        c.small.block_k = static_cast<int>(std::min(bk, kg::round_up(shape.k, 128)));
        add(c);
      }
  }
  return out;
}

std::string describe(const ProblemShape& s) {
  return fmt::format(
      "{} a={} b={} d={} m={}{} n={} k={}{} threads={}", backend_name(s.isa), elem_name(s.a_type),
      elem_name(s.b_type), s.d_type == kg::OutType::f32 ? "f32" : "bf16", s.m_total,
      s.segments > 1 ? fmt::format(" (max {} in {} segments)", s.m_max, s.segments) : std::string(),
      s.n, s.k, s.promotion_gran ? fmt::format(" promote={}", s.promotion_gran) : "", s.threads);
}

std::string describe(const KernelConfig& c) {
  return fmt::format(
      "small M (m <= {}): block_n={} block_k={}; large M: block_m={} block_n={} block_k={} [{}]",
      c.small_m_max, c.small.block_n, c.small.block_k, c.large.block_m, c.large.block_n,
      c.large.block_k, c.origin);
}

// ---- the autotuner's cache ----

AutotuneMode autotune_mode() {
  const std::optional<std::string> v = env::lookup("GEMM", "AUTOTUNE");
  if (!v || v->empty()) return AutotuneMode::reuse;
  return env::get_bool("GEMM", "AUTOTUNE", false) ? AutotuneMode::tune : AutotuneMode::off;
}

std::string autotune_key(const ProblemShape& s) {
  const CpuFeatures& cpu = cpu_features();
  int64_t m_bucket = 1;
  while (m_bucket < s.m_max) m_bucket *= 2;
  return fmt::format("{}/{}-{}-{}/{}x{}->{}/n{}/k{}/m{}/s{}/p{}/t{}", backend_name(s.isa),
                     cpu.vendor, cpu.family, cpu.model_id, elem_name(s.a_type), elem_name(s.b_type),
                     s.d_type == kg::OutType::f32 ? "f32" : "bf16", s.n, s.k, m_bucket,
                     s.segments > 1 ? "g" : "1", s.promotion_gran, s.threads);
}

namespace {

std::mutex g_cache_mutex;
std::unordered_map<std::string, nlohmann::json> g_entries;  // loaded once per process
bool g_loaded = false;

fs::path cache_file(const fs::path& root) {
  return root / "autotune" / "gemm.json";
}

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

void load_all_locked() {
  if (g_loaded) return;
  g_loaded = true;
  std::vector<fs::path> roots = jit::cache_roots("GEMM");
  // Later roots first, so the first root's entries win.
  for (auto it = roots.rbegin(); it != roots.rend(); ++it) {
    const nlohmann::json j = read_json(cache_file(*it));
    if (j.contains("entries") && j["entries"].is_object())
      for (const auto& [key, value] : j["entries"].items()) g_entries[key] = value;
  }
}

std::optional<KernelConfig> from_json(const nlohmann::json& e) {
  try {
    KernelConfig c;
    c.small_m_max = e.at("small_m_max").get<int>();
    const auto large = e.at("large").get<std::vector<int>>();
    const auto small = e.at("small").get<std::vector<int>>();
    if (large.size() != 3 || small.size() != 3) return std::nullopt;
    c.large = {large[0], large[1], large[2]};
    c.small = {small[0], small[1], small[2]};
    c.origin = "cached";
    return c;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

bool valid_for(const KernelConfig& c, const ProblemShape& s) {
  const auto ok = [&](const PathBlocks& b, bool large) {
    const bool k_ok = b.block_k > 0 && b.block_k % kg::kPanelKAlign == 0 &&
                      (s.promotion_gran == 0 || b.block_k % s.promotion_gran == 0);
    return k_ok && b.block_n > 0 && b.block_n % kg::kPanelCols == 0 &&
           (!large || (b.block_m > 0 && b.block_m % row_step(s.isa) == 0));
  };
  return c.small_m_max >= 0 && ok(c.large, true) && ok(c.small, false);
}

}  // namespace

std::optional<KernelConfig> cached_config(const ProblemShape& shape) {
  std::lock_guard lock(g_cache_mutex);
  load_all_locked();
  const auto it = g_entries.find(autotune_key(shape));
  if (it == g_entries.end()) return std::nullopt;
  std::optional<KernelConfig> c = from_json(it->second);
  if (c && !valid_for(*c, shape)) return std::nullopt;
  return c;
}

void store_config(const ProblemShape& shape, const KernelConfig& config) {
  const nlohmann::json entry = {
      {"small_m_max", config.small_m_max},
      {"large", {config.large.block_m, config.large.block_n, config.large.block_k}},
      {"small", {config.small.block_m, config.small.block_n, config.small.block_k}},
      {"shape", describe(shape)}};
  std::lock_guard lock(g_cache_mutex);
  load_all_locked();
  g_entries[autotune_key(shape)] = entry;
  // NOTES: read-merge-write through a temporary file and rename(2), so readers never see half a
  // file; two processes storing at once may lose one of their entries (it is measured again).
  const fs::path file = cache_file(jit::writable_cache_root("GEMM"));
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  nlohmann::json j = read_json(file);
  if (!j.contains("entries") || !j["entries"].is_object()) j["entries"] = nlohmann::json::object();
  j["version"] = 1;
  j["entries"][autotune_key(shape)] = entry;
  const fs::path tmp = file.string() + fmt::format(".tmp.{}", getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    if (!out) return;  // an unwritable cache costs a measurement next time, nothing else
  }
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace dsk::gemm::engine
