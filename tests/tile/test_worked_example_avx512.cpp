// The worked example of docs/tile.md: the scaled row-sum kernel (dsk/kernels/examples/
// scaled_rowsum.hpp) compiled through dsk::jit for each backend, run, and compared bit for bit
// with its runtime-shape instantiation built into this test, across backends, and with an fp64
// reference. This TU has the AVX-512 flags, so it can build the generic and avx512 variants.
#include <fmt/core.h>

#include <cmath>

#include <dsk/jit.hpp>
#include <dsk/kernels/examples/scaled_rowsum.hpp>
#include <dsk/ref.hpp>

#include "common/isa_test.hpp"
#include "common/test_util.hpp"

namespace dsk {
namespace {

namespace ex = kernels::examples;
using RuntimeVariant = void (*)(const ex::ScaledRowsumArgs&);

// What a user writes to run the kernel through the JIT (docs/tile.md shows its body).
jit::KernelSource scaled_rowsum_source(Backend isa, int cols) {
  return jit::tile_example_kernel(isa, cols);
}

RuntimeVariant runtime_variant(Backend isa) {
  if (isa == Backend::generic) return &ex::scaled_rowsum<tile::generic_t, ex::ScaledRowsumConfig{}>;
  return &ex::scaled_rowsum<tile::avx512_t, ex::ScaledRowsumConfig{}>;
}

struct Problem {
  Tensor x, scale;
  int64_t rows, cols;
};

// x is a column slice of a wider matrix, so rows are strided.
Problem make_problem(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor wide = ref::randn({rows, cols + 5}, DType::bf16, seed);
  return {wide.slice(1, 2, 2 + cols), ref::randn({rows}, DType::f32, seed + 1), rows, cols};
}

Tensor run(const jit::Kernel<ex::ScaledRowsumArgs>& kernel, const Problem& p) {
  Tensor y = Tensor::empty({p.rows}, DType::f32);
  ref::poison(y);
  kernel({p.x.data<bf16>(), p.scale.data<float>(), y.data<float>(), p.rows, p.cols, p.x.stride(0)});
  EXPECT_EQ(ref::count_poisoned(y), 0);
  return y;
}

// |y - scale * sum| <= |scale| * cols * 2^-24 * sum |x|: each of the cols f32 additions rounds
// once.
void expect_near_fp64(const Tensor& y, const Problem& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    double sum = 0, magnitude = 0;
    for (int64_t c = 0; c < p.cols; ++c) {
      const double v = bf16_to_f32(p.x.at<bf16>({r, c}));
      sum += v;
      magnitude += std::fabs(v);
    }
    const double scale = p.scale.at<float>({r});
    const double bound =
        std::fabs(scale) * (static_cast<double>(p.cols) * 0x1p-24 * magnitude + 1e-30);
    EXPECT_LE(std::fabs(y.at<float>({r}) - scale * sum), bound) << "row " << r;
  }
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what;
}

void scaled_rowsum_through_the_jit_on_every_backend() {
  test::TempDir cache;
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", cache.path().c_str());
  test::ScopedEnv generic_too("DSK_JIT", "1");
  const std::vector<Backend> isas = {Backend::generic, Backend::avx512};
  if (!jit::availability().available) GTEST_SKIP() << "no usable compiler for the JIT here";
  for (auto [rows, cols] : {std::pair{1, 7}, {16, 32}, {37, 100}, {70, 256}}) {
    const Problem p = make_problem(rows, cols, 1000 + rows);
    std::vector<Tensor> results;
    for (Backend isa : isas) {
      if (!backend_supported(isa)) continue;
      const std::string what = fmt::format("{} rows {} cols {}", backend_name(isa), rows, cols);
      // Shape-specialised (cols fixed at compile time) when cols is the common 256.
      const auto kernel = jit::get<ex::ScaledRowsumArgs>(
          scaled_rowsum_source(isa, cols == 256 ? 256 : 0), runtime_variant(isa));
      EXPECT_EQ(kernel.provider(), jit::Provider::jit) << what;
      const Tensor y = run(kernel, p);
      const jit::Kernel<ex::ScaledRowsumArgs> built_in(nullptr, runtime_variant(isa),
                                                       jit::Provider::runtime);
      expect_bitwise_equal(y, run(built_in, p), "JIT vs runtime-shape build, " + what);
      expect_near_fp64(y, p);
      results.push_back(y);
    }
    for (size_t i = 1; i < results.size(); ++i)
      expect_bitwise_equal(results[0], results[i], fmt::format("backends differ, cols {}", cols));
  }
}

void amx_instantiation_matches_avx512() {
  test::TempDir cache;
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", cache.path().c_str());
  const Problem p = make_problem(45, 200, 7);
  const auto amx = jit::get<ex::ScaledRowsumArgs>(scaled_rowsum_source(Backend::amx, 0),
                                                  runtime_variant(Backend::avx512));
  ASSERT_EQ(amx.provider(), jit::Provider::jit);
  const jit::Kernel<ex::ScaledRowsumArgs> avx512(nullptr, runtime_variant(Backend::avx512),
                                                 jit::Provider::runtime);
  expect_bitwise_equal(run(amx, p), run(avx512, p), "amx vs avx512");
}

}  // namespace
}  // namespace dsk

// Registered by a baseline file (common/isa_test.hpp).
namespace dsk::test {
DSK_ISA_TESTS(worked_example_avx512_tests,
              {"WorkedExample", "ScaledRowsumThroughTheJitOnEveryBackend", Backend::avx512,
               &scaled_rowsum_through_the_jit_on_every_backend},
              {"WorkedExample", "AmxInstantiationMatchesAvx512", Backend::amx,
               &amx_instantiation_matches_avx512});
}  // namespace dsk::test
