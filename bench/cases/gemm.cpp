// The "gemm" module's bench cases (`dsk bench gemm`): the dense BF16 and FP8 GEMMs at large M
// (M = 4096, the upstream (N, K) pairs; hot, bound by the bf16 compute roof: amx_bf16 on AMX
// machines, avx512_bf16 elsewhere), at small M (1, 4, 16, 64 rows; weights cold, bound by DRAM
// reads), and the grouped contiguous / masked GEMMs at the dense case's total M. The peer is
// oneDNN's BF16 matmul with weights prepacked in its preferred layout, measured in the same run.
// The verify cases of the module live in gemm_verify.cpp (gemm_cases.hpp).
#include <dlfcn.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include <dsk/core.hpp>
#include <dsk/gemm.hpp>

#include "bench/cases/gemm_tuning.hpp"
#include "bench/harness.hpp"

#if __has_include("bench/cases/gemm_cases.hpp")
#include "bench/cases/gemm_cases.hpp"
#define DSK_BENCH_GEMM_VERIFY 1
#endif

#if DSK_BENCH_HAS_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace dsk::bench {
namespace {

namespace g = dsk::gemm;

struct NK {
  int64_t n, k;
};
// Upstream's normal GEMM grid (tests/generators.py), the (N, K) of DeepSeek-V3's layers.
constexpr NK kUpstreamPairs[] = {{2112, 7168},  {576, 7168},  {24576, 1536}, {32768, 512},
                                 {7168, 16384}, {4096, 7168}, {7168, 2048}};
constexpr int64_t kLargeM = 4096;
constexpr int64_t kSmallMs[] = {1, 4, 16, 64};
constexpr NK kSmallPairs[] = {{4096, 7168}, {7168, 16384}};

// ---- data ----

uint64_t g_seed = 1;

Tensor random_bf16(const Shape& shape) {
  Tensor f = Tensor::empty(shape, DType::f32);
  fill_uniform(f.data<float>(), static_cast<size_t>(f.numel()), g_seed++);
  Tensor out = Tensor::empty(shape, DType::bf16);
  convert_f32_to_bf16(f.data<float>(), out.data<bf16>(), static_cast<size_t>(f.numel()));
  return out;
}

// An FP8 operand [rows, k] with one f32 scale per gran_mn x 128 block: random codes and scales
// (quantization itself is not what is measured). ue8m0: the scales are powers of two.
g::Fp8Tensor random_fp8(int64_t rows, int64_t k, int64_t gran_mn, bool ue8m0) {
  Tensor f = Tensor::empty({rows, k}, DType::f32);
  fill_uniform(f.data<float>(), static_cast<size_t>(f.numel()), g_seed++);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] *= 400.0f;
  g::Fp8Tensor out{Tensor::empty({rows, k}, DType::e4m3),
                   Tensor::empty({(rows + gran_mn - 1) / gran_mn, (k + 127) / 128}, DType::f32)};
  convert_f32_to_e4m3(f.data<float>(), out.data.data<e4m3>(), static_cast<size_t>(f.numel()));
  std::mt19937 rng(static_cast<uint32_t>(g_seed++));
  std::uniform_real_distribution<float> spread(0.5f, 1.0f);
  float* sf = out.sf.data<float>();
  for (int64_t i = 0; i < out.sf.numel(); ++i) sf[i] = ue8m0 ? 1.0f / 512 : spread(rng) / 448;
  return out;
}

// ---- the peer: oneDNN's BF16 matmul, weights prepacked ----

#if DSK_BENCH_HAS_ONEDNN
// oneDNN (Debian's build) threads with OpenMP: give it dsk's thread count. libgomp is loaded with
// libdnnl, so its omp_set_num_threads is found without linking OpenMP here.
void match_onednn_threads() {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")))
    fn(get_num_threads());
}

dnnl::engine& onednn_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// D [m, n] bf16 = A [m, k] bf16 . B^T, B given [n, k] and reordered once into the layout the
// primitive prefers (format_tag::any).
class OnednnMatmul {
 public:
  OnednnMatmul(int64_t m, int64_t n, int64_t k) : n_(n), k_(k) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc a({m, k}, dt::bf16, tag::ab), b({k, n}, dt::bf16, tag::any),
        d({m, n}, dt::bf16, tag::ab);
    pd_ = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, d), onednn_engine());
    primitive_ = dnnl::matmul(pd_);
  }

  dnnl::memory pack(const Tensor& b_nk) const {
    const dnnl::memory::desc user({k_, n_}, dnnl::memory::data_type::bf16,
                                  dnnl::memory::format_tag::ba);
    dnnl::memory source(user, onednn_engine(), b_nk.data_ptr());
    dnnl::memory packed(pd_.weights_desc(), onednn_engine());
    dnnl::stream stream(onednn_engine());
    dnnl::reorder(source, packed).execute(stream, source, packed);
    stream.wait();
    return packed;
  }

  void run(const Tensor& a, const dnnl::memory& b, const Tensor& d) const {
    dnnl::stream stream(onednn_engine());
    dnnl::memory am(pd_.src_desc(), onednn_engine(), a.data_ptr());
    dnnl::memory dm(pd_.dst_desc(), onednn_engine(), d.data_ptr());
    primitive_.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, dm}});
    stream.wait();
  }

 private:
  int64_t n_, k_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul primitive_;
};

