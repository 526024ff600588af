// The GEMM engine itself (src/gemm/engine.hpp), below the API layer: every kernel path (small and
// large M), operand type (bf16, e4m3, e2m1), scale mode (none, folded powers of two, promoted f32),
// tail in M, N and K, strided operands and accumulation, against an fp64 loop on every backend;
// and the bitwise guarantees: repeated runs, thread counts, configs, backends with the same
// numerics (avx512 and generic) and the JIT against the built-in kernels give identical bits.
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include <dsk/jit.hpp>
#include <dsk/kernels/gemm/gemm.hpp>

#include "../src/gemm/engine.hpp"
#include "../src/gemm/engine_config.hpp"
#include "../src/gemm/engine_kernels.hpp"
#include "common/test_util.hpp"

namespace dsk::gemm::engine {
namespace {

enum class ScaleKind { none, pow2, f32 };

struct Case {
  DType a = DType::bf16, b = DType::bf16, d = DType::f32;
  int64_t m = 1, n = 1, k = 2;
  ScaleKind scales = ScaleKind::none;
  int gran_k = 128;  // both operands' K granularity
  int gran_n = 128;  // B's
  bool accumulate = false;
  bool a_mn_major = false;  // A stored [k, m] (stride_k = m), as the k-grouped GEMM passes it
  bool b_mn_major = false;  // B stored [k, n]

  std::string name() const {
    return fmt::format("{}x{}->{} m={} n={} k={} sf={} gk={} gn={}{}{}{}", dtype_name(a),
                       dtype_name(b), dtype_name(d), m, n, k, static_cast<int>(scales), gran_k,
                       gran_n, accumulate ? " acc" : "", a_mn_major ? " a^T" : "",
                       b_mn_major ? " b^T" : "");
  }
};

// One operand's storage and its logical values (already dequantized, fp64).
struct OperandData {
  std::vector<uint8_t> bytes;
  std::vector<float> sf;
  std::vector<double> values;  // [rows, k], scale applied
  Operand op;
};

uint8_t random_code(DType t, std::mt19937& rng) {
  if (t == DType::fp4x2) return static_cast<uint8_t>(rng() & 0xFF);
  uint8_t c;
  do c = static_cast<uint8_t>(rng());
  while ((c & 0x7F) == 0x7F);  // no e4m3 NaN
  return c;
}

float random_scale(ScaleKind kind, std::mt19937& rng) {
  if (kind == ScaleKind::pow2) return std::ldexp(1.0f, static_cast<int>(rng() % 10) - 6);
  return std::uniform_real_distribution<float>(0.5f, 2.0f)(rng) / 16;
}

double raw_value(DType t, const std::vector<uint8_t>& bytes, int64_t index) {
  if (t == DType::bf16) {
    bf16 v;
    std::memcpy(&v, bytes.data() + 2 * index, 2);
    return bf16_to_f32(v);
  }
  if (t == DType::e4m3) return e4m3_to_f32(e4m3{bytes[index]});
  const uint8_t byte = bytes[index / 2];
  return e2m1_to_f32(index % 2 == 0 ? byte & 0xF : byte >> 4);
}

OperandData make_operand(DType t, int64_t rows, int64_t k, bool mn_major, ScaleKind scales,
                         int gran_mn, int gran_k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  OperandData o;
  const int64_t count = rows * k;
  const size_t bytes = t == DType::bf16 ? 2 * count : t == DType::e4m3 ? count : (count + 1) / 2;
  o.bytes.resize(bytes);
  if (t == DType::bf16) {
    for (int64_t i = 0; i < count; ++i) {
      const bf16 v = f32_to_bf16(normal(rng));
      std::memcpy(o.bytes.data() + 2 * i, &v, 2);
    }
  } else {
    for (uint8_t& c : o.bytes) c = random_code(t, rng);
  }
  // Logical (r, kk) lives at r * stride_r + kk * stride_k (FP4 is always K-major).
  const int64_t stride_r = mn_major ? 1 : k, stride_k = mn_major ? rows : 1;
  const int64_t sf_rows = (rows + gran_mn - 1) / gran_mn, sf_cols = (k + gran_k - 1) / gran_k;
  if (scales != ScaleKind::none) {
    o.sf.resize(static_cast<size_t>(sf_rows * sf_cols));
    for (float& s : o.sf) s = random_scale(scales, rng);
  }
  o.values.resize(static_cast<size_t>(count));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kk = 0; kk < k; ++kk) {
      const double s = o.sf.empty() ? 1.0 : o.sf[(r / gran_mn) * sf_cols + kk / gran_k];
      o.values[r * k + kk] = raw_value(t, o.bytes, r * stride_r + kk * stride_k) * s;
    }
  o.op.data = o.bytes.data();
  o.op.dtype = t;
  o.op.rows = rows;
  o.op.k = k;
  o.op.stride_r = t == DType::fp4x2 ? k / 2 : stride_r;
  o.op.stride_k = t == DType::fp4x2 ? 1 : stride_k;
  if (!o.sf.empty()) o.op.sf = {o.sf.data(), sf_cols, gran_mn, gran_k, scales == ScaleKind::pow2};
  return o;
}

// D with its poisoned (or C-holding) initial contents, and the fp64 expectation.
struct Problem {
  Case c;
  OperandData a, b;
  std::shared_ptr<const PackedB> packed;
  std::vector<uint8_t> initial;   // D before the call (C when accumulating, NaN otherwise)
  std::vector<double> expected;   // fp64 C + A B^T
  std::vector<double> tolerance;  // per element

