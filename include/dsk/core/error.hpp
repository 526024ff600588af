// dsk::Error and the argument-check macros every public entry point uses.
//
// Messages have one shape: "<function>: <argument>: expected <expectation>, got <value>", so a
// user can tell from one line which call, which argument and what was wrong.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace dsk {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  Error(std::string function, std::string argument, const std::string& message)
      : std::runtime_error(message),
        function_(std::move(function)),
        argument_(std::move(argument)) {}

  // The entry point that raised the error ("" when not an argument error).
  const std::string& function() const { return function_; }
  // The argument that was rejected ("" when the error is not about one argument).
  const std::string& argument() const { return argument_; }

 private:
  std::string function_;
  std::string argument_;
};

namespace detail {

template <class T>
std::string to_text(const T& value) {
  if constexpr (std::is_constructible_v<std::string, const T&>) {
    return std::string(value);  // strings and string_views print as text, not as lists
  } else if constexpr (requires {
                         value.begin();
                         value.end();
                       }) {
    std::ostringstream os;  // a list of values, e.g. a shape: "[2, 3, 4]"
    os << "[";
    const char* sep = "";
    for (const auto& v : value) {
      os << sep << to_text(v);
      sep = ", ";
    }
    os << "]";
    return os.str();
  } else {
    std::ostringstream os;
    os << value;
    return os.str();
  }
}

[[noreturn]] void throw_argument_error(const char* function, const char* argument,
                                       const std::string& expected, const std::string& got);
[[noreturn]] void throw_error(const char* function, const std::string& message);

}  // namespace detail
}  // namespace dsk

// Checks one argument; `expected` and `got` are evaluated only when `cond` fails.
//   DSK_CHECK_ARG(a.dim() == 2, "fp8_gemm_nt", "a", "a 2-D tensor", a.dim());
#define DSK_CHECK_ARG(cond, function, argument, expected, got)                                    \
  do {                                                                                            \
    if (!(cond)) [[unlikely]]                                                                     \
      ::dsk::detail::throw_argument_error(                                                        \
          (function), (argument), ::dsk::detail::to_text(expected), ::dsk::detail::to_text(got)); \
  } while (0)

// Checks a condition that is not about a single argument.
#define DSK_CHECK(cond, function, message)                                     \
  do {                                                                         \
    if (!(cond)) [[unlikely]]                                                  \
      ::dsk::detail::throw_error((function), ::dsk::detail::to_text(message)); \
  } while (0)

#define DSK_FAIL(function, message) \
  ::dsk::detail::throw_error((function), ::dsk::detail::to_text(message))
