#include <dsk/core/env.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include <dsk/core/error.hpp>

extern char** environ;

namespace dsk::env {
namespace {

// The one table of every variable the library reads. Add a row when a module reads a new one;
// `dsk env` prints them and docs/environment.md documents them.
const std::vector<Variable> kVariables = {
    {"DSK_BACKEND", "best supported", "force the kernel backend: generic | avx512 | amx", false},
    {"DSK_NUM_THREADS", "CPUs available", "compute threads (upstream set_num_sms)", false},
    {"DSK_DETERMINISTIC", "0", "start with use_deterministic_algorithms(true)", false},
    {"DSK_JIT", "auto",
     "auto compiles avx512 and amx kernels; 1 generic ones too; 0 none (ahead-of-time only)", true},
    {"DSK_JIT_CACHE_DIR", "$HOME/.cache/dsk",
     ":-list of cache roots; misses are written to the first", true},
    {"DSK_JIT_CXX", "$CXX, else c++", "compiler used by the JIT", true},
    {"DSK_JIT_FLAGS", "", "extra compiler flags appended to the JIT command line (part of the key)",
     true},
    {"DSK_JIT_DEBUG", "0", "print JIT compile commands, cache hits and times on stderr", true},
    {"DSK_JIT_INCLUDE_DIR", "installed include/", "where the JIT finds <dsk/kernels/...> headers",
     true},
    {"DSK_TENSOR_CACHE_MB", "2048",
     "freed tensor buffers of 64 KiB or more kept for reuse, at most this many MiB (0: none)",
     false},
    {"DSK_POISON_NEW_TENSORS", "0",
     "1: every new tensor starts poisoned (NaN, 0x7F bytes), so an unwritten output shows; for "
     "tests",
     false},
    {"DSK_PRINT_CONFIGS", "0", "print the config each heuristic chooses", true},
    {"DSK_AUTOTUNE", "unset",
     "1: time candidate kernel configs for shapes not yet tuned and cache the fastest; unset: "
     "reuse cached choices; 0: heuristic only",
     true},
    {"DSK_EP_TIMEOUT_S", "300",
     "seconds an ep:: operation waits for its peer ranks before raising dsk::Error", false},
    {"DSK_EP_PROGRESS_THREAD", "auto",
     "1: async_finish operations move their data on the buffer's communication thread; 0: in "
     "the call; auto: the thread when the rank may run on more than one CPU",
     false},
};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string variable_name(std::string_view module, std::string_view name) {
  return module.empty() ? "DSK_" + upper(name) : "DSK_" + upper(module) + "_" + upper(name);
}

// The name that was actually set, for error messages.
std::string set_name(std::string_view module, std::string_view name) {
  if (!module.empty() && std::getenv(variable_name(module, name).c_str()))
    return variable_name(module, name);
  return variable_name("", name);
}

}  // namespace

std::optional<std::string> lookup(std::string_view module, std::string_view name) {
  if (!module.empty())
    if (const char* v = std::getenv(variable_name(module, name).c_str())) return std::string(v);
  if (const char* v = std::getenv(variable_name("", name).c_str())) return std::string(v);
  return std::nullopt;
}

std::string get_string(std::string_view module, std::string_view name, std::string_view fallback) {
  auto v = lookup(module, name);
  return v ? *v : std::string(fallback);
}

bool get_bool(std::string_view module, std::string_view name, bool fallback) {
  auto v = lookup(module, name);
  if (!v || v->empty()) return fallback;
  const std::string s = lower(*v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  const std::string var = set_name(module, name);
  DSK_CHECK_ARG(false, "dsk::env", var.c_str(), "1/0, true/false, yes/no or on/off", *v);
  return fallback;
}

int64_t get_int(std::string_view module, std::string_view name, int64_t fallback) {
  auto v = lookup(module, name);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  const std::string var = set_name(module, name);
  DSK_CHECK_ARG(end && *end == '\0', "dsk::env", var.c_str(), "an integer", *v);
  return x;
}

double get_double(std::string_view module, std::string_view name, double fallback) {
  auto v = lookup(module, name);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  const std::string var = set_name(module, name);
  DSK_CHECK_ARG(end && *end == '\0', "dsk::env", var.c_str(), "a number", *v);
  return x;
}

const std::vector<Variable>& known_variables() {
  return kVariables;
}

std::vector<std::pair<std::string, std::string>> dsk_variables_in_effect() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "DSK_", 4) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    out.emplace_back(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_known_variable(std::string_view name) {
  for (const Variable& v : kVariables) {
    if (name == v.name) return true;
    if (!v.module_prefixable) continue;
    // DSK_<MODULE>_<suffix>: the suffix after the module must be the variable without "DSK_".
    const std::string_view suffix = std::string_view(v.name).substr(4);
    if (name.size() > 4 + suffix.size() + 1 && name.substr(0, 4) == "DSK_" &&
        name.substr(name.size() - suffix.size()) == suffix &&
        name[name.size() - suffix.size() - 1] == '_')
      return true;
  }
  return false;
}

}  // namespace dsk::env
