// `--plot FILE.png`: the roofline of this machine with every case that has both work and traffic
// drawn as a point, rendered by gnuplot (pngcairo when the build has it, else png).
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include <dsk/core/error.hpp>

#include "bench/runner.hpp"

namespace dsk::bench {
namespace {

constexpr const char* kFunction = "bench --plot";

// Runs a shell command; returns its exit status and its stdout+stderr.
int run_shell(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  DSK_CHECK(pipe != nullptr, kFunction, "cannot start a shell");
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    output->append(buffer.data(), n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string png_terminal() {
  std::string terminals;
  const int rc = run_shell("gnuplot -e 'set terminal'", &terminals);
  DSK_CHECK(rc == 0, kFunction,
            "gnuplot is needed to draw the roofline (Debian: apt-get install gnuplot-nox)");
  return terminals.find("pngcairo") != std::string::npos ? "pngcairo" : "png";
}

// A file under the temp dir that is removed when this object goes away.
class TempFile {
 public:
  explicit TempFile(const char* suffix) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dsk-plot-XXXXXX").string() + suffix;
    const int fd = mkstemps(pattern.data(), static_cast<int>(std::string(suffix).size()));
    DSK_CHECK(fd >= 0, kFunction, "cannot create a temporary file");
    close(fd);
    path_ = pattern;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string quoted(std::string text) {
  for (char& c : text)
    if (c == '"' || c == '\\') c = '\'';
  return "\"" + text + "\"";
}

// One roof per term: bandwidth terms as slopes x*B up to the highest compute roof, compute terms
// as flat lines from where the DRAM slope reaches them.
std::vector<std::string> roof_plots(const Ceilings& c) {
  double top = 0;
  for (const RoofTerm& t : kRoofTerms)
    if (auto v = c.get(std::string(t.name)); v && !t.bandwidth) top = std::max(top, *v);
  const double dram_tbs = c.get("dram_read").value_or(0) * 1e-3;
  std::vector<std::string> plots;
  for (const RoofTerm& t : kRoofTerms) {
    const std::optional<double> v = c.get(std::string(t.name));
    if (!v) continue;
    if (t.bandwidth) {
      const double tbs = *v * 1e-3;  // GB/s -> TB/s: flop/byte x TB/s = TFLOPS
      plots.push_back(top > 0 ? fmt::format("(x*{0} < {1} ? x*{0} : 1/0)", tbs, top)
                              : fmt::format("x*{}", tbs));
      plots.back() +=
          fmt::format(" lw 2 title {}", quoted(fmt::format("{} {:.1f} GB/s", t.title, *v)));
    } else {
      plots.push_back(dram_tbs > 0 ? fmt::format("(x*{0} >= {1} ? {1} : 1/0)", dram_tbs, *v)
                                   : fmt::format("{}", *v));
      plots.back() +=
          fmt::format(" lw 2 title {}", quoted(fmt::format("{} {:.3g} TFLOPS", t.title, *v)));
    }
  }
  return plots;
}

}  // namespace

void check_can_plot(const std::string& path) {
  png_terminal();
  check_output_file(path, "bench", "--plot");
}

void plot_roofline(const BenchReport& report, const std::string& path) {
  const std::vector<std::string> roofs = roof_plots(report.ceilings);
  TempFile data(".dat"), script(".gp");
  size_t points = 0;
  {
    std::ofstream out(data.path());
    for (const BenchRow& r : report.rows) {
      if (!r.tflops || !r.gbs || !r.measures.empty()) continue;
      out << fmt::format("{} {} {}\n", r.flops / r.bytes, *r.tflops,
                         quoted(r.module + "/" + r.name + " " + r.shape));
      ++points;
    }
  }
  DSK_CHECK(!roofs.empty() || points > 0, kFunction,
            "nothing to draw: no ceiling was measured and no case has both work and traffic");

  std::vector<std::string> plots = roofs;
  if (points > 0) {
    plots.push_back(
        fmt::format("{} using 1:2 with points pt 7 ps 1.5 title 'cases'", quoted(data.path())));
    plots.push_back(fmt::format("{} using 1:2:3 with labels left offset 1,0.5 font ',9' notitle",
                                quoted(data.path())));
  }
  {
    std::ofstream out(script.path());
    out << fmt::format("set terminal {} noenhanced size 1100,750\n", png_terminal());
    out << fmt::format("set output {}\n", quoted(path));
    out << "set logscale xy\nset grid\nset key left top\nset samples 1000\n";
    out << "set xrange [0.01:10000]\n";
    out << "set xlabel 'arithmetic intensity (operations per byte)'\n";
    out << "set ylabel 'TFLOPS (TOPS for integer cases)'\n";
    out << fmt::format("set title {}\n",
                       quoted(fmt::format("roofline, {} thread{}", report.ceilings.threads,
                                          report.ceilings.threads == 1 ? "" : "s")));
    out << "plot ";
    for (size_t i = 0; i < plots.size(); ++i) out << (i ? ", \\\n     " : "") << plots[i];
    out << "\n";
  }
  std::string output;
  const int rc = run_shell("gnuplot " + quoted(script.path()), &output);
  DSK_CHECK(rc == 0, kFunction, "gnuplot failed: " + output.substr(0, output.find('\n')));
  std::error_code ec;
  DSK_CHECK(std::filesystem::file_size(path, ec) > 0 && !ec, kFunction,
            "gnuplot wrote no image to " + path);
}

}  // namespace dsk::bench
