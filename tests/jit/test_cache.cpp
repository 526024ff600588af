// dsk::jit's disk cache under stress: processes racing to publish, damaged entries, unwritable
// roots, several roots, and the management API (list, clear).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <sys/stat.h>

#include <cstdio>

#include "jit/jit_test_util.hpp"

namespace dsk::jit::testing {
namespace {

using JitCache = JitTest;

// Child exit codes.
constexpr int kCompiled = 0, kFoundOnDisk = 1, kWrongResult = 2;

// Loads `s` in the calling (child) process and checks the kernel against the runtime variant.
int load_and_check(const KernelSource& s) {
  const Loaded loaded = load(s);
  const Matrix m = random_matrix(13, s.name.find("c256") != std::string::npos ? 256 : 64);
  if (!same_bits(run_entry(loaded.entry, m), run_rowsum(&rowsum_runtime, m))) return kWrongResult;
  return loaded.origin == Origin::compiled ? kCompiled : kFoundOnDisk;
}

std::string xxh3_hex(const std::string& bytes) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
  std::string hex;
  char two[3];
  for (unsigned char b : c.digest) {
    std::snprintf(two, sizeof(two), "%02x", b);
    hex += two;
  }
  return hex;
}

// Replaces a file by a new one (a new inode: this process may have the old one mapped, and
// changing a mapped library in place would crash it, not test the cache).
void replace_file(const fs::path& path, const std::string& bytes) {
  write_file(path.string() + ".new", bytes);
  fs::rename(path.string() + ".new", path);
}

// Replaces kernel.so by `bytes` and makes meta.json agree, so only dlopen can tell.
void replace_library_consistently(const fs::path& dir, const std::string& bytes) {
  replace_file(dir / "kernel.so", bytes);
  replace_file(dir / "meta.json", "{\"so_bytes\": " + std::to_string(bytes.size()) +
                                      ", \"so_xxh3\": \"" + xxh3_hex(bytes) + "\"}\n");
}

TEST_F(JitCache, TwoProcessesCompilingAtOnceLeaveOneEntry) {
  const KernelSource s = sample(64, 4);
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < 2; ++i)
    children.push_back(fork_child([&] {
      close(go[1]);
      char c;
      while (read(go[0], &c, 1) > 0) {  // start together: when the parent closes the pipe
      }
      return load_and_check(s);
    }));
  close(go[0]);
  close(go[1]);
  int compiled = 0;
  for (pid_t pid : children) {
    const int code = wait_child(pid);
    EXPECT_TRUE(code == kCompiled || code == kFoundOnDisk) << "child exit code " << code;
    compiled += code == kCompiled;
  }
  RecordProperty("children_that_compiled", compiled);
  const std::vector<CacheEntry> entries = list_cache();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].committed);
  EXPECT_EQ(entries[0].name, s.name);
  EXPECT_TRUE(subdirectories(cache_root() / "tmp").empty()) << "staging directories left over";
  EXPECT_EQ(load(s).origin, Origin::disk);
}

TEST_F(JitCache, DamagedEntriesAreRebuiltWithAWarning) {
  const KernelSource s = sample(64, 4);
  // Compiled by another process, so that this one has never dlopened the file.
  ASSERT_EQ(wait_child(fork_child([&] { return load_and_check(s); })), kCompiled);
  const fs::path dir = cache_root() / "cache" / (s.name + "." + cache_key(s).digest);
  const Matrix m = random_matrix(8, 64);
  const std::vector<float> expected = run_rowsum(&rowsum_runtime, m);

  auto expect_rebuilt = [&](const std::string& problem) {
    ::testing::internal::CaptureStderr();
    const Loaded loaded = load(s);
    const std::string warnings = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(loaded.origin, Origin::compiled);
    EXPECT_EQ(stats().rebuilds, 1);
    EXPECT_NE(warnings.find("rebuilding it"), std::string::npos) << warnings;
    EXPECT_NE(warnings.find(problem), std::string::npos) << warnings;
    EXPECT_TRUE(same_bits(run_entry(loaded.entry, m), expected));
    EXPECT_TRUE(fs::exists(dir / ".committed"));
    EXPECT_TRUE(subdirectories(cache_root() / "tmp").empty());
    detail::reset_process_state();
  };
  // A kernel.so that agrees with meta.json but is not a shared object: only dlopen can tell.
  replace_library_consistently(dir, std::string(4096, 'x'));
  expect_rebuilt("does not load");
  // A truncated kernel.so.
  const std::string library = read_file(dir / "kernel.so");
  replace_file(dir / "kernel.so", library.substr(0, library.size() / 2));
  expect_rebuilt("bytes where meta.json records");
  // A meta.json that does not say what kernel.so should be.
  replace_file(dir / "meta.json", "{\"so_bytes\": \"many\"}");
  expect_rebuilt("unreadable meta.json");
  // An entry without .committed.
  fs::remove(dir / ".committed");
  expect_rebuilt("no .committed");
  // And an intact entry is simply loaded.
  EXPECT_EQ(load(s).origin, Origin::disk);
}

