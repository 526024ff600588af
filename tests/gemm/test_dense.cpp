// Dense GEMMs (fp8_fp4_gemm_*, bf16_gemm_*) against dsk::ref: the upstream normal grid scaled
// down (N and K / 16, M in {1, 16, 128, 513}) for every quantization config, accumulation into C
// (separate and C == D), FP32 and BF16 D, nt/nn/tn/tt, strided operands and outputs, every scale
// form, every backend, the trivial cases, repeatability and thread-count independence.
#include <vector>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

class Fp8Dense : public NoJit {};
class Bf16Dense : public NoJit {};
class Dense : public NoJit {};

struct Shape3 {
  int64_t m, n, k;
};

// Upstream's (N, K) pairs (tests/generators.py enumerate_normal) divided by 16, K at least 256.
constexpr std::pair<int64_t, int64_t> kScaledNk[] = {
    {132, 448}, {36, 448}, {1536, 256}, {2048, 256}, {448, 1024}, {256, 448}, {448, 256}};
constexpr int64_t kGridM[] = {1, 16, 128, 513};

struct Fp8Config {
  const char* name;
  Quant a, b;
  bool pass_recipes;  // false: rely on the defaults
};

constexpr Fp8Config kConfigs[] = {
    {"legacy_1d2d", Quant::token_f32, Quant::block_f32, false},         // default (1, 128, 128)
    {"ue8m0_1d1d", Quant::token_ue8m0, Quant::token_ue8m0, true},       // (1, 1, 128), FP32 values
    {"packed_ue8m0", Quant::token_packed, Quant::token_packed, false},  // default (1, 1, 128)
    {"fp8_x_fp4", Quant::token_ue8m0, Quant::fp4, false},               // default (1,128)/(1,32)
    {"fp4_x_fp8", Quant::fp4, Quant::token_ue8m0, true},
    {"fp4_x_fp4", Quant::fp4, Quant::fp4, false},
};

enum class Acc { none, separate_c, c_is_d };

// What one call is given: the quantized operands, D and C, and the references.
struct Fp8Problem {
  Tensor a, b;  // bf16 originals
  QuantOperand qa, qb;
};

Fp8Problem make_problem(const Fp8Config& cfg, Shape3 s) {
  Fp8Problem p;
  p.a = randn_bf16({s.m, s.k});
  p.b = randn_bf16({s.n, s.k});
  p.qa = quantize(p.a, cfg.a);
  p.qb = quantize(p.b, cfg.b);
  return p;
}

std::optional<OperandRecipe> recipe_or_default(const Fp8Config& cfg, const QuantOperand& q) {
  return cfg.pass_recipes ? std::optional<OperandRecipe>(q.recipe) : std::nullopt;
}

// Runs fp8_fp4_gemm_nt once on fresh data and checks it against both references.
void check_fp8_nt(const Fp8Config& cfg, Shape3 s, DType d_dtype, Acc acc) {
  SCOPED_TRACE(fmt::format("{} m={} n={} k={} d={} acc={}", cfg.name, s.m, s.n, s.k,
                           dtype_name(d_dtype), static_cast<int>(acc)));
  const Fp8Problem p = make_problem(cfg, s);
  Tensor d = poisoned({s.m, s.n}, d_dtype);
  std::optional<Tensor> c;
  Tensor c_before;
  if (acc != Acc::none) {
    c_before = ref::randn({s.m, s.n}, d_dtype, fresh_seed(), 0.0f, 32.0f);
    c = acc == Acc::c_is_d ? d : c_before.clone();
    if (acc == Acc::c_is_d) d.copy_(c_before);
  }
  gemm::fp8_fp4_gemm_nt(p.qa.x, p.qb.x, d, c, std::nullopt, recipe_or_default(cfg, p.qa),
                        recipe_or_default(cfg, p.qb));
  const std::optional<Tensor> c_ref =
      acc == Acc::none ? std::nullopt : std::optional<Tensor>(c_before);
  expect_close(d, ref::gemm_nt(p.a, p.b, c_ref), upstream_tolerance(cfg.a, cfg.b),
               ref::gemm_nt(p.qa.values, p.qb.values, c_ref), dequantized_tolerance(d_dtype),
               "fp8_fp4_gemm_nt");
  if (acc == Acc::separate_c) {
    EXPECT_TRUE(bitwise_equal(*c, c_before)) << "C was modified";
  }
}

