// dsk::tk routing: topk_gate, group selection, the DeepSeek gates (noaux_tc_gate, top2_sum_gate
// with masks, shared experts, replicas and EP/TP), group_count, normalize_weight,
// mask_indices_by_tp — against dsk::ref::tk, with ties, non-finite inputs and every backend.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

using test::bitwise_equal;
using test::fresh_seed;

constexpr float kInf = std::numeric_limits<float>::infinity();

// The rows of a [T, k] int64 tensor, each sorted.
std::vector<std::vector<int64_t>> sorted_rows(const Tensor& idx) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(idx.size(0)));
  for (int64_t t = 0; t < idx.size(0); ++t) {
    for (int64_t j = 0; j < idx.size(1); ++j) rows[t].push_back(idx.at<int64_t>({t, j}));
    std::sort(rows[t].begin(), rows[t].end());
  }
  return rows;
}

// Each row's weights keyed by expert id, as (id, weight) sorted by id: comparable whatever the
// slot order.
std::vector<std::vector<std::pair<int64_t, float>>> weights_by_id(const GateResult& r) {
  std::vector<std::vector<std::pair<int64_t, float>>> rows(static_cast<size_t>(r.topk_idx.size(0)));
  for (int64_t t = 0; t < r.topk_idx.size(0); ++t) {
    for (int64_t j = 0; j < r.topk_idx.size(1); ++j)
      rows[t].emplace_back(r.topk_idx.at<int64_t>({t, j}), r.topk_weights.at<float>({t, j}));
    std::sort(rows[t].begin(), rows[t].end());
  }
  return rows;
}

// A copy of a [T, k] f32 tensor with each row sorted.
Tensor sorted_weight_rows(const Tensor& w) {
  Tensor out = w.contiguous().clone();
  for (int64_t t = 0; t < out.size(0); ++t) {
    float* row = &out.at<float>({t, 0});
    std::sort(row, row + out.size(1));
  }
  return out;
}

void expect_same_routing(const GateResult& got, const GateResult& want, double rel_tol = 2e-6) {
  ASSERT_EQ(got.topk_idx.sizes(), want.topk_idx.sizes());
  EXPECT_EQ(sorted_rows(got.topk_idx), sorted_rows(want.topk_idx));
  const auto g = weights_by_id(got), w = weights_by_id(want);
  for (size_t t = 0; t < g.size(); ++t)
    for (size_t j = 0; j < g[t].size(); ++j) {
      ASSERT_EQ(g[t][j].first, w[t][j].first) << "row " << t;
      EXPECT_NEAR(g[t][j].second, w[t][j].second, rel_tol * std::fabs(w[t][j].second) + 1e-30)
          << "row " << t << " expert " << g[t][j].first;
    }
}

// The num_selected-th and next values of v (descending), for gap checks.
double gap_after(std::vector<double> v, int num_selected) {
  if (num_selected >= static_cast<int>(v.size())) return kInf;
  std::sort(v.begin(), v.end(), std::greater<>());
  return v[num_selected - 1] - v[num_selected];
}

struct GateShape {
  int num_experts, num_topk, num_groups, num_topk_groups;
};

