// Bad input to every entry point raises dsk::Error naming the function and the argument: dtypes,
// ranks, majors, K mismatches, output layouts, C, scale shapes, recipes, grouped layouts (group id
// >= G, misaligned segments, psum ends), masked_m > M, K-grouped sizes and packed weights.
#include <functional>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

class Errors : public NoJit {};

// Runs `call`, which must throw dsk::Error from `fn` about `arg`.
void expect_argument_error(const std::function<void()>& call, const char* fn, const char* arg,
                           int line) {
  SCOPED_TRACE(fmt::format("line {}", line));
  try {
    call();
    ADD_FAILURE() << fn << " accepted a bad " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.function(), fn) << e.what();
    EXPECT_EQ(e.argument(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string(fn) + ": " + arg + ": expected"),
              std::string::npos)
        << e.what();
  }
}

#define EXPECT_ARG_ERROR(call, fn, arg) expect_argument_error([&] { call; }, fn, arg, __LINE__)

constexpr const char* kNt = "fp8_fp4_gemm_nt";

// A valid dense FP8 problem (default recipe (1, 128, 128)) to break one piece at a time.
struct Dense {
  int64_t m = 8, n = 160, k = 256;
  Fp8Tensor a = gemm::per_token_cast_to_fp8(randn_bf16({8, 256}), false);
  Fp8Tensor b = gemm::per_block_cast_to_fp8(randn_bf16({160, 256}), false);
  Tensor d = Tensor::empty({8, 160}, DType::bf16);
};

TEST_F(Errors, DenseOperandsAndOutputs) {
  Dense p;
  gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d);  // the valid call
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt({randn_bf16({8, 256}), p.a.sf}, p.b, p.d), kNt, "a.data");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt({p.a.data.unsqueeze(0), p.a.sf}, p.b, p.d), kNt, "a.data");
  // Neither K- nor MN-major: every other column of a wider tensor.
  Tensor wide = Tensor::empty({8, 512}, DType::e4m3);
  const Tensor strided = Tensor::from_blob(wide.data_ptr(), {8, 256}, DType::e4m3, {512, 2});
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt({strided, p.a.sf}, p.b, p.d), kNt, "a.data");
  // K mismatch.
  const Fp8Tensor b_k = gemm::per_block_cast_to_fp8(randn_bf16({160, 384}), false);
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, b_k, p.d), kNt, "b.data");
  // D: dtype, shape, column-major.
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, Tensor::empty({8, 160}, DType::f16)), kNt, "d");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, Tensor::empty({8, 161}, DType::bf16)), kNt, "d");
  EXPECT_ARG_ERROR(
      gemm::fp8_fp4_gemm_nt(p.a, p.b, Tensor::empty({160, 8}, DType::bf16).transpose(0, 1)), kNt,
      "d");
  // C: dtype, shape, partial overlap with D, C == D with other strides.
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, Tensor::empty({8, 160}, DType::f32)), kNt,
                   "c");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, Tensor::empty({8, 16}, DType::bf16)), kNt,
                   "c");
  Tensor big = Tensor::empty({9, 160}, DType::bf16);
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, big.slice(0, 0, 8), big.slice(0, 1, 9)), kNt,
                   "c");
  // compiled_dims.
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, std::nullopt, std::nullopt, std::nullopt,
                                         std::nullopt, "nkx"),
                   kNt, "compiled_dims");
  // nn/tn/tt check ranks before transposing.
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nn(p.a, {p.b.data.unsqueeze(0), p.b.sf}, p.d),
                   "fp8_fp4_gemm_nn", "b.data");
  // BF16.
  const Tensor a16 = randn_bf16({8, 256}), b16 = randn_bf16({160, 256});
  EXPECT_ARG_ERROR(gemm::bf16_gemm_nt(p.a.data, b16, p.d), "bf16_gemm_nt", "a");
  EXPECT_ARG_ERROR(gemm::bf16_gemm_nt(a16, randn_bf16({160, 200}), p.d), "bf16_gemm_nt", "b");
  EXPECT_ARG_ERROR(gemm::bf16_gemm_tn(a16, b16, p.d), "bf16_gemm_tn", "b");
}

