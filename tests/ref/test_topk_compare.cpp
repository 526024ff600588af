// compare_topk_sets: order-insensitive comparison, ties, padding, candidate ranges, bad rows.
#include <algorithm>
#include <numeric>
#include <vector>

#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::ref {
namespace {

Tensor indices(const std::vector<std::vector<int32_t>>& rows) {
  const auto k = static_cast<int64_t>(rows.empty() ? 0 : rows[0].size());
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), k}, DType::i32);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), t.data<int32_t>() + r * k);
  return t;
}

Tensor scores(const std::vector<std::vector<float>>& rows) {
  const auto n = static_cast<int64_t>(rows[0].size());
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), n}, DType::f32);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), t.data<float>() + r * n);
  return t;
}

TEST(TopkSets, OrderDoesNotMatter) {
  const Tensor a = indices({{3, 1, 2}, {0, 5, 4}});
  const Tensor e = indices({{1, 2, 3}, {4, 5, 0}});
  EXPECT_TRUE(compare_topk_sets(a, e));
  DSK_EXPECT_TOPK_SETS(a, e);
  const TopkCompareResult r = compare_topk_sets(indices({{1, 2, 3}, {0, 5, 6}}), e);
  EXPECT_FALSE(r);
  EXPECT_EQ(r.num_bad_rows, 1);
  EXPECT_EQ(r.first_bad_row, 1);
  EXPECT_NE(r.message.find("index 6 selected instead of index 4"), std::string::npos) << r;
}

TEST(TopkSets, TiesMaySwapOnlyEqualValues) {
  const Tensor v = scores({{0.1f, 0.9f, 0.5f, 0.5f, 0.2f}});
  const Tensor expected = indices({{1, 2}});
  // 3 has the same value as 2: either may be selected.
  EXPECT_TRUE(compare_topk_sets(indices({{3, 1}}), expected, v));
  // Without values the sets must be equal.
  EXPECT_FALSE(compare_topk_sets(indices({{3, 1}}), expected));
  // 4 is below an unselected 0.5.
  const TopkCompareResult r = compare_topk_sets(indices({{1, 4}}), expected, v);
  EXPECT_FALSE(r);
  EXPECT_NE(r.message.find("selected index 4 (value 0.2"), std::string::npos) << r;
}

TEST(TopkSets, AWrongExpectationIsCaughtByTheValueRule) {
  // Equal value multisets are required: here actual picks a strictly better element than the
  // (wrong) expectation, which the threshold rule accepts but the swap rule rejects.
  const Tensor v = scores({{0.1f, 0.9f, 0.5f, 0.7f}});
  const TopkCompareResult r = compare_topk_sets(indices({{1, 3}}), indices({{1, 2}}), v);
  EXPECT_FALSE(r);
  EXPECT_NE(r.message.find("index 3 (value 0.7"), std::string::npos) << r;
}

TEST(TopkSets, PaddingAndDuplicatesAndRanges) {
  const Tensor v = scores({{1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}});
  // Row 1 has only 2 candidates ([0, 2)), padded with -1 anywhere in the row.
  TopkCompareOptions options;
  options.row_ends = Tensor::empty({2}, DType::i32);
  options.row_ends->data<int32_t>()[0] = 6;
  options.row_ends->data<int32_t>()[1] = 2;
  EXPECT_TRUE(compare_topk_sets(indices({{5, 4, 3}, {-1, 1, 0}}), indices({{3, 4, 5}, {0, 1, -1}}),
                                v, options));
  // Too few selections.
  EXPECT_FALSE(
      compare_topk_sets(indices({{5, 4, -1}}), indices({{3, 4, 5}}), scores({{1, 2, 3, 4, 5, 6}})));
  // A duplicate.
  const TopkCompareResult dup = compare_topk_sets(indices({{5, 5, 4}}), indices({{3, 4, 5}}));
  EXPECT_FALSE(dup);
  EXPECT_NE(dup.message.find("index 5 selected twice"), std::string::npos) << dup;
  // Outside the candidate range, and a negative index that is not the pad.
  const TopkCompareResult range = compare_topk_sets(indices({{5, 4, 3}, {3, 1, 0}}),
                                                    indices({{3, 4, 5}, {0, 1, -1}}), v, options);
  EXPECT_FALSE(range);
  EXPECT_EQ(range.first_bad_row, 1);
  EXPECT_NE(range.message.find("actual index 3 outside the candidate range [0, 2)"),
            std::string::npos)
      << range;
  const TopkCompareResult negative =
      compare_topk_sets(indices({{-2, 1, 0}}), indices({{0, 1, -1}}));
  EXPECT_FALSE(negative);
  EXPECT_NE(negative.message.find("outside the candidate range"), std::string::npos) << negative;
}

TEST(TopkSets, ARandomRowWithManyTies) {
  // 512 candidates drawn from 8 distinct values: the tied block at the threshold straddles k.
  const int n = 512, k = 100;
  const Tensor v = randint({1, n}, DType::f32, 21, 0, 8);
  const float* s = v.data<float>();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });
  const float threshold = s[order[k - 1]];
  std::vector<int32_t> above, tied, below;
  for (int32_t i : order)
    (s[i] > threshold ? above : s[i] == threshold ? tied : below).push_back(i);
  const size_t from_tied = k - above.size();
  ASSERT_GT(tied.size(), from_tied);
  // Two valid selections: the first and the last tied elements.
  std::vector<int32_t> first = above, last = above;
  first.insert(first.end(), tied.begin(), tied.begin() + static_cast<ptrdiff_t>(from_tied));
  last.insert(last.end(), tied.end() - static_cast<ptrdiff_t>(from_tied), tied.end());
  std::reverse(last.begin(), last.end());
  EXPECT_TRUE(compare_topk_sets(indices({last}), indices({first}), v));
  EXPECT_FALSE(compare_topk_sets(indices({last}), indices({first})));  // as sets they differ
  // A tied selection replaced by a lower candidate breaks the threshold rule.
  ASSERT_FALSE(below.empty());
  last[0] = below[0];
  EXPECT_FALSE(compare_topk_sets(indices({last}), indices({first}), v));
}

TEST(TopkSets, BadArgumentsRaise) {
  EXPECT_THROW(compare_topk_sets(indices({{1, 2}}), indices({{1, 2, 3}})), Error);
  EXPECT_THROW(compare_topk_sets(Tensor::empty({2}, DType::i32), Tensor::empty({2}, DType::i32)),
               Error);
  EXPECT_THROW(compare_topk_sets(Tensor::empty({1, 2}, DType::f32), indices({{1, 2}})), Error);
  EXPECT_THROW(compare_topk_sets(indices({{1, 2}}), indices({{1, 2}}), scores({{1}, {2}})), Error);
}

}  // namespace
}  // namespace dsk::ref
