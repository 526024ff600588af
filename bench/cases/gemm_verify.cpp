// `dsk verify gemm`: the dense (BF16, FP8, FP8 x FP4; nt and the transposed layouts), grouped
// contiguous / masked and k-grouped GEMMs against dsk::ref on fresh random data, outputs poisoned
// first. Each case reports calc_diff against the fp64 product of the values the operands stand
// for (the dequantized FP8 / FP4 inputs), where only the kernels' own rounding remains: f32
// accumulation, and the final rounding of a BF16 D. An element the call never wrote fails the case.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include <dsk/core.hpp>
#include <dsk/gemm.hpp>
#include <dsk/ref.hpp>

#include "bench/cases/gemm_cases.hpp"

namespace dsk::bench {
namespace {

namespace g = dsk::gemm;

// calc_diff of one bf16 D: its final rounding alone gives about 1e-6; of an f32 D, about 1e-12.
constexpr double kBf16Tolerance = 1e-5;
constexpr double kF32Tolerance = 1e-9;

uint64_t fresh_seed() {
  return fresh_rng()();
}

Tensor randn_bf16(const Shape& shape) {
  return ref::randn(shape, DType::bf16, fresh_seed());
}

Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  ref::poison(t);
  return t;
}

// calc_diff(got, want), or 1 (a failure) when an element of `got` was never written.
double diff_or_unwritten(const Tensor& got, const Tensor& want) {
  if (ref::count_poisoned(got) != 0) return 1.0;
  return ref::calc_diff(got, want);
}

// ---- dense ----

struct Quantized {
  g::Fp8Tensor x;
  g::OperandRecipe recipe;
  Tensor values;  // f32: what x stands for
};

enum class Form { token_f32, block_f32, token_packed_ue8m0, fp4 };

Quantized quantize(const Tensor& x, Form form) {
  Quantized q;
  switch (form) {
    case Form::token_f32:
      q = {g::per_token_cast_to_fp8(x, false), {1, 128}, {}};
      break;
    case Form::block_f32:
      q = {g::per_block_cast_to_fp8(x, false), {128, 128}, {}};
      break;
    case Form::token_packed_ue8m0:
      q = {g::per_token_cast_to_fp8(x, true, 128, true), {1, 128}, {}};
      break;
    case Form::fp4:
      q = {g::per_token_cast_to_fp4(x, true, 32), {1, 32}, {}};
      break;
  }
  q.values = ref::dequantize(q.x.data, q.x.sf, std::get<0>(q.recipe), std::get<1>(q.recipe));
  return q;
}

struct DenseShape {
  int64_t m, n, k;
};

std::string shape_text(const DenseShape& s, const char* extra) {
  return fmt::format("m={} n={} k={}{}", s.m, s.n, s.k, extra);
}

// D (f32) = C + A . B^T, BF16 operands.
double verify_bf16_nt(const DenseShape& s) {
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  const Tensor c = ref::randn({s.m, s.n}, DType::f32, fresh_seed());
  const Tensor d = poisoned({s.m, s.n}, DType::f32);
  g::bf16_gemm_nt(a, b, d, c);
  return diff_or_unwritten(d, ref::gemm_nt(a, b, c));
}

// D (bf16) = A . B^T through the nn / tn / tt views (operands stored transposed).
double verify_bf16_views(const DenseShape& s) {
  const Tensor a = randn_bf16({s.m, s.k}), b = randn_bf16({s.n, s.k});
  const Tensor a_t = a.transpose(0, 1).contiguous(), b_t = b.transpose(0, 1).contiguous();
  const Tensor want = ref::gemm_nt(a, b);
  double worst = 0;
  for (int layout = 0; layout < 3; ++layout) {
    const Tensor d = poisoned({s.m, s.n}, DType::bf16);
    if (layout == 0) g::bf16_gemm_nn(a, b_t, d);
    if (layout == 1) g::bf16_gemm_tn(a_t, b_t, d);
    if (layout == 2) g::bf16_gemm_tt(a_t, b, d);
    worst = std::max(worst, diff_or_unwritten(d, want));
  }
  return worst;
}

// D (bf16) = A . B^T with the operands quantized as `fa` / `fb`, B raw and prepacked (both
// checked).
double verify_fp8_nt(const DenseShape& s, Form fa, Form fb) {
  const Quantized qa = quantize(randn_bf16({s.m, s.k}), fa);
  const Quantized qb = quantize(randn_bf16({s.n, s.k}), fb);
  const Tensor want = ref::gemm_nt(qa.values, qb.values);
  const Tensor d = poisoned({s.m, s.n}, DType::bf16);
  g::fp8_fp4_gemm_nt(qa.x, qb.x, d, std::nullopt, std::nullopt, qa.recipe, qb.recipe);
  const Tensor d_packed = poisoned({s.m, s.n}, DType::bf16);
  g::fp8_fp4_gemm_nt(qa.x, g::pack_weight(qb.x, qb.recipe), d_packed, std::nullopt, std::nullopt,
                     qa.recipe);
  return std::max(diff_or_unwritten(d, want), diff_or_unwritten(d_packed, want));
}

// ---- grouped ----

// MoE-like rows per group (expected x U(0.7, 1.3)) with group 0 empty and group 1 a single row.
std::vector<int64_t> group_rows(int64_t groups, int64_t expected) {
  std::mt19937_64 rng = fresh_rng();
  std::uniform_real_distribution<double> u(0.7, 1.3);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < groups; ++i)
    rows.push_back(static_cast<int64_t>(static_cast<double>(expected) * u(rng)));
  rows[0] = 0;
  rows[1] = 1;
  return rows;
}