// The peer of a dense case: `copies` prepacked weights [n, k], one A and one D.
std::function<void(int)> onednn_peer(int64_t m, int64_t n, int64_t k, int copies) {
  match_onednn_threads();
  auto mm = std::make_shared<OnednnMatmul>(m, n, k);
  auto weights = std::make_shared<std::vector<dnnl::memory>>();
  for (int c = 0; c < copies; ++c) weights->push_back(mm->pack(random_bf16({n, k})));
  const Tensor a = random_bf16({m, k});
  const Tensor d = Tensor::empty({m, n}, DType::bf16);
  return [=](int copy) { mm->run(a, (*weights)[static_cast<size_t>(copy)], d); };
}

// The peer of a grouped case: one matmul per group of rows (`rows`), each with its own weight.
std::function<void(int)> onednn_grouped_peer(const std::vector<int64_t>& rows, int64_t n,
                                             int64_t k) {
  match_onednn_threads();
  struct Group {
    std::shared_ptr<OnednnMatmul> mm;
    dnnl::memory weight;
    Tensor a, d;
  };
  auto groups = std::make_shared<std::vector<Group>>();
  for (int64_t m : rows) {
    if (m == 0) continue;
    auto mm = std::make_shared<OnednnMatmul>(m, n, k);
    groups->push_back({mm, mm->pack(random_bf16({n, k})), random_bf16({m, k}),
                       Tensor::empty({m, n}, DType::bf16)});
  }
  return [groups](int) {
    for (const Group& gr : *groups) gr.mm->run(gr.a, gr.weight, gr.d);
  };
}
constexpr const char* kPeer = "oneDNN bf16 matmul";
#else
std::function<void(int)> onednn_peer(int64_t, int64_t, int64_t, int) {
  return {};
}
std::function<void(int)> onednn_grouped_peer(const std::vector<int64_t>&, int64_t, int64_t) {
  return {};
}
constexpr const char* kPeer = "";
#endif

// ---- dense cases ----

enum class Weights { bf16, fp8_f32, fp8_ue8m0 };

const char* weights_name(Weights w) {
  return w == Weights::bf16 ? "bf16_gemm_nt" : "fp8_gemm_nt";
}
std::string scales_text(Weights w) {
  return w == Weights::bf16 ? "" : w == Weights::fp8_f32 ? " sf=f32" : " sf=ue8m0";
}

// Bytes of one weight [n, k] with its scales, as stored before packing.
double weight_bytes(Weights w, int64_t n, int64_t k) {
  const double values = static_cast<double>(n) * static_cast<double>(k);
  if (w == Weights::bf16) return 2 * values;
  return values + 4.0 * static_cast<double>((n + 127) / 128) * static_cast<double>((k + 127) / 128);
}

// One call: D [m, n] bf16 = A . B^T with B prepacked, on working-set copy `copy`.
struct DenseData {
  std::vector<g::PackedWeight> weights;
  Tensor a_bf16;
  g::Fp8Tensor a_fp8;
  Tensor d;
};

Prepared prepare_dense(Weights w, int64_t m, int64_t n, int64_t k, const CaseContext& ctx,
                       bool with_peer = true) {
  auto data = std::make_shared<DenseData>();
  for (int c = 0; c < ctx.copies; ++c) {
    if (w == Weights::bf16)
      data->weights.push_back(g::pack_weight(random_bf16({n, k})));
    else
      data->weights.push_back(g::pack_weight(random_fp8(n, k, 128, w == Weights::fp8_ue8m0),
                                             g::OperandRecipe{128, 128}));
  }
  if (w == Weights::bf16)
    data->a_bf16 = random_bf16({m, k});
  else
    data->a_fp8 = random_fp8(m, k, 1, w == Weights::fp8_ue8m0);
  data->d = Tensor::empty({m, n}, DType::bf16);
  Prepared p;
  p.kernel = [data, w](int copy) {
    const g::PackedWeight& b = data->weights[static_cast<size_t>(copy)];
    if (w == Weights::bf16)
      g::bf16_gemm_nt(data->a_bf16, b, data->d);
    else
      g::fp8_gemm_nt(data->a_fp8, b, data->d, std::nullopt, g::Recipe{1, 128, 128});
  };
  if (with_peer) p.peer = onednn_peer(m, n, k, ctx.copies);
  p.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double a_bytes = static_cast<double>(m * k) * (w == Weights::bf16 ? 2 : 1);
  p.bytes = weight_bytes(w, n, k) + a_bytes + 2.0 * static_cast<double>(m * n);
  return p;
}

