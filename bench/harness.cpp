// The registry and the small helpers cases share (random data, cache sizes).
#include "bench/harness.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>

namespace dsk::bench {
namespace {

void add_module_once(std::vector<std::string>& names, const std::string& module) {
  if (std::find(names.begin(), names.end(), module) == names.end()) names.push_back(module);
}

// "1024K", "32M" or a plain byte count, as sysfs cache sizes are written.
size_t parse_cache_size(const std::string& text) {
  size_t i = 0;
  size_t value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9')
    value = value * 10 + (text[i++] - '0');
  if (i < text.size() && (text[i] == 'K' || text[i] == 'k')) return value << 10;
  if (i < text.size() && (text[i] == 'M' || text[i] == 'm')) return value << 20;
  return value;
}

// The size of cache `level` of cpu0: sysconf first (glibc reads CPUID), sysfs as a fallback.
size_t cache_bytes(int level, int sysconf_name, size_t fallback) {
  const long from_sysconf = sysconf(sysconf_name);
  if (from_sysconf > 0) return static_cast<size_t>(from_sysconf);
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level"), size_file(dir + "/size");
    int found_level = 0;
    std::string size_text;
    if (level_file >> found_level && found_level == level && size_file >> size_text) {
      const size_t bytes = parse_cache_size(size_text);
      if (bytes > 0) return bytes;
    }
  }
  return fallback;
}

}  // namespace

const RoofTerm& roof_term(std::string_view name) {
  for (const RoofTerm& t : kRoofTerms)
    if (t.name == name) return t;
  DSK_FAIL("dsk::bench::roof_term", "unknown roofline term '" + std::string(name) + "'");
}

void Registry::add(BenchCase c) {
  c.module = module_;
  roof_term(c.ceiling);  // a typo in a case's ceiling fails when the registry is built
  if (!c.measures.empty()) roof_term(c.measures);
  bench_.push_back(std::move(c));
}

void Registry::add(VerifyCase c) {
  c.module = module_;
  verify_.push_back(std::move(c));
}

std::vector<std::string> Registry::bench_modules() const {
  std::vector<std::string> names;
  for (const BenchCase& c : bench_) add_module_once(names, c.module);
  return names;
}

std::vector<std::string> Registry::verify_modules() const {
  std::vector<std::string> names;
  for (const VerifyCase& c : verify_) add_module_once(names, c.module);
  return names;
}

std::mt19937_64 fresh_rng() {
  std::random_device rd;
  std::seed_seq seed{rd(), rd(), rd(), rd()};
  return std::mt19937_64(seed);
}

void fill_uniform(float* data, size_t n, uint64_t seed) {
  uint64_t state = seed | 1;  // xorshift64: a few cycles per value
  for (size_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    // 24 random bits -> [-1, 1)
    data[i] = static_cast<float>(static_cast<int32_t>(state >> 40) - (1 << 23)) * 0x1p-23f;
  }
}

double mismatches(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return 1e30;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const size_t es = ca.element_size();
  double bad = 0;
  for (int64_t i = 0; i < ca.numel(); ++i)
    bad += std::memcmp(static_cast<const char*>(ca.data_ptr()) + i * es,
                       static_cast<const char*>(cb.data_ptr()) + i * es, es) != 0;
  return bad;
}

size_t last_level_cache_bytes() {
  return cache_bytes(3, _SC_LEVEL3_CACHE_SIZE, size_t{32} << 20);
}

size_t l2_cache_bytes() {
  return cache_bytes(2, _SC_LEVEL2_CACHE_SIZE, size_t{1} << 20);
}

std::string bf16_roof() {
  return backend_supported(Backend::amx) ? "amx_bf16" : "avx512_bf16";
}

}  // namespace dsk::bench
