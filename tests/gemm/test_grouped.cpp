// Grouped GEMMs against dsk::ref: M-grouped contiguous (group ids with -1 padding rows, and the
// psum layout; zeroed or untouched padding; an empty group and a one-row expert), masked (rows
// past masked_m untouched), K-grouped (empty groups keep D = C), pre-packed weights, the mk
// alignment being honoured, and thread-count independence.
#include <numeric>
#include <vector>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

class MGroupedContiguous : public NoJit {};
class MGroupedMasked : public NoJit {};
class KGrouped : public NoJit {};
class Grouped : public NoJit {};

int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

// Upstream's (N, K) pairs of the grouped grids (tests/generators.py) divided by 32.
constexpr std::pair<int64_t, int64_t> kGroupedNk[] = {{192, 224}, {224, 96}, {128, 128}, {128, 64}};

// ---- contiguous ----

// Row r of the contiguous layout belongs to group row_group[r] (-1: padding).
struct Contiguous {
  int64_t m = 0;
  std::vector<int32_t> row_group;
  std::vector<int64_t> starts;  // each group's first row
  Tensor layout;                // int32 [m] group ids, or [G] psum ends
};

// Groups with `rows[g]` rows each, every segment padded to `alignment` (upstream's generator).
Contiguous make_contiguous(const std::vector<int64_t>& rows, int64_t alignment, bool psum) {
  Contiguous c;
  for (int64_t r : rows) c.m += align_up(r, alignment);
  c.row_group.assign(static_cast<size_t>(c.m), -1);
  std::vector<int32_t> ends;
  int64_t start = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    c.starts.push_back(start);
    for (int64_t i = 0; i < rows[g]; ++i)
      c.row_group[static_cast<size_t>(start + i)] = static_cast<int32_t>(g);
    ends.push_back(static_cast<int32_t>(start + rows[g]));
    start += align_up(rows[g], alignment);
  }
  const std::vector<int32_t>& values = psum ? ends : c.row_group;
  c.layout = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i32);
  std::copy(values.begin(), values.end(), c.layout.data<int32_t>());
  return c;
}

// Random rows per group around `expected` (0.7x to 1.3x), with group 0 empty and group 1 a
// single row when there are enough groups.
std::vector<int64_t> random_group_rows(int64_t groups, int64_t expected) {
  const Tensor u = ref::rand_uniform({groups}, DType::f32, fresh_seed(), 0.7f, 1.3f);
  std::vector<int64_t> rows;
  for (int64_t g = 0; g < groups; ++g)
    rows.push_back(static_cast<int64_t>(expected * u.data<float>()[g]));
  if (groups >= 3) {
    rows[0] = 0;
    rows[1] = 1;
  }
  return rows;
}

// D's expected value: row r = A[r] · B[g]ᵀ for its group g, zero on padding rows.
Tensor contiguous_reference(const Tensor& a, const Tensor& b, const Contiguous& c,
                            const std::vector<int64_t>& rows) {
  const int64_t n = b.size(1);
  Tensor out = Tensor::zeros({c.m, n}, DType::f64);
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] == 0) continue;
    const int64_t s = c.starts[g];
    out.slice(0, s, s + rows[g])
        .copy_(ref::gemm_nt(a.slice(0, s, s + rows[g]), b.select(0, static_cast<int64_t>(g))));
  }
  return out;
}

// The padding rows of D are all zero (ensure_zero_padding) or all still poisoned.
void expect_padding(const Tensor& d, const Contiguous& c, bool zeroed) {
  const int64_t n = d.size(1);
  for (int64_t r = 0; r < c.m; ++r) {
    if (c.row_group[static_cast<size_t>(r)] != -1) continue;
    const Tensor row = d.slice(0, r, r + 1);
    if (zeroed)
      EXPECT_TRUE(bitwise_equal(row, Tensor::zeros({1, n}, d.dtype()))) << "padding row " << r;
    else
      EXPECT_EQ(ref::count_poisoned(row), n) << "padding row " << r << " was written";
  }
}

struct GroupedConfig {
  const char* name;
  Quant a, b;
};

constexpr GroupedConfig kGroupedConfigs[] = {
    {"legacy_1d2d", Quant::token_f32, Quant::block_f32},
    {"packed_ue8m0", Quant::token_packed, Quant::token_packed},
    {"fp8_x_fp4", Quant::token_ue8m0, Quant::fp4},
    {"fp4_x_fp4", Quant::fp4, Quant::fp4},
};