// Logits whose fp64 biased scores keep the last selected group and expert at least `gap` above
// the first unselected ones, so f32 kernels cannot legitimately choose otherwise (upstream's test
// draws its data the same way). Rows without the gap are redrawn.
Tensor separated_logits(int64_t tokens, const GateShape& s, const Tensor* bias, int topk_sum,
                        std::string_view scoring, uint64_t seed, double gap = 1e-4) {
  Tensor logits = ref::randn({tokens, s.num_experts}, DType::f32, seed);
  const int per = s.num_experts / std::max(s.num_groups, 1);
  const bool grouped = s.num_groups > 1 && s.num_topk_groups < s.num_groups;
  for (int attempt = 0;; ++attempt) {
    const Tensor scores = ref::tk::gate_scores(logits, scoring);
    std::vector<int64_t> bad;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> b(static_cast<size_t>(s.num_experts));
      for (int e = 0; e < s.num_experts; ++e)
        b[e] = scores.at<double>({t, e}) + (bias ? bias->at<float>({e}) : 0.0f);
      std::vector<double> candidates = b;
      if (grouped) {
        std::vector<double> group_scores;
        for (int g = 0; g < s.num_groups; ++g) {
          std::vector<double> member(b.begin() + g * per, b.begin() + (g + 1) * per);
          std::sort(member.begin(), member.end(), std::greater<>());
          group_scores.push_back(topk_sum == 1 ? member[0] : member[0] + member[1]);
        }
        if (gap_after(group_scores, s.num_topk_groups) < gap) {
          bad.push_back(t);
          continue;
        }
        std::vector<double> sorted_groups = group_scores;
        std::sort(sorted_groups.begin(), sorted_groups.end(), std::greater<>());
        candidates.clear();
        for (int g = 0; g < s.num_groups; ++g)
          if (group_scores[g] >= sorted_groups[s.num_topk_groups - 1])
            candidates.insert(candidates.end(), b.begin() + g * per, b.begin() + (g + 1) * per);
      }
      if (gap_after(candidates, s.num_topk) < gap) bad.push_back(t);
    }
    if (bad.empty()) return logits;
    if (attempt == 50) ADD_FAILURE() << "could not draw separated logits";
    for (int64_t t : bad) {
      const Tensor row =
          ref::randn({1, s.num_experts}, DType::f32, seed + 7919 * (attempt + 1) + t);
      std::memcpy(&logits.at<float>({t, 0}), row.data_ptr(), s.num_experts * sizeof(float));
    }
  }
}

// ---- topk_gate ----

using TopkGate = test::PerBackend;

TEST_P(TopkGate, MatchesTheReferenceInOrder) {
  for (int64_t tokens : {1, 7, 4096})
    for (auto [experts, k] : {std::pair{256, 8}, {384, 16}, {72, 6}, {16, 16}, {1000, 32}}) {
      if (tokens == 4096 && experts == 1000) continue;
      const uint64_t seed = fresh_seed();
      const Tensor scores = ref::randn({tokens, experts}, DType::f32, seed);
      const Tensor idx = topk_gate(scores, k);
      EXPECT_TRUE(bitwise_equal(idx, ref::tk::topk_gate(scores, k)))
          << tokens << "x" << experts << " k=" << k << " seed " << seed;
    }
}

TEST_P(TopkGate, TiesPickTheSmallerIndexAndNanRanksLast) {
  Tensor scores = Tensor::empty({3, 40}, DType::f32);
  for (int e = 0; e < 40; ++e) {
    scores.at<float>({0, e}) = 0.5f;                                     // all equal
    scores.at<float>({1, e}) = e % 2 == 0 ? NAN : -kInf;                 // NaN below -inf
    scores.at<float>({2, e}) = e == 7 ? kInf : (e == 3 ? -0.0f : 0.0f);  // -0 == +0
  }
  const Tensor idx = topk_gate(scores, 4);
  const std::vector<std::vector<int64_t>> want = {{0, 1, 2, 3}, {1, 3, 5, 7}, {7, 0, 1, 2}};
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(idx.at<int64_t>({r, j}), want[r][j]) << r << "," << j;
  EXPECT_TRUE(bitwise_equal(idx, ref::tk::topk_gate(scores, 4)));
  // Strided rows (a column slice) read the same values.
  Tensor wide = ref::randn({5, 64}, DType::f32, fresh_seed());
  EXPECT_TRUE(bitwise_equal(topk_gate(wide.slice(1, 0, 48), 5),
                            ref::tk::topk_gate(wide.slice(1, 0, 48).contiguous(), 5)));
}

TEST_P(TopkGate, GroupIndicesMatchTheReference) {
  for (int sum : {1, 2}) {
    const uint64_t seed = fresh_seed();
    const Tensor scores = ref::randn({257, 8, 32}, DType::f32, seed);
    EXPECT_TRUE(bitwise_equal(topk_sum_and_topk_group_idx(scores, sum, 4),
                              ref::tk::topk_sum_and_topk_group_idx(scores, sum, 4)))
        << "sum " << sum << " seed " << seed;
    const Tensor odd = ref::randn({9, 6, 12}, DType::f32, seed + 1);  // scalar group path
    EXPECT_TRUE(bitwise_equal(topk_sum_and_topk_group_idx(odd, sum, 3),
                              ref::tk::topk_sum_and_topk_group_idx(odd, sum, 3)));
  }
}