TEST_F(JitCache, UnwritableRootFallsBackToAPrivateTemporaryRoot) {
  // Root ignores permission bits, so the root is made unwritable by placing it under a file.
  const fs::path file = scratch_.path() / "a-file";
  write_file(file, "not a directory");
  const fs::path unwritable = file / "cache-root";
  test::ScopedEnv root("DSK_JIT_CACHE_DIR", unwritable.c_str());
  const KernelSource s = sample(64, 4);
  ::testing::internal::CaptureStderr();
  const Kernel<RowsumArgs> kernel = get<RowsumArgs>(s, &rowsum_runtime);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(kernel.provider(), Provider::jit);
  EXPECT_EQ(count_of(warnings, "dsk::jit: warning:"), 1) << warnings;
  EXPECT_NE(warnings.find("is not writable"), std::string::npos) << warnings;
  const fs::path private_root = writable_cache_root();
  EXPECT_NE(private_root, unwritable);
  EXPECT_EQ(private_root.parent_path(), fs::temp_directory_path());
  EXPECT_NE(warnings.find(private_root.string()), std::string::npos) << warnings;
  EXPECT_EQ(subdirectories(private_root / "cache").size(), 1u);
  const Matrix m = random_matrix(5, 64);
  expect_close_to_reference(run_rowsum(kernel, m), m);

  // Several roots: all are searched (a hit in the second writes nothing to the first).
  const fs::path first = scratch_.path() / "first";
  const std::string both = first.string() + ":" + private_root.string();
  test::ScopedEnv roots("DSK_JIT_CACHE_DIR", both.c_str());
  detail::reset_process_state();
  EXPECT_EQ(cache_roots(), (std::vector<fs::path>{first, private_root}));
  const Loaded loaded = load(s);
  EXPECT_EQ(loaded.origin, Origin::disk);
  EXPECT_EQ(loaded.path.parent_path().parent_path(), private_root);
  EXPECT_FALSE(fs::exists(first / "cache"));

  if (geteuid() != 0) {  // for other users a read-only directory is unwritable too
    const fs::path read_only = scratch_.path() / "read-only";
    fs::create_directories(read_only);
    fs::permissions(read_only, fs::perms::owner_read | fs::perms::owner_exec);
    test::ScopedEnv ro("DSK_JIT_CACHE_DIR", read_only.c_str());
    EXPECT_NE(writable_cache_root(), read_only);
  }
}

TEST_F(JitCache, ListAndClear) {
  const fs::path root2 = scratch_.path() / "second";
  const std::string roots = cache_root().string() + ":" + root2.string();
  test::ScopedEnv env("DSK_JIT_CACHE_DIR", roots.c_str());
  const std::string digest(32, 'a');
  write_file(cache_root() / "cache" / ("rowsum_a." + digest) / "kernel.so", std::string(100, 'x'));
  write_file(cache_root() / "cache" / ("rowsum_a." + digest) / ".committed", digest);
  write_file(cache_root() / "cache" / ("gemm_b." + digest) / "kernel.cpp", std::string(10, 'y'));
  write_file(root2 / "cache" / ("rowsum_c." + digest) / ".committed", digest);
  write_file(cache_root() / "failed" / ("gemm_b." + digest + ".log"), "error");
  // Staging directories: one of a process that has exited, one of this (live) process.
  const pid_t dead = fork_child([] { return 0; });
  wait_child(dead);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string host_tag;
  for (const char* c = host; *c; ++c)
    if (std::isalnum(static_cast<unsigned char>(*c)) || *c == '-') host_tag += *c;
  const fs::path stale =
      cache_root() / "tmp" / ("x." + host_tag + "." + std::to_string(dead) + ".0123");
  const fs::path live =
      cache_root() / "tmp" / ("x." + host_tag + "." + std::to_string(getpid()) + ".0123");
  fs::create_directories(stale);
  fs::create_directories(live);

  const std::vector<CacheEntry> entries = list_cache();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name, "gemm_b");
  EXPECT_FALSE(entries[0].committed);
  EXPECT_EQ(entries[0].bytes, 10u);
  EXPECT_EQ(entries[1].name, "rowsum_a");
  EXPECT_EQ(entries[1].digest, digest);
  EXPECT_TRUE(entries[1].committed);
  EXPECT_EQ(entries[1].bytes, 132u);
  EXPECT_GE(entries[1].age_s, 0.0);
  EXPECT_LT(entries[1].age_s, 3600.0);
  EXPECT_EQ(entries[2].path.parent_path().parent_path(), root2);

  const ClearResult by_prefix = clear_cache("rowsum");
  EXPECT_EQ(by_prefix.entries, 2);
  EXPECT_EQ(by_prefix.bytes, 132u + 32u);
  EXPECT_TRUE(by_prefix.errors.empty());
  ASSERT_EQ(list_cache().size(), 1u);
  EXPECT_TRUE(fs::exists(stale)) << "a prefix clears entries only";

  const ClearResult all = clear_cache();
  EXPECT_EQ(all.entries, 1);
  EXPECT_TRUE(list_cache().empty());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live)) << "a live process's staging directory is kept";
  EXPECT_TRUE(fs::is_empty(cache_root() / "failed"));
}

}  // namespace
}  // namespace dsk::jit::testing