  int64_t d_bytes() const { return element_size(c.d) == 4 ? 4 : 2; }
  double d_value(const std::vector<uint8_t>& d, int64_t i) const {
    if (c.d == DType::f32) {
      float v;
      std::memcpy(&v, d.data() + 4 * i, 4);
      return v;
    }
    bf16 v;
    std::memcpy(&v, d.data() + 2 * i, 2);
    return bf16_to_f32(v);
  }
};

Problem make_problem(const Case& c, uint32_t seed) {
  Problem p;
  p.c = c;
  p.a = make_operand(c.a, c.m, c.k, c.a_mn_major, c.scales, 1, c.gran_k, seed);
  p.b = make_operand(c.b, c.n, c.k, c.b_mn_major, c.scales, c.gran_n, c.gran_k, seed + 7);
  p.packed = pack_b(p.b.op);
  const int64_t mn = c.m * c.n;
  p.initial.assign(static_cast<size_t>(mn * p.d_bytes()), 0xFF);  // NaN in f32 and bf16
  std::mt19937 rng(seed + 13);
  std::normal_distribution<float> normal;
  p.expected.assign(static_cast<size_t>(mn), 0.0);
  p.tolerance.assign(static_cast<size_t>(mn), 0.0);
  for (int64_t i = 0; i < mn; ++i) {
    if (!c.accumulate) continue;
    const float v = normal(rng);
    if (c.d == DType::f32) {
      std::memcpy(p.initial.data() + 4 * i, &v, 4);
    } else {
      const bf16 h = f32_to_bf16(v);
      std::memcpy(p.initial.data() + 2 * i, &h, 2);
    }
    p.expected[i] = p.d_value(p.initial, i);
  }
  const double out_rel = c.d == DType::f32 ? 0x1p-23 : 0x1p-8;
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, magnitude = std::fabs(p.expected[r * c.n + j]);
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double term = p.a.values[r * c.k + kk] * p.b.values[j * c.k + kk];
        sum += term;
        magnitude += std::fabs(term);
      }
      double& e = p.expected[r * c.n + j];
      e += sum;
      // f32 sums of k terms (and one promotion product per block), then D's rounding.
      p.tolerance[r * c.n + j] =
          static_cast<double>(c.k + 4) * 0x1p-23 * magnitude + out_rel * std::fabs(e) + 1e-30;
    }
  return p;
}

