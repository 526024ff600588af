// Helpers shared by the GoogleTest suites.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>

#include <dsk/core.hpp>

namespace dsk::test {

// Skips (not fails) the current test when this CPU cannot run backend `b`.
#define DSK_SKIP_UNLESS_BACKEND(b)                                                \
  do {                                                                            \
    if (!::dsk::backend_supported(b))                                             \
      GTEST_SKIP() << "this CPU has no " << ::dsk::backend_name(b) << " backend"; \
  } while (0)

// Every backend this CPU supports, for parameterised tests.
std::vector<Backend> supported_backends();

// Sets the process backend for a scope and restores the previous one.
class ScopedBackend {
 public:
  explicit ScopedBackend(Backend b) : saved_(backend()) { set_backend(b); }
  ~ScopedBackend() { set_backend(saved_); }

 private:
  Backend saved_;
};

// Calls set(value) for a scope and set(nullopt) at its end: the internal switches that pick a
// kernel form for tests (mla::detail::set_products_override,
// gemm::detail::set_mqa_products_override).
template <class T>
class ScopedOverride {
 public:
  ScopedOverride(void (*set)(std::optional<T>), T value) : set_(set) { set_(value); }
  ~ScopedOverride() { set_(std::nullopt); }
  ScopedOverride(const ScopedOverride&) = delete;
  ScopedOverride& operator=(const ScopedOverride&) = delete;

 private:
  void (*set_)(std::optional<T>);
};

// A parameterised test that runs once per backend this CPU supports, with the process backend
// set to the parameter for the test's duration:
//   class MySuite : public dsk::test::PerBackend {};
//   TEST_P(MySuite, Case) { ... }
//   DSK_INSTANTIATE_PER_BACKEND(MySuite);   // names Backends/MySuite.Case/avx512, ...
class PerBackend : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { scoped_.emplace(GetParam()); }
  void TearDown() override { scoped_.reset(); }

 private:
  std::optional<ScopedBackend> scoped_;
};

#define DSK_INSTANTIATE_PER_BACKEND(Suite)                                            \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite,                                           \
                           ::testing::ValuesIn(::dsk::test::supported_backends()),    \
                           [](const ::testing::TestParamInfo<::dsk::Backend>& info) { \
                             return std::string(::dsk::backend_name(info.param));     \
                           })

// Sets (or unsets, with nullptr) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();

 private:
  std::string name_;
  std::optional<std::string> saved_;
};

// A fresh directory under the system temp dir, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Same shape, dtype and bytes (NaN payloads included): the check of a bitwise-repeatable result.
bool bitwise_equal(const Tensor& a, const Tensor& b);

// Runs a shell command; returns its exit status and captures stdout+stderr into *output.
int run_command(const std::string& command, std::string* output = nullptr);

}  // namespace dsk::test
