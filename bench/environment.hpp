// What machine and build a result came from: the "env" object of every bench/verify JSON and the
// core of `dsk env`. One function, so the two never disagree.
#pragma once

#include <nlohmann/json.hpp>

namespace dsk::bench {

// {"version", "git", "compiler", "flags", "build_type", "cpu", "cpu_vendor", "cpu_family",
//  "cpu_model", "cpu_stepping", "features": [...], "backend", "supported_backends": [...],
//  "threads", "variables": [{"name", "value", "known"}]} (docs/bench.md). Raises dsk::Error when
// DSK_BACKEND or DSK_NUM_THREADS is invalid.
nlohmann::json environment_json();

}  // namespace dsk::bench