// M = 1 as a decode step does it: s.m single-row calls against one B, checked together.
void check_fp8_single_rows(const Fp8Config& cfg, Shape3 s) {
  SCOPED_TRACE(fmt::format("{} {} single rows n={} k={}", cfg.name, s.m, s.n, s.k));
  const Fp8Problem p = make_problem(cfg, s);
  Tensor d = poisoned({s.m, s.n}, DType::bf16);
  for (int64_t r = 0; r < s.m; ++r) {
    const Fp8Tensor row{p.qa.x.data.slice(0, r, r + 1), p.qa.x.sf.slice(0, r, r + 1)};
    gemm::fp8_fp4_gemm_nt(row, p.qb.x, d.slice(0, r, r + 1), std::nullopt, std::nullopt,
                          recipe_or_default(cfg, p.qa), recipe_or_default(cfg, p.qb));
  }
  expect_close(d, ref::gemm_nt(p.a, p.b), upstream_tolerance(cfg.a, cfg.b),
               ref::gemm_nt(p.qa.values, p.qb.values), dequantized_tolerance(DType::bf16),
               "fp8_fp4_gemm_nt, one row per call");
}

void check_bf16_nt(Shape3 s, DType d_dtype, Acc acc) {
  SCOPED_TRACE(fmt::format("bf16 m={} n={} k={} d={} acc={}", s.m, s.n, s.k, dtype_name(d_dtype),
                           static_cast<int>(acc)));
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  Tensor d = poisoned({s.m, s.n}, d_dtype);
  std::optional<Tensor> c;
  Tensor c_before;
  if (acc != Acc::none) {
    c_before = ref::randn({s.m, s.n}, d_dtype, fresh_seed(), 0.0f, 32.0f);
    c = acc == Acc::c_is_d ? d : c_before.clone();
    if (acc == Acc::c_is_d) d.copy_(c_before);
  }
  gemm::bf16_gemm_nt(a, b, d, c);
  const Tensor expected =
      ref::gemm_nt(a, b, acc == Acc::none ? std::nullopt : std::optional<Tensor>(c_before));
  EXPECT_EQ(ref::count_poisoned(d), 0);
  EXPECT_LT(ref::calc_diff(d, expected), dequantized_tolerance(d_dtype));
}

// calc_diff against the BF16 reference measures the quantization error, whose spread shrinks with
// the number of rows and outputs averaged. Below 8 rows and 4096 outputs the upstream tolerances
// of one FP4 operand start to fail by chance (measured: 16 x 36 x 448 reaches 0.0093 against 0.01
// in 200 draws), so small M takes a wider N, and M = 1 is checked over 8 single-row calls.
int64_t grid_n(int64_t m, int64_t scaled_n) {
  return m == 1 ? 16 * scaled_n : m == 16 ? 8 * scaled_n : scaled_n;
}

// The grid of one config: every M x (N, K) with a BF16 D, accumulation into D (C == D) at
// M = 128, and an FP32 D at M = 16.
void run_fp8_grid(const Fp8Config& cfg) {
  SCOPED_TRACE(seed_note());
  for (auto [n, k] : kScaledNk) {
    for (int64_t m : kGridM) {
      if (m == 1)
        check_fp8_single_rows(cfg, {8, grid_n(m, n), k});
      else
        check_fp8_nt(cfg, {m, grid_n(m, n), k}, DType::bf16, Acc::none);
    }
    check_fp8_nt(cfg, {128, n, k}, DType::bf16, Acc::c_is_d);
    check_fp8_nt(cfg, {16, n, k}, DType::f32, Acc::none);
  }
}

TEST_F(Fp8Dense, GridLegacy1d2d) {
  run_fp8_grid(kConfigs[0]);
}
TEST_F(Fp8Dense, GridUe8m01d1d) {
  run_fp8_grid(kConfigs[1]);
}
TEST_F(Fp8Dense, GridPackedUe8m0) {
  run_fp8_grid(kConfigs[2]);
}
TEST_F(Fp8Dense, GridFp8xFp4) {
  run_fp8_grid(kConfigs[3]);
}
TEST_F(Fp8Dense, GridFp4xFp8) {
  run_fp8_grid(kConfigs[4]);
}
TEST_F(Fp8Dense, GridFp4xFp4) {
  run_fp8_grid(kConfigs[5]);
}

