// The small-M path of the dense GEMMs (decode: segments of up to 16 rows take it, 17 and more the
// large-M path) for every row count from 1 to 16 and across the 16 / 17 boundary, on shapes with N
// and K tails (N < 64, N not a multiple of 64, K odd or not a multiple of 32), BF16 and FP8 / FP4
// weights with every scale mode (promoted FP32, promoted UE8M0, folded FP4 powers of two):
// against the dequantized dsk::ref oracle, and for the bits the row tiling must keep. Each row of
// an M-row call equals the one-row call of that row, so every tile shape (one full-width tile,
// 32-column tiles, groups of 6 rows) and both paths sum K in the same order; results do not
// depend on the thread count; the JIT-compiled kernels give the built-in ones' bits.
#include <vector>

#include <dsk/jit.hpp>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

// 1..6 rows: one full-width tile; 7..12: 32-column tiles; 13..16: groups of 6 + 6 + (1..4) rows;
// 17, 18, 24: the large-M path.
std::vector<int64_t> row_counts() {
  std::vector<int64_t> m;
  for (int64_t i = 1; i <= 18; ++i) m.push_back(i);
  m.push_back(24);
  return m;
}

struct Nk {
  int64_t n, k;
};
// One partial panel; two panels and a tail of 22 columns; N and K both off every block size.
constexpr Nk kBf16Shapes[] = {{17, 301}, {150, 97}, {130, 545}};
// FP8 / FP4 K: 128-value scale blocks with a tail (and FP4's 32-value blocks with one too).
constexpr Nk kFp8Shapes[] = {{17, 300}, {150, 556}};

struct Fp8Case {
  const char* name;
  Quant a, b;
};
constexpr Fp8Case kFp8Cases[] = {
    {"promoted f32 (1, 128, 128)", Quant::token_f32, Quant::block_f32},
    {"promoted ue8m0 (1, 1, 128)", Quant::token_ue8m0, Quant::token_ue8m0},
    {"fp8 x fp4, folded", Quant::token_ue8m0, Quant::fp4},
    {"fp4 x fp4, folded", Quant::fp4, Quant::fp4},
};

// Rows [r0, r1) of an FP8 / FP4 operand with per-row scales.
Fp8Tensor rows_of(const Fp8Tensor& x, int64_t r0, int64_t r1) {
  return {x.data.slice(0, r0, r1), x.sf.slice(0, r0, r1)};
}

// The operands of one case and the call under test, D = A . B^T in f32 (the tightest check).
struct Problem {
  Tensor a, b;          // bf16
  QuantOperand qa, qb;  // FP8 / FP4 cases only
  bool fp8 = false;

  Tensor expected() const { return fp8 ? ref::gemm_nt(qa.values, qb.values) : ref::gemm_nt(a, b); }

  // Rows [r0, r1) of A times B into d (r1 - r0 rows).
  void run(int64_t r0, int64_t r1, const Tensor& d) const {
    if (fp8)
      gemm::fp8_fp4_gemm_nt(rows_of(qa.x, r0, r1), qb.x, d, std::nullopt, std::nullopt, qa.recipe,
                            qb.recipe);
    else
      gemm::bf16_gemm_nt(a.slice(0, r0, r1), b, d);
  }

  Tensor run_all() const {
    Tensor d = poisoned({a.size(0), b.size(0)}, DType::f32);
    run(0, a.size(0), d);
    return d;
  }
};

Problem bf16_problem(int64_t m, Nk s) {
  Problem p;
  p.a = randn_bf16({m, s.k});
  p.b = randn_bf16({s.n, s.k});
  return p;
}

Problem fp8_problem(const Fp8Case& c, int64_t m, Nk s) {
  Problem p = bf16_problem(m, s);
  p.fp8 = true;
  p.qa = quantize(p.a, c.a);
  p.qb = quantize(p.b, c.b);
  return p;
}

