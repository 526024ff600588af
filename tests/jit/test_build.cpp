// dsk::jit builds: compile -> publish -> load, the in-process map (also under concurrent
// requests), compile errors, and the AOT and runtime-shape fallbacks, which must give the same
// bits as the JIT.
#include <atomic>
#include <thread>

#include "jit/jit_test_util.hpp"

namespace dsk::jit::testing {
namespace {

using JitBuild = JitTest;

TEST_F(JitBuild, CompilesPublishesAndLoadsFromMemoryThenDisk) {
  test::ScopedEnv debug("DSK_JIT_DEBUG", "1");
  const KernelSource s = sample(64, 4);
  ::testing::internal::CaptureStderr();
  const Kernel<RowsumArgs> kernel = get<RowsumArgs>(s, &rowsum_runtime);
  const std::string compile_log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(kernel.provider(), Provider::jit);
  EXPECT_NE(compile_log.find("miss rowsum_f32_c64r4_generic."), std::string::npos) << compile_log;
  EXPECT_NE(compile_log.find("-march=native"), std::string::npos) << compile_log;
  EXPECT_NE(compile_log.find("compiled rowsum_f32_c64r4_generic in"), std::string::npos);

  for (int64_t rows : {1, 4, 7, 33}) {
    const Matrix m = random_matrix(rows, 64);
    const std::vector<float> y = run_rowsum(kernel, m);
    expect_close_to_reference(y, m);
    EXPECT_TRUE(same_bits(y, run_rowsum(&rowsum_runtime, m))) << "rows " << rows;
  }

  // The entry: the four files, nothing left in tmp/, meta.json describing the build.
  const CacheKey key = cache_key(s);
  const fs::path dir = cache_root() / "cache" / (s.name + "." + key.digest);
  for (const char* file : {"kernel.cpp", "kernel.so", "meta.json", ".committed"})
    EXPECT_TRUE(fs::exists(dir / file)) << file;
  EXPECT_TRUE(subdirectories(cache_root() / "tmp").empty());
  EXPECT_EQ(read_file(dir / "kernel.cpp"), generate_source(s));
  const std::string meta = read_file(dir / "meta.json");
  for (const char* field : {"\"name\"", "\"digest\"", "\"compiler\"", "\"flags\"", "\"command\"",
                            "\"compile_seconds\"", "\"created\""})
    EXPECT_NE(meta.find(field), std::string::npos) << field;
  EXPECT_NE(meta.find(key.digest), std::string::npos);

  // Second request: the in-process map, no compile, no hashing.
  ::testing::internal::CaptureStderr();
  const Loaded again = load(s);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("hit (memory)"), std::string::npos);
  EXPECT_EQ(again.origin, Origin::memory);
  EXPECT_EQ(again.digest, key.digest);
  EXPECT_EQ(stats().compiles, 1);

  // A fresh process state finds it on disk.
  detail::reset_process_state();
  ::testing::internal::CaptureStderr();
  const Loaded from_disk = load(s);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("hit (disk)"), std::string::npos);
  EXPECT_EQ(from_disk.origin, Origin::disk);
  EXPECT_EQ(from_disk.path, dir);
  EXPECT_EQ(stats().compiles, 0);
  EXPECT_EQ(stats().disk_hits, 1);
  const Matrix m = random_matrix(5, 64);
  EXPECT_TRUE(same_bits(run_entry(from_disk.entry, m), run_rowsum(kernel, m)));
}