DSK_TK_INSTANTIATE_PER_BACKEND(TopkGate);

// ---- the DeepSeek gates ----

using Gate = test::PerBackend;

TEST_P(Gate, NoauxTcMatchesTheReference) {
  const std::vector<std::pair<GateShape, std::string_view>> cases = {
      {{256, 8, 8, 4}, "sigmoid"},   // DeepSeek-V3
      {{384, 16, 8, 4}, "sigmoid"},  // 48 experts per group: the scalar group path
      {{256, 8, 1, 1}, "softmax"},
      {{64, 6, 8, 3}, "softmax"},
  };
  for (const auto& [shape, scoring] : cases)
    for (int64_t tokens : {1, 7, 4096}) {
      const uint64_t seed = fresh_seed();
      const Tensor bias = ref::randn({shape.num_experts}, DType::f32, seed ^ 0xB1A5, 0.0f, 0.1f);
      const Tensor logits = separated_logits(tokens, shape, &bias, 2, scoring, seed);
      const GateResult got = noaux_tc_gate(logits, bias, shape.num_topk, shape.num_groups,
                                           shape.num_topk_groups, 2.5f, scoring);
      const GateResult want = ref::tk::noaux_tc_gate(logits, bias, shape.num_topk, shape.num_groups,
                                                     shape.num_topk_groups, 2.5f, scoring);
      SCOPED_TRACE(::testing::Message() << shape.num_experts << " experts, " << tokens
                                        << " tokens, " << scoring << ", seed " << seed);
      expect_same_routing(got, want);
    }
}

TEST_P(Gate, NoauxTcWithoutBiasUsesTheGroupMaximumAndCanSkipNormalisation) {
  const GateShape shape{160, 6, 8, 3};
  const uint64_t seed = fresh_seed();
  const Tensor logits = separated_logits(300, shape, nullptr, 1, "softmax", seed);
  for (bool norm : {true, false}) {
    const GateResult got = noaux_tc_gate(logits, std::nullopt, 6, 8, 3, 1.0f, "softmax", norm);
    const GateResult want =
        ref::tk::noaux_tc_gate(logits, std::nullopt, 6, 8, 3, 1.0f, "softmax", norm);
    expect_same_routing(got, want);
  }
}

TEST_P(Gate, AllEqualLogitsSelectTheFirstExpertsOfTheFirstGroups) {
  Tensor logits = Tensor::empty({3, 256}, DType::f32);
  for (int64_t i = 0; i < logits.numel(); ++i) static_cast<float*>(logits.data_ptr())[i] = 0.37f;
  Tensor bias = Tensor::empty({256}, DType::f32);
  for (int e = 0; e < 256; ++e) bias.at<float>({e}) = 0.125f;
  const GateResult r = noaux_tc_gate(logits, bias, 8, 8, 4, 2.5f);
  for (int64_t t = 0; t < 3; ++t)
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(r.topk_idx.at<int64_t>({t, j}), j);
      EXPECT_FLOAT_EQ(r.topk_weights.at<float>({t, j}), 2.5f / 8);
    }
  // The selection is a valid top-k of the (equal) biased scores, whatever the tie rule.
  Tensor biased = Tensor::empty({3, 256}, DType::f32);
  for (int64_t i = 0; i < biased.numel(); ++i) static_cast<float*>(biased.data_ptr())[i] = 1.0f;
  DSK_EXPECT_TOPK_SETS(r.topk_idx, ref::tk::topk_gate(biased, 8), biased);
}