void check_fp8_contiguous(const GroupedConfig& cfg, int64_t groups, int64_t expected, int64_t n,
                          int64_t k, bool psum, bool zero_padding) {
  const int64_t alignment = gemm::get_mk_alignment_for_contiguous_layout();
  const std::vector<int64_t> rows = random_group_rows(groups, expected);
  const Contiguous c = make_contiguous(rows, alignment, psum);
  SCOPED_TRACE(fmt::format("{} G={} m={} n={} k={} psum={} zero_padding={} alignment={}", cfg.name,
                           groups, c.m, n, k, psum, zero_padding, alignment));
  const Tensor a = randn_bf16({c.m, k}), b = randn_bf16({groups, n, k});
  const QuantOperand qa = quantize(a, cfg.a), qb = quantize_groups(b, cfg.b);
  Tensor d = poisoned({c.m, n}, DType::bf16);
  gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(qa.x, qb.x, d, c.layout, std::nullopt, qa.recipe,
                                             qb.recipe, "nk", false, psum, zero_padding);
  expect_padding(d, c, zero_padding);
  if (!zero_padding) {
    for (int64_t r = 0; r < c.m; ++r)  // compare the written rows only
      if (c.row_group[static_cast<size_t>(r)] == -1) d.slice(0, r, r + 1).fill_bytes_(0);
  }
  expect_close(d, contiguous_reference(a, b, c, rows), upstream_tolerance(cfg.a, cfg.b),
               contiguous_reference(qa.values, qb.values, c, rows),
               dequantized_tolerance(DType::bf16), "m_grouped contiguous");
}

TEST_F(MGroupedContiguous, Fp8GridBothLayouts) {
  SCOPED_TRACE(seed_note());
  for (const GroupedConfig& cfg : kGroupedConfigs)
    for (bool psum : {false, true})
      for (auto [groups, expected] : {std::pair<int64_t, int64_t>{4, 40}, {3, 70}, {1, 40}})
        for (auto [n, k] : kGroupedNk)
          check_fp8_contiguous(cfg, groups, expected, n, k, psum, true);
}

TEST_F(MGroupedContiguous, PaddingRowsUntouchedWithoutZeroPadding) {
  SCOPED_TRACE(seed_note());
  for (bool psum : {false, true})
    check_fp8_contiguous(kGroupedConfigs[0], 4, 30, 64, 256, psum, false);
}

TEST_F(MGroupedContiguous, Bf16BothLayoutsAndPackedWeights) {
  SCOPED_TRACE(seed_note());
  const int64_t alignment = gemm::get_mk_alignment_for_contiguous_layout();
  for (bool psum : {false, true})
    for (auto [n, k] : kGroupedNk) {
      const std::vector<int64_t> rows = random_group_rows(4, 45);
      const Contiguous c = make_contiguous(rows, alignment, psum);
      const Tensor a = randn_bf16({c.m, k}), b = randn_bf16({4, n, k});
      Tensor d = poisoned({c.m, n}, DType::bf16);
      gemm::m_grouped_bf16_gemm_nt_contiguous(a, b, d, c.layout, "nk", psum);
      expect_padding(d, c, true);
      EXPECT_LT(ref::calc_diff(d, contiguous_reference(a, b, c, rows)), 1e-5);
      Tensor d_packed = poisoned({c.m, n}, DType::bf16);
      gemm::m_grouped_bf16_gemm_nt_contiguous(a, gemm::pack_weight(b), d_packed, c.layout, "nk",
                                              psum);
      EXPECT_TRUE(bitwise_equal(d_packed, d)) << "packed weight";
    }
}

TEST_F(MGroupedContiguous, PackedFp8WeightsGiveTheSameBits) {
  SCOPED_TRACE(seed_note());
  for (const GroupedConfig& cfg : kGroupedConfigs) {
    const std::vector<int64_t> rows = random_group_rows(3, 50);
    const Contiguous c =
        make_contiguous(rows, gemm::get_mk_alignment_for_contiguous_layout(), false);
    const Tensor a = randn_bf16({c.m, 256}), b = randn_bf16({3, 96, 256});
    const QuantOperand qa = quantize(a, cfg.a), qb = quantize_groups(b, cfg.b);
    Tensor raw = poisoned({c.m, 96}, DType::bf16), packed = poisoned({c.m, 96}, DType::bf16);
    gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(qa.x, qb.x, raw, c.layout, std::nullopt, qa.recipe,
                                               qb.recipe);
    const gemm::PackedWeight w = gemm::pack_weight(qb.x, qb.recipe);
    EXPECT_EQ(w.num_groups(), 3);
    gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(qa.x, w, packed, c.layout, std::nullopt, qa.recipe);
    EXPECT_TRUE(bitwise_equal(packed, raw)) << cfg.name;
    gemm::m_grouped_fp8_gemm_nt_contiguous(qa.x, w, packed, c.layout, std::nullopt, qa.recipe);
    EXPECT_TRUE(bitwise_equal(packed, raw)) << cfg.name << " (legacy name)";
  }
}