TEST_F(Bf16Dense, Grid) {
  SCOPED_TRACE(seed_note());
  for (auto [n, k] : kScaledNk) {
    for (int64_t m : kGridM) check_bf16_nt({m, grid_n(m, n), k}, DType::bf16, Acc::none);
    check_bf16_nt({128, n, k}, DType::bf16, Acc::c_is_d);
  }
  // The BF16-only pairs with an FP32 D ((256, 7168) and (129280, 7168), scaled).
  for (int64_t m : kGridM) {
    check_bf16_nt({m, 16, 448}, DType::f32, Acc::none);
    check_bf16_nt({m, 8080, 448}, DType::f32, Acc::none);
  }
}

TEST_F(Dense, AccumulationIntoASeparateCAndIntoD) {
  SCOPED_TRACE(seed_note());
  for (DType d_dtype : {DType::bf16, DType::f32})
    for (Acc acc : {Acc::separate_c, Acc::c_is_d}) {
      check_fp8_nt(kConfigs[0], {40, 96, 320}, d_dtype, acc);
      check_fp8_nt(kConfigs[3], {40, 96, 320}, d_dtype, acc);
      check_bf16_nt({40, 96, 320}, d_dtype, acc);
    }
}

// ---- nt / nn / tn / tt ----

// Packed FP4 [r, c / 2] (pairs along c) as [c, r / 2] (pairs along r): the operand stored
// transposed, as upstream's transpose_packed_fp4 makes it.
Tensor transpose_packed_fp4(const Tensor& x) {
  const int64_t r = x.size(0), c = 2 * x.size(1);
  Tensor out = Tensor::empty({c, r / 2}, DType::fp4x2);
  const auto* in = static_cast<const uint8_t*>(x.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  auto value = [&](int64_t i, int64_t j) {
    const uint8_t byte = in[i * (c / 2) + j / 2];
    return j % 2 == 0 ? byte & 0xF : byte >> 4;
  };
  for (int64_t j = 0; j < c; ++j)
    for (int64_t p = 0; p < r / 2; ++p)
      o[j * (r / 2) + p] = static_cast<uint8_t>(value(2 * p, j) | (value(2 * p + 1, j) << 4));
  return out;
}

// What a user holding an operand transposed ([k, mn], and its scales transposed) passes.
Fp8Tensor stored_transposed(const Fp8Tensor& x) {
  const Tensor data = x.data.dtype() == DType::fp4x2 ? transpose_packed_fp4(x.data)
                                                     : x.data.transpose(0, 1).contiguous();
  return {data, x.sf.transpose(0, 1).contiguous()};
}

TEST_F(Dense, NnTnTtTransposeTheirViews) {
  SCOPED_TRACE(seed_note());
  const Shape3 s{34, 130, 320};  // even M and N: FP4 stored transposed packs pairs along them
  for (const Fp8Config& cfg : {kConfigs[0], kConfigs[2], kConfigs[3], kConfigs[4]}) {
    const Fp8Problem p = make_problem(cfg, s);
    const Tensor bf16_ref = ref::gemm_nt(p.a, p.b);
    const Tensor dequant_ref = ref::gemm_nt(p.qa.values, p.qb.values);
    const auto ra = recipe_or_default(cfg, p.qa), rb = recipe_or_default(cfg, p.qb);
    const double tol = upstream_tolerance(cfg.a, cfg.b);
    const double tight = dequantized_tolerance(DType::bf16);
    const Fp8Tensor at = stored_transposed(p.qa.x), bt = stored_transposed(p.qb.x);
    Tensor d = poisoned({s.m, s.n}, DType::bf16);
    gemm::fp8_fp4_gemm_nn(p.qa.x, bt, d, std::nullopt, std::nullopt, ra, rb);
    expect_close(d, bf16_ref, tol, dequant_ref, tight, std::string(cfg.name) + " nn");
    d = poisoned({s.m, s.n}, DType::bf16);
    gemm::fp8_fp4_gemm_tn(at, bt, d, std::nullopt, std::nullopt, ra, rb);
    expect_close(d, bf16_ref, tol, dequant_ref, tight, std::string(cfg.name) + " tn");
    d = poisoned({s.m, s.n}, DType::bf16);
    gemm::fp8_fp4_gemm_tt(at, p.qb.x, d, std::nullopt, std::nullopt, ra, rb);
    expect_close(d, bf16_ref, tol, dequant_ref, tight, std::string(cfg.name) + " tt");
    // The legacy names forward.
    d = poisoned({s.m, s.n}, DType::bf16);
    gemm::fp8_gemm_tt(at, p.qb.x, d, std::nullopt, std::nullopt, ra, rb);
    expect_close(d, bf16_ref, tol, dequant_ref, tight, std::string(cfg.name) + " fp8_gemm_tt");
  }
  // BF16.
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  const Tensor expected = ref::gemm_nt(a, b);
  const Tensor a_t = a.transpose(0, 1).contiguous(), b_t = b.transpose(0, 1).contiguous();
  for (int variant = 0; variant < 3; ++variant) {
    Tensor d = poisoned({s.m, s.n}, DType::f32);
    if (variant == 0) gemm::bf16_gemm_nn(a, b_t, d);
    if (variant == 1) gemm::bf16_gemm_tn(a_t, b_t, d);
    if (variant == 2) gemm::bf16_gemm_tt(a_t, b, d);
    EXPECT_LT(ref::calc_diff(d, expected), 1e-9) << "bf16 variant " << variant;
    EXPECT_EQ(ref::count_poisoned(d), 0);
  }
}

// ---- strides ----

// `x` copied into the leading columns of a wider buffer, returned as the strided view.
Tensor in_wider(const Tensor& x, int64_t extra) {
  Tensor wide = Tensor::empty({x.size(0), x.size(1) + extra}, x.dtype());
  ref::poison(wide);
  Tensor view = wide.slice(1, 0, x.size(1));
  view.copy_(x);
  return view;
}

TEST_F(Dense, StridedOperandsScalesAndOutputs) {
  SCOPED_TRACE(seed_note());
  const Shape3 s{40, 120, 400};
  for (const Fp8Config& cfg : {kConfigs[0], kConfigs[1], kConfigs[3]}) {
    const Fp8Problem p = make_problem(cfg, s);
    // A with a leading dimension > K (its scales too); B MN-major; D a column slice.
    const Fp8Tensor a_strided{in_wider(p.qa.x.data, 64), in_wider(p.qa.x.sf, 3)};
    Fp8Tensor b_strided = p.qb.x;
    if (cfg.b != Quant::fp4)
      b_strided.data = p.qb.x.data.transpose(0, 1).contiguous().transpose(0, 1);
    Tensor wide_d = poisoned({s.m, s.n + 24}, DType::bf16);
    Tensor d = wide_d.slice(1, 0, s.n);
    Tensor wide_c = ref::randn({s.m, s.n + 8}, DType::bf16, fresh_seed(), 0.0f, 8.0f);
    const Tensor c = wide_c.slice(1, 3, 3 + s.n);
    gemm::fp8_fp4_gemm_nt(a_strided, b_strided, d, c, std::nullopt, recipe_or_default(cfg, p.qa),
                          recipe_or_default(cfg, p.qb));
    expect_close(d, ref::gemm_nt(p.a, p.b, c), upstream_tolerance(cfg.a, cfg.b),
                 ref::gemm_nt(p.qa.values, p.qb.values, c), dequantized_tolerance(DType::bf16),
                 cfg.name);
    EXPECT_EQ(ref::count_poisoned(wide_d.slice(1, s.n, s.n + 24)), s.m * 24)
        << "columns past N were written";
  }
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  Tensor wide_d = poisoned({s.m, s.n + 5}, DType::f32);
  gemm::bf16_gemm_nt(in_wider(a, 8), b.transpose(0, 1).contiguous().transpose(0, 1),
                     wide_d.slice(1, 0, s.n));
  EXPECT_LT(ref::calc_diff(wide_d.slice(1, 0, s.n), ref::gemm_nt(a, b)), 1e-9);
  EXPECT_EQ(ref::count_poisoned(wide_d.slice(1, s.n, s.n + 5)), s.m * 5);
}

// ---- scale forms ----

// Ascend's int16 form of f32 UE8M0 scales [mn, blocks]: 2 UE8M0 bytes per int16, low byte first.
Tensor ascend_int16(const Tensor& sf) {
  const int64_t mn = sf.size(0), blocks = sf.size(1), words = (blocks + 1) / 2;
  Tensor out = Tensor::zeros({mn, words}, DType::i16);
  auto* bytes = static_cast<uint8_t*>(out.data_ptr());
  const Tensor c = sf.contiguous();
  for (int64_t r = 0; r < mn; ++r)
    for (int64_t j = 0; j < blocks; ++j)
      bytes[r * words * 2 + j] = numeric::f32_to_ue8m0_exact(c.data<float>()[r * blocks + j]).bits;
  return out;
}

TEST_F(Dense, EveryScaleFormGivesTheSameBits) {
  SCOPED_TRACE(seed_note());
  const Shape3 s{45, 100, 1000};  // 8 blocks of 128: whole int32 words; 32 blocks of 32
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  for (int gran_k : {128, 32}) {
    const Fp8Tensor qa = gemm::per_token_cast_to_fp8(a, true, gran_k);
    const Fp8Tensor qb = gemm::per_token_cast_to_fp8(b, true, gran_k);
    const OperandRecipe r{1, gran_k};
    auto run = [&](const Tensor& sfa, const Tensor& sfb) {
      Tensor d = poisoned({s.m, s.n}, DType::f32);
      gemm::fp8_fp4_gemm_nt({qa.data, sfa}, {qb.data, sfb}, d, std::nullopt, std::nullopt, r, r);
      return d;
    };
    const Tensor base = run(qa.sf, qb.sf);
    EXPECT_LT(ref::calc_diff(base, ref::gemm_nt(a, b)), 1e-3);
    auto mn_major = [&](const Tensor& sf, int64_t mn) {
      return gemm::transform_sf_into_required_layout(sf, mn, s.k, Recipe{1, 1, gran_k},
                                                     std::nullopt, std::nullopt, true);
    };
    EXPECT_TRUE(bitwise_equal(run(mn_major(qa.sf, s.m), mn_major(qb.sf, s.n)), base))
        << "f32 MN-major, gran_k " << gran_k;
    EXPECT_TRUE(bitwise_equal(run(qa.sf.transpose(0, 1).contiguous().transpose(0, 1), qb.sf), base))
        << "f32 column-major, gran_k " << gran_k;
    EXPECT_TRUE(
        bitwise_equal(run(gemm::pack_ue8m0_to_int(qa.sf), gemm::pack_ue8m0_to_int(qb.sf)), base))
        << "packed int32, gran_k " << gran_k;
    EXPECT_TRUE(bitwise_equal(run(gemm::get_mn_major_tma_aligned_packed_ue8m0_tensor(qa.sf),
                                  gemm::get_mn_major_tma_aligned_packed_ue8m0_tensor(qb.sf)),
                              base))
        << "packed int32 MN-major, gran_k " << gran_k;
    if (gran_k == 32) {
      const Tensor ia = ascend_int16(qa.sf), ib = ascend_int16(qb.sf);
      EXPECT_TRUE(bitwise_equal(run(ia, ib), base)) << "int16";
      const Tensor ra = gemm::transform_sf_into_required_layout(ia, s.m, s.k, std::nullopt, r);
      const Tensor rb = gemm::transform_sf_into_required_layout(ib, s.n, s.k, std::nullopt, r);
      EXPECT_TRUE(bitwise_equal(run(ra, rb), base)) << "int16 required layout";
    }
  }
}

TEST_F(Dense, Int16ScalesWithRowBlocksRepeatPerRow) {
  // B with one int16 scale row per 128 rows, given as is and in the required (repeated) layout.
  SCOPED_TRACE(seed_note());
  const Shape3 s{8, 200, 256};
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  const Fp8Tensor qa = gemm::per_token_cast_to_fp8(a, true, 32);
  const Fp8Tensor qb = gemm::per_block_cast_to_fp8(b, true, 32);  // scales [7, 8] per 32 x 32
  // Take one scale row per 128 rows of B: blocks of 128 x 32 hold the largest of four rows.
  Tensor sfb = Tensor::empty({2, 8}, DType::f32);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      float v = 0;
      for (int64_t r = 4 * i; r < std::min<int64_t>(7, 4 * i + 4); ++r)
        v = std::max(v, qb.sf.data<float>()[r * 8 + j]);
      sfb.data<float>()[i * 8 + j] = v;
    }
  const OperandRecipe ra{1, 32}, rb{128, 32};
  Tensor d_f32 = poisoned({s.m, s.n}, DType::f32), d_i16 = poisoned({s.m, s.n}, DType::f32),
         d_req = poisoned({s.m, s.n}, DType::f32);
  gemm::fp8_fp4_gemm_nt(qa, {qb.data, sfb}, d_f32, std::nullopt, std::nullopt, ra, rb);
  gemm::fp8_fp4_gemm_nt(qa, {qb.data, ascend_int16(sfb)}, d_i16, std::nullopt, std::nullopt, ra,
                        rb);
  const Tensor required =
      gemm::transform_sf_into_required_layout(ascend_int16(sfb), s.n, s.k, std::nullopt, rb);
  gemm::fp8_fp4_gemm_nt(qa, {qb.data, required}, d_req, std::nullopt, std::nullopt, ra, rb);
  EXPECT_TRUE(bitwise_equal(d_i16, d_f32));
  EXPECT_TRUE(bitwise_equal(d_req, d_f32));
  EXPECT_LT(ref::calc_diff(d_f32, ref::gemm_nt(ref::dequantize(qa.data, qa.sf, 1, 32),
                                               ref::dequantize(qb.data, sfb, 128, 32))),
            1e-9);
}