void add_dense_case(Registry& r, Weights w, int64_t m, NK nk, bool quick) {
  const bool memory_bound = m <= 64;
  r.add(BenchCase{.name = weights_name(w),
                  .shape = fmt::format("m={} n={} k={}{}", m, nk.n, nk.k, scales_text(w)),
                  .ceiling = memory_bound ? "dram_read" : bf16_roof(),
                  .peer = kPeer,
                  .residency = memory_bound ? Residency::cold : Residency::hot,
                  .working_set_bytes = static_cast<size_t>(weight_bytes(w, nk.n, nk.k)),
                  .quick = quick,
                  .prepare = [w, m, nk](const CaseContext& ctx) {
                    return prepare_dense(w, m, nk.n, nk.k, ctx);
                  }});
}

// ---- grouped cases (MoE experts): the dense case's total M spread over groups ----

constexpr int64_t kGroups = 8;
constexpr NK kGroupedPair = {4096, 7168};

// Rows per group: expected * U(0.7, 1.3), as upstream's generators, scaled to sum to `total`.
std::vector<int64_t> moe_group_rows(int64_t groups, int64_t total, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.7, 1.3);
  std::vector<double> w(static_cast<size_t>(groups));
  for (double& x : w) x = u(rng);
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<int64_t> rows;
  int64_t used = 0;
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t m = i + 1 == groups
                          ? total - used
                          : static_cast<int64_t>(static_cast<double>(total) * w[i] / sum);
    rows.push_back(m);
    used += m;
  }
  return rows;
}

// kGroups weights [n, k] (n a multiple of 128) as one [G, N, K] FP8 tensor with its scales.
g::Fp8Tensor grouped_fp8_weight(int64_t n, int64_t k) {
  const g::Fp8Tensor w = random_fp8(kGroups * n, k, 128, false);
  return {w.data.view({kGroups, n, k}), w.sf.view({kGroups, n / 128, w.sf.size(1)})};
}

struct GroupedData {
  g::PackedWeight weights;
  Tensor a_bf16, d, layout;
  g::Fp8Tensor a_fp8;
};

// Contiguous: groups padded to the mk alignment, padding rows marked -1.
Prepared prepare_contiguous(bool fp8, const CaseContext&, bool with_peer = true) {
  const auto [n, k] = kGroupedPair;
  const std::vector<int64_t> rows = moe_group_rows(kGroups, kLargeM, 7);
  const int64_t align = g::get_mk_alignment_for_contiguous_layout();
  int64_t m = 0;
  for (int64_t r : rows) m += (r + align - 1) / align * align;
  auto data = std::make_shared<GroupedData>();
  data->layout = Tensor::empty({m}, DType::i32);
  int64_t at = 0;
  for (int64_t gi = 0; gi < kGroups; ++gi) {
    const int64_t padded = (rows[gi] + align - 1) / align * align;
    for (int64_t i = 0; i < padded; ++i)
      data->layout.data<int32_t>()[at + i] = i < rows[gi] ? static_cast<int32_t>(gi) : -1;
    at += padded;
  }
  if (fp8) {
    data->weights = g::pack_weight(grouped_fp8_weight(n, k), g::OperandRecipe{128, 128});
    data->a_fp8 = random_fp8(m, k, 1, false);
  } else {
    data->weights = g::pack_weight(random_bf16({kGroups, n, k}));
    data->a_bf16 = random_bf16({m, k});
  }
  data->d = Tensor::empty({m, n}, DType::bf16);
  Prepared p;
  p.kernel = [data, fp8](int) {
    if (fp8)
      g::m_grouped_fp8_gemm_nt_contiguous(data->a_fp8, data->weights, data->d, data->layout,
                                          g::Recipe{1, 128, 128});
    else
      g::m_grouped_bf16_gemm_nt_contiguous(data->a_bf16, data->weights, data->d, data->layout);
  };
  if (with_peer) p.peer = onednn_grouped_peer(rows, n, k);
  p.flops = 2.0 * static_cast<double>(kLargeM) * static_cast<double>(n) * static_cast<double>(k);
  return p;
}

