// The documentation names every environment variable the library reads.
#include <fstream>
#include <sstream>

#include "common/test_util.hpp"

namespace dsk {
namespace {

TEST(Docs, EnvironmentPageListsEveryKnownVariable) {
  std::ifstream in(std::string(DSK_TEST_SOURCE_DIR) + "/docs/environment.md");
  ASSERT_TRUE(in) << "docs/environment.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  for (const env::Variable& v : env::known_variables())
    EXPECT_NE(text.str().find("`" + v.name + "`"), std::string::npos)
        << v.name << " is not documented";
}

}  // namespace
}  // namespace dsk
