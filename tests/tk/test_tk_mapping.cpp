// dsk::tk mapping: get_fused_mapping (exact layout, alignment, -1 ids, thread-count independence),
// expand_to_fused (+ scales) and reduce_fused (fixed-order f32 combine) against dsk::ref::tk.
#include <cmath>

#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

using test::bitwise_equal;
using test::fresh_seed;
using test::same_mapping;

// Routing ids with about one -1 in ten.
Tensor routing_ids(int64_t tokens, int k, int experts, uint64_t seed, DType dtype = DType::i64) {
  Tensor idx = ref::randint({tokens, k}, dtype, seed, -(experts / 9) - 1, experts);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    if (dtype == DType::i64) {
      auto& v = static_cast<int64_t*>(idx.data_ptr())[i];
      if (v < 0) v = -1;
    } else {
      auto& v = static_cast<int32_t*>(idx.data_ptr())[i];
      if (v < 0) v = -1;
    }
  }
  return idx;
}

// 16385 tokens: with two threads, two chunks of ids, the second starting mid-token.
TEST(FusedMapping, MatchesTheReferenceExactly) {
  for (int64_t tokens : {1, 7, 4096, 16385})
    for (int alignment : {16, 64, 128})
      for (DType dtype : {DType::i64, DType::i32}) {
        const uint64_t seed = fresh_seed();
        const Tensor idx = routing_ids(tokens, 8, 256, seed, dtype);
        const FusedMapping got = get_fused_mapping(idx, 256, 0, alignment);
        const FusedMapping want = ref::tk::get_fused_mapping(idx, 256, alignment);
        SCOPED_TRACE(::testing::Message()
                     << tokens << " tokens, alignment " << alignment << ", seed " << seed);
        EXPECT_TRUE(same_mapping(got, want));
        EXPECT_EQ(got.num_tokens_per_expert_list, want.num_tokens_per_expert_list);
        // Every expert starts at a multiple of the alignment; padding rows are -1 throughout.
        for (int e = 0; e < 256; ++e) EXPECT_EQ(got.expert_start.at<int32_t>({e}) % alignment, 0);
      }
}

TEST(FusedMapping, DefaultsToTheGemmAlignmentAndIsTheGroupedLayout) {
  const int alignment = gemm::get_mk_alignment_for_contiguous_layout();
  const Tensor idx = routing_ids(300, 8, 64, fresh_seed());
  const FusedMapping m = get_fused_mapping(idx, 64);
  EXPECT_TRUE(same_mapping(m, ref::tk::get_fused_mapping(idx, 64, alignment)));
  // pos_to_expert is a valid grouped_layout: segments of one expert, -1 only at segment ends.
  const int64_t rows = m.pos_to_expert.size(0);
  EXPECT_EQ(rows % alignment, 0);
  for (int64_t p = 0; p < rows; p += alignment) {
    int32_t expert = -1;
    bool padding = false;
    for (int64_t q = p; q < p + alignment; ++q) {
      const int32_t e = m.pos_to_expert.at<int32_t>({q});
      if (e < 0) {
        padding = true;
        continue;
      }
      EXPECT_FALSE(padding) << "a token row after padding at " << q;
      if (expert < 0) expert = e;
      EXPECT_EQ(e, expert) << "two experts in one aligned block at " << q;
    }
  }
}

TEST(FusedMapping, HonoursAUserSetGemmAlignment) {
  const int saved = gemm::get_mk_alignment_for_contiguous_layout();
  const Tensor idx = routing_ids(500, 8, 64, fresh_seed());
  for (int alignment : {16, 48, 128}) {
    gemm::set_mk_alignment_for_contiguous_layout(alignment);
    const FusedMapping m = get_fused_mapping(idx, 64);
    EXPECT_TRUE(same_mapping(m, ref::tk::get_fused_mapping(idx, 64, alignment)));
    for (int e = 0; e < 64; ++e) EXPECT_EQ(m.expert_start.at<int32_t>({e}) % alignment, 0);
    // The no-sync upper bound uses the same value.
    EXPECT_EQ(get_fused_mapping(idx, 64, 0, std::nullopt, true).pos_to_expert.size(0),
              (500 * 8 + (alignment - 1) * 64 + alignment - 1) / alignment * alignment);
  }
  gemm::set_mk_alignment_for_contiguous_layout(saved);
}

