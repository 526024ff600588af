// Environment lookup with module-prefix fallback (DESIGN §3):
//   DSK_<MODULE>_<NAME>  overrides  DSK_<NAME>  overrides  the default,
// like upstream DG_* > DJ_*. Every variable the library reads is declared in one table
// (env.cpp) so `dsk env` and docs/environment.md can list them and flag unknown DSK_* names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsk::env {

// The raw value of the first of DSK_<MODULE>_<NAME>, DSK_<NAME> that is set (module may be "").
// `module` and `name` are upper-case without the DSK_ prefix: lookup("GEMM", "JIT_CACHE_DIR").
std::optional<std::string> lookup(std::string_view module, std::string_view name);

std::string get_string(std::string_view module, std::string_view name, std::string_view fallback);
// Accepts 1/0, true/false, yes/no, on/off (any case); anything else raises dsk::Error naming the
// variable.
bool get_bool(std::string_view module, std::string_view name, bool fallback);
int64_t get_int(std::string_view module, std::string_view name, int64_t fallback);
double get_double(std::string_view module, std::string_view name, double fallback);

// One variable the library reads.
struct Variable {
  std::string name;          // without module prefix, e.g. "DSK_JIT_CACHE_DIR"
  std::string default_text;  // human-readable default
  std::string description;
  bool module_prefixable;  // also read as DSK_<MODULE>_<NAME-without-DSK_>
};
const std::vector<Variable>& known_variables();

// Every DSK_* variable set in this process's environment, as (name, value), sorted.
std::vector<std::pair<std::string, std::string>> dsk_variables_in_effect();
// Whether `name` is a known variable or a module-prefixed form of one.
bool is_known_variable(std::string_view name);

}  // namespace dsk::env
