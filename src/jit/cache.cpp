// The JIT's disk cache: roots, entry checks, atomic publishing, and the management API behind
// `dsk jit ls|clear`.
//
// Layout of one root:
//   <root>/cache/<name>.<digest>/{kernel.cpp, kernel.so, meta.json, .committed}
//   <root>/tmp/<name>.<host>.<pid>.<random>/    entries being built
//   <root>/failed/<name>.<digest>.log           the full log of the last failed compile
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <random>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "internal.hpp"

namespace dsk::jit::internal {
namespace {

// The directory a process writes to when its first cache root is not writable; removed when the
// process that created it exits (not by forked children).
struct PrivateRoot {
  fs::path path;
  pid_t owner = 0;
  ~PrivateRoot() {
    if (path.empty() || getpid() != owner) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::mutex g_roots_mutex;
std::map<fs::path, fs::path> g_write_roots;  // configured first root -> where misses go
PrivateRoot g_private_root;

std::string random_hex() {
  thread_local std::mt19937_64 rng(
      std::random_device{}() ^ (static_cast<uint64_t>(getpid()) << 32) ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return fmt::format("{:016x}", rng());
}

// The host name reduced to [A-Za-z0-9-], so staging names parse back unambiguously.
std::string host_tag() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "host";
  std::string tag;
  for (const char* c = name; *c; ++c)
    if (std::isalnum(static_cast<unsigned char>(*c)) || *c == '-') tag += *c;
  return tag.empty() ? "host" : tag;
}

std::optional<std::string> unwritable_reason(const fs::path& root) {
  for (const char* sub : {"cache", "tmp", "failed"}) {
    std::error_code ec;
    fs::create_directories(root / sub, ec);
    if (ec) return fmt::format("cannot create '{}': {}", (root / sub).string(), ec.message());
    // An existing directory may still refuse new files: try one.
    const fs::path probe = root / sub / (".write-test." + random_hex());
    const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
      return fmt::format("cannot write in '{}': {}", (root / sub).string(), std::strerror(errno));
    close(fd);
    unlink(probe.c_str());
  }
  return std::nullopt;
}

fs::path make_private_root() {
  std::string pattern = (fs::temp_directory_path() / "dsk-jit-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw Unavailable{fmt::format("no writable cache directory (mkdtemp in '{}': {})",
                                  fs::temp_directory_path().string(), std::strerror(errno))};
  const fs::path root = pattern;
  if (auto reason = unwritable_reason(root))
    throw Unavailable{"no writable cache directory (" + *reason + ")"};
  return root;
}

double seconds_since(time_t then) {
  return std::max(0.0, std::difftime(std::time(nullptr), then));
}

std::optional<time_t> mtime_of(const fs::path& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return st.st_mtime;
}

uint64_t directory_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    std::error_code size_ec;
    if (f.is_regular_file(size_ec)) bytes += f.file_size(size_ec);
  }
  return bytes;
}

// "<name>.<digest>" -> (name, digest)
std::pair<std::string, std::string> split_entry_name(const std::string& dir_name) {
  const size_t dot = dir_name.rfind('.');
  if (dot == std::string::npos) return {dir_name, ""};
  return {dir_name.substr(0, dot), dir_name.substr(dot + 1)};
}

// A staging directory "<name>.<host>.<pid>.<random>" of a process on this host that has exited,
// or any staging directory older than a day (a crashed process on another node).
bool is_stale_staging(const fs::directory_entry& dir, const std::string& host) {
  const std::string name = dir.path().filename().string();
  if (name.rfind("trash.", 0) == 0) return true;
  if (auto mtime = mtime_of(dir.path()); mtime && seconds_since(*mtime) > 24 * 3600) return true;
  const size_t random_dot = name.rfind('.');
  if (random_dot == std::string::npos || random_dot == 0) return false;
  const size_t pid_dot = name.rfind('.', random_dot - 1);
  if (pid_dot == std::string::npos || pid_dot == 0) return false;
  const size_t host_dot = name.rfind('.', pid_dot - 1);
  if (host_dot == std::string::npos) return false;
  if (name.substr(host_dot + 1, pid_dot - host_dot - 1) != host) return false;
  const pid_t pid = static_cast<pid_t>(std::atoll(name.substr(pid_dot + 1).c_str()));
  return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

std::vector<CacheEntry> list_root(const fs::path& root) {
  std::vector<CacheEntry> entries;
  std::error_code ec;
  for (const auto& dir : fs::directory_iterator(root / "cache", ec)) {
    std::error_code type_ec;
    if (!dir.is_directory(type_ec)) continue;
    CacheEntry e;
    e.path = dir.path();
    std::tie(e.name, e.digest) = split_entry_name(dir.path().filename().string());
    e.bytes = directory_bytes(dir.path());
    e.committed = fs::exists(dir.path() / ".committed", type_ec);
    const nlohmann::json meta =
        nlohmann::json::parse(read_text(dir.path() / "meta.json").value_or(""), nullptr, false);
    const time_t dir_mtime = mtime_of(dir.path()).value_or(std::time(nullptr));
    const bool has_created = meta.is_object() && meta.contains("created_unix") &&
                             meta["created_unix"].is_number_integer();
    const time_t created =
        has_created ? static_cast<time_t>(meta["created_unix"].get<int64_t>()) : dir_mtime;
    e.age_s = seconds_since(created);
    e.idle_s = seconds_since(mtime_of(dir.path() / ".committed").value_or(created));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.path < b.path; });
  return entries;
}

void remove_leftovers(const fs::path& root) {
  std::error_code ec;
  for (const auto& log : fs::directory_iterator(root / "failed", ec)) {
    std::error_code rm_ec;
    fs::remove(log.path(), rm_ec);
  }
  const std::string host = host_tag();
  for (const auto& dir : fs::directory_iterator(root / "tmp", ec)) {
    std::error_code rm_ec;
    if (is_stale_staging(dir, host)) fs::remove_all(dir.path(), rm_ec);
  }
}

fs::path entry_dir(const fs::path& root, const std::string& name, const std::string& digest) {
  return root / "cache" / (name + "." + digest);
}

EntryCheck check_entry(const fs::path& dir) {
  EntryCheck check;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return check;
  check.exists = true;
  if (!fs::exists(dir / ".committed", ec)) {
    check.problem = "has no .committed marker (an interrupted or foreign write)";
    return check;
  }
  const nlohmann::json meta =
      nlohmann::json::parse(read_text(dir / "meta.json").value_or(""), nullptr, false);
  if (!meta.is_object() || !meta.contains("so_bytes") || !meta["so_bytes"].is_number_unsigned() ||
      !meta.contains("so_xxh3") || !meta["so_xxh3"].is_string()) {
    check.problem = "has an unreadable meta.json";
    return check;
  }
  const uint64_t expected_bytes = meta["so_bytes"].get<uint64_t>();
  const uint64_t bytes = fs::file_size(dir / "kernel.so", ec);
  if (ec) {
    check.problem = "has no kernel.so";
  } else if (bytes != expected_bytes) {
    check.problem = fmt::format("has a kernel.so of {} bytes where meta.json records {}", bytes,
                                expected_bytes);
  } else if (file_digest(dir / "kernel.so") != meta["so_xxh3"].get<std::string>()) {
    check.problem = "has a kernel.so whose digest differs from meta.json";
  } else {
    check.usable = true;
  }
  return check;
}

fs::path write_root(const Settings& settings) {
  const fs::path& first = settings.roots.front();
  std::lock_guard lock(g_roots_mutex);
  if (auto it = g_write_roots.find(first); it != g_write_roots.end()) return it->second;
  fs::path chosen = first;
  if (auto reason = unwritable_reason(first)) {
    if (g_private_root.path.empty()) {
      g_private_root.path = make_private_root();
      g_private_root.owner = getpid();
    }
    chosen = g_private_root.path;
    warn_once(
        fmt::format("the cache root '{}' is not writable ({}); this process writes its "
                    "kernels to the private temporary root '{}' instead",
                    first.string(), *reason, chosen.string()));
  }
  g_write_roots[first] = chosen;
  return chosen;
}

void forget_write_roots() {
  std::lock_guard lock(g_roots_mutex);
  g_write_roots.clear();
}

fs::path make_staging_dir(const fs::path& root, const std::string& name) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const fs::path dir =
        root / "tmp" / fmt::format("{}.{}.{}.{}", name, host_tag(), getpid(), random_hex());
    if (mkdir(dir.c_str(), 0755) == 0) return dir;
    if (errno != EEXIST)
      throw Unavailable{fmt::format("cannot create '{}': {}", dir.string(), std::strerror(errno))};
  }
  throw Unavailable{"cannot create a staging directory under '" + (root / "tmp").string() + "'"};
}

