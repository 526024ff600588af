// The GEMM engine (src/gemm/engine.hpp): weights packed into the kernels' layout
// (dsk/kernels/gemm/layout.hpp), and runs of segments cut into work items that the kernels compute
// on the compute threads. Each item owns its D elements and sums them in a fixed order, so results
// are bitwise identical across runs, thread counts, configs and the JIT / built-in kernels.
#include "gemm/engine.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/env.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/tensor.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/core/timer.hpp>

#include "gemm/engine_config.hpp"
#include "gemm/engine_kernels.hpp"

namespace dsk::gemm::engine {

namespace {

kg::Elem elem_of(DType t) {
  return t == DType::e4m3 ? kg::Elem::e4m3 : t == DType::fp4x2 ? kg::Elem::e2m1 : kg::Elem::bf16;
}

kg::OutType out_of(DType t) {
  return t == DType::bf16 ? kg::OutType::bf16 : kg::OutType::f32;
}

// A scale 2^e with |e| <= kMaxFoldExponent: positive, zero mantissa, exponent in range.
bool foldable_scale(float s) {
  const uint32_t bits = numeric::bits_of(s);
  const int e = static_cast<int>(bits >> 23) - 127;  // the sign bit makes negatives fail
  return (bits & 0x7FFFFFu) == 0 && e >= -kg::kMaxFoldExponent && e <= kg::kMaxFoldExponent;
}

// Whether the scales of `rows` rows of an operand with K values `k` can be folded.
bool foldable_scales(const Scales& sf, int64_t rows, int64_t k) {
  if (sf.data == nullptr || !sf.power_of_two) return false;
  const int64_t sf_rows = kg::ceil_div(rows, sf.gran_mn), blocks = kg::ceil_div(k, sf.gran_k);
  for (int64_t r = 0; r < sf_rows; ++r)
    for (int64_t b = 0; b < blocks; ++b)
      if (!foldable_scale(sf.data[r * sf.ld + b])) return false;
  return true;
}

// Whether the packed e4m3 bytes hold a NaN code (0x7F or 0xFF).
bool has_e4m3_nan(const std::byte* data, int64_t bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(data);
  uint8_t found = 0;
  for (int64_t i = 0; i < bytes; ++i) found |= static_cast<uint8_t>((p[i] & 0x7F) == 0x7F);
  return found != 0;
}

Backend kernel_isa() {
  return backend();
}

// ---- per-thread scratch ----

struct ScratchDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

std::byte* thread_scratch(int64_t bytes) {
  thread_local std::unique_ptr<std::byte, ScratchDeleter> buffer;
  thread_local int64_t capacity = 0;
  if (capacity < bytes) {
    const auto rounded = static_cast<size_t>(kg::round_up(bytes, 4096));
    buffer.reset(static_cast<std::byte*>(std::aligned_alloc(kg::kLayoutAlign, rounded)));
    DSK_CHECK(buffer != nullptr, "dsk::gemm",
              fmt::format("out of memory allocating {} bytes of scratch", rounded));
    capacity = static_cast<int64_t>(rounded);
  }
  return buffer.get();
}

// ---- a run: segments with one B shape and one set of dtypes ----

struct Run {
  ProblemShape shape;
  kg::PackedLayout layout;
  std::vector<kg::GemmSegment> segments;
  bool accumulate = false;
};

// Everything one execution needs: the items (small-M ones first) and the kernels' arguments.
struct Plan {
  KernelConfig config;
  std::vector<kg::GemmItem> items;
  int64_t first_large = 0;
  int64_t scratch_bytes = 0;
};

kg::GemmSegment kernel_segment(const Segment& s) {
  kg::GemmSegment out;
  out.a = {.data = s.a.data,
           .stride_r = s.a.stride_r,
           .stride_k = s.a.stride_k,
           .sf = s.a.sf.data,
           .sf_ld = s.a.sf.ld,
           .sf_gran_m = s.a.sf.gran_mn,
           .sf_gran_k = s.a.sf.gran_k};
  out.a_foldable = foldable_scales(s.a.sf, s.d.m, s.a.k);
  out.b = s.b->data();
  out.d = s.d.data;
  out.ldd = s.d.ld;
  out.m = s.d.m;
  return out;
}

int promotion_gran(const Run& r) {
  int gran = 0;
  const auto take = [&gran](int g) { gran = gran == 0 ? g : std::min(gran, g); };
  // The register kernels' granularity: the tile kernels promote at most as often.
  if (r.layout.scale_gran_k > 0 &&
      !kg::folds(r.layout.scales_foldable, r.layout.scale_gran_k, false))
    take(r.layout.scale_gran_k);
  for (const kg::GemmSegment& s : r.segments)
    if (s.a.sf != nullptr && !kg::folds(s.a_foldable, s.a.sf_gran_k, false)) take(s.a.sf_gran_k);
  return gran;
}

Run make_run(const std::vector<const Segment*>& segments, bool accumulate) {
  Run r;
  const Segment& first = *segments.front();
  r.layout = first.b->layout;
  r.accumulate = accumulate;
  for (const Segment* s : segments) r.segments.push_back(kernel_segment(*s));
  ProblemShape& sh = r.shape;
  sh.isa = kernel_isa();
  sh.a_type = elem_of(first.a.dtype);
  sh.b_type = r.layout.type;
  sh.d_type = out_of(first.d.dtype);
  sh.n = r.layout.n;
  sh.k = r.layout.k;
  sh.segments = static_cast<int64_t>(segments.size());
  for (const Segment* s : segments) {
    sh.m_total += s->d.m;
    sh.m_max = std::max(sh.m_max, s->d.m);
  }
  sh.promotion_gran = promotion_gran(r);
  sh.threads = get_num_threads();
  return r;
}

Plan make_plan(const Run& r, const KernelConfig& config) {
  Plan plan;
  plan.config = config;
  const int64_t panels = r.layout.panels;
  int64_t small_bytes = 0, large_bytes = 0;
  // Small-M items: every row of a segment, panel ranges of block_n columns.
  const int64_t small_panels = config.small.block_n / kg::kPanelCols;
  for (size_t i = 0; i < r.segments.size(); ++i) {
    const int64_t m = r.segments[i].m;
    if (m > config.small_m_max) continue;
    for (int64_t p = 0; p < panels; p += small_panels)
      plan.items.push_back({.segment = static_cast<int32_t>(i),
                            .m0 = 0,
                            .m1 = static_cast<int32_t>(m),
                            .p0 = static_cast<int32_t>(p),
                            .p1 = static_cast<int32_t>(std::min(panels, p + small_panels))});
    small_bytes = std::max(
        small_bytes,
        kg::scratch_plan(kg::Path::small_m, m, 1, config.small.block_k, r.layout.k_pad).bytes);
  }
  plan.first_large = static_cast<int64_t>(plan.items.size());
  // Large-M items: blocks of block_m rows x block_n columns, rows outer.
  const int64_t large_panels = config.large.block_n / kg::kPanelCols;
  for (size_t i = 0; i < r.segments.size(); ++i) {
    const int64_t m = r.segments[i].m;
    if (m <= config.small_m_max) continue;
    for (int64_t m0 = 0; m0 < m; m0 += config.large.block_m)
      for (int64_t p = 0; p < panels; p += large_panels)
        plan.items.push_back(
            {.segment = static_cast<int32_t>(i),
             .m0 = static_cast<int32_t>(m0),
             .m1 = static_cast<int32_t>(std::min<int64_t>(m, m0 + config.large.block_m)),
             .p0 = static_cast<int32_t>(p),
             .p1 = static_cast<int32_t>(std::min(panels, p + large_panels))});
    large_bytes = std::max(
        large_bytes, kg::scratch_plan(kg::Path::large_m, std::min<int64_t>(m, config.large.block_m),
                                      large_panels, config.large.block_k, r.layout.k_pad)
                         .bytes);
  }
  plan.scratch_bytes = std::max(small_bytes, large_bytes);
  return plan;
}

kg::GemmConfig jit_config(const Run& r, kg::Path path, const PathBlocks& blocks) {
  return {.path = path,
          .a_type = r.shape.a_type,
          .b_type = r.shape.b_type,
          .d_type = r.shape.d_type,
          .n = static_cast<int>(r.shape.n),
          .k = static_cast<int>(r.shape.k),
          .block_k = blocks.block_k};
}

// Runs the plan's items on the compute threads (each thread's share with its own scratch).
void execute(const Run& r, const Plan& plan, const std::vector<kg::GemmSegment>& segments) {
  if (plan.items.empty()) return;
  const Backend isa = r.shape.isa;
  jit::Kernel<kg::GemmArgs> small, large;
  if (plan.first_large > 0)
    small = kernel(isa, jit_config(r, kg::Path::small_m, plan.config.small));
  if (plan.first_large < static_cast<int64_t>(plan.items.size()))
    large = kernel(isa, jit_config(r, kg::Path::large_m, plan.config.large));
  kg::GemmArgs base;
  base.segments = segments.data();
  base.items = plan.items.data();
  base.b = r.layout;
  base.a_type = r.shape.a_type;
  base.d_type = r.shape.d_type;
  base.accumulate = r.accumulate;
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  parallel_for(
      n_items,
      [&](int64_t begin, int64_t end, int) {
        kg::GemmArgs args = base;
        args.scratch = thread_scratch(plan.scratch_bytes);
        if (begin < plan.first_large) {
          args.item_begin = begin;
          args.item_end = std::min(end, plan.first_large);
          args.block_k = plan.config.small.block_k;
          small(args);
        }
        if (end > plan.first_large) {
          args.item_begin = std::max(begin, plan.first_large);
          args.item_end = end;
          args.block_k = plan.config.large.block_k;
          large(args);
        }
      },
      1);
}

// ---- the autotuner ----

// Output buffers with D's shape for trial runs, so that trials never touch D (which may hold C).
struct TrialOutputs {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<kg::GemmSegment> segments;
};

TrialOutputs trial_outputs(const Run& r) {
  TrialOutputs t;
  t.segments = r.segments;
  const size_t es = r.shape.d_type == kg::OutType::f32 ? 4 : 2;
  for (kg::GemmSegment& s : t.segments) {
    const size_t row_bytes = static_cast<size_t>(r.shape.n) * es;
    t.buffers.emplace_back(static_cast<size_t>(s.m) * row_bytes);
    for (int64_t i = 0; i < s.m; ++i)  // the current D: accumulating trials start from it
      std::memcpy(t.buffers.back().data() + i * row_bytes,
                  static_cast<const std::byte*>(s.d) + i * s.ldd * static_cast<int64_t>(es),
                  row_bytes);
    s.d = t.buffers.back().data();
    s.ldd = r.shape.n;
  }
  return t;
}

// Times every candidate on the call's own data (outputs redirected) and keeps the fastest.
KernelConfig tune(const Run& r) {
  const TrialOutputs trial = trial_outputs(r);
  KernelConfig best;
  double best_s = 0;
  for (const KernelConfig& c : candidate_configs(r.shape)) {
    const Plan plan = make_plan(r, c);
    execute(r, plan, trial.segments);  // warm-up (and the JIT compile)
    double seconds = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      Timer timer;
      execute(r, plan, trial.segments);
      seconds = std::min(seconds, timer.seconds());
    }
    if (best_s == 0 || seconds < best_s) {
      best = c;
      best_s = seconds;
    }
  }
  best.origin = "autotuned";
  return best;
}

std::mutex g_override_mutex;
std::optional<KernelConfig> g_override;

// The config of a run: cached or measured (DSK_AUTOTUNE), else the heuristic's; printed once per
// shape with DSK_PRINT_CONFIGS.
KernelConfig choose_config(const Run& r) {
  KernelConfig config = heuristic_config(r.shape);
  const AutotuneMode mode = autotune_mode();
  std::optional<KernelConfig> forced;
  {
    std::lock_guard lock(g_override_mutex);
    forced = g_override;
  }
  if (forced) {
    config = *forced;
  } else if (mode != AutotuneMode::off) {
    if (std::optional<KernelConfig> cached = cached_config(r.shape)) {
      config = *cached;
    } else if (mode == AutotuneMode::tune) {
      config = tune(r);
      store_config(r.shape, config);
    }
  }
  // The amx tile path and the dot-tile small-M path round differently (tile/unit.hpp, dot.hpp),
  // so a row's bits would depend on how many rows share its call. Deterministic mode makes them
  // independent of the batch: on amx every M takes the tile path.
  if (get_deterministic_algorithms() && r.shape.isa == Backend::amx) config.small_m_max = 0;
  if (env::get_bool("GEMM", "PRINT_CONFIGS", false)) {
    static std::mutex mutex;
    static std::set<std::string> printed;
    const std::string line = describe(r.shape) + " -> " + describe(config);
    std::lock_guard lock(mutex);
    if (printed.insert(line).second) fmt::print(stderr, "dsk::gemm: {}\n", line);
  }
  return config;
}

// Segments that can share one run: same B layout and dtypes.
bool same_run(const Segment& a, const Segment& b) {
  const kg::PackedLayout &la = a.b->layout, &lb = b.b->layout;
  return a.a.dtype == b.a.dtype && a.d.dtype == b.d.dtype && la.type == lb.type && la.n == lb.n &&
         la.k == lb.k && la.scale_gran_k == lb.scale_gran_k &&
         la.scales_foldable == lb.scales_foldable &&
         (a.a.sf.data == nullptr) == (b.a.sf.data == nullptr);
}

}  // namespace

