// Tests whose bodies need an ISA's compiler flags (tests/<module>/*_avx512.cpp, *_amx.cpp).
//
// Such a file must not use TEST(): GoogleTest registers a TEST from the file's static initializer,
// which the compiler builds with the file's flags and the program runs at startup on every CPU.
// Under AddressSanitizer that initializer poisons its stack with zmm stores, so the whole test
// program died with SIGILL on a CPU without AVX-512 before it could skip anything; a TEST body's
// own prologue can do the same before its DSK_SKIP_UNLESS_BACKEND line runs.
//
// Instead, the ISA file defines its bodies as plain functions and lists them in a table the
// compiler builds (constinit: no code of the file runs to build it), and a baseline file of the
// same test program registers that table: each test first checks, in baseline code, that this CPU
// runs the backend it needs, and skips otherwise. core.IsaHygiene.TestStartup checks that no
// startup code of a test program holds an AVX-512 or AMX instruction.
//
//   // test_foo_avx512.cpp
//   namespace dsk::test {
//   DSK_ISA_TESTS(foo_avx512_tests, {"FooAvx512", "MatchesGeneric", Backend::avx512, &foo_fn});
//   }
//   // test_foo.cpp
//   namespace dsk::test {
//   DSK_REGISTER_ISA_TESTS(foo_avx512_tests);
//   }
#pragma once

#include <span>

#include <dsk/core.hpp>

namespace dsk::test {

struct IsaTest {
  const char* suite;
  const char* name;
  Backend needs;  // skipped unless backend_supported(needs)
  void (*body)();
};

using IsaTests = std::span<const IsaTest>;

// Registers every test of `tests` with GoogleTest, under its suite and name; returns true.
bool register_isa_tests(IsaTests tests, const char* file, int line);

}  // namespace dsk::test

// The ISA file's table `name`, at namespace scope in dsk::test.
#define DSK_ISA_TESTS(name, ...)                                         \
  constinit const ::dsk::test::IsaTest name##_entries[] = {__VA_ARGS__}; \
  extern const ::dsk::test::IsaTests name;                               \
  constinit const ::dsk::test::IsaTests name {                           \
    name##_entries                                                       \
  }

// A baseline file's registration of the table `name`, at namespace scope in dsk::test.
#define DSK_REGISTER_ISA_TESTS(name)              \
  extern const ::dsk::test::IsaTests name;        \
  [[maybe_unused]] const bool name##_registered = \
      ::dsk::test::register_isa_tests(name, __FILE__, __LINE__)