TEST_P(Gate, Top2SumGateMatchesTheReferenceWithEveryOption) {
  struct Case {
    GateShape shape;
    int shared;
  };
  // Upstream's configurations (num_groups 0 = no group limit) with 4 EP and 2 TP ranks.
  const std::vector<Case> cases = {{{72, 6, 0, 0}, 1},
                                   {{128, 6, 0, 0}, 2},
                                   {{144, 6, 0, 0}, 2},
                                   {{256, 8, 8, 8}, 2},
                                   {{256, 8, 8, 4}, 2}};
  constexpr int kExtra = 32, kEp = 4, kTp = 2;
  for (const Case& c : cases)
    for (std::string_view scoring : {"sigmoid", "sqrtsoftplus", "softmax"})
      for (int option = 0; option < 4; ++option) {
        const int64_t tokens = option == 0 ? 4096 : 37, padded = option == 0 ? 0 : 10;
        const int n = c.shape.num_experts, k = c.shape.num_topk;
        const bool shared_ok = k % c.shared == 0 && n % (k / c.shared) == 0;
        const bool use_shared = shared_ok && option >= 2;
        const bool fix = option == 3;
        const uint64_t seed = fresh_seed();
        const Tensor bias = ref::randn({n}, DType::f32, seed ^ 0xB1A5);
        const Tensor logits =
            separated_logits(tokens + padded, c.shape, &bias, 2, scoring, seed, 2e-4);
        std::optional<Tensor> mask, map, count, fix_mask;
        if (padded > 0)
          mask = test::bool_rows(tokens + padded, [&](int64_t t) { return t < tokens; });
        if (use_shared) {
          map = Tensor::empty({n + c.shared, kExtra + 1}, DType::i32);
          count = Tensor::empty({n + c.shared}, DType::i32);
          for (int e = 0; e < n + c.shared; ++e) {
            count->at<int32_t>({e}) = 1 + e % 3;
            for (int r = 0; r <= kExtra; ++r)
              map->at<int32_t>({e, r}) = e < n ? (e + r * 7) % n : n + (e - n + r) % kExtra;
          }
        }
        Tensor unmapped = ref::randint({tokens + padded, k}, DType::i64, seed + 3, 0, n);
        Tensor unmapped_ref = unmapped.clone();
        if (fix) fix_mask = test::bool_rows(tokens + padded, [](int64_t t) { return t % 3 == 0; });
        for (int tp_rank = 0; tp_rank < kTp; ++tp_rank) {
          const int num_groups = c.shape.num_groups, topk_groups = c.shape.num_topk_groups;
          const GateResult got =
              top2_sum_gate(logits, bias, k, topk_groups, num_groups, use_shared, c.shared, 1.5f, 0,
                            kEp, tp_rank, kTp, scoring, mask, fix_mask, map, count, unmapped);
          const GateResult want = ref::tk::top2_sum_gate(
              logits, bias, k, topk_groups, num_groups, use_shared, c.shared, 1.5f, 0, kEp, tp_rank,
              kTp, scoring, mask, fix_mask, map, count, unmapped_ref);
          SCOPED_TRACE(::testing::Message() << n << " experts, " << scoring << ", option " << option
                                            << ", tp_rank " << tp_rank << ", seed " << seed);
          EXPECT_EQ(sorted_rows(got.topk_idx), sorted_rows(want.topk_idx));
          EXPECT_EQ(sorted_rows(unmapped), sorted_rows(unmapped_ref));
          // Slots are ordered by the f32 (kernel) or fp64 (reference) biased score, which may
          // order two close experts differently: compare each row's weights as a sorted set.
          DSK_EXPECT_ALLCLOSE(sorted_weight_rows(got.topk_weights),
                              sorted_weight_rows(want.topk_weights),
                              {.abs_tol = 1e-6, .rel_tol = 1e-5, .cos_tol = 1e-10});
        }
      }
}

TEST_P(Gate, NonFiniteLogitsAreRejected) {
  const Tensor bias = ref::randn({64}, DType::f32, fresh_seed());
  for (float bad : {NAN, kInf, -kInf}) {
    Tensor logits = ref::randn({5, 64}, DType::f32, fresh_seed());
    logits.at<float>({3, 17}) = bad;
    EXPECT_THROW(noaux_tc_gate(logits, bias, 4, 4, 2), Error);
    EXPECT_THROW(top2_sum_gate(logits, bias, 4, 2, 4, false, 0, 1.0f, 0, 1, 0, 1, "sigmoid"),
                 Error);
    // A row that is not routed is not read.
    const Tensor mask = test::bool_rows(5, [](int64_t t) { return t != 3; });
    EXPECT_NO_THROW(
        top2_sum_gate(logits, bias, 4, 2, 4, false, 0, 1.0f, 0, 1, 0, 1, "sigmoid", mask));
  }
}