// 16385 tokens at top-8: two threads split the ids into two chunks (of 65536 or more), the second
// starting mid-token.
TEST(FusedMapping, PresizedBuffersAndThreadCounts) {
  const Tensor idx = routing_ids(16385, 8, 256, fresh_seed());
  const FusedMapping exact = get_fused_mapping(idx, 256, 0, 32);
  const int64_t rows = exact.pos_to_expert.size(0);
  // A larger buffer: the same layout followed by padding rows.
  const FusedMapping big = get_fused_mapping(idx, 256, rows + 100, 32);
  EXPECT_TRUE(big.num_tokens_per_expert_list.empty());
  EXPECT_TRUE(bitwise_equal(big.pos_to_expert.slice(0, 0, rows), exact.pos_to_expert));
  for (int64_t p = rows; p < rows + 100; ++p) EXPECT_EQ(big.pos_to_expert.at<int32_t>({p}), -1);
  // No sync: the upper bound.
  const FusedMapping bound = get_fused_mapping(idx, 256, 0, 32, true);
  EXPECT_EQ(bound.pos_to_expert.size(0), (16385 * 8 + 31 * 256 + 31) / 32 * 32);
  EXPECT_THROW(get_fused_mapping(idx, 256, rows - 1, 32), Error);
  // One thread and two give the same layout.
  const int saved = get_num_threads();
  set_num_threads(1);
  const FusedMapping one = get_fused_mapping(idx, 256, 0, 32);
  set_num_threads(saved);
  EXPECT_TRUE(same_mapping(one, exact));
}

TEST(FusedMapping, RejectsIdsOutOfRange) {
  Tensor idx = routing_ids(10, 4, 16, fresh_seed());
  idx.at<int64_t>({3, 1}) = 16;
  EXPECT_THROW(get_fused_mapping(idx, 16, 0, 32), Error);
  idx.at<int64_t>({3, 1}) = -2;
  EXPECT_THROW(get_fused_mapping(idx, 16, 0, 32), Error);
}

// ---- expand / reduce ----

using Combine = test::PerBackend;

TEST_P(Combine, ExpandCopiesRowsAndZeroesPadding) {
  for (auto [tokens, hidden] : {std::pair<int64_t, int64_t>{7, 7168}, {1, 2048}, {4096, 128}}) {
    const uint64_t seed = fresh_seed();
    const Tensor idx = routing_ids(tokens, 8, 64, seed);
    const FusedMapping m = get_fused_mapping(idx, 64, 0, 32);
    const Tensor x = ref::randn({tokens, hidden}, DType::bf16, seed + 1);
    const Tensor got = expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert);
    EXPECT_TRUE(
        bitwise_equal(got, ref::tk::expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert)))
        << tokens << "x" << hidden << " seed " << seed;
  }
}

// The padding rows are zeroed by the threads in slices of the rows, trailing padding included
// (force_no_sync sizes the layout for the worst case). A poisoned buffer of the output's size is
// freed first, so that the allocator's cache likely hands it back.
TEST_P(Combine, ExpandZeroesPaddingOnEveryThread) {
  for (int64_t tokens : {4096, 33, 1}) {
    const uint64_t seed = fresh_seed();
    const FusedMapping m = get_fused_mapping(routing_ids(tokens, 8, 64, seed), 64, 0, 32, true);
    const Tensor x = ref::randn({tokens, 256}, DType::bf16, seed + 1);
    ref::poison(Tensor::empty({m.pos_to_expert.size(0), 256}, DType::bf16));
    const Tensor got = expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert);
    EXPECT_TRUE(
        bitwise_equal(got, ref::tk::expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert)))
        << tokens << " seed " << seed;
  }
}