TEST_F(Errors, DenseScalesAndRecipes) {
  Dense p;
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt({p.a.data, randn_bf16({8, 2})}, p.b, p.d), kNt, "a.sf");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt({p.a.data, randn_f32({8, 3})}, p.b, p.d), kNt, "a.sf");
  // Per-token B scales under the default per-block recipe.
  const Fp8Tensor b_token = gemm::per_token_cast_to_fp8(randn_bf16({160, 256}), false);
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, b_token, p.d), kNt, "b.sf");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, std::nullopt, Recipe{1, 128, 128},
                                         OperandRecipe{1, 128}, OperandRecipe{128, 128}),
                   kNt, "recipe");
  EXPECT_ARG_ERROR(
      gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, std::nullopt, std::nullopt, OperandRecipe{1, 128}), kNt,
      "recipe_b");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, std::nullopt, Recipe{1, 128, 64}), kNt,
                   "recipe");
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, p.b, p.d, std::nullopt, std::nullopt,
                                         OperandRecipe{0, 128}, OperandRecipe{128, 128}),
                   kNt, "recipe_a");
  // Packed int32 scales are per row; int16 ones need gran_k 32.
  const Fp8Tensor packed = gemm::per_token_cast_to_fp8(randn_bf16({160, 256}), true, 128, true);
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, packed, p.d, std::nullopt, std::nullopt,
                                         OperandRecipe{1, 128}, OperandRecipe{128, 128}),
                   kNt, "recipe_b");
  EXPECT_ARG_ERROR(
      gemm::fp8_fp4_gemm_nt(p.a, {p.b.data, Tensor::zeros({160, 1}, DType::i16)}, p.d, std::nullopt,
                            std::nullopt, OperandRecipe{1, 128}, OperandRecipe{1, 128}),
      kNt, "recipe_b");
  // FP4 x FP4 needs K-major operands.
  const Fp8Tensor a4 = gemm::per_token_cast_to_fp4(randn_bf16({8, 256}), true, 32);
  const Fp8Tensor b4 = gemm::per_token_cast_to_fp4(randn_bf16({160, 256}), true, 32);
  const Fp8Tensor b4_mn{Tensor::empty({256, 80}, DType::fp4x2).transpose(0, 1), b4.sf};
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(a4, b4_mn, p.d), kNt, "b.data");
}

// A valid contiguous grouped problem: 3 groups of 32-row segments.
struct Contig {
  int64_t m = 96, n = 64, k = 128, groups = 3;
  Fp8Tensor a = gemm::per_token_cast_to_fp8(randn_bf16({96, 128}), false);
  Fp8Tensor b{Tensor::zeros({3, 64, 128}, DType::e4m3), Tensor::zeros({3, 1, 1}, DType::f32)};
  Tensor d = Tensor::empty({96, 64}, DType::bf16);
  Tensor ids = Tensor::zeros({96}, DType::i32);
  Contig() {
    for (int64_t r = 0; r < m; ++r) ids.data<int32_t>()[r] = static_cast<int32_t>(r / 32);
    b.sf.fill_bytes_(0);
    for (int64_t i = 0; i < 3; ++i) b.sf.data<float>()[i] = 1.0f;
  }
};

TEST_F(Errors, ContiguousGroupedLayouts) {
  ScopedAlignment alignment(32);
  constexpr const char* fn = "m_grouped_fp8_fp4_gemm_nt_contiguous";
  Contig p;
  gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(p.a, p.b, p.d, p.ids);  // the valid call
  auto call = [&](const Tensor& layout, bool psum = false) {
    gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(p.a, p.b, p.d, layout, std::nullopt, std::nullopt,
                                               std::nullopt, "nk", false, psum);
  };
  Tensor ids = p.ids.clone();
  ids.data<int32_t>()[40] = 3;  // group id >= G
  EXPECT_ARG_ERROR(call(ids), fn, "grouped_layout");
  ids = p.ids.clone();
  ids.data<int32_t>()[40] = -2;
  EXPECT_ARG_ERROR(call(ids), fn, "grouped_layout");
  ids = p.ids.clone();
  for (int64_t r = 32; r < 40; ++r) ids.data<int32_t>()[r] = -1;  // group 1 starts at row 40
  EXPECT_ARG_ERROR(call(ids), fn, "grouped_layout");
  EXPECT_ARG_ERROR(call(p.ids.slice(0, 0, 95)), fn, "grouped_layout");
  EXPECT_ARG_ERROR(call(Tensor::zeros({96}, DType::i64)), fn, "grouped_layout");
  // psum: decreasing ends, an end past M, a group starting before align(previous end).
  Tensor ends = Tensor::zeros({3}, DType::i32);
  auto set_ends = [&](int32_t e0, int32_t e1, int32_t e2) {
    ends.data<int32_t>()[0] = e0;
    ends.data<int32_t>()[1] = e1;
    ends.data<int32_t>()[2] = e2;
    return ends;
  };
  call(set_ends(20, 50, 90), true);  // valid: groups start at 0, 32 and 64
  EXPECT_ARG_ERROR(call(set_ends(20, 10, 90), true), fn, "grouped_layout");
  EXPECT_ARG_ERROR(call(set_ends(20, 50, 97), true), fn, "grouped_layout");
  EXPECT_ARG_ERROR(call(set_ends(20, 25, 90), true), fn, "grouped_layout");
  EXPECT_ARG_ERROR(
      gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(p.a, p.b, p.d, p.ids, std::nullopt, std::nullopt,
                                                 std::nullopt, "nk", false, false, true, 64),
      fn, "expected_m_for_psum_layout");
  // A must be K-major, D BF16 [M, N], B 3-D, A per row.
  const Fp8Tensor a_mn{p.a.data.transpose(0, 1).contiguous().transpose(0, 1), p.a.sf};
  EXPECT_ARG_ERROR(gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(a_mn, p.b, p.d, p.ids), fn, "a.data");
  EXPECT_ARG_ERROR(gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(
                       p.a, p.b, Tensor::empty({96, 64}, DType::f32), p.ids),
                   fn, "d");
  EXPECT_ARG_ERROR(gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(
                       p.a, {p.b.data.select(0, 0), p.b.sf.select(0, 0)}, p.d, p.ids),
                   fn, "b.data");
  EXPECT_ARG_ERROR(
      gemm::m_grouped_fp8_fp4_gemm_nt_contiguous(p.a, p.b, p.d, p.ids, Recipe{128, 128, 128}), fn,
      "recipe");
  // BF16.
  EXPECT_ARG_ERROR(gemm::m_grouped_bf16_gemm_nt_contiguous(randn_bf16({96, 128}),
                                                           randn_bf16({3, 64, 100}), p.d, p.ids),
                   "m_grouped_bf16_gemm_nt_contiguous", "b");
}

