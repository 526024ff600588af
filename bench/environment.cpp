// environment_json(): build, CPU, backend, threads and the DSK_* variables in effect.
#include "bench/environment.hpp"

#include <sstream>
#include <string>

#include <dsk/core/cpu.hpp>
#include <dsk/core/env.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/core/version.hpp>

namespace dsk::bench {
namespace {

nlohmann::json split_words(const std::string& text) {
  nlohmann::json words = nlohmann::json::array();
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace

nlohmann::json environment_json() {
  const BuildInfo& build = build_info();
  const CpuFeatures& cpu = cpu_features();
  nlohmann::json j;
  j["version"] = std::string(build.version);
  j["git"] = std::string(build.git_revision);
  j["compiler"] = std::string(build.compiler);
  j["flags"] = std::string(build.cxx_flags);
  j["build_type"] = std::string(build.build_type);
  j["cpu"] = cpu.model;
  j["cpu_vendor"] = cpu.vendor;
  j["cpu_family"] = cpu.family;
  j["cpu_model"] = cpu.model_id;
  j["cpu_stepping"] = cpu.stepping;
  j["features"] = split_words(cpu.list());
  j["backend"] = std::string(backend_name(backend()));
  j["supported_backends"] = nlohmann::json::array();
  for (Backend b : {Backend::generic, Backend::avx512, Backend::amx})
    if (backend_supported(b)) j["supported_backends"].push_back(std::string(backend_name(b)));
  j["threads"] = get_num_threads();
  j["variables"] = nlohmann::json::array();
  for (const auto& [name, value] : env::dsk_variables_in_effect())
    j["variables"].push_back(
        {{"name", name}, {"value", value}, {"known", env::is_known_variable(name)}});
  return j;
}

}  // namespace dsk::bench
