// Rendering results: aligned text tables for people, JSON for machines (schema: docs/bench.md).
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include <dsk/core/error.hpp>

#include "bench/environment.hpp"
#include "bench/runner.hpp"

namespace dsk::bench {
namespace {

// ---- text ----

struct Column {
  std::string header;
  bool right = false;  // numbers align right
};

void print_table(std::FILE* out, const std::vector<Column>& columns,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    width[c] = columns[c].header.size();
    for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](auto cell) {
    std::string line;
    for (size_t c = 0; c < columns.size(); ++c) {
      const std::string& text = cell(c);
      const std::string pad(width[c] - text.size(), ' ');
      line += columns[c].right ? pad + text : text + pad;
      if (c + 1 < columns.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print(out, "{}\n", line);
  };
  print_row([&](size_t c) -> const std::string& { return columns[c].header; });
  for (const auto& row : rows) print_row([&](size_t c) -> const std::string& { return row[c]; });
}

std::string or_dash(const std::optional<double>& v, const char* format) {
  return v ? fmt::format(fmt::runtime(format), *v) : "-";
}

std::string rate_text(double value, bool bandwidth) {
  return bandwidth ? fmt::format("{:.1f} GB/s", value) : fmt::format("{:.3g} TFLOPS", value);
}

std::vector<std::string> bench_cells(const BenchRow& r) {
  const std::string data = r.residency == Residency::cold ? "cold" : "hot";
  if (!r.skipped.empty())
    return {r.module, r.name, r.shape, data, "n/a (" + r.skipped + ")", "-", "-", r.ceiling,
            "-",      "-",    "-",     "-"};
  const std::optional<double> pct =
      r.fraction_of_ceiling ? std::optional(100 * *r.fraction_of_ceiling) : std::nullopt;
  return {r.module,
          r.name,
          r.shape,
          data,
          format_seconds(r.median_s),
          or_dash(r.tflops, "{:.3g}"),
          or_dash(r.gbs, "{:.1f}"),
          r.ceiling,
          or_dash(pct, "{:.1f}%"),
          r.peer.empty() ? "-" : r.peer,
          r.peer_median_s ? format_seconds(*r.peer_median_s) : "-",
          or_dash(r.speedup_vs_peer, "{:.2f}x")};
}

// ---- JSON ----

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json ceiling_values(const std::map<std::string, double>& values) {
  nlohmann::json j = nlohmann::json::object();
  for (const RoofTerm& t : kRoofTerms) {
    const auto it = values.find(std::string(t.name));
    j[std::string(t.json_key)] =
        it == values.end() ? nlohmann::json(nullptr) : nlohmann::json(it->second);
  }
  return j;
}

nlohmann::json row_json(const BenchRow& r) {
  const bool ran = r.skipped.empty();
  return {{"module", r.module},
          {"name", r.name},
          {"shape", r.shape},
          {"median_s", ran ? nlohmann::json(r.median_s) : nlohmann::json(nullptr)},
          {"tflops", optional_json(r.tflops)},
          {"gbs", optional_json(r.gbs)},
          {"ceiling", r.ceiling},
          {"fraction_of_ceiling", optional_json(r.fraction_of_ceiling)},
          {"peer", r.peer.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.peer)},
          {"peer_median_s", optional_json(r.peer_median_s)},
          {"speedup_vs_peer", optional_json(r.speedup_vs_peer)},
          {"data", r.residency == Residency::cold ? "cold" : "hot"},
          {"flops", r.flops},
          {"bytes", r.bytes},
          {"repetitions", r.repetitions},
          {"pass_medians_s", r.pass_medians_s},
          {"skipped", ran ? nlohmann::json(nullptr) : nlohmann::json(r.skipped)}};
}

}  // namespace

std::string format_seconds(double s) {
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  if (s >= 1e-6) return fmt::format("{:.3g} us", s * 1e6);
  return fmt::format("{:.3g} ns", s * 1e9);
}

void print_ceilings(std::FILE* out, const Ceilings& c) {
  if (c.threads == 1)
    fmt::print(out, "ceilings (1 thread):\n");
  else
    fmt::print(out, "ceilings ({} threads; one thread in brackets):\n", c.threads);
  for (const RoofTerm& t : kRoofTerms) {
    const std::string term(t.name);
    std::string text;
    if (auto it = c.total.find(term); it != c.total.end()) {
      text = rate_text(it->second, t.bandwidth);
      if (auto pc = c.per_core.find(term); pc != c.per_core.end() && c.threads > 1) {
        text += "  [" + rate_text(pc->second, t.bandwidth) + "]";
        // All threads cannot do less than one of them: another tenant or process took the
        // machine during this measurement, and every "of bound" against it reads too high.
        if (it->second < pc->second) text += "  BELOW ONE THREAD: machine busy, ratios inflated";
      }
    } else if (auto why = c.unavailable.find(term); why != c.unavailable.end()) {
      text = "n/a (" + why->second + ")";
    } else {
      text = "not measured";
    }
    fmt::print(out, "  {:<18}{}\n", t.title, text);
  }
}

void print_bench_table(std::FILE* out, const BenchReport& report) {
  const std::vector<Column> columns = {{"module"},
                                       {"case"},
                                       {"shape"},
                                       {"data"},
                                       {"median", true},
                                       {"TFLOPS", true},
                                       {"GB/s", true},
                                       {"bound"},
                                       {"of bound", true},
                                       {"peer"},
                                       {"peer median", true},
                                       {"vs peer", true}};
  std::vector<std::vector<std::string>> cells;
  for (const BenchRow& r : report.rows) cells.push_back(bench_cells(r));
  if (report.passes > 1)
    fmt::print(out, "each case's median from the fastest of {} passes (all of them in --json)\n",
               report.passes);
  print_table(out, columns, cells);
}

void print_verify_table(std::FILE* out, const VerifyReport& report) {
  const std::vector<Column> columns = {{"module"}, {"case"},        {"shape"},
                                       {"metric"}, {"value", true}, {"tolerance", true},
                                       {"result"}, {"time", true}};
  std::vector<std::vector<std::string>> cells;
  for (const VerifyRow& r : report.rows) {
    std::string result = r.passed ? "PASS" : "FAIL";
    if (!r.skipped.empty()) result = "SKIP (" + r.skipped + ")";
    if (!r.error.empty()) result = "FAIL (" + r.error + ")";
    cells.push_back({r.module, r.name, r.shape, r.metric,
                     r.value ? fmt::format("{:.3g}", *r.value) : "-",
                     fmt::format("{:.3g}", r.tolerance), result,
                     r.skipped.empty() ? format_seconds(r.seconds) : "-"});
  }
  print_table(out, columns, cells);
  fmt::print(out, "{} passed, {} failed, {} skipped ({} backend)\n", report.passed(),
             report.failed(), report.rows.size() - report.passed() - report.failed(),
             report.rows.empty() ? "-" : report.rows.front().backend);
}

nlohmann::json to_json(const Ceilings& c) {
  nlohmann::json j = ceiling_values(c.total);
  j["threads"] = c.threads;
  j["per_core"] = ceiling_values(c.per_core);
  j["unavailable"] = c.unavailable;
  return j;
}

nlohmann::json to_json(const BenchReport& report) {
  nlohmann::json results = nlohmann::json::array();
  for (const BenchRow& r : report.rows) results.push_back(row_json(r));
  return {{"env", environment_json()},
          {"quick", report.quick},
          {"passes", report.passes},
          {"ceilings", to_json(report.ceilings)},
          {"results", results}};
}

nlohmann::json to_json(const VerifyReport& report) {
  nlohmann::json results = nlohmann::json::array();
  for (const VerifyRow& r : report.rows)
    results.push_back(
        {{"module", r.module},
         {"name", r.name},
         {"shape", r.shape},
         {"metric", r.metric},
         {"value", optional_json(r.value)},
         {"tolerance", r.tolerance},
         {"passed", r.passed},
         {"backend", r.backend},
         {"skipped", r.skipped.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.skipped)},
         {"error", r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error)},
         {"seconds", r.seconds}});
  return {{"env", environment_json()}, {"quick", report.quick}, {"results", results}};
}

void check_output_file(const std::string& path, const char* command, const char* option) {
  std::ofstream out(path, std::ios::app);  // creates it, keeps what is there
  DSK_CHECK_ARG(out.good(), command, option, "a writable file",
                path + " (" + std::strerror(errno) + ")");
}

void write_json_file(const std::string& path, const nlohmann::json& j, const char* command) {
  std::ofstream out(path);
  DSK_CHECK_ARG(out.good(), command, "--json", "a writable file",
                path + " (" + std::strerror(errno) + ")");
  out << j.dump(2) << "\n";
  out.close();
  DSK_CHECK_ARG(!out.fail(), command, "--json", "a writable file", path + " (write failed)");
}

}  // namespace dsk::bench
