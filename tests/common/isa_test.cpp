#include "common/isa_test.hpp"

#include "common/test_util.hpp"

namespace dsk::test {
namespace {

// Built without ISA flags: the backend check runs before any instruction of the ISA file.
class IsaTestCase : public testing::Test {
 public:
  explicit IsaTestCase(const IsaTest& test) : test_(test) {}

  void TestBody() override {
    DSK_SKIP_UNLESS_BACKEND(test_.needs);
    test_.body();
  }

 private:
  const IsaTest& test_;
};

}  // namespace

bool register_isa_tests(IsaTests tests, const char* file, int line) {
  for (const IsaTest& test : tests)
    // Returned as testing::Test*, so these tests share a suite with TEST()s of the same name.
    testing::RegisterTest(test.suite, test.name, nullptr, nullptr, file, line,
                          [&test]() -> testing::Test* { return new IsaTestCase(test); });
  return true;
}

}  // namespace dsk::test
