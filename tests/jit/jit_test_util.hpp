// Shared fixture and helpers of the dsk::jit tests: a private cache root per test, the sample
// kernel's data and reference, child processes, and fake compilers.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <dsk/jit.hpp>
#include <dsk/kernels/jit_test/rowsum.hpp>

#include "common/test_util.hpp"

namespace dsk::jit::testing {

namespace fs = std::filesystem;
using kernels::jit_test::RowsumArgs;

// The runtime-shape variant, compiled into the test program with the build's baseline flags.
inline void rowsum_runtime(const RowsumArgs& args) {
  kernels::jit_test::rowsum<kernels::jit_test::RowsumConfig{.cols = 0, .rows_per_step = 1}>(args);
}

// A row-major matrix with padded rows; the padding holds NaN, which a correct kernel never reads.
struct Matrix {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<float> x;
};

inline Matrix random_matrix(int64_t rows, int64_t cols) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Matrix m{rows, cols, cols + 3, {}};
  m.x.assign(static_cast<size_t>(rows * m.ld), std::nanf(""));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m.x[static_cast<size_t>(r * m.ld + c)] = dist(rng);
  return m;
}

// Runs a kernel on `m` into a NaN-poisoned output.
template <class Kernel>
std::vector<float> run_rowsum(const Kernel& kernel, const Matrix& m) {
  std::vector<float> y(static_cast<size_t>(m.rows), std::nanf(""));
  kernel(RowsumArgs{m.x.data(), y.data(), m.rows, m.cols, m.ld});
  return y;
}

inline std::vector<float> run_entry(Entry entry, const Matrix& m) {
  std::vector<float> y(static_cast<size_t>(m.rows), std::nanf(""));
  const RowsumArgs args{m.x.data(), y.data(), m.rows, m.cols, m.ld};
  entry(&args);
  return y;
}

// Sums in double: the result of a float kernel must be within a few ulps of the row's magnitude.
inline void expect_close_to_reference(const std::vector<float>& y, const Matrix& m) {
  ASSERT_EQ(static_cast<int64_t>(y.size()), m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    double sum = 0, magnitude = 0;
    for (int64_t c = 0; c < m.cols; ++c) {
      sum += m.x[static_cast<size_t>(r * m.ld + c)];
      magnitude += std::fabs(m.x[static_cast<size_t>(r * m.ld + c)]);
    }
    EXPECT_NEAR(y[static_cast<size_t>(r)], sum, 1e-6 * magnitude + 1e-30) << "row " << r;
  }
}

// Bitwise equality (memcmp semantics, so NaN in the same place compares equal).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y);
         });
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The directories directly under `dir` (none when it does not exist).
inline std::vector<fs::path> subdirectories(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory()) out.push_back(e.path());
  return out;
}

// Runs fn in a forked child that exits with fn's return value (98 when it throws), without
// running the parent's static destructors.
inline pid_t fork_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 98;
  try {
    code = fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
  }
  std::fflush(nullptr);
  _exit(code);
}

// The child's exit code, or -1 when it did not exit normally.
inline int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// A shell script that answers `--version` with `version` (and appends "version" to `log`), and
// otherwise appends "compile" to `log` and runs `compile_command "$@"`.
inline fs::path write_fake_compiler(const fs::path& path, const std::string& version,
                                    const fs::path& log, const std::string& compile_command) {
  std::string script = R"(#!/bin/sh
if [ "$1" = --version ]; then
  echo version >> '@LOG@'
  echo '@VERSION@'
  exit 0
fi
echo compile >> '@LOG@'
@COMPILE@ "$@"
)";
  script = replace_all(script, "@LOG@", log.string());
  script = replace_all(script, "@VERSION@", version);
  script = replace_all(script, "@COMPILE@", compile_command);
  write_file(path, script);
  fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  return path;
}

// Every test gets its own cache root, the build's compiler, no inherited JIT settings, and a
// process state as if freshly started.
class JitTest : public ::testing::Test {
 protected:
  void SetUp() override { detail::reset_process_state(); }
  void TearDown() override { detail::reset_process_state(); }

  // The sample kernel with a dependency signature unique to this test run, so that no entry of
  // another test or process matches it.
  KernelSource sample(int cols, int rows_per_step) const {
    KernelSource s = sample_kernel(cols, rows_per_step);
    s.dependency_signature = signature_;
    return s;
  }

  fs::path cache_root() const { return cache_.path(); }

  test::TempDir cache_;
  test::TempDir scratch_;
  test::ScopedEnv cache_dir_{"DSK_JIT_CACHE_DIR", cache_.path().c_str()};
  test::ScopedEnv jit_{"DSK_JIT",
                       "1"};  // the sample kernels are generic (auto would not build them)
  test::ScopedEnv cxx_{"DSK_JIT_CXX", DSK_TEST_CXX_COMPILER};
  test::ScopedEnv flags_{"DSK_JIT_FLAGS", nullptr};
  test::ScopedEnv debug_{"DSK_JIT_DEBUG", nullptr};
  test::ScopedEnv include_{"DSK_JIT_INCLUDE_DIR", nullptr};
  std::string signature_ =
      "test-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}());
};

}  // namespace dsk::jit::testing