// Groups packed one by one and stacked (stack_packed_weights shares them) give the bits of the
// weight packed as [G, N, K].
TEST_F(MGroupedContiguous, StackedPackedWeightsGiveTheSameBits) {
  SCOPED_TRACE(seed_note());
  const std::vector<int64_t> rows = random_group_rows(3, 40);
  const Contiguous c = make_contiguous(rows, gemm::get_mk_alignment_for_contiguous_layout(), false);
  const Tensor a = randn_bf16({c.m, 256}), b = randn_bf16({3, 96, 256});
  const QuantOperand qa = quantize(a, kGroupedConfigs[0].a);
  const QuantOperand qb = quantize_groups(b, kGroupedConfigs[0].b);
  Tensor whole = poisoned({c.m, 96}, DType::bf16), stacked = poisoned({c.m, 96}, DType::bf16);
  gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(qa.x, gemm::pack_weight(qb.x, qb.recipe), whole,
                                             c.layout, std::nullopt, qa.recipe);
  std::vector<gemm::PackedWeight> parts;
  for (int64_t g = 0; g < 3; ++g)
    parts.push_back(gemm::pack_weight(gemm::Fp8Tensor{qb.x.data.select(0, g), qb.x.sf.select(0, g)},
                                      qb.recipe));
  const gemm::PackedWeight w = gemm::stack_packed_weights(parts);
  EXPECT_EQ(w.num_groups(), 3);
  EXPECT_EQ(w.nbytes(), gemm::pack_weight(qb.x, qb.recipe).nbytes());
  gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(qa.x, w, stacked, c.layout, std::nullopt, qa.recipe);
  EXPECT_TRUE(bitwise_equal(stacked, whole));
}

TEST_F(MGroupedContiguous, MkAlignmentIsHonoured) {
  SCOPED_TRACE(seed_note());
  for (int alignment : {16, 64, 128}) {
    ScopedAlignment scoped(alignment);
    check_fp8_contiguous(kGroupedConfigs[0], 3, 37, 64, 128, false, true);
    check_fp8_contiguous(kGroupedConfigs[0], 3, 37, 64, 128, true, true);
  }
  // A layout made for 16 is refused once the alignment is 64.
  const Contiguous c16 = make_contiguous({17, 5, 20}, 16, false);
  ScopedAlignment scoped(64);
  const Tensor a = randn_bf16({c16.m, 64}), b = randn_bf16({3, 32, 64});
  Tensor d = poisoned({c16.m, 32}, DType::bf16);
  try {
    gemm::m_grouped_bf16_gemm_nt_contiguous(a, b, d, c16.layout);
    ADD_FAILURE() << "a misaligned segment was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "grouped_layout") << e.what();
  }
}

// ---- masked ----