// Every problem of the suite: BF16 on its shapes, each FP8 / FP4 case on its own.
template <class Check>
void for_each_problem(int64_t m, Check check) {
  for (Nk s : kBf16Shapes) check(bf16_problem(m, s), fmt::format("bf16 n={} k={}", s.n, s.k));
  for (const Fp8Case& c : kFp8Cases)
    for (Nk s : kFp8Shapes)
      check(fp8_problem(c, m, s), fmt::format("{} n={} k={}", c.name, s.n, s.k));
}

// The built-in kernels on every backend (the JIT has its own test below).
class SmallM : public test::PerBackend {
 private:
  test::ScopedEnv no_jit_{"DSK_GEMM_JIT", "0"};
};

TEST_P(SmallM, EveryRowCountMatchesTheReference) {
  SCOPED_TRACE(seed_note());
  for (int64_t m : row_counts())
    for_each_problem(m, [m](const Problem& p, const std::string& what) {
      SCOPED_TRACE(fmt::format("m={} {}", m, what));
      const Tensor d = p.run_all();
      EXPECT_EQ(ref::count_poisoned(d), 0) << "elements never written";
      EXPECT_LT(ref::calc_diff(d, p.expected()), dequantized_tolerance(DType::f32));
    });
}

// Each row alone takes the one-row tile; together they take every other tile shape, or the
// large-M path from 17 rows on. With the VDPBF16PS numerics (avx512, generic) all of them add the
// products of a row in one order, so the bits agree. On amx the tile path (from 5 rows on) rounds
// differently from the dot path, so there the property is deterministic mode's, which sends every
// M through the tiles.
TEST_P(SmallM, EachRowEqualsItsOneRowCall) {
  SCOPED_TRACE(seed_note());
  const bool was_deterministic = get_deterministic_algorithms();
  use_deterministic_algorithms(GetParam() == Backend::amx || was_deterministic);
  for (int64_t m : row_counts()) {
    for_each_problem(m, [m](const Problem& p, const std::string& what) {
      SCOPED_TRACE(fmt::format("m={} {}", m, what));
      const Tensor all = p.run_all();
      Tensor alone = poisoned(all.sizes(), DType::f32);
      for (int64_t r = 0; r < m; ++r) p.run(r, r + 1, alone.slice(0, r, r + 1));
      EXPECT_TRUE(bitwise_equal(all, alone));
    });
  }
  use_deterministic_algorithms(was_deterministic);
}

TEST_P(SmallM, RepeatableAndIndependentOfTheThreadCount) {
  SCOPED_TRACE(seed_note());
  // Enough panels for several work items per thread.
  for (const Problem& p :
       {bf16_problem(16, {1000, 544}), fp8_problem(kFp8Cases[0], 16, {1000, 544}),
        fp8_problem(kFp8Cases[2], 13, {1000, 544})}) {
    Tensor one;
    {
      ScopedThreads threads(1);
      one = p.run_all();
    }
    for (int threads : {2, 3, 2}) {
      ScopedThreads scoped(threads);
      EXPECT_TRUE(bitwise_equal(p.run_all(), one)) << threads << " threads";
    }
  }
}

DSK_INSTANTIATE_PER_BACKEND(SmallM);

// One shape-specialised kernel per dtype serves every row count (M is a run-time value).
TEST(SmallMJit, JitKernelsMatchTheBuiltInOnes) {
  SCOPED_TRACE(seed_note());
  test::TempDir cache;
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", cache.path().c_str());
  if (!jit::availability("GEMM").available) GTEST_SKIP() << jit::availability("GEMM").reason;
  const jit::Stats before = jit::stats();
  for (int64_t m : {1, 4, 7, 12, 13, 16}) {
    SCOPED_TRACE(fmt::format("m={}", m));
    const Problem p = fp8_problem(kFp8Cases[0], m, {150, 556});
    Tensor built_in;
    {
      test::ScopedEnv off("DSK_GEMM_JIT", "0");
      built_in = p.run_all();
    }
    test::ScopedEnv on("DSK_GEMM_JIT", "1");
    EXPECT_TRUE(bitwise_equal(p.run_all(), built_in));
  }
  EXPECT_GT(jit::stats().compiles, before.compiles) << "the JIT was not used";
}

}  // namespace
}  // namespace dsk::gemm_test