TEST_F(JitBuild, ConcurrentRequestsCompileOnce) {
  const KernelSource s = sample(256, 2);
  constexpr int kThreads = 8;
  std::vector<Loaded> results(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      results[static_cast<size_t>(t)] = load(s);
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(stats().compiles, 1);
  EXPECT_EQ(stats().memory_hits, kThreads - 1);
  int compiled = 0;
  for (const Loaded& r : results) {
    EXPECT_EQ(r.entry, results[0].entry);
    compiled += r.origin == Origin::compiled;
  }
  EXPECT_EQ(compiled, 1);
  const Matrix m = random_matrix(6, 256);
  expect_close_to_reference(run_entry(results[0].entry, m), m);
}

TEST_F(JitBuild, CompileErrorCarriesTheCompilerMessageAndTheLog) {
  KernelSource s = sample(64, 4);
  s.name = "rowsum_broken";
  s.instantiation = "dsk::kernels::jit_test::no_such_kernel<3>";
  std::string what;
  try {
    load(s);
    FAIL() << "a kernel that does not compile was loaded";
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("rowsum_broken does not compile"), std::string::npos) << what;
  EXPECT_NE(what.find("no_such_kernel"), std::string::npos) << what;
  const size_t at = what.find("Full log: ");
  ASSERT_NE(at, std::string::npos) << what;
  const fs::path log = what.substr(at + 10, what.find('\n', at) - at - 10);
  EXPECT_EQ(log.parent_path(), cache_root() / "failed");
  EXPECT_NE(read_file(log).find("no_such_kernel"), std::string::npos);
  // get() does not hide a broken kernel behind a fallback.
  EXPECT_THROW(get<RowsumArgs>(s, &rowsum_runtime), Error);
  EXPECT_TRUE(subdirectories(cache_root() / "cache").empty());
  EXPECT_TRUE(subdirectories(cache_root() / "tmp").empty());
}

TEST_F(JitBuild, AheadOfTimeAndRuntimeVariantsGiveTheJitBits) {
  const KernelSource registered = sample(64, 4);  // compiled into libdsk ahead of time
  const KernelSource unregistered = sample(48, 3);
  const Matrix m = random_matrix(23, 64);
  const Matrix m48 = random_matrix(11, 48);
  const std::vector<float> jit = run_rowsum(get<RowsumArgs>(registered, &rowsum_runtime), m);
  expect_close_to_reference(jit, m);
  EXPECT_TRUE(same_bits(run_rowsum(&rowsum_runtime, m), jit));
  EXPECT_NE(find_aot(" dsk::kernels::jit_test::rowsum < dsk::kernels::jit_test::RowsumConfig{ "
                     ".cols = 64,\n.rows_per_step = 4 } >"),
            nullptr)
      << "the AOT registry ignores blanks";

  auto expect_fallbacks = [&](const std::string& expected_warning) {
    detail::reset_process_state();
    ::testing::internal::CaptureStderr();
    const Kernel<RowsumArgs> aot = get<RowsumArgs>(registered, &rowsum_runtime);
    const Kernel<RowsumArgs> runtime = get<RowsumArgs>(unregistered, &rowsum_runtime);
    const std::string warnings = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(aot.provider(), Provider::aot);
    EXPECT_EQ(runtime.provider(), Provider::runtime);
    EXPECT_TRUE(same_bits(run_rowsum(aot, m), jit));
    expect_close_to_reference(run_rowsum(runtime, m48), m48);
    EXPECT_EQ(count_of(warnings, "dsk::jit: warning:"), 1) << warnings;
    EXPECT_NE(warnings.find(expected_warning), std::string::npos) << warnings;
    EXPECT_THROW(load(registered), Error);
  };
  {
    test::ScopedEnv off("DSK_JIT", "0");
    expect_fallbacks("runtime compilation is off (DSK_JIT=0)");
  }
  {
    test::ScopedEnv missing("DSK_JIT_CXX", "/nonexistent/c++");
    expect_fallbacks("'/nonexistent/c++' cannot be run");
  }
  {  // a compiler that runs but cannot compile anything: found out by the trivial probe
    const fs::path log = scratch_.path() / "calls.log";
    const fs::path cc = write_fake_compiler(scratch_.path() / "cc", "brokencc 1", log, "false");
    test::ScopedEnv broken("DSK_JIT_CXX", cc.c_str());
    expect_fallbacks("fails to compile a trivial file");
  }
  {  // DSK_<MODULE>_JIT=0 turns off one module only
    test::ScopedEnv off("DSK_TESTMOD_JIT", "0");
    KernelSource in_module = registered;
    in_module.module = "TESTMOD";
    detail::reset_process_state();
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(get<RowsumArgs>(in_module, &rowsum_runtime).provider(), Provider::aot);
    EXPECT_NE(::testing::internal::GetCapturedStderr().find("DSK_TESTMOD_JIT=0"),
              std::string::npos);
    EXPECT_EQ(get<RowsumArgs>(registered, &rowsum_runtime).provider(), Provider::jit);
  }
}

// DSK_JIT=auto (the default): get() takes a generic kernel from its AOT instantiation or runtime
// variant without compiling it or warning, and still compiles the other backends' kernels;
// DSK_JIT=1 and load() compile generic ones too.
TEST_F(JitBuild, AutoCompilesOnlyTheNonGenericKernels) {
  const KernelSource registered = sample(64, 4);  // compiled into libdsk ahead of time
  const KernelSource unregistered = sample(48, 3);
  KernelSource avx512 = sample(32, 2);
  avx512.name = "rowsum_f32_c32r2_avx512";
  avx512.isa = Backend::avx512;  // compiled, never run: this CPU may lack AVX-512
  for (const char* mode : {static_cast<const char*>(nullptr), "auto", "AUTO", " "}) {
    SCOPED_TRACE(mode ? mode : "unset");
    test::ScopedEnv env("DSK_JIT", mode);
    detail::reset_process_state();
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(get<RowsumArgs>(registered, &rowsum_runtime).provider(), Provider::aot);
    EXPECT_EQ(get<RowsumArgs>(unregistered, &rowsum_runtime).provider(), Provider::runtime);
    EXPECT_EQ(stats().compiles, 0u);
    EXPECT_EQ(get<RowsumArgs>(avx512, &rowsum_runtime).provider(), Provider::jit);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "auto is not a fallback";
    EXPECT_TRUE(availability().available);
  }
  {
    test::ScopedEnv unset("DSK_JIT", nullptr);
    EXPECT_EQ(load(unregistered).origin, Origin::compiled) << "load() compiles what it is asked";
  }
  detail::reset_process_state();
  test::ScopedEnv on("DSK_JIT", "1");
  EXPECT_EQ(get<RowsumArgs>(unregistered, &rowsum_runtime).provider(), Provider::jit);
}

TEST_F(JitBuild, AvailabilitySaysWhyNot) {
  EXPECT_TRUE(availability().available) << availability().reason;
  {
    test::ScopedEnv off("DSK_JIT", "no");
    EXPECT_FALSE(availability().available);
    EXPECT_NE(availability().reason.find("DSK_JIT=0"), std::string::npos);
  }
  {
    test::ScopedEnv missing("DSK_JIT_CXX", "/nonexistent/c++");
    EXPECT_FALSE(availability().available);
    EXPECT_NE(availability().reason.find("/nonexistent/c++"), std::string::npos);
  }
  {  // no kernel headers: the JIT cannot work, get() falls back
    test::ScopedEnv include("DSK_JIT_INCLUDE_DIR", scratch_.path().c_str());
    EXPECT_FALSE(availability().available);
    EXPECT_NE(availability().reason.find("has no dsk/kernels"), std::string::npos);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(get<RowsumArgs>(sample(64, 4), &rowsum_runtime).provider(), Provider::aot);
    EXPECT_EQ(count_of(::testing::internal::GetCapturedStderr(), "has no dsk/kernels"), 1);
  }
  {
    test::ScopedEnv bad("DSK_JIT", "maybe");
    EXPECT_THROW(availability(), Error) << "a malformed value is an error, not a fallback";
  }
}

}  // namespace
}  // namespace dsk::jit::testing