TEST_F(MGroupedMasked, Fp8AndBf16RowsPastMaskedMUntouched) {
  SCOPED_TRACE(seed_note());
  const int64_t max_m = 48;
  for (auto [n_, k_] : kGroupedNk) {
    // Copies: clang 14 does not let lambdas capture structured bindings.
    const int64_t n = n_, k = k_;
    for (int64_t groups : {1, 4}) {
      std::vector<int32_t> counts = {max_m, 0, 1, 29};
      counts.resize(static_cast<size_t>(groups));
      if (groups == 1) counts[0] = 40;
      Tensor masked_m = Tensor::empty({groups}, DType::i32);
      std::copy(counts.begin(), counts.end(), masked_m.data<int32_t>());
      const Tensor a = randn_bf16({groups, max_m, k}), b = randn_bf16({groups, n, k});
      // Rows past masked_m keep their poison; the valid rows of all groups, stacked, match the
      // reference (one calc_diff over every valid output, as upstream's d[valid_mask]).
      const int64_t valid = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      auto check = [&](const Tensor& d, const Tensor& a_values, const Tensor& b_values,
                       double tolerance, const char* what) {
        Tensor got = Tensor::empty({valid, n}, d.dtype());
        Tensor want = Tensor::empty({valid, n}, DType::f64);
        int64_t row = 0;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t rows = counts[static_cast<size_t>(g)];
          const Tensor dg = d.select(0, g);
          EXPECT_EQ(ref::count_poisoned(dg.slice(0, rows, max_m)), (max_m - rows) * n)
              << what << ": rows past masked_m written, group " << g;
          if (rows == 0) continue;
          got.slice(0, row, row + rows).copy_(dg.slice(0, 0, rows));
          want.slice(0, row, row + rows)
              .copy_(ref::gemm_nt(a_values.select(0, g).slice(0, 0, rows), b_values.select(0, g)));
          row += rows;
        }
        EXPECT_EQ(ref::count_poisoned(got), 0) << what;
        EXPECT_LT(ref::calc_diff(got, want), tolerance) << what << " n " << n << " k " << k;
      };
      for (const GroupedConfig& cfg : kGroupedConfigs) {
        const QuantOperand qa = quantize_groups(a, cfg.a), qb = quantize_groups(b, cfg.b);
        Tensor d = poisoned({groups, max_m, n}, DType::bf16);
        gemm::m_grouped_fp8_fp4_gemm_nt_masked(qa.x, qb.x, d, masked_m, 32, std::nullopt, qa.recipe,
                                               qb.recipe);
        check(d, a, b, upstream_tolerance(cfg.a, cfg.b), cfg.name);
        check(d, qa.values, qb.values, dequantized_tolerance(DType::bf16), cfg.name);
        Tensor d_packed = poisoned({groups, max_m, n}, DType::bf16);
        gemm::m_grouped_fp8_gemm_nt_masked(qa.x, gemm::pack_weight(qb.x, qb.recipe), d_packed,
                                           masked_m, 32, std::nullopt, qa.recipe);
        EXPECT_TRUE(bitwise_equal(d_packed, d)) << cfg.name << " packed";
      }
      Tensor d = poisoned({groups, max_m, n}, DType::bf16);
      gemm::m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 32);
      check(d, a, b, 1e-5, "bf16");
      Tensor d_packed = poisoned({groups, max_m, n}, DType::bf16);
      gemm::m_grouped_bf16_gemm_nt_masked(a, gemm::pack_weight(b), d_packed, masked_m, 32);
      EXPECT_TRUE(bitwise_equal(d_packed, d)) << "bf16 packed";
    }
  }
}

// A read from a [M, G, K] tensor and D written into a [M, G, N] one through transposed views (the
// model's attention heads) give the bits of the contiguous call, and rows past masked_m of the
// view stay untouched.
TEST_F(MGroupedMasked, TransposedViewsGiveTheSameBits) {
  SCOPED_TRACE(seed_note());
  const int64_t groups = 3, max_m = 40, n = 72, k = 160;
  const std::vector<int32_t> counts = {40, 0, 23};
  Tensor masked_m = Tensor::empty({groups}, DType::i32);
  std::copy(counts.begin(), counts.end(), masked_m.data<int32_t>());
  const Tensor a_by_row = randn_bf16({max_m, groups, k}), b = randn_bf16({groups, n, k});
  const Tensor a = a_by_row.transpose(0, 1), a_contiguous = a.contiguous();
  const auto compare = [&](const Tensor& d_view, const Tensor& d, const char* what) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rows = counts[static_cast<size_t>(g)];
      EXPECT_TRUE(bitwise_equal(d_view.select(0, g).slice(0, 0, rows).contiguous(),
                                d.select(0, g).slice(0, 0, rows)))
          << what << " group " << g;
      EXPECT_EQ(ref::count_poisoned(d_view.select(0, g).slice(0, rows, max_m)), (max_m - rows) * n)
          << what << ": rows past masked_m written, group " << g;
    }
  };
  {
    // D's rows sit in wider rows (as the absorbed queries in q_mla): the columns past n stay.
    Tensor d = poisoned({groups, max_m, n}, DType::bf16);
    Tensor wide = poisoned({max_m, groups, n + 24}, DType::bf16);
    const Tensor d_by_row = wide.slice(2, 0, n);
    gemm::m_grouped_bf16_gemm_nt_masked(a_contiguous, b, d, masked_m, 32);
    gemm::m_grouped_bf16_gemm_nt_masked(a, gemm::pack_weight(b), d_by_row.transpose(0, 1), masked_m,
                                        32);
    compare(d_by_row.transpose(0, 1), d, "bf16");
    EXPECT_EQ(ref::count_poisoned(wide.slice(2, n, n + 24)), max_m * groups * 24)
        << "columns past n written";
  }
  const GroupedConfig& cfg = kGroupedConfigs[0];
  const QuantOperand qa = quantize_groups(a_contiguous, cfg.a), qb = quantize_groups(b, cfg.b);
  Tensor codes_by_row = Tensor::empty({max_m, groups, k}, qa.x.data.dtype());
  codes_by_row.transpose(0, 1).copy_(qa.x.data);
  Tensor d = poisoned({groups, max_m, n}, DType::bf16);
  Tensor d_by_row = poisoned({max_m, groups, n}, DType::bf16);
  gemm::m_grouped_fp8_fp4_gemm_nt_masked(qa.x, qb.x, d, masked_m, 32, std::nullopt, qa.recipe,
                                         qb.recipe);
  gemm::m_grouped_fp8_fp4_gemm_nt_masked({codes_by_row.transpose(0, 1), qa.x.sf}, qb.x,
                                         d_by_row.transpose(0, 1), masked_m, 32, std::nullopt,
                                         qa.recipe, qb.recipe);
  compare(d_by_row.transpose(0, 1), d, cfg.name);
}