// ---- trivial cases ----

TEST_F(Dense, EmptyProblemsFollowUpstreamsEarlyReturn) {
  SCOPED_TRACE(seed_note());
  const int64_t m = 6, n = 10;
  // k == 0: D = C, or zeros without C.
  const Fp8Tensor a0{Tensor::empty({m, 0}, DType::e4m3), Tensor::empty({m, 0}, DType::f32)};
  const Fp8Tensor b0{Tensor::empty({n, 0}, DType::e4m3), Tensor::empty({1, 0}, DType::f32)};
  Tensor d = poisoned({m, n}, DType::bf16);
  gemm::fp8_fp4_gemm_nt(a0, b0, d);
  EXPECT_TRUE(bitwise_equal(d, Tensor::zeros({m, n}, DType::bf16)));
  const Tensor c = randn_bf16({m, n});
  d = poisoned({m, n}, DType::bf16);
  gemm::fp8_fp4_gemm_nt(a0, b0, d, c);
  EXPECT_TRUE(bitwise_equal(d, c));
  Tensor df = poisoned({m, n}, DType::f32);
  gemm::bf16_gemm_nt(Tensor::empty({m, 0}, DType::bf16), Tensor::empty({n, 0}, DType::bf16), df);
  EXPECT_TRUE(bitwise_equal(df, Tensor::zeros({m, n}, DType::f32)));
  // m == 0 or n == 0: nothing happens (C is not even copied).
  Tensor d_n0 = poisoned({m, 0}, DType::bf16);
  gemm::bf16_gemm_nt(randn_bf16({m, 64}), Tensor::empty({0, 64}, DType::bf16), d_n0);
  Tensor d_m0 = poisoned({0, n}, DType::bf16);
  gemm::bf16_gemm_nt(Tensor::empty({0, 64}, DType::bf16), randn_bf16({n, 64}), d_m0,
                     Tensor::empty({0, n}, DType::bf16));
}

