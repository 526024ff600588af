// What build of DSKernels this is: reported by `dsk env` and embedded in every bench/verify JSON.
#pragma once

#include <string_view>

namespace dsk {

struct BuildInfo {
  std::string_view version;       // "0.1.0"
  std::string_view git_revision;  // `git describe --always --dirty` at configure time
  std::string_view compiler;      // "GNU 12.2.0"
  std::string_view cxx_flags;     // flags the library was built with
  std::string_view build_type;    // CMAKE_BUILD_TYPE
};

const BuildInfo& build_info();

}  // namespace dsk