TEST_F(Errors, MaskedLayouts) {
  constexpr const char* fn = "m_grouped_fp8_fp4_gemm_nt_masked";
  const int64_t groups = 2, m = 16, n = 32, k = 128;
  const Fp8Tensor a{Tensor::zeros({groups, m, k}, DType::e4m3),
                    Tensor::zeros({groups, m, 1}, DType::f32)};
  const Fp8Tensor b{Tensor::zeros({groups, n, k}, DType::e4m3),
                    Tensor::zeros({groups, 1, 1}, DType::f32)};
  const Tensor d = Tensor::empty({groups, m, n}, DType::bf16);
  Tensor masked = Tensor::zeros({groups}, DType::i32);
  masked.data<int32_t>()[0] = 16;
  gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked, 8);  // the valid call
  masked.data<int32_t>()[1] = 17;                              // masked_m > M
  EXPECT_ARG_ERROR(gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked, 8), fn, "masked_m");
  masked.data<int32_t>()[1] = -1;
  EXPECT_ARG_ERROR(gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked, 8), fn, "masked_m");
  EXPECT_ARG_ERROR(
      gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, Tensor::zeros({3}, DType::i32), 8), fn,
      "masked_m");
  EXPECT_ARG_ERROR(
      gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, Tensor::zeros({2}, DType::i32), 0), fn,
      "expected_m");
  // An output whose groups share rows: [m, n] seen twice (group stride 0), or groups n apart
  // with rows n apart (each row of group 1 is a row of group 0).
  const Tensor rows = Tensor::empty({m + 1, n}, DType::bf16);
  masked.data<int32_t>()[1] = 16;
  for (const Shape& strides : {Shape{0, n, 1}, Shape{n, n, 1}})
    EXPECT_ARG_ERROR(
        gemm::m_grouped_fp8_fp4_gemm_nt_masked(
            a, b, Tensor::from_blob(rows.data_ptr(), {groups, m, n}, DType::bf16, strides), masked,
            8),
        fn, "d");
  // Groups n apart with rows n * groups apart (a transposed [m, groups, n]) are valid.
  const Tensor by_row = Tensor::empty({m, groups, n}, DType::bf16);
  gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, by_row.transpose(0, 1), masked, 8);
  const Fp8Tensor b3{Tensor::zeros({3, n, k}, DType::e4m3), Tensor::zeros({3, 1, 1}, DType::f32)};
  EXPECT_ARG_ERROR(
      gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b3, d, Tensor::zeros({2}, DType::i32), 8), fn,
      "b.data");
  EXPECT_ARG_ERROR(
      gemm::m_grouped_fp8_fp4_gemm_nt_masked(a, b, Tensor::empty({groups, m, n + 1}, DType::bf16),
                                             Tensor::zeros({2}, DType::i32), 8),
      fn, "d");
  EXPECT_ARG_ERROR(
      gemm::m_grouped_bf16_gemm_nt_masked(randn_bf16({groups, m, k}), randn_bf16({groups, n, k}), d,
                                          Tensor::zeros({2}, DType::i64), 8),
      "m_grouped_bf16_gemm_nt_masked", "masked_m");
}