void write_file_synced(const fs::path& path, std::string_view content) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < content.size();) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!ok)
    throw Unavailable{fmt::format("cannot write '{}': {}", path.string(), std::strerror(error))};
}

std::optional<std::string> read_text(const fs::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

void fsync_path(const fs::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

// NOTES: publishing an entry. A kernel is compiled in <root>/tmp/<unique>, on the same file
// system as <root>/cache, and its files are fsynced, .committed last, then the directory itself.
// One rename(2) of the whole directory then makes it visible under its final name, so a reader
// sees either no entry or a complete one, even with many processes, users or nodes sharing the
// root (rename is atomic on local file systems and on NFS). When two processes build the same
// kernel at once, the second rename fails (the destination is a non-empty directory); if the
// winner's entry is committed and intact, the loser deletes its own copy and loads the winner's.
// An entry in the way that is not usable (no .committed, or a kernel.so that does not match
// meta.json) is first renamed into tmp/ and deleted, then the rename is retried. If publishing
// still fails the caller loads the kernel from its staging directory and deletes it afterwards.
fs::path publish(const fs::path& staged, const fs::path& final_dir, const Settings& settings) {
  const fs::path root = final_dir.parent_path().parent_path();
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (rename(staged.c_str(), final_dir.c_str()) == 0) {
      fsync_path(final_dir.parent_path());
      return final_dir;
    }
    if (errno != EEXIST && errno != ENOTEMPTY) break;
    if (check_entry(final_dir).usable) {
      debug_log(
          settings,
          fmt::format(
              "{} was published first (by another process, or before a forced compile); using it",
              final_dir.string()));
      std::error_code ec;
      fs::remove_all(staged, ec);
      return final_dir;
    }
    remove_entry(root, final_dir);
  }
  return staged;
}

void touch_committed(const fs::path& dir) {
  utimensat(AT_FDCWD, (dir / ".committed").c_str(), nullptr, 0);
}

bool remove_entry(const fs::path& root, const fs::path& dir) {
  const fs::path trash =
      root / "tmp" / fmt::format("trash.{}.{}", dir.filename().string(), random_hex());
  std::error_code ec;
  if (rename(dir.c_str(), trash.c_str()) == 0) {
    fs::remove_all(trash, ec);
    return !ec;
  }
  // Someone else removed it first, or <root>/tmp is missing (then delete in place).
  if (!fs::exists(dir, ec)) return true;
  fs::remove_all(dir, ec);
  return !fs::exists(dir, ec);
}

}  // namespace dsk::jit::internal