// ---- repeatability ----

TEST_F(Dense, RepeatableAndThreadCountIndependentInDeterministicMode) {
  SCOPED_TRACE(seed_note());
  ScopedDeterministic deterministic(true);
  const Shape3 s{200, 300, 640};
  const Fp8Problem p = make_problem(kConfigs[0], s);
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  auto fp8 = [&] {
    Tensor d = poisoned({s.m, s.n}, DType::bf16);
    gemm::fp8_fp4_gemm_nt(p.qa.x, p.qb.x, d);
    return d;
  };
  auto bf16 = [&] {
    Tensor d = poisoned({s.m, s.n}, DType::f32);
    gemm::bf16_gemm_nt(a, b, d);
    return d;
  };
  Tensor fp8_one, bf16_one;
  {
    ScopedThreads threads(1);
    fp8_one = fp8();
    bf16_one = bf16();
  }
  ScopedThreads threads(2);
  EXPECT_TRUE(bitwise_equal(fp8(), fp8_one));
  EXPECT_TRUE(bitwise_equal(fp8(), fp8_one)) << "second run";
  EXPECT_TRUE(bitwise_equal(bf16(), bf16_one));
  EXPECT_TRUE(bitwise_equal(bf16(), bf16_one)) << "second run";
}

// ---- pre-packed weights ----