// Outputs of 8 MiB or more are written around the caches: whole 64-byte lines by one store each
// where the backend and the row width allow, else narrower stores or memcpy. Rows of 64-byte
// multiples (2112 bytes), of 16-byte but not 64-byte multiples (2080) and of odd widths (2082),
// each into a poisoned buffer the allocator likely hands back.
TEST_P(Combine, ExpandStreamsRowsOfEveryWidth) {
  for (int64_t hidden : {1056, 1040, 1041}) {
    const uint64_t seed = fresh_seed();
    const FusedMapping m = get_fused_mapping(routing_ids(1024, 8, 64, seed), 64, 0, 32);
    ASSERT_GE(m.pos_to_expert.size(0) * hidden * 2, int64_t{8} << 20);
    const Tensor x = ref::randn({1024, hidden}, DType::bf16, seed + 1);
    ref::poison(Tensor::empty({m.pos_to_expert.size(0), hidden}, DType::bf16));
    const Tensor got = expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert);
    EXPECT_TRUE(
        bitwise_equal(got, ref::tk::expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert)))
        << hidden << " seed " << seed;
  }
}

TEST_P(Combine, ExpandWithScalesKeepsEveryLayout) {
  const uint64_t seed = fresh_seed();
  const int64_t tokens = 33, hidden = 512;
  const Tensor idx = routing_ids(tokens, 6, 16, seed);
  const FusedMapping m = get_fused_mapping(idx, 16, 0, 16);
  const Tensor x = ref::randn({tokens, hidden}, DType::bf16, seed + 1);
  for (auto [col_major, packed] : {std::pair{false, false}, {true, false}, {true, true}}) {
    const QuantTensor q = per_token_cast(x, "e4m3", 128, col_major, packed, packed);
    const QuantTensor e =
        expand_to_fused_with_sf(q, 128, m.token_topk_to_pos, m.pos_to_expert, col_major);
    EXPECT_TRUE(bitwise_equal(
        e.data, ref::tk::expand_to_fused(q.data, m.token_topk_to_pos, m.pos_to_expert)));
    const int64_t rows = m.pos_to_expert.size(0);
    const Tensor sf = test::scales_of(e, rows, 4), src = test::scales_of(q, tokens, 4);
    for (int64_t p = 0; p < rows; ++p) {
      const int32_t token = m.pos_to_token.at<int32_t>({p});
      for (int b = 0; b < 4; ++b) {
        if (token >= 0) {
          EXPECT_EQ(sf.at<float>({p, b}), src.at<float>({token, b})) << p << "," << b;
        } else if (!packed) {
          EXPECT_EQ(sf.at<float>({p, b}), 0.0f);
        }
      }
    }
  }
}

// out[t] in f32 exactly as the contract orders it: acc = acc + x * s, slot by slot.
Tensor reduce_in_order(const Tensor& x, const Tensor& weights, const Tensor& pos) {
  const int64_t tokens = pos.size(0), k = pos.size(1), hidden = x.size(1);
  const std::vector<double> v = test::values_of(x);
  Tensor out = Tensor::empty({tokens, hidden}, DType::f32);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < hidden; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = pos.at<int32_t>({t, j});
        if (p >= 0) acc = acc + static_cast<float>(v[p * hidden + c]) * weights.at<float>({t, j});
      }
      out.at<float>({t, c}) = acc;
    }
  return out;
}

TEST_P(Combine, ReduceIsTheFixedOrderWeightedSum) {
  // Widths that take the kernel's 128-, 32- and 16-column steps and a partial vector (200), and
  // its prefetch both within a row and into the next token's (7168).
  for (auto [tokens, hidden] :
       {std::pair<int64_t, int64_t>{7, 7168}, {1, 512}, {4096, 128}, {33, 200}}) {
    const uint64_t seed = fresh_seed();
    const Tensor idx = routing_ids(tokens, 8, 64, seed);
    const FusedMapping m = get_fused_mapping(idx, 64, 0, 32);
    const int64_t rows = m.pos_to_expert.size(0);
    const Tensor y = ref::randn({rows, hidden}, DType::f32, seed + 1);
    const Tensor w = ref::rand_uniform({tokens, 8}, DType::f32, seed + 2, 0.0f, 1.0f);
    const Tensor got = reduce_fused(y, w, m.token_topk_to_pos);
    SCOPED_TRACE(::testing::Message() << tokens << "x" << hidden << " seed " << seed);
    EXPECT_TRUE(bitwise_equal(got, reduce_in_order(y, w, m.token_topk_to_pos)));
    EXPECT_LT(ref::calc_diff(got, ref::tk::reduce_fused(y, w, m.token_topk_to_pos)), 1e-12);
    // bf16 in, bf16 out; and into a caller's buffer.
    const Tensor y16 = ref::randn({rows, hidden}, DType::bf16, seed + 3);
    Tensor out = test::poisoned({tokens, hidden}, DType::bf16);
    reduce_fused(y16, w, m.token_topk_to_pos, "", std::nullopt, out);
    EXPECT_TRUE(ref::all_written(out));
    EXPECT_LT(ref::calc_diff(out, ref::tk::reduce_fused(y16, w, m.token_topk_to_pos)), 1e-5);
    // The same f32 sums, each rounded once to bf16.
    const Tensor sums = reduce_in_order(y16, w, m.token_topk_to_pos);
    int64_t differ = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < hidden; ++c)
        differ += out.at<bf16>({t, c}).bits != numeric::f32_to_bf16(sums.at<float>({t, c})).bits;
    EXPECT_EQ(differ, 0);
  }
}