DSK_TK_INSTANTIATE_PER_BACKEND(Gate);

// Bitwise equality of the backends (they share one Simd code path) and across thread counts.
TEST(GateBackends, AreBitwiseIdenticalAcrossIsasAndThreads) {
  const uint64_t seed = fresh_seed();
  const Tensor bias = ref::randn({256}, DType::f32, seed ^ 0xB1A5, 0.0f, 0.1f);
  const Tensor logits = ref::randn({2048, 256}, DType::f32, seed);
  std::vector<GateResult> results;
  for (Backend b : dsk::test::supported_backends())
    for (int threads : {1, 2}) {
      dsk::test::ScopedBackend scoped(b);
      const int saved = get_num_threads();
      set_num_threads(threads);
      for (std::string_view scoring : {"sigmoid", "softmax", "sqrtsoftplus"}) {
        results.push_back(noaux_tc_gate(logits, bias, 8, 8, 4, 2.5f, scoring));
        results.push_back(
            top2_sum_gate(logits, bias, 8, 4, 8, false, 0, 2.5f, 0, 1, 0, 1, scoring));
      }
      set_num_threads(saved);
    }
  for (size_t i = 6; i < results.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(results[i].topk_idx, results[i % 6].topk_idx)) << i;
    EXPECT_TRUE(bitwise_equal(results[i].topk_weights, results[i % 6].topk_weights)) << i;
  }
}

// ---- counts, weights, TP masking ----

TEST(GroupCount, CountsIdsAndSkipsMinusOne) {
  for (DType dtype : {DType::i64, DType::i32}) {
    const uint64_t seed = fresh_seed();
    const Tensor idx = ref::randint({4096, 8}, dtype, seed, -1, 256);
    EXPECT_TRUE(bitwise_equal(group_count(idx, 256), ref::tk::group_count(idx, 256))) << seed;
    Tensor bad = idx.clone();
    bad.fill_bytes_(0);
    if (dtype == DType::i64)
      bad.at<int64_t>({5, 2}) = 256;
    else
      bad.at<int32_t>({5, 2}) = -2;
    EXPECT_THROW(group_count(bad, 256), Error);
  }
}

TEST(NormalizeWeight, MatchesTheGateRule) {
  Tensor w = ref::rand_uniform({1000, 8}, DType::f32, fresh_seed(), 0.01f, 1.0f);
  for (int j = 0; j < 8; ++j) w.at<float>({7, j}) = 0.0f;  // a row of zeros stays finite
  const NormalizedWeights got = normalize_weight(w);
  const NormalizedWeights want = ref::tk::normalize_weight(w);
  DSK_EXPECT_ALLCLOSE(got.denominator, want.denominator, {.abs_tol = 1e-30, .rel_tol = 1e-6});
  DSK_EXPECT_ALLCLOSE(got.normalized_weights, want.normalized_weights,
                      {.abs_tol = 1e-30, .rel_tol = 1e-6});
  EXPECT_EQ(got.normalized_weights.at<float>({7, 3}), 0.0f);
}

TEST(MaskIndicesByTp, KeepsThisRanksExperts) {
  for (DType dtype : {DType::i64, DType::i32})
    for (int tp_rank : {0, 1}) {
      const Tensor idx = ref::randint({513, 8}, dtype, fresh_seed(), -1, 288);
      EXPECT_TRUE(bitwise_equal(mask_indices_by_tp(idx, 288, 4, tp_rank, 2),
                                ref::tk::mask_indices_by_tp(idx, 288, 4, tp_rank, 2)));
    }
  // 8 experts, 4 EP ranks of 2, TP 2: rank 1 owns EP ranks 1 and 3 (experts 2, 3, 6, 7).
  Tensor idx = Tensor::empty({1, 9}, DType::i64);
  for (int j = 0; j < 9; ++j) idx.at<int64_t>({0, j}) = j - 1;
  const Tensor m = mask_indices_by_tp(idx, 8, 4, 1, 2);
  const std::vector<int64_t> want = {-1, -1, -1, 0, 1, -1, -1, 2, 3};
  for (int j = 0; j < 9; ++j) EXPECT_EQ(m.at<int64_t>({0, j}), want[j]) << j;
}

}  // namespace
}  // namespace dsk::tk
