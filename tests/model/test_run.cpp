// `dsk run` as a user runs it (issue 8): token ids in, the scheduler's generated ids out, one line
// per request, equal to serving the same checkpoint through the library; bad input is one error
// line and exit status 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <dsk/model.hpp>

#include "common/test_util.hpp"

namespace dsk {
namespace {

namespace fs = std::filesystem;

#ifdef DSK_TEST_PROGRAM
constexpr const char* kProgram = DSK_TEST_PROGRAM;
#else
constexpr const char* kProgram = nullptr;
#endif

std::vector<std::vector<int32_t>> parse_lines(const std::string& text) {
  std::vector<std::vector<int32_t>> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    int32_t id = 0;
    while (words >> id) ids.push_back(id);
    lines.push_back(ids);
  }
  return lines;
}

TEST(DskRun, GeneratesWhatTheSchedulerGenerates) {
  if (!kProgram) GTEST_SKIP() << "the dsk program is not built (DSK_BUILD_TOOLS=OFF)";
  test::TempDir dir;
  const fs::path ckpt = dir.path() / "tiny", prompts = dir.path() / "prompts.txt";
  ASSERT_EQ(test::run_command(fmt::format("{} make-checkpoint --preset v32-tiny --layers 2 "
                                          "--seed 3 {} >/dev/null",
                                          kProgram, ckpt.string())),
            0);
  const std::vector<std::vector<int32_t>> input{{5, 17, 99, 1024, 7}, {3000, 12}};
  std::ofstream(prompts) << "5 17 99 1024 7\n\n3000, 12\n";  // an empty line is skipped
  std::string output;
  ASSERT_EQ(test::run_command(fmt::format("({} run --checkpoint {} --prompt-ids {} "
                                          "--max-new-tokens 6 2>/dev/null)",
                                          kProgram, ckpt.string(), prompts.string()),
                              &output),
            0)
      << output;
  const auto lines = parse_lines(output);
  ASSERT_EQ(lines.size(), 2u) << output;

  model::Model m(model::load_checkpoint(ckpt), {});
  model::Scheduler s(m);
  for (size_t i = 0; i < input.size(); ++i) s.submit({static_cast<int64_t>(i), input[i], 6, {}});
  std::vector<std::vector<int32_t>> want(input.size());
  for (const model::Completion& c : s.run()) want[static_cast<size_t>(c.id)] = c.tokens;
  EXPECT_EQ(lines, want);
}

TEST(DskRun, BadPromptIsOneErrorLine) {
  if (!kProgram) GTEST_SKIP() << "the dsk program is not built (DSK_BUILD_TOOLS=OFF)";
  test::TempDir dir;
  const fs::path ckpt = dir.path() / "tiny", prompts = dir.path() / "prompts.txt";
  ASSERT_EQ(test::run_command(fmt::format("{} make-checkpoint --preset v32-tiny --layers 1 "
                                          "--seed 3 {} >/dev/null",
                                          kProgram, ckpt.string())),
            0);
  std::ofstream(prompts) << "1 2 3\n4 five 6\n";
  std::string output;
  EXPECT_EQ(
      test::run_command(fmt::format("{{ {} run --checkpoint {} --prompt-ids {} >/dev/null; }}",
                                    kProgram, ckpt.string(), prompts.string()),
                        &output),
      2);
  EXPECT_EQ(output.rfind("dsk: ", 0), 0u) << output;
  EXPECT_NE(output.find("line 2"), std::string::npos) << output;
  // A token id the vocabulary does not have: refused by the scheduler, naming the request.
  std::ofstream(prompts) << "1 2 999999\n";
  EXPECT_EQ(
      test::run_command(fmt::format("{{ {} run --checkpoint {} --prompt-ids {} >/dev/null; }}",
                                    kProgram, ckpt.string(), prompts.string()),
                        &output),
      2);
  EXPECT_NE(output.find("request 0"), std::string::npos) << output;
}

}  // namespace
}  // namespace dsk