// Masked: every group holds kLargeM / kGroups valid rows of an A [G, Mmax, K].
Prepared prepare_masked(bool fp8, const CaseContext&, bool with_peer = true) {
  const auto [n, k] = kGroupedPair;
  const int64_t per_group = kLargeM / kGroups, max_m = per_group + per_group / 4;
  auto data = std::make_shared<GroupedData>();
  data->layout = Tensor::empty({kGroups}, DType::i32);
  for (int64_t gi = 0; gi < kGroups; ++gi)
    data->layout.data<int32_t>()[gi] = static_cast<int32_t>(per_group);
  if (fp8) {
    data->weights = g::pack_weight(grouped_fp8_weight(n, k), g::OperandRecipe{128, 128});
    g::Fp8Tensor a = random_fp8(kGroups * max_m, k, 1, false);
    data->a_fp8 = {a.data.view({kGroups, max_m, k}), a.sf.view({kGroups, max_m, a.sf.size(1)})};
  } else {
    data->weights = g::pack_weight(random_bf16({kGroups, n, k}));
    data->a_bf16 = random_bf16({kGroups, max_m, k});
  }
  data->d = Tensor::empty({kGroups, max_m, n}, DType::bf16);
  Prepared p;
  p.kernel = [data, fp8](int) {
    if (fp8)
      g::m_grouped_fp8_gemm_nt_masked(data->a_fp8, data->weights, data->d, data->layout,
                                      static_cast<int>(per_group), g::Recipe{1, 128, 128});
    else
      g::m_grouped_bf16_gemm_nt_masked(data->a_bf16, data->weights, data->d, data->layout,
                                       static_cast<int>(per_group));
  };
  if (with_peer) p.peer = onednn_grouped_peer(std::vector<int64_t>(kGroups, per_group), n, k);
  p.flops = 2.0 * static_cast<double>(kLargeM) * static_cast<double>(n) * static_cast<double>(k);
  return p;
}

void add_grouped_cases(Registry& r) {
  for (bool fp8 : {false, true}) {
    const std::string dtypes = fp8 ? "fp8" : "bf16";
    r.add(BenchCase{
        .name = fmt::format("m_grouped_{}_gemm_nt_contiguous", dtypes),
        .shape = fmt::format("{}x~{} n={} k={}", kGroups, kLargeM / kGroups, kGroupedPair.n,
                             kGroupedPair.k),
        .ceiling = bf16_roof(),
        .peer = kPeer,
        .quick = false,
        .prepare = [fp8](const CaseContext& ctx) { return prepare_contiguous(fp8, ctx); }});
    r.add(BenchCase{.name = fmt::format("m_grouped_{}_gemm_nt_masked", dtypes),
                    .shape = fmt::format("{}x{} n={} k={}", kGroups, kLargeM / kGroups,
                                         kGroupedPair.n, kGroupedPair.k),
                    .ceiling = bf16_roof(),
                    .peer = kPeer,
                    .quick = false,
                    .prepare = [fp8](const CaseContext& ctx) { return prepare_masked(fp8, ctx); }});
  }
}

// ---- the mk-alignment study: one set of MoE-like group sizes padded to each alignment ----

struct AlignmentRegime {
  const char* name;
  int64_t groups, expected_m, n, k;
};
// Prefill: a few hundred rows per expert; decode: a handful (docs/gemm.md, "## Performance").
constexpr AlignmentRegime kAlignmentRegimes[] = {{"prefill", 8, 512, 4096, 7168},
                                                 {"decode", 32, 16, 4096, 2048}};
constexpr int kAlignments[] = {16, 32, 64, 128};

int64_t padded_rows(const std::vector<int64_t>& rows, int64_t align) {
  int64_t m = 0;
  for (int64_t r : rows) m += (r + align - 1) / align * align;
  return m;
}