TEST_F(Dense, PackedWeightsGiveTheSameBitsAsRawWeights) {
  SCOPED_TRACE(seed_note());
  const Shape3 s{33, 130, 384};
  for (const Fp8Config& cfg : kConfigs) {
    const Fp8Problem p = make_problem(cfg, s);
    const auto rb = recipe_or_default(cfg, p.qb);
    const gemm::PackedWeight w = gemm::pack_weight(p.qb.x, rb);
    EXPECT_EQ(w.n(), s.n);
    EXPECT_EQ(w.k(), s.k);
    EXPECT_EQ(w.num_groups(), 1);
    EXPECT_EQ(w.dtype(), p.qb.x.data.dtype());
    EXPECT_GT(w.nbytes(), 0u);
    // The packed call takes A's recipe from recipe_a (or recipe's (gran_m, gran_k)).
    const auto ra = recipe_or_default(cfg, p.qa);
    Tensor raw = poisoned({s.m, s.n}, DType::bf16), packed = poisoned({s.m, s.n}, DType::bf16);
    gemm::fp8_fp4_gemm_nt(p.qa.x, p.qb.x, raw, std::nullopt, std::nullopt, ra, rb);
    gemm::fp8_fp4_gemm_nt(p.qa.x, w, packed, std::nullopt, std::nullopt, ra);
    EXPECT_TRUE(bitwise_equal(packed, raw)) << cfg.name;
  }
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  const gemm::PackedWeight w = gemm::pack_weight(b.transpose(0, 1).contiguous().transpose(0, 1));
  EXPECT_EQ(w.dtype(), DType::bf16);
  Tensor raw = poisoned({s.m, s.n}, DType::f32), packed = poisoned({s.m, s.n}, DType::f32);
  const Tensor c = randn_f32({s.m, s.n});
  gemm::bf16_gemm_nt(a, b, raw, c);
  gemm::bf16_gemm_nt(a, w, packed, c);
  EXPECT_TRUE(bitwise_equal(packed, raw));
}

