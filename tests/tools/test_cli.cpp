// The `dsk` program, run as a user runs it: JSON outputs parse and carry the documented keys,
// every error is one stderr line with exit status 2, verify passes, --plot draws a PNG.
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/test_util.hpp"

namespace dsk {
namespace {

#ifdef DSK_TEST_PROGRAM
constexpr const char* kProgram = DSK_TEST_PROGRAM;
#else
constexpr const char* kProgram = nullptr;
#endif

#define DSK_SKIP_WITHOUT_PROGRAM()                                                       \
  do {                                                                                   \
    if (!kProgram) GTEST_SKIP() << "the dsk program is not built (DSK_BUILD_TOOLS=OFF)"; \
  } while (0)

struct Outcome {
  int status = -1;
  std::string out;  // stdout, or stderr for stderr_of()
};

// Runs `dsk <args>` with `env` prepended ("DSK_BACKEND=x"); captures stdout only.
Outcome stdout_of(const std::string& args, const std::string& env = "") {
  Outcome o;
  o.status =
      test::run_command("{ " + env + " " + kProgram + " " + args + " 2>/dev/null; }", &o.out);
  return o;
}

// The same, capturing stderr only.
Outcome stderr_of(const std::string& args, const std::string& env = "") {
  Outcome o;
  o.status = test::run_command("{ " + env + " " + kProgram + " " + args + " >/dev/null; }", &o.out);
  return o;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void expect_keys(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) EXPECT_TRUE(j.contains(k)) << "missing key '" << k << "' in " << j;
}

void expect_env_keys(const nlohmann::json& env) {
  expect_keys(env, {"version", "git", "cpu", "features", "backend", "threads", "compiler", "flags",
                    "supported_backends", "variables"});
  EXPECT_TRUE(env["features"].is_array());
  EXPECT_GE(env["threads"].get<int>(), 1);
}

// Exactly one line, "dsk: ...".
void expect_one_error_line(const Outcome& o) {
  EXPECT_EQ(o.status, 2) << o.out;
  ASSERT_FALSE(o.out.empty());
  EXPECT_EQ(o.out.rfind("dsk: ", 0), 0u) << o.out;
  EXPECT_EQ(o.out.find('\n'), o.out.size() - 1) << "more than one line:\n" << o.out;
}

TEST(Cli, HelpExitsZeroAndListsTheCommands) {
  DSK_SKIP_WITHOUT_PROGRAM();
  const Outcome o = stdout_of("--help");
  EXPECT_EQ(o.status, 0);
  for (const char* cmd : {"env", "bench", "verify", "demo"})
    EXPECT_NE(o.out.find(cmd), std::string::npos) << o.out;
  EXPECT_EQ(stdout_of("bench --help").status, 0);
}

TEST(Cli, EnvJsonHasTheDocumentedKeys) {
  DSK_SKIP_WITHOUT_PROGRAM();
  const Outcome o = stdout_of("env --json", "DSK_NO_SUCH_VARIABLE=1");
  ASSERT_EQ(o.status, 0);
  const nlohmann::json j = nlohmann::json::parse(o.out);
  expect_env_keys(j);
  expect_keys(j, {"known_variables", "jit", "mpi", "build_type"});
  EXPECT_EQ(j["version"], std::string(build_info().version));
  EXPECT_EQ(j["backend"], std::string(backend_name(backend())));
  bool flagged = false;
  for (const auto& v : j["variables"])
    if (v["name"] == "DSK_NO_SUCH_VARIABLE") flagged = !v["known"].get<bool>();
  EXPECT_TRUE(flagged) << j["variables"];
  EXPECT_FALSE(j["known_variables"].empty());
}

TEST(Cli, EnvTextFlagsUnknownVariables) {
  DSK_SKIP_WITHOUT_PROGRAM();
  const Outcome o = stdout_of("env", "DSK_NO_SUCH_VARIABLE=7");
  ASSERT_EQ(o.status, 0);
  EXPECT_NE(o.out.find("DSK_NO_SUCH_VARIABLE=7   (unknown)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("DSK_BACKEND"), std::string::npos);
}

TEST(Cli, UnknownOptionIsOneLineAndStatus2) {
  DSK_SKIP_WITHOUT_PROGRAM();
  expect_one_error_line(stderr_of("env --no-such-option"));
  expect_one_error_line(stderr_of("no-such-command"));
  expect_one_error_line(stderr_of(""));
}

TEST(Cli, BadBackendIsOneLineAndStatus2) {
  DSK_SKIP_WITHOUT_PROGRAM();
  expect_one_error_line(stderr_of("env", "DSK_BACKEND=bogus"));
  expect_one_error_line(stderr_of("verify --quick", "DSK_BACKEND=bogus"));
  if (!backend_supported(Backend::amx)) expect_one_error_line(stderr_of("env", "DSK_BACKEND=amx"));
}

TEST(Cli, UnknownModuleIsOneLineAndStatus2) {
  DSK_SKIP_WITHOUT_PROGRAM();
  expect_one_error_line(stderr_of("verify no_such_module"));
  expect_one_error_line(stderr_of("bench no_such_module"));
  expect_one_error_line(stderr_of("verify --filter '('"));
}

// The layer module's prefill runs in one step by default; --prefill-chunk cuts it into steps of
// N tokens (at most the whole prefill), as the shape column says.
TEST(Cli, PrefillChunkSetsTheLayerStep) {
  DSK_SKIP_WITHOUT_PROGRAM();
  const Outcome plain = stdout_of("bench layer --list");
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_NE(plain.out.find("tokens=2048 chunk=2048"), std::string::npos) << plain.out;
  const Outcome chunked = stdout_of("bench layer --list --prefill-chunk 256");
  ASSERT_EQ(chunked.status, 0) << chunked.out;
  EXPECT_NE(chunked.out.find("tokens=2048 chunk=256"), std::string::npos) << chunked.out;
  EXPECT_NE(chunked.out.find("tokens=512 chunk=256"), std::string::npos) << chunked.out;
  EXPECT_NE(stdout_of("bench layer --list --prefill-chunk 4096").out.find("tokens=512 chunk=512"),
            std::string::npos);
  expect_one_error_line(stderr_of("bench layer --list --prefill-chunk 0"));
  expect_one_error_line(stderr_of("bench layer --list --prefill-chunk -3"));
}

// --repeat N times the selection N times over and keeps each case's fastest pass, listing every
// pass's median in the JSON; a count outside 1..100 is refused before anything runs. (A tk case:
// the ceilings size their calls anew in every pass, so their passes compare by rate instead.)
TEST(Cli, BenchRepeatKeepsTheFastestOfEveryPass) {
  DSK_SKIP_WITHOUT_PROGRAM();
  test::TempDir dir;
  const std::string json = (dir.path() / "repeat.json").string();
  const Outcome run =
      stdout_of("bench tk --quick --filter 'tk/get_fused_mapping' --repeat 2 --json " + json);
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("fastest of 2 passes"), std::string::npos) << run.out;
  const nlohmann::json j = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(j["passes"], 2);
  ASSERT_EQ(j["results"].size(), 1u) << j["results"];
  for (const auto& r : j["results"]) {
    const auto medians = r["pass_medians_s"].get<std::vector<double>>();
    ASSERT_EQ(medians.size(), 2u) << r;
    EXPECT_EQ(r["median_s"].get<double>(), *std::min_element(medians.begin(), medians.end())) << r;
  }
  for (const char* bad : {"0", "101", "-1", "two"})
    expect_one_error_line(
        stderr_of(std::string("bench ceilings --filter fp32_fma_peak --repeat ") + bad));
}

TEST(Cli, VerifyQuickPassesAndWritesJson) {
  DSK_SKIP_WITHOUT_PROGRAM();
  test::TempDir dir;
  const auto json_path = dir.path() / "verify.json";
  const Outcome o = stdout_of("verify --quick --json " + json_path.string());
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("PASS"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("FAIL"), std::string::npos) << o.out;
  const nlohmann::json j = nlohmann::json::parse(read_file(json_path));
  expect_env_keys(j["env"]);
  ASSERT_FALSE(j["results"].empty());
  for (const auto& r : j["results"]) {
    expect_keys(r, {"module", "name", "shape", "metric", "value", "tolerance", "passed"});
    // Cases this machine cannot run (ep outside mpirun) are listed as skipped, with the reason.
    if (!r["skipped"].is_null()) continue;
    EXPECT_TRUE(r["passed"].get<bool>()) << r;
  }
}

// One `dsk bench ceilings --quick` run (seconds: it reads 1 GiB) shared by the checks below.
class BenchCeilings : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!kProgram) return;
    dir_ = new test::TempDir;
    const std::string json = (dir_->path() / "ceilings.json").string();
    const std::string png = (dir_->path() / "roofline.png").string();
    const std::string err = (dir_->path() / "stderr.txt").string();
    status_ = test::run_command("{ " + std::string(kProgram) + " bench ceilings --quick --json " +
                                    json + " --plot " + png + " 2>" + err + "; }",
                                &stdout_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static inline test::TempDir* dir_ = nullptr;
  static inline int status_ = -1;
  static inline std::string stdout_;
};

TEST_F(BenchCeilings, SucceedsQuietlyWhenStderrIsNotATerminal) {
  DSK_SKIP_WITHOUT_PROGRAM();
  EXPECT_EQ(status_, 0) << stdout_;
  EXPECT_EQ(read_file(dir_->path() / "stderr.txt"), "") << "no progress bar outside a terminal";
  EXPECT_NE(stdout_.find("DRAM read"), std::string::npos) << stdout_;
}

TEST_F(BenchCeilings, JsonFollowsTheSchema) {
  DSK_SKIP_WITHOUT_PROGRAM();
  const nlohmann::json j = nlohmann::json::parse(read_file(dir_->path() / "ceilings.json"));
  expect_keys(j, {"env", "quick", "passes", "ceilings", "results"});
  expect_env_keys(j["env"]);
  EXPECT_EQ(j["passes"], 1);
  const nlohmann::json& c = j["ceilings"];
  expect_keys(c, {"amx_bf16_tflops", "amx_int8_tops", "fp32_tflops", "dram_read_gbs",
                  "dram_write_gbs", "core_to_core_gbs", "threads", "per_core"});
  ASSERT_TRUE(c["dram_read_gbs"].is_number()) << c;
  EXPECT_GT(c["dram_read_gbs"].get<double>(), 0);
  ASSERT_TRUE(c["dram_write_gbs"].is_number()) << c;
  EXPECT_GT(c["dram_write_gbs"].get<double>(), 0);
  EXPECT_EQ(c["amx_bf16_tflops"].is_number(), backend_supported(Backend::amx)) << c;
  // Two threads or more pass chunks between cores; one thread has no other core to pass to.
  if (c["threads"].get<int>() >= 2) {
    ASSERT_TRUE(c["core_to_core_gbs"].is_number()) << c;
    EXPECT_GT(c["core_to_core_gbs"].get<double>(), 0) << c;
  } else {
    EXPECT_TRUE(c["core_to_core_gbs"].is_null()) << c;
  }
  if (cpu_features().avx512f) {
    EXPECT_GT(c["fp32_tflops"].get<double>(), 0) << c;
  }
  ASSERT_FALSE(j["results"].empty());
  for (const auto& r : j["results"]) {
    expect_keys(
        r, {"module", "name", "shape", "median_s", "tflops", "gbs", "ceiling",
            "fraction_of_ceiling", "peer", "peer_median_s", "speedup_vs_peer", "pass_medians_s"});
    EXPECT_EQ(r["module"], "ceilings");
    if (r["skipped"].is_null()) {
      EXPECT_GT(r["median_s"].get<double>(), 0) << r;
      EXPECT_EQ(r["pass_medians_s"], nlohmann::json::array({r["median_s"]})) << r;
    }
  }
}

TEST_F(BenchCeilings, PlotIsAPng) {
  DSK_SKIP_WITHOUT_PROGRAM();
  const std::string png = read_file(dir_->path() / "roofline.png");
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

}  // namespace
}  // namespace dsk