Prepared prepare_alignment(const AlignmentRegime& reg, int align) {
  const std::vector<int64_t> rows = moe_group_rows(reg.groups, reg.groups * reg.expected_m, 11);
  const int64_t m = padded_rows(rows, align);
  auto data = std::make_shared<GroupedData>();
  data->layout = Tensor::empty({m}, DType::i32);
  int64_t at = 0;
  for (int64_t gi = 0; gi < reg.groups; ++gi) {
    const int64_t padded = (rows[gi] + align - 1) / align * align;
    for (int64_t i = 0; i < padded; ++i)
      data->layout.data<int32_t>()[at + i] = i < rows[gi] ? static_cast<int32_t>(gi) : -1;
    at += padded;
  }
  data->weights = g::pack_weight(random_bf16({reg.groups, reg.n, reg.k}));
  data->a_bf16 = random_bf16({m, reg.k});
  data->d = Tensor::empty({m, reg.n}, DType::bf16);
  Prepared p;
  p.kernel = [data, align](int) {
    const int saved = g::get_mk_alignment_for_contiguous_layout();
    g::set_mk_alignment_for_contiguous_layout(align);
    g::m_grouped_bf16_gemm_nt_contiguous(data->a_bf16, data->weights, data->d, data->layout);
    g::set_mk_alignment_for_contiguous_layout(saved);
  };
  const double useful = static_cast<double>(reg.groups * reg.expected_m);
  p.flops = 2.0 * useful * static_cast<double>(reg.n) * static_cast<double>(reg.k);
  p.bytes = 2.0 * static_cast<double>(reg.groups) * static_cast<double>(reg.n * reg.k);
  return p;
}

void add_alignment_cases(Registry& r) {
  for (const AlignmentRegime& reg : kAlignmentRegimes) {
    const std::vector<int64_t> rows = moe_group_rows(reg.groups, reg.groups * reg.expected_m, 11);
    const int64_t useful = reg.groups * reg.expected_m;
    for (int align : kAlignments) {
      const int64_t m = padded_rows(rows, align);
      r.add(BenchCase{
          .name = "mk_alignment",
          .shape = fmt::format("{} {}x~{} n={} k={} align={} padding={:.1f}%", reg.name, reg.groups,
                               reg.expected_m, reg.n, reg.k, align,
                               100.0 * static_cast<double>(m - useful) / static_cast<double>(m)),
          .ceiling = reg.expected_m <= 64 ? "dram_read" : bf16_roof(),
          .quick = false,
          .prepare = [reg, align](const CaseContext&) { return prepare_alignment(reg, align); }});
    }
  }
}

}  // namespace

void warm_up_gemm_shapes(bool quick, const std::function<void(const std::string&)>& on_shape) {
  const CaseContext ctx{.quick = quick, .copies = 1, .threads = get_num_threads()};
  const auto once = [&](const std::string& what, const Prepared& p) {
    on_shape(what);
    p.kernel(0);
  };
  for (Weights w : {Weights::bf16, Weights::fp8_f32, Weights::fp8_ue8m0})
    for (size_t i = quick ? 1 : 0; i < (quick ? 2 : std::size(kUpstreamPairs)); ++i) {
      const NK nk = kUpstreamPairs[i];
      once(fmt::format("{} m={} n={} k={}{}", weights_name(w), kLargeM, nk.n, nk.k, scales_text(w)),
           prepare_dense(w, kLargeM, nk.n, nk.k, ctx, false));
    }
  for (Weights w : {Weights::bf16, Weights::fp8_ue8m0})
    for (const NK& nk : kSmallPairs)
      for (int64_t m : kSmallMs)
        once(fmt::format("{} m={} n={} k={}{}", weights_name(w), m, nk.n, nk.k, scales_text(w)),
             prepare_dense(w, m, nk.n, nk.k, ctx, false));
  for (bool fp8 : {false, true}) {
    once(fmt::format("m_grouped_{}_gemm_nt_contiguous", fp8 ? "fp8" : "bf16"),
         prepare_contiguous(fp8, ctx, false));
    once(fmt::format("m_grouped_{}_gemm_nt_masked", fp8 ? "fp8" : "bf16"),
         prepare_masked(fp8, ctx, false));
  }
}

void register_gemm_cases(Registry& r) {
  // Large M, hot: compute-bound. --quick keeps the smallest pair, in BF16 and FP8.
  for (Weights w : {Weights::bf16, Weights::fp8_f32, Weights::fp8_ue8m0})
    for (size_t i = 0; i < std::size(kUpstreamPairs); ++i)
      add_dense_case(r, w, kLargeM, kUpstreamPairs[i], i == 1 && w != Weights::fp8_ue8m0);
  // Small M, weights cold: bound by reading them.
  for (Weights w : {Weights::bf16, Weights::fp8_ue8m0})
    for (const NK& nk : kSmallPairs)
      for (int64_t m : kSmallMs)
        add_dense_case(r, w, m, nk, nk.n == kSmallPairs[0].n && (m == 1 || m == 16));
  add_grouped_cases(r);
  add_alignment_cases(r);
#if DSK_BENCH_GEMM_VERIFY
  register_gemm_verify(r);
#endif
}

}  // namespace dsk::bench
