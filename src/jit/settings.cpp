// The JIT's settings from the environment (DSK_<MODULE>_JIT_* > DSK_JIT_* > defaults), where
// the kernel headers are, and its warnings.
#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include <fmt/core.h>

#include <dsk/core/env.hpp>

#include "internal.hpp"

namespace dsk::jit::internal {
namespace {

std::mutex g_warn_mutex;
std::set<std::string> g_warned;

std::optional<std::string> getenv_string(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

std::optional<std::string> non_blank(std::optional<std::string> value) {
  if (!value || split_words(*value).empty()) return std::nullopt;
  return value;
}

// The include directory of the installed tree this libdsk belongs to: dladdr gives
// <prefix>/<libdir>/libdsk.so, hence <prefix>/<includedir>. Empty when libdsk does not sit in
// an install layout (the build tree) or the headers were not installed with it.
fs::path find_installed_include_root() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_installed_include_root), &info) == 0 ||
      info.dli_fname == nullptr)
    return {};
  std::error_code ec;
  fs::path dir = fs::absolute(fs::path(info.dli_fname), ec).lexically_normal().parent_path();
  const fs::path lib_subdir = DSK_INSTALL_LIB_SUBDIR;
  const fs::path include_subdir = DSK_INSTALL_INCLUDE_SUBDIR;
  fs::path candidate;
  if (include_subdir.is_absolute()) {
    candidate = include_subdir;
  } else if (lib_subdir.is_absolute()) {
    return {};  // no prefix to derive a relative include directory from
  } else {
    std::vector<fs::path> parts(lib_subdir.begin(), lib_subdir.end());
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      if (dir.filename() != *it) return {};
      dir = dir.parent_path();
    }
    candidate = dir / include_subdir;
  }
  return fs::is_directory(candidate / "dsk" / "kernels", ec) ? candidate : fs::path();
}

fs::path default_include_root() {
  static const fs::path root = [] {
    if (fs::path installed = find_installed_include_root(); !installed.empty()) return installed;
    std::error_code ec;
    const fs::path source = DSK_SOURCE_INCLUDE_DIR;
    return fs::is_directory(source / "dsk" / "kernels", ec) ? source : fs::path();
  }();
  return root;
}

std::vector<fs::path> parse_roots(std::string_view module) {
  std::vector<fs::path> roots;
  const std::string list = env::get_string(module, "JIT_CACHE_DIR", "");
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find(':', begin);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(begin, end - begin);
    if (!split_words(item).empty()) roots.emplace_back(item);
    begin = end + 1;
  }
  if (roots.empty()) {
    const char* home = std::getenv("HOME");
    if (home && *home)
      roots.push_back(fs::path(home) / ".cache" / "dsk");
    else
      roots.push_back(fs::temp_directory_path() / ("dsk-cache-" + std::to_string(getuid())));
  }
  return roots;
}

std::string disabling_variable(std::string_view module) {
  if (!module.empty()) {
    const std::string prefixed = "DSK_" + std::string(module) + "_JIT";
    if (std::getenv(prefixed.c_str())) return prefixed;
  }
  return "DSK_JIT";
}

}  // namespace

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < text.size()) {
    while (i < text.size() && blank(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !blank(text[i])) ++i;
    if (i > start) words.emplace_back(text.substr(start, i - start));
  }
  return words;
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) {
    if (!out.empty()) out += ' ';
    const bool plain = !w.empty() && w.find_first_not_of(
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklm"
                                         "nopqrstuvwxyz0123456789_-+=/.,:@%") == std::string::npos;
    if (plain) {
      out += w;
      continue;
    }
    out += '\'';
    for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

Settings read_settings(std::string_view module) {
  Settings s;
  s.module = std::string(module);
  const std::optional<std::string> mode = env::lookup(module, "JIT");
  if (!mode || split_words(*mode).empty() || strcasecmp(mode->c_str(), "auto") == 0) {
    s.enabled = true;
  } else {
    s.enabled = env::get_bool(module, "JIT", true);  // dsk::Error for anything else
    s.compile_generic = s.enabled;
  }
  if (!s.enabled) s.disabled_by = disabling_variable(module);
  if (auto cxx = non_blank(env::lookup(module, "JIT_CXX")))
    s.compiler = split_words(*cxx);
  else if (auto cxx_env = non_blank(getenv_string("CXX")))
    s.compiler = split_words(*cxx_env);
  else
    s.compiler = {"c++"};
  s.user_flags = split_words(env::get_string(module, "JIT_FLAGS", ""));
  s.roots = parse_roots(module);
  if (auto dir = non_blank(env::lookup(module, "JIT_INCLUDE_DIR")))
    s.include_root = *dir;
  else
    s.include_root = default_include_root();
  s.debug = env::get_bool(module, "JIT_DEBUG", false);
  return s;
}

void warn_once(const std::string& message) {
  std::lock_guard lock(g_warn_mutex);
  if (!g_warned.insert(message).second) return;
  fmt::print(stderr, "dsk::jit: warning: {}\n", message);
  std::fflush(stderr);
}

void warn(const std::string& message) {
  std::lock_guard lock(g_warn_mutex);
  fmt::print(stderr, "dsk::jit: warning: {}\n", message);
  std::fflush(stderr);
}

void debug_log(const Settings& settings, const std::string& message) {
  if (!settings.debug) return;
  std::lock_guard lock(g_warn_mutex);
  fmt::print(stderr, "dsk::jit: {}\n", message);
  std::fflush(stderr);
}

void forget_warnings() {
  std::lock_guard lock(g_warn_mutex);
  g_warned.clear();
}

}  // namespace dsk::jit::internal