std::vector<uint8_t> run_problem(const Problem& p) {
  std::vector<uint8_t> d = p.initial;
  Segment s;
  s.a = p.a.op;
  s.b = p.packed.get();
  s.d = {d.data(), p.c.d, p.c.m, p.c.n, p.c.n};
  run(std::span<const Segment>(&s, 1), p.c.accumulate);
  return d;
}

void expect_close(const Problem& p, const std::vector<uint8_t>& d, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < p.c.m * p.c.n; ++i) {
    const double x = p.d_value(d, i);
    if (!(std::fabs(x - p.expected[i]) <= p.tolerance[i])) {
      if (++bad <= 3)
        ADD_FAILURE() << what << " " << p.c.name() << ": element (" << i / p.c.n << ", "
                      << i % p.c.n << ") = " << x << ", expected " << p.expected[i] << " +- "
                      << p.tolerance[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << " " << p.c.name();
}

// Sets the config of every run for a scope.
class ScopedConfig {
 public:
  explicit ScopedConfig(const KernelConfig& c) { set_config_override(c); }
  ~ScopedConfig() { set_config_override(std::nullopt); }
};

KernelConfig config(int small_m_max, PathBlocks large, PathBlocks small) {
  KernelConfig c;
  c.small_m_max = small_m_max;
  c.large = large;
  c.small = small;
  return c;
}

// The configs every case runs with: each path, with blocks that split M, N and K into pieces
// (tails included) and blocks larger than the problem.
std::vector<KernelConfig> configs_for(Backend isa) {
  const int step = isa == Backend::amx ? 32 : 6;
  return {config(16, {2 * step, 64, 128}, {0, 64, 128}),     // heuristic-like small / large
          config(0, {step, 128, 256}, {0, 64, 128}),         // large path only, tiny blocks
          config(1 << 20, {96, 256, 256}, {0, 128, 256}),    // small path only, row groups
          config(0, {16 * step, 512, 512}, {0, 512, 512})};  // blocks larger than the problem
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // bf16: tails in M (rows % 6, one row), N (n % 64, n < 16) and K (odd, < 32, not % 32).
  for (auto [m, n, k] : {std::tuple{1, 1, 2},
                         {5, 64, 64},
                         {7, 130, 301},
                         {16, 70, 33},
                         {37, 129, 256},
                         {3, 200, 1},
                         {20, 17, 100}})
    out.push_back({.m = m, .n = n, .k = k});
  out.push_back({.d = DType::bf16, .m = 13, .n = 96, .k = 160, .accumulate = true});
  out.push_back({.m = 9, .n = 65, .k = 97, .accumulate = true});
  out.push_back({.m = 11, .n = 33, .k = 70, .a_mn_major = true, .b_mn_major = true});
  out.push_back({.m = 40, .n = 70, .k = 96});  // on tiles: a whole row tile, then one of 8 rows
  // FP8: promoted f32 scales (per-block and per-channel B), folded powers of two, gran_k 32.
  const DType e4 = DType::e4m3, e2 = DType::fp4x2;
  out.push_back(
      {.a = e4, .b = e4, .d = DType::bf16, .m = 19, .n = 150, .k = 384, .scales = ScaleKind::f32});
  out.push_back({.a = e4,
                 .b = e4,
                 .m = 4,
                 .n = 64,
                 .k = 300,
                 .scales = ScaleKind::f32,
                 .gran_n = 1,
                 .accumulate = true});
  out.push_back(
      {.a = e4, .b = e4, .d = DType::bf16, .m = 23, .n = 70, .k = 512, .scales = ScaleKind::pow2});
  // 128-value blocks of powers of two, which the tile kernels fold, in a tile of at most 16 rows.
  out.push_back(
      {.a = e4, .b = e4, .d = DType::bf16, .m = 5, .n = 130, .k = 384, .scales = ScaleKind::pow2});
  out.push_back({.a = e4,
                 .b = e4,
                 .m = 2,
                 .n = 100,
                 .k = 130,
                 .scales = ScaleKind::pow2,
                 .gran_k = 32,
                 .gran_n = 1});
  out.push_back({.a = e4,
                 .b = e4,
                 .m = 9,
                 .n = 40,
                 .k = 200,
                 .scales = ScaleKind::f32,
                 .gran_n = 1,
                 .a_mn_major = true,
                 .b_mn_major = true});
  // FP4 (UE8M0 scales, gran_k 32) alone and against FP8.
  out.push_back({.a = e2,
                 .b = e2,
                 .d = DType::bf16,
                 .m = 17,
                 .n = 90,
                 .k = 256,
                 .scales = ScaleKind::pow2,
                 .gran_k = 32,
                 .gran_n = 1});
  out.push_back({.a = e4,
                 .b = e2,
                 .m = 3,
                 .n = 64,
                 .k = 96,
                 .scales = ScaleKind::pow2,
                 .gran_k = 32,
                 .gran_n = 1,
                 .accumulate = true});
  out.push_back({.a = e2,
                 .b = e2,
                 .m = 8,
                 .n = 72,
                 .k = 64,
                 .scales = ScaleKind::f32,
                 .gran_k = 32,
                 .gran_n = 1});
  return out;
}

class Engine : public ::testing::Test {
 protected:
  void TearDown() override { set_config_override(std::nullopt); }
  test::ScopedEnv no_jit_{"DSK_GEMM_JIT", "0"};  // the JIT has its own test below
};

TEST_F(Engine, MatchesFp64OnEveryBackendAndConfigWithIdenticalBits) {
  uint32_t seed = 1;
  for (const Case& c : cases()) {
    const Problem p = make_problem(c, seed += 101);
    std::optional<std::vector<uint8_t>> first;  // avx512 and generic share their numerics
    for (Backend be : test::supported_backends()) {
      test::ScopedBackend scoped(be);
      for (const KernelConfig& cfg : configs_for(be)) {
        ScopedConfig forced(cfg);
        const std::vector<uint8_t> d = run_problem(p);
        const std::string what = fmt::format("{} {}", backend_name(be), describe(cfg));
        expect_close(p, d, what);
        if (be == Backend::amx) continue;  // AMX adds the even product first
        if (!first)
          first = d;
        else
          EXPECT_EQ(d, *first) << what << " " << c.name() << ": bits differ";
      }
    }
  }
}

TEST_F(Engine, RepeatableAndIndependentOfThreadCount) {
  const int saved = get_num_threads();
  const Problem p = make_problem({.a = DType::e4m3,
                                  .b = DType::e4m3,
                                  .d = DType::bf16,
                                  .m = 70,
                                  .n = 300,
                                  .k = 640,
                                  .scales = ScaleKind::f32},
                                 77);
  std::vector<std::vector<uint8_t>> results;
  for (int threads : {1, 2, 3, 1, 2}) {
    set_num_threads(threads);
    results.push_back(run_problem(p));
  }
  set_num_threads(saved);
  for (const auto& r : results) EXPECT_EQ(r, results.front());
}

TEST_F(Engine, GroupedSegmentsIncludingEmptyAndSingleRows) {
  // One run of segments sharing B's shape: rows 0, 1, 5, 40 and 17 with their own weights.
  const std::vector<int64_t> rows = {0, 1, 5, 40, 17};
  std::vector<Problem> problems;
  for (size_t g = 0; g < rows.size(); ++g)
    problems.push_back(make_problem({.a = DType::e4m3,
                                     .b = DType::e4m3,
                                     .d = DType::bf16,
                                     .m = std::max<int64_t>(rows[g], 1),
                                     .n = 96,
                                     .k = 256,
                                     .scales = ScaleKind::pow2},
                                    static_cast<uint32_t>(500 + g)));
  std::vector<std::vector<uint8_t>> outputs;
  std::vector<Segment> segments;
  for (size_t g = 0; g < rows.size(); ++g) outputs.push_back(problems[g].initial);
  for (size_t g = 0; g < rows.size(); ++g) {
    Segment s;
    s.a = problems[g].a.op;
    s.b = problems[g].packed.get();
    s.d = {outputs[g].data(), DType::bf16, rows[g], 96, 96};
    segments.push_back(s);
  }
  run(segments, false);
  EXPECT_EQ(outputs[0], problems[0].initial) << "an empty segment writes nothing";
  for (size_t g = 1; g < rows.size(); ++g) {
    expect_close(problems[g], outputs[g], fmt::format("segment {}", g));
    EXPECT_EQ(outputs[g], run_problem(problems[g])) << "segment " << g << " alone";
  }
}

TEST_F(Engine, NanInAnFp8WeightPropagates) {
  Problem p = make_problem(
      {.a = DType::e4m3, .b = DType::e4m3, .m = 3, .n = 64, .k = 128, .scales = ScaleKind::pow2},
      31);
  p.b.bytes[5 * 128 + 7] = 0x7F;  // B(5, 7) = NaN: its scales must not be folded
  p.packed = pack_b(p.b.op);
  const std::vector<uint8_t> d = run_problem(p);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j = 0; j < 64; ++j)
      EXPECT_EQ(std::isnan(p.d_value(d, r * 64 + j)), j == 5) << r << ", " << j;
}

TEST_F(Engine, PackedLayoutIsTheSameFromEveryStorageOrder) {
  for (DType t : {DType::bf16, DType::e4m3}) {
    const OperandData k_major = make_operand(t, 70, 45, false, ScaleKind::none, 1, 128, 9);
    OperandData mn_major = make_operand(t, 70, 45, true, ScaleKind::none, 1, 128, 9);
    // Same logical values stored transposed.
    const int64_t es = t == DType::bf16 ? 2 : 1;
    for (int64_t r = 0; r < 70; ++r)
      for (int64_t kk = 0; kk < 45; ++kk)
        std::memcpy(mn_major.bytes.data() + (kk * 70 + r) * es,
                    k_major.bytes.data() + (r * 45 + kk) * es, static_cast<size_t>(es));
    for (Backend be : test::supported_backends()) {
      test::ScopedBackend scoped(be);
      const auto a = pack_b(k_major.op), b = pack_b(mn_major.op);
      ASSERT_EQ(packed_bytes(*a), packed_bytes(*b));
      EXPECT_EQ(std::memcmp(a->data(), b->data(), packed_bytes(*a)), 0)
          << dtype_name(t) << " " << backend_name(be);
    }
  }
}

// The amx kernel's algorithm (32 x 32 tiles of four tile accumulators, zero-padded A blocks,
// promotion out of tile registers) run on the generic TileUnit, which emulates AMX bit for bit:
// checked against fp64 here, and against the real amx backend where the CPU has AMX.
std::vector<uint8_t> run_tile_path(const Problem& p, int block_m, int panels_per_item,
                                   int block_k) {
  namespace tl = dsk::tile;
  std::vector<uint8_t> d = p.initial;
  const kg::PackedLayout& layout = p.packed->layout;
  kg::GemmSegment segment;
  segment.a = {.data = p.a.op.data,
               .stride_r = p.a.op.stride_r,
               .stride_k = p.a.op.stride_k,
               .sf = p.a.op.sf.data,
               .sf_ld = p.a.op.sf.ld,
               .sf_gran_m = p.a.op.sf.gran_mn,
               .sf_gran_k = p.a.op.sf.gran_k};
  // Powers of two well inside the fold range.
  segment.a_foldable = p.c.scales == ScaleKind::pow2;
  segment.b = p.packed->data();
  segment.d = d.data();
  segment.ldd = p.c.n;
  segment.m = p.c.m;
  std::vector<kg::GemmItem> items;
  for (int64_t m0 = 0; m0 < p.c.m; m0 += block_m)
    for (int64_t p0 = 0; p0 < layout.panels; p0 += panels_per_item)
      items.push_back(
          {0, static_cast<int32_t>(m0),
           static_cast<int32_t>(std::min<int64_t>(p.c.m, m0 + block_m)), static_cast<int32_t>(p0),
           static_cast<int32_t>(std::min<int64_t>(layout.panels, p0 + panels_per_item))});
  const kg::ScratchPlan plan =
      kg::scratch_plan(kg::Path::large_m, block_m, panels_per_item, block_k, layout.k_pad);
  std::vector<std::byte> scratch(static_cast<size_t>(plan.bytes + 64));
  kg::GemmArgs args;
  args.segments = &segment;
  args.items = items.data();
  args.item_end = static_cast<int64_t>(items.size());
  args.b = layout;
  args.a_type = p.c.a == DType::bf16   ? kg::Elem::bf16
                : p.c.a == DType::e4m3 ? kg::Elem::e4m3
                                       : kg::Elem::e2m1;
  args.d_type = p.c.d == DType::f32 ? kg::OutType::f32 : kg::OutType::bf16;
  args.accumulate = p.c.accumulate;
  args.block_k = block_k;
  args.scratch = reinterpret_cast<std::byte*>(
      kg::round_up(reinterpret_cast<int64_t>(scratch.data()), kg::kLayoutAlign));
  kg::gemm_tile_path<tl::generic_t, kg::GemmConfig{}>(args);
  return d;
}

TEST_F(Engine, AmxAlgorithmOnEmulatedTilesMatchesFp64AndRealAmx) {
  uint32_t seed = 3;
  for (const Case& c : cases()) {
    const Problem p = make_problem(c, seed += 17);
    const std::vector<uint8_t> emulated = run_tile_path(p, 64, 2, 128);
    expect_close(p, emulated, "emulated amx tiles");
    EXPECT_EQ(run_tile_path(p, 32, 1, 256), emulated) << c.name() << ": blocking changed bits";
    if (!backend_supported(Backend::amx)) continue;
    test::ScopedBackend amx(Backend::amx);
    ScopedConfig large_only(config(0, {64, 128, 128}, {0, 64, 128}));
    EXPECT_EQ(run_problem(p), emulated) << c.name() << ": AMX differs from its emulation";
  }
}

// The JIT-compiled kernel (specialised for the shape) against the built-in runtime-shape one.
TEST(EngineJit, CompiledKernelsGiveTheBitsOfTheBuiltInOnes) {
  test::TempDir cache;
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", cache.path().c_str());
  if (!jit::availability("GEMM").available) GTEST_SKIP() << jit::availability("GEMM").reason;
  const Problem p = make_problem({.a = DType::e4m3,
                                  .b = DType::e4m3,
                                  .d = DType::bf16,
                                  .m = 21,
                                  .n = 130,
                                  .k = 300,
                                  .scales = ScaleKind::f32},
                                 4242);
  std::vector<uint8_t> built_in;
  {
    test::ScopedEnv off("DSK_GEMM_JIT", "0");
    built_in = run_problem(p);
  }
  test::ScopedEnv on("DSK_GEMM_JIT", "1");
  const jit::Stats before = jit::stats();
  EXPECT_EQ(run_problem(p), built_in);
  EXPECT_GT(jit::stats().compiles, before.compiles) << "the JIT was not used";
}

// The amx kernels run where the CPU has AMX; elsewhere their JIT instantiation must still compile.
TEST(EngineJit, AmxKernelsCompile) {
  test::TempDir cache;
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", cache.path().c_str());
  if (!jit::availability("GEMM").available) GTEST_SKIP() << jit::availability("GEMM").reason;
  const kg::GemmConfig c{.path = kg::Path::large_m,
                         .a_type = kg::Elem::e4m3,
                         .b_type = kg::Elem::e4m3,
                         .d_type = kg::OutType::bf16,
                         .n = 256,
                         .k = 512,
                         .block_k = 256};
  EXPECT_NO_THROW(jit::load(kernel_source(Backend::amx, c)));
  kg::GemmConfig small = c;
  small.path = kg::Path::small_m;
  EXPECT_NO_THROW(jit::load(kernel_source(Backend::amx, small)));
}

}  // namespace
}  // namespace dsk::gemm::engine
