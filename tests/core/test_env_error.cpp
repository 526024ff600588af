#include "common/test_util.hpp"

namespace dsk {
namespace {

TEST(Error, MessageNamesFunctionArgumentExpectationAndValue) {
  try {
    DSK_CHECK_ARG(1 + 1 == 3, "fp8_gemm_nt", "a", "a 2-D tensor", 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "fp8_gemm_nt: a: expected a 2-D tensor, got 3");
    EXPECT_EQ(e.function(), "fp8_gemm_nt");
    EXPECT_EQ(e.argument(), "a");
  }
}

TEST(Error, TensorChecksDescribeTheTensor) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::bf16);
  try {
    check::dim("bf16_gemm_nt", "b", t, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bf16_gemm_nt: b: expected 2 dimensions, got 3 (bfloat16[2, 3, 4])");
  }
  EXPECT_THROW(check::dtype("f", "x", t, DType::e4m3), Error);
  EXPECT_THROW(check::dtype_in("f", "x", t, {DType::f32, DType::e4m3}), Error);
  EXPECT_NO_THROW(check::dtype_in("f", "x", t, {DType::f32, DType::bf16}));
  EXPECT_THROW(check::shape("f", "x", t, {2, -1, 5}), Error);
  EXPECT_NO_THROW(check::shape("f", "x", t, {2, -1, 4}));
  EXPECT_THROW(check::contiguous("f", "x", t.transpose(0, 2)), Error);
  EXPECT_THROW(check::defined("f", "x", Tensor()), Error);
  EXPECT_THROW(check::in_range("f", "k", 0, 1, 8), Error);
}

TEST(Env, ModulePrefixOverridesGlobalOverridesDefault) {
  test::ScopedEnv a("DSK_TESTMOD_SOME_KNOB", nullptr);
  test::ScopedEnv b("DSK_SOME_KNOB", nullptr);
  EXPECT_EQ(env::get_string("TESTMOD", "SOME_KNOB", "default"), "default");
  {
    test::ScopedEnv g("DSK_SOME_KNOB", "global");
    EXPECT_EQ(env::get_string("TESTMOD", "SOME_KNOB", "default"), "global");
    test::ScopedEnv m("DSK_TESTMOD_SOME_KNOB", "module");
    EXPECT_EQ(env::get_string("TESTMOD", "SOME_KNOB", "default"), "module");
    EXPECT_EQ(env::get_string("", "SOME_KNOB", "default"), "global");
    EXPECT_EQ(env::get_string("OTHER", "SOME_KNOB", "default"), "global");
  }
}

TEST(Env, TypedValuesAndBadValues) {
  test::ScopedEnv b("DSK_SOME_FLAG", "yes");
  EXPECT_TRUE(env::get_bool("", "SOME_FLAG", false));
  test::ScopedEnv b2("DSK_SOME_FLAG", "Off");
  EXPECT_FALSE(env::get_bool("", "SOME_FLAG", true));
  test::ScopedEnv b3("DSK_SOME_FLAG", "maybe");
  try {
    env::get_bool("", "SOME_FLAG", true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSK_SOME_FLAG"), std::string::npos) << e.what();
  }
  test::ScopedEnv i("DSK_SOME_INT", "42");
  EXPECT_EQ(env::get_int("", "SOME_INT", 0), 42);
  test::ScopedEnv i2("DSK_SOME_INT", "42x");
  EXPECT_THROW(env::get_int("", "SOME_INT", 0), Error);
}

TEST(Env, KnownVariablesAndPrefixedForms) {
  EXPECT_TRUE(env::is_known_variable("DSK_JIT_CACHE_DIR"));
  EXPECT_TRUE(env::is_known_variable("DSK_GEMM_JIT_CACHE_DIR"));
  EXPECT_TRUE(env::is_known_variable("DSK_BACKEND"));
  EXPECT_FALSE(env::is_known_variable("DSK_GEMM_BACKEND"));
  EXPECT_FALSE(env::is_known_variable("DSK_JIT_CACHE_DIRR"));
  test::ScopedEnv v("DSK_ZZZ_TEST", "1");
  bool found = false;
  for (auto& [k, val] : env::dsk_variables_in_effect())
    found |= (k == "DSK_ZZZ_TEST" && val == "1");
  EXPECT_TRUE(found);
}

TEST(Cpu, FeaturesAndBackends) {
  const CpuFeatures& f = cpu_features();
  EXPECT_FALSE(f.vendor.empty());
  EXPECT_TRUE(backend_supported(Backend::generic));
  if (f.amx_tile) {
    EXPECT_TRUE(f.amx_permitted) << "the kernel refused the AMX tile permission";
  }
  EXPECT_TRUE(backend_supported(best_backend()));
  EXPECT_EQ(parse_backend("avx512"), Backend::avx512);
  EXPECT_THROW(parse_backend("sse"), Error);
  for (Backend b : {Backend::avx512, Backend::amx}) {
    if (!backend_supported(b)) {
      EXPECT_THROW(set_backend(b), Error);
    }
  }
  const Backend before = backend();
  set_backend(Backend::generic);
  EXPECT_EQ(backend(), Backend::generic);
  set_backend(before);
}

}  // namespace
}  // namespace dsk