// ---- the JIT path ----

// With the JIT on (for generic kernels too), the shape-specialised kernels give the built-in
// kernels' bits.
TEST(DenseJit, JitKernelsMatchTheBuiltInOnes) {
  SCOPED_TRACE(seed_note());
  const Shape3 s{40, 96, 512};
  const Fp8Problem p = make_problem(kConfigs[0], s);
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  auto run = [&](const char* jit) {
    test::ScopedEnv env("DSK_GEMM_JIT", jit);
    Tensor d8 = poisoned({s.m, s.n}, DType::bf16), d16 = poisoned({s.m, s.n}, DType::f32);
    gemm::fp8_fp4_gemm_nt(p.qa.x, p.qb.x, d8);
    gemm::bf16_gemm_nt(a, b, d16);
    return std::pair{d8, d16};
  };
  const auto [jit8, jit16] = run("1");
  const auto [aot8, aot16] = run("0");
  EXPECT_TRUE(bitwise_equal(jit8, aot8));
  EXPECT_TRUE(bitwise_equal(jit16, aot16));
  EXPECT_LT(ref::calc_diff(jit8, ref::gemm_nt(p.a, p.b)), 1e-3);
  EXPECT_LT(ref::calc_diff(jit16, ref::gemm_nt(a, b)), 1e-9);
}

// ---- every backend ----

class DenseBackends : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { DSK_SKIP_UNLESS_BACKEND(GetParam()); }

 private:
  test::ScopedEnv no_jit_{"DSK_GEMM_JIT", "0"};
};

TEST_P(DenseBackends, EveryConfigMatchesTheReferences) {
  SCOPED_TRACE(seed_note());
  test::ScopedBackend backend(GetParam());
  for (Shape3 s : {Shape3{37, 130, 300}, Shape3{4, 1024, 512}, Shape3{70, 60, 2000}}) {
    for (const Fp8Config& cfg : kConfigs) {
      check_fp8_nt(cfg, s, DType::bf16, Acc::none);
      check_fp8_nt(cfg, s, DType::f32, Acc::separate_c);
    }
    check_bf16_nt(s, DType::bf16, Acc::c_is_d);
    check_bf16_nt(s, DType::f32, Acc::none);
  }
}

INSTANTIATE_TEST_SUITE_P(Gemm, DenseBackends, ::testing::ValuesIn(test::supported_backends()),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace dsk::gemm_test
