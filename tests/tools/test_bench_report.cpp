// The bench report's printed ceilings, tested on hand-made values (tests/tools links dsk_bench).
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "bench/runner.hpp"

namespace dsk::bench {
namespace {

std::string printed(const Ceilings& c) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  print_ceilings(out, c);
  std::fclose(out);
  std::string text(buffer, size);
  std::free(buffer);
  return text;
}

std::string line_of(const std::string& text, const std::string& title) {
  const size_t at = text.find(title);
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}

TEST(BenchReport, FlagsACeilingOfAllThreadsBelowOneThread) {
  Ceilings c;
  c.threads = 2;
  c.total["amx_bf16"] = 1.8;  // seen on a busy VM: 2 threads below 1
  c.per_core["amx_bf16"] = 2.19;
  c.total["dram_read"] = 25.5;
  c.per_core["dram_read"] = 12.5;
  const std::string text = printed(c);
  EXPECT_NE(line_of(text, "AMX BF16").find("BELOW ONE THREAD"), std::string::npos) << text;
  EXPECT_EQ(line_of(text, "DRAM read").find("BELOW ONE THREAD"), std::string::npos) << text;
}

TEST(BenchReport, OneThreadRunHasNothingToCompare) {
  Ceilings c;
  c.threads = 1;
  c.total["dram_read"] = 12.5;
  c.per_core["dram_read"] = 13.0;
  const std::string text = printed(c);
  EXPECT_EQ(text.find("BELOW ONE THREAD"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "DRAM read").find("12.5 GB/s"), std::string::npos) << text;
}

}  // namespace
}  // namespace dsk::bench
