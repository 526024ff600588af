// The worked example of docs/tile.md: its AMX instantiation compiles on every CPU, and the tests
// built with the AVX-512 flags (test_worked_example_avx512.cpp) are registered here.
#include <dsk/jit.hpp>

#include "common/isa_test.hpp"
#include "common/test_util.hpp"

namespace dsk {
namespace {

// Builds the AMX instantiation even where it cannot run, so the AMX path compiles everywhere.
TEST(WorkedExample, AmxInstantiationCompiles) {
  test::TempDir cache;
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", cache.path().c_str());
  if (!jit::availability().available) GTEST_SKIP() << "no usable compiler for the JIT here";
  const jit::Loaded loaded = jit::load(jit::tile_example_kernel(Backend::amx, 256));
  EXPECT_NE(loaded.entry, nullptr);
  EXPECT_EQ(loaded.origin, jit::Origin::compiled);
}

}  // namespace
}  // namespace dsk

namespace dsk::test {
DSK_REGISTER_ISA_TESTS(worked_example_avx512_tests);
}  // namespace dsk::test