// The valid rows of every group, stacked: D's rows `got_rows` against the reference rows.
struct Stacked {
  Tensor got, want;
};

// Contiguous layout: groups padded to the mk alignment, padding rows marked -1.
double verify_contiguous(bool fp8, int64_t groups, int64_t expected, int64_t n, int64_t k) {
  const std::vector<int64_t> rows = group_rows(groups, expected);
  const int64_t align = g::get_mk_alignment_for_contiguous_layout();
  std::vector<int64_t> starts;
  int64_t m = 0, valid = 0;
  for (int64_t r : rows) {
    starts.push_back(m);
    m += (r + align - 1) / align * align;
    valid += r;
  }
  Tensor layout = Tensor::empty({m}, DType::i32);
  std::fill_n(layout.data<int32_t>(), m, -1);
  for (int64_t gi = 0; gi < groups; ++gi)
    std::fill_n(layout.data<int32_t>() + starts[gi], rows[gi], static_cast<int32_t>(gi));
  const Tensor a = randn_bf16({m, k}), b = randn_bf16({groups, n, k});
  Tensor a_values = a, b_values = b;
  const Tensor d = poisoned({m, n}, DType::bf16);
  if (fp8) {
    const Quantized qa = quantize(a, Form::token_f32);
    g::Fp8Tensor qb{Tensor::empty({groups, n, k}, DType::e4m3),
                    Tensor::empty({groups, (n + 127) / 128, (k + 127) / 128}, DType::f32)};
    b_values = Tensor::empty({groups, n, k}, DType::f32);
    for (int64_t gi = 0; gi < groups; ++gi) {
      const Quantized part = quantize(b.select(0, gi), Form::block_f32);
      qb.data.select(0, gi).copy_(part.x.data);
      qb.sf.select(0, gi).copy_(part.x.sf);
      b_values.select(0, gi).copy_(part.values);
    }
    a_values = qa.values;
    g::m_grouped_fp8_gemm_nt_contiguous(qa.x, qb, d, layout);
  } else {
    g::m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout);
  }
  Stacked s{Tensor::empty({valid, n}, DType::bf16), Tensor::empty({valid, n}, DType::f64)};
  int64_t row = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    if (rows[gi] == 0) continue;
    const int64_t r0 = starts[gi], r1 = r0 + rows[gi];
    s.got.slice(0, row, row + rows[gi]).copy_(d.slice(0, r0, r1));
    s.want.slice(0, row, row + rows[gi])
        .copy_(ref::gemm_nt(a_values.slice(0, r0, r1), b_values.select(0, gi)));
    row += rows[gi];
  }
  return diff_or_unwritten(s.got, s.want);
}

// Masked layout: A [G, max_m, K] with masked_m[g] valid rows; rows past them must stay untouched.
double verify_masked(int64_t groups, int64_t expected, int64_t n, int64_t k) {
  const std::vector<int64_t> rows = group_rows(groups, expected);
  const int64_t max_m = *std::max_element(rows.begin(), rows.end()) + 3;
  Tensor masked_m = Tensor::empty({groups}, DType::i32);
  int64_t valid = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    masked_m.data<int32_t>()[gi] = static_cast<int32_t>(rows[gi]);
    valid += rows[gi];
  }
  const Tensor a = randn_bf16({groups, max_m, k}), b = randn_bf16({groups, n, k});
  const Tensor d = poisoned({groups, max_m, n}, DType::bf16);
  g::m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, static_cast<int>(expected));
  Stacked s{Tensor::empty({valid, n}, DType::bf16), Tensor::empty({valid, n}, DType::f64)};
  int64_t row = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const Tensor dg = d.select(0, gi);
    if (ref::count_poisoned(dg.slice(0, rows[gi], max_m)) != (max_m - rows[gi]) * n)
      return 1.0;  // a row past masked_m was written
    if (rows[gi] == 0) continue;
    s.got.slice(0, row, row + rows[gi]).copy_(dg.slice(0, 0, rows[gi]));
    s.want.slice(0, row, row + rows[gi])
        .copy_(ref::gemm_nt(a.select(0, gi).slice(0, 0, rows[gi]), b.select(0, gi)));
    row += rows[gi];
  }
  return diff_or_unwritten(s.got, s.want);
}