// ---- K-grouped ----

struct KGroups {
  std::vector<int64_t> starts, ks;  // logical rows of each group
  int64_t sum_k = 0;                // rows of A and B
  Tensor layout;
  std::vector<int> ks_cpu;
};

// Groups of `ks[g]` rows; non-psum: ks must be aligned and are the layout; psum: the layout holds
// each group's end, groups start aligned (upstream's build_psum_layout_from_ks).
KGroups make_k_grouped(const std::vector<int64_t>& ks, int64_t alignment, bool psum) {
  KGroups kg;
  kg.ks = ks;
  std::vector<int32_t> values;
  int64_t cursor = 0;
  for (int64_t k : ks) {
    const int64_t start = psum ? align_up(cursor, alignment) : cursor;
    kg.starts.push_back(start);
    cursor = start + k;
    values.push_back(static_cast<int32_t>(psum ? cursor : k));
    kg.ks_cpu.push_back(static_cast<int>(align_up(k, alignment)));
  }
  kg.sum_k = align_up(cursor, alignment);
  kg.layout = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i32);
  std::copy(values.begin(), values.end(), kg.layout.data<int32_t>());
  return kg;
}

// Per-group per-channel FP8 of x [ΣK, mn] (rows outside groups stay zero): data [ΣK, mn] and
// scales [Σ ceil(align(K_g) / gran_k), mn], as upstream's k_grouped_cast_fp8_fp4_with_major.
struct KGroupedQuant {
  Fp8Tensor x;
  std::vector<int64_t> sf_rows;  // first scale row of each group
};

KGroupedQuant quantize_k_grouped(const Tensor& x, const KGroups& kg, int64_t alignment,
                                 int gran_k) {
  const int64_t mn = x.size(1);
  KGroupedQuant q;
  q.x.data = Tensor::zeros({kg.sum_k, mn}, DType::e4m3);
  std::vector<Tensor> sfs;
  int64_t sf_row = 0;
  for (size_t g = 0; g < kg.ks.size(); ++g) {
    q.sf_rows.push_back(sf_row);
    const int64_t k = kg.ks[g], padded = align_up(k, alignment);
    if (padded == 0) continue;
    Tensor group = Tensor::zeros({padded, mn}, DType::bf16);
    group.slice(0, 0, k).copy_(x.slice(0, kg.starts[g], kg.starts[g] + k));
    const Fp8Tensor part = gemm::per_channel_cast_to_fp8(group, true, gran_k);
    q.x.data.slice(0, kg.starts[g], kg.starts[g] + k).copy_(part.data.slice(0, 0, k));
    sfs.push_back(part.sf);
    sf_row += part.sf.size(0);
  }
  q.x.sf = Tensor::empty({sf_row, mn}, DType::f32);
  int64_t row = 0;
  for (const Tensor& sf : sfs) {
    q.x.sf.slice(0, row, row + sf.size(0)).copy_(sf);
    row += sf.size(0);
  }
  return q;
}