// ---- the contract ----

void set_config_override(std::optional<KernelConfig> config) {
  std::lock_guard lock(g_override_mutex);
  g_override = std::move(config);
}

std::shared_ptr<const PackedB> pack_b(const Operand& b) {
  auto packed = std::make_shared<PackedB>();
  packed->dtype = b.dtype;
  const int gran = b.sf.data != nullptr ? b.sf.gran_k : 0;
  kg::PackedLayout& l = packed->layout;
  l = kg::make_layout(elem_of(b.dtype), b.rows, b.k, gran);
  packed->storage = Tensor::empty({std::max<int64_t>(1, kg::layout_bytes(l))}, DType::u8);
  const kg::PackSource source{.data = b.data,
                              .stride_r = b.stride_r,
                              .stride_k = b.stride_k,
                              .sf = b.sf.data,
                              .sf_ld = b.sf.ld,
                              .sf_gran_n = b.sf.gran_mn};
  const auto pack = kernels_for(kernel_isa()).pack_panels;
  auto* dst = static_cast<std::byte*>(packed->storage.data_ptr());
  std::vector<uint8_t> nan_in(static_cast<size_t>(get_num_threads()), 0);
  parallel_for(
      l.panels,
      [&](int64_t p0, int64_t p1, int thread) {
        pack(l, source, p0, p1, dst);
        if (l.type == kg::Elem::e4m3)
          for (int64_t p = p0; p < p1; ++p)
            nan_in[thread] |= has_e4m3_nan(dst + p * l.panel_bytes, l.data_bytes);
      },
      1);
  const bool nan = std::any_of(nan_in.begin(), nan_in.end(), [](uint8_t x) { return x != 0; });
  l.scales_foldable = gran > 0 && !nan && foldable_scales(b.sf, b.rows, b.k);
  return packed;
}

int64_t packed_n(const PackedB& b) {
  return b.layout.n;
}
int64_t packed_k(const PackedB& b) {
  return b.layout.k;
}
DType packed_dtype(const PackedB& b) {
  return b.dtype;
}
size_t packed_bytes(const PackedB& b) {
  return static_cast<size_t>(kg::layout_bytes(b.layout));
}

void run(std::span<const Segment> segments, bool accumulate) {
  std::vector<std::vector<const Segment*>> runs;
  for (const Segment& s : segments) {
    if (s.d.m == 0 || s.d.n == 0 || s.a.k == 0) continue;
    auto it = std::find_if(runs.begin(), runs.end(),
                           [&](const auto& run) { return same_run(*run.front(), s); });
    if (it == runs.end())
      runs.push_back({&s});
    else
      it->push_back(&s);
  }
  for (const auto& group : runs) {
    const Run r = make_run(group, accumulate);
    const Plan plan = make_plan(r, choose_config(r));
    execute(r, plan, r.segments);
  }
}

}  // namespace dsk::gemm::engine