TEST_F(Errors, KGroupedSizesAndScales) {
  ScopedAlignment alignment(32);
  constexpr const char* fn = "k_grouped_fp8_gemm_tn_contiguous";
  const int64_t groups = 2, m = 16, n = 24;
  const Tensor d = Tensor::empty({groups, m, n}, DType::f32);
  const Tensor c = Tensor::zeros({groups, m, n}, DType::f32);
  auto operand = [](int64_t sum_k, int64_t mn, int64_t sf_rows) {
    return Fp8Tensor{Tensor::zeros({sum_k, mn}, DType::e4m3),
                     Tensor::zeros({sf_rows, mn}, DType::f32)};
  };
  Tensor ks = Tensor::zeros({groups}, DType::i32);
  ks.data<int32_t>()[0] = 64;
  ks.data<int32_t>()[1] = 32;
  const std::vector<int> ks_cpu = {64, 32};
  const Fp8Tensor a = operand(96, m, 2), b = operand(96, n, 2);    // gran_k 128: 1 + 1 scale rows
  gemm::k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, ks, c);  // the valid call
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, ks, std::nullopt), fn,
                   "c");
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, ks, c, {1, 128, 128}),
                   fn, "recipe");
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(a, b, d, std::vector<int>{64, 64}, ks, c),
                   fn, "ks_cpu");
  Tensor bad = ks.clone();
  bad.data<int32_t>()[1] = 40;  // not a multiple of the alignment
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(a, b, d, std::nullopt, bad, c), fn,
                   "grouped_layout");
  bad.data<int32_t>()[1] = 64;  // sums to 128, not the 96 rows of a
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(a, b, d, std::nullopt, bad, c), fn,
                   "grouped_layout");
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(operand(96, m, 3), b, d, ks_cpu, ks, c),
                   fn, "a.sf");
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(a, operand(64, n, 2), d, ks_cpu, ks, c),
                   fn, "b.data");
  EXPECT_ARG_ERROR(gemm::k_grouped_fp8_gemm_tn_contiguous(
                       a, b, Tensor::empty({groups, m, n}, DType::bf16), ks_cpu, ks, c),
                   fn, "d");
}

TEST_F(Errors, PackedWeights) {
  Dense p;
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, gemm::PackedWeight(), p.d), kNt, "b");
  const gemm::PackedWeight bf16_weight = gemm::pack_weight(randn_bf16({160, 256}));
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, bf16_weight, p.d), kNt, "b");
  const gemm::PackedWeight fp8_k =
      gemm::pack_weight(gemm::per_block_cast_to_fp8(randn_bf16({160, 384}), false));
  EXPECT_ARG_ERROR(gemm::fp8_fp4_gemm_nt(p.a, fp8_k, p.d), kNt, "b");
  EXPECT_ARG_ERROR(gemm::bf16_gemm_nt(randn_bf16({8, 256}), gemm::pack_weight(p.b), p.d),
                   "bf16_gemm_nt", "b");
  EXPECT_ARG_ERROR(gemm::pack_weight(randn_bf16({256})), "pack_weight", "b");
  EXPECT_ARG_ERROR(gemm::pack_weight(Fp8Tensor{p.b.data, randn_f32({160, 2})}), "pack_weight",
                   "b.sf");
  EXPECT_ARG_ERROR(gemm::pack_weight(p.b, OperandRecipe{128, 64}), "pack_weight", "recipe_b");
  // Stacking needs defined parts of one N, K and dtype.
  EXPECT_ARG_ERROR(gemm::stack_packed_weights({}), "stack_packed_weights", "parts");
  EXPECT_ARG_ERROR(gemm::stack_packed_weights({bf16_weight, gemm::PackedWeight()}),
                   "stack_packed_weights", "parts");
  EXPECT_ARG_ERROR(
      gemm::stack_packed_weights({bf16_weight, gemm::pack_weight(randn_bf16({96, 256}))}),
      "stack_packed_weights", "parts");
  EXPECT_ARG_ERROR(gemm::stack_packed_weights({bf16_weight, fp8_k}), "stack_packed_weights",
                   "parts");
  // A grouped weight must have the masked A's number of groups.
  const gemm::PackedWeight grouped = gemm::pack_weight(randn_bf16({3, 32, 128}));
  EXPECT_ARG_ERROR(gemm::m_grouped_bf16_gemm_nt_masked(randn_bf16({2, 16, 128}), grouped,
                                                       Tensor::empty({2, 16, 32}, DType::bf16),
                                                       Tensor::zeros({2}, DType::i32), 8),
                   "m_grouped_bf16_gemm_nt_masked", "b");
}

}  // namespace
}  // namespace dsk::gemm_test
