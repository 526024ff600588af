#include <dsk/core/error.hpp>

namespace dsk::detail {

void throw_argument_error(const char* function, const char* argument, const std::string& expected,
                          const std::string& got) {
  throw Error(function, argument,
              std::string(function) + ": " + argument + ": expected " + expected + ", got " + got);
}

void throw_error(const char* function, const std::string& message) {
  throw Error(function, "", std::string(function) + ": " + message);
}

}  // namespace dsk::detail