void check_k_grouped(const std::vector<int64_t>& ks, int gran_k, bool psum, bool c_is_d) {
  ScopedAlignment alignment(gran_k);
  const int64_t m = 64, n = 64, groups = static_cast<int64_t>(ks.size());
  const KGroups kg = make_k_grouped(ks, gran_k, psum);
  SCOPED_TRACE(fmt::format("ks {} gran_k {} psum {} c_is_d {}", ::dsk::detail::to_text(ks), gran_k,
                           psum, c_is_d));
  // Zero outside the groups, like upstream's generator.
  Tensor a = Tensor::zeros({kg.sum_k, m}, DType::bf16),
         b = Tensor::zeros({kg.sum_k, n}, DType::bf16);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t s = kg.starts[static_cast<size_t>(g)], k = ks[static_cast<size_t>(g)];
    a.slice(0, s, s + k).copy_(randn_bf16({k, m}));
    b.slice(0, s, s + k).copy_(randn_bf16({k, n}));
  }
  const KGroupedQuant qa = quantize_k_grouped(a, kg, gran_k, gran_k);
  const KGroupedQuant qb = quantize_k_grouped(b, kg, gran_k, gran_k);
  const Tensor c = ref::randn({groups, m, n}, DType::f32, fresh_seed(), 0.0f, 32.0f);
  Tensor d = c_is_d ? c.clone() : poisoned({groups, m, n}, DType::f32);
  gemm::k_grouped_fp8_gemm_tn_contiguous(qa.x, qb.x, d, kg.ks_cpu, kg.layout,
                                         c_is_d ? d : c.clone(), {1, 1, gran_k}, "mn", psum);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t s = kg.starts[static_cast<size_t>(g)], k = ks[static_cast<size_t>(g)];
    const Tensor dg = d.select(0, g), cg = c.select(0, g);
    if (k == 0) {
      EXPECT_TRUE(bitwise_equal(dg, cg)) << "empty group " << g << ": D must equal C";
      continue;
    }
    const Tensor ag = a.slice(0, s, s + k), bg = b.slice(0, s, s + k);
    const int64_t sf_blocks = (k + gran_k - 1) / gran_k;
    // Group g's values: its scale rows cover gran_k rows of K each, one column per M (or N).
    auto values = [&](const KGroupedQuant& q) {
      const int64_t r = q.sf_rows[static_cast<size_t>(g)];
      return ref::dequantize(q.x.data.slice(0, s, s + k), q.x.sf.slice(0, r, r + sf_blocks), gran_k,
                             1);
    };
    expect_close(dg, ref::gemm_nt(ag.transpose(0, 1), bg.transpose(0, 1), cg), 1e-3,
                 ref::gemm_nt(values(qa).transpose(0, 1), values(qb).transpose(0, 1), cg),
                 dequantized_tolerance(DType::f32), fmt::format("group {}", g));
  }
}

TEST_F(KGrouped, GroupsWithEmptyOnesBothLayouts) {
  SCOPED_TRACE(seed_note());
  for (int gran_k : {32, 128}) {
    const int64_t unit = gran_k;
    check_k_grouped({2 * unit, unit, 3 * unit, unit}, gran_k, false, true);
    check_k_grouped({0, 2 * unit, 0, unit}, gran_k, false, false);        // empty groups
    check_k_grouped({0, 0, 0}, gran_k, false, true);                      // every group empty
    check_k_grouped({unit + 5, 0, 1, 2 * unit - 3}, gran_k, true, true);  // psum, unaligned ends
    check_k_grouped({0, unit, 7}, gran_k, true, false);
  }
}

// ---- determinism ----

TEST_F(Grouped, ThreadCountIndependentInDeterministicMode) {
  SCOPED_TRACE(seed_note());
  ScopedDeterministic deterministic(true);
  const std::vector<int64_t> rows = random_group_rows(4, 90);
  const Contiguous c = make_contiguous(rows, gemm::get_mk_alignment_for_contiguous_layout(), false);
  const Tensor a = randn_bf16({c.m, 512}), b = randn_bf16({4, 160, 512});
  const QuantOperand qa = quantize(a, Quant::token_f32), qb = quantize_groups(b, Quant::block_f32);
  auto run = [&] {
    Tensor d = poisoned({c.m, 160}, DType::bf16);
    gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(qa.x, qb.x, d, c.layout);
    return d;
  };
  Tensor one;
  {
    ScopedThreads threads(1);
    one = run();
  }
  ScopedThreads threads(2);
  EXPECT_TRUE(bitwise_equal(run(), one));
  EXPECT_TRUE(bitwise_equal(run(), one)) << "second run";
}

}  // namespace
}  // namespace dsk::gemm_test