namespace dsk::jit {

std::vector<std::filesystem::path> cache_roots(std::string_view module) {
  return internal::read_settings(module).roots;
}

std::filesystem::path writable_cache_root(std::string_view module) {
  try {
    return internal::write_root(internal::read_settings(module));
  } catch (const internal::Unavailable& u) {
    DSK_FAIL("dsk::jit::writable_cache_root", u.reason);
  }
}

std::vector<CacheEntry> list_cache(std::string_view module) {
  std::vector<CacheEntry> entries;
  for (const auto& root : cache_roots(module)) {
    std::vector<CacheEntry> in_root = internal::list_root(root);
    entries.insert(entries.end(), in_root.begin(), in_root.end());
  }
  return entries;
}

ClearResult clear_cache(std::string_view name_prefix, std::string_view module) {
  ClearResult result;
  for (const auto& root : cache_roots(module)) {
    for (const CacheEntry& e : internal::list_root(root)) {
      if (e.name.rfind(name_prefix, 0) != 0) continue;
      if (internal::remove_entry(root, e.path)) {
        ++result.entries;
        result.bytes += e.bytes;
      } else {
        result.errors.push_back(e.path.string());
      }
    }
    if (name_prefix.empty()) internal::remove_leftovers(root);
  }
  return result;
}

}  // namespace dsk::jit