TEST_P(Combine, ReduceWithRowScalesAndFp8Output) {
  const uint64_t seed = fresh_seed();
  const Tensor idx = routing_ids(100, 6, 32, seed);
  const FusedMapping m = get_fused_mapping(idx, 32, 0, 16);
  const int64_t rows = m.pos_to_expert.size(0);
  const Tensor y = ref::randn({rows, 256}, DType::bf16, seed + 1);
  const Tensor row_sf = ref::rand_uniform({rows}, DType::f32, seed + 2, 0.5f, 2.0f);
  // Without weights every slot counts once.
  const Tensor got = reduce_fused(QuantTensor{y, row_sf}, std::nullopt, m.token_topk_to_pos);
  EXPECT_EQ(got.dtype(), DType::bf16);
  EXPECT_LT(
      ref::calc_diff(got, ref::tk::reduce_fused(y, std::nullopt, m.token_topk_to_pos, row_sf)),
      1e-5);
  Tensor sf = Tensor::empty({1}, DType::f32);
  sf.at<float>({0}) = 8.0f;
  const Tensor fp8 = reduce_fused(y, std::nullopt, m.token_topk_to_pos, "e4m3", sf);
  EXPECT_EQ(fp8.dtype(), DType::e4m3);
  EXPECT_LT(ref::calc_diff(fp8, ref::tk::reduce_fused(y, std::nullopt, m.token_topk_to_pos,
                                                      std::nullopt, 8.0f)),
            2e-3);
  EXPECT_THROW(reduce_fused(y, std::nullopt, m.token_topk_to_pos, "", sf), Error);
  EXPECT_THROW(reduce_fused(y, std::nullopt, m.token_topk_to_pos, "e5m2"), Error);
}

TEST_P(Combine, InconsistentMappingsAreRejected) {
  const Tensor idx = routing_ids(20, 4, 8, fresh_seed());
  const FusedMapping m = get_fused_mapping(idx, 8, 0, 16);
  const Tensor x = ref::randn({20, 64}, DType::f32, fresh_seed());
  Tensor twice = m.token_topk_to_pos.clone();
  int first = -1;
  for (int64_t i = 0; i < twice.numel(); ++i) {
    int32_t& p = static_cast<int32_t*>(twice.data_ptr())[i];
    if (p < 0) continue;
    if (first < 0)
      first = p;
    else {
      p = first;  // two slots write one row
      break;
    }
  }
  EXPECT_THROW(expand_to_fused(x, twice, m.pos_to_expert), Error);
  Tensor padding = m.pos_to_expert.clone();
  padding.at<int32_t>({first}) = -1;  // a referenced row marked as padding
  EXPECT_THROW(expand_to_fused(x, m.token_topk_to_pos, padding), Error);
  Tensor far = m.token_topk_to_pos.clone();
  far.at<int32_t>({0, 0}) = 20;  // x has 20 rows
  EXPECT_THROW(reduce_fused(x, std::nullopt, far), Error);
}

DSK_TK_INSTANTIATE_PER_BACKEND(Combine);

}  // namespace
}  // namespace dsk::tk