// K-grouped: D[g] (f32) = C[g] + A_g^T . B_g over groups of K rows (multiples of 128, empty ones
// included), per-channel FP8 with 128-row scale blocks (which never straddle a group).
double verify_k_grouped(int64_t m, int64_t n) {
  const std::vector<int> ks = {256, 0, 128, 384, 0};
  const int64_t groups = static_cast<int64_t>(ks.size());
  int64_t sum_k = 0;
  for (int k : ks) sum_k += k;
  const g::Fp8Tensor a = g::per_channel_cast_to_fp8(randn_bf16({sum_k, m}), true);
  const g::Fp8Tensor b = g::per_channel_cast_to_fp8(randn_bf16({sum_k, n}), true);
  const Tensor a_values = ref::dequantize(a.data, a.sf, 128, 1);
  const Tensor b_values = ref::dequantize(b.data, b.sf, 128, 1);
  Tensor layout = Tensor::empty({groups}, DType::i32);
  std::copy(ks.begin(), ks.end(), layout.data<int32_t>());
  const Tensor c = ref::randn({groups, m, n}, DType::f32, fresh_seed());
  const Tensor d = poisoned({groups, m, n}, DType::f32);
  g::k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, layout, c);
  Tensor want = Tensor::empty({groups, m, n}, DType::f64);
  int64_t k0 = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t k1 = k0 + ks[static_cast<size_t>(gi)];
    want.select(0, gi).copy_(ref::gemm_nt(a_values.slice(0, k0, k1).transpose(0, 1),
                                          b_values.slice(0, k0, k1).transpose(0, 1),
                                          c.select(0, gi)));
    k0 = k1;
  }
  return diff_or_unwritten(d, want);
}

void add(Registry& r, std::string name, std::string shape, double tolerance, bool quick,
         std::function<double()> run) {
  r.add(VerifyCase{.name = std::move(name),
                   .shape = std::move(shape),
                   .metric = "calc_diff",
                   .tolerance = tolerance,
                   .quick = quick,
                   .run = [run = std::move(run)](const CaseContext&) { return run(); }});
}

}  // namespace

void register_gemm_verify(Registry& r) {
  // Dense: a large-M shape (row and column tails), a small-M one (the decode kernel).
  constexpr DenseShape kLarge{197, 576, 1024}, kSmall{5, 2112, 2048};
  for (const DenseShape& s : {kLarge, kSmall})
    add(r, "bf16_gemm_nt", shape_text(s, " d=f32 +C"), kF32Tolerance, true,
        [s] { return verify_bf16_nt(s); });
  add(r, "bf16_gemm_nn/tn/tt", shape_text({96, 160, 320}, " d=bf16"), kBf16Tolerance, false, [] {
    return verify_bf16_views({96, 160, 320});
  });
  struct Fp8Case {
    const char* what;
    Form a, b;
  };
  constexpr Fp8Case kFp8[] = {
      {" 1x128 f32 . 128x128 f32", Form::token_f32, Form::block_f32},
      {" 1x128 . 1x128 packed ue8m0", Form::token_packed_ue8m0, Form::token_packed_ue8m0},
      {" fp8 1x128 . fp4 1x32", Form::token_packed_ue8m0, Form::fp4},
      {" fp4 . fp4 1x32", Form::fp4, Form::fp4}};
  for (const Fp8Case& c : kFp8)
    for (const DenseShape& s : {kLarge, kSmall})
      add(r, "fp8_fp4_gemm_nt", shape_text(s, c.what), kBf16Tolerance,
          c.a == Form::token_f32 || s.m == kSmall.m, [s, c] { return verify_fp8_nt(s, c.a, c.b); });
  // Grouped: an empty group and a one-row expert among MoE-like sizes.
  for (bool fp8 : {false, true})
    add(r, fp8 ? "m_grouped_fp8_gemm_nt_contiguous" : "m_grouped_bf16_gemm_nt_contiguous",
        fmt::format("6x~96 n=384 k=512{} align={}", fp8 ? " 1x128 . 128x128" : "",
                    g::get_mk_alignment_for_contiguous_layout()),
        kBf16Tolerance, true, [fp8] { return verify_contiguous(fp8, 6, 96, 384, 512); });
  add(r, "m_grouped_bf16_gemm_nt_masked", "6x~40 n=384 k=512", kBf16Tolerance, true,
      [] { return verify_masked(6, 40, 384, 512); });
  add(r, "k_grouped_fp8_gemm_tn_contiguous", "ks=256,0,128,384,0 m=96 n=160 d=f32 +C",
      kF32Tolerance, true, [] { return verify_k_grouped(96, 160); });
}

}  // namespace dsk::bench
