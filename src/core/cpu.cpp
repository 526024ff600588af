#include <dsk/core/cpu.hpp>

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <ostream>

#include <dsk/core/env.hpp>
#include <dsk/core/error.hpp>

namespace dsk {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(unsigned x, int i) {
  return (x >> i) & 1u;
}

uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Linux asks each process to request the AMX tile data state before using it (kernel >= 5.16).
bool request_amx_permission() {
  constexpr int kArchGetXcompPerm = 0x1022;
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXfeatureXtiledata) & 1u;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs r0 = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;
  const unsigned max_leaf = r0.a;

  char brand[49] = {};
  if (cpuid(0x80000000).a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
  }
  f.model = brand;
  while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
  while (!f.model.empty() && f.model.front() == ' ') f.model.erase(0, 1);

  const Regs r1 = cpuid(1);
  const unsigned base_family = (r1.a >> 8) & 0xF, base_model = (r1.a >> 4) & 0xF;
  f.family =
      static_cast<int>(base_family == 0xF ? base_family + ((r1.a >> 20) & 0xFF) : base_family);
  f.model_id = static_cast<int>((base_family == 0x6 || base_family == 0xF)
                                    ? base_model + (((r1.a >> 16) & 0xF) << 4)
                                    : base_model);
  f.stepping = static_cast<int>(r1.a & 0xF);

  const bool osxsave = bit(r1.c, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;

  f.fma = os_avx && bit(r1.c, 12);
  f.f16c = os_avx && bit(r1.c, 29);
  if (max_leaf >= 7) {
    const Regs r7 = cpuid(7, 0);
    const Regs r7_1 = cpuid(7, 1);
    f.avx2 = os_avx && bit(r7.b, 5);
    f.avx512f = os_avx512 && bit(r7.b, 16);
    f.avx512dq = os_avx512 && bit(r7.b, 17);
    f.avx512cd = os_avx512 && bit(r7.b, 28);
    f.avx512bw = os_avx512 && bit(r7.b, 30);
    f.avx512vl = os_avx512 && bit(r7.b, 31);
    f.avx512_vbmi = os_avx512 && bit(r7.c, 1);
    f.avx512_vnni = os_avx512 && bit(r7.c, 11);
    f.avx512_fp16 = os_avx512 && bit(r7.d, 23);
    f.avx512_bf16 = os_avx512 && bit(r7_1.a, 5);
    f.amx_bf16 = os_amx && bit(r7.d, 22);
    f.amx_tile = os_amx && bit(r7.d, 24);
    f.amx_int8 = os_amx && bit(r7.d, 25);
  }
  if (f.amx_tile) f.amx_permitted = request_amx_permission();
  return f;
}

std::atomic<int> g_forced_backend{-1};  // set_backend(); -1 = not set
std::once_flag g_env_backend_once;
std::optional<Backend> g_env_backend;

}  // namespace

std::string CpuFeatures::list() const {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512cd, "avx512cd");
  add(avx512_vbmi, "avx512_vbmi");
  add(avx512_vnni, "avx512_vnni");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  add(amx_int8, "amx_int8");
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::generic:
      return "generic";
    case Backend::avx512:
      return "avx512";
    case Backend::amx:
      return "amx";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, Backend b) {
  return os << backend_name(b);
}

Backend parse_backend(std::string_view text) {
  for (Backend b : {Backend::generic, Backend::avx512, Backend::amx})
    if (text == backend_name(b)) return b;
  DSK_CHECK_ARG(false, "dsk::parse_backend", "backend", "generic, avx512 or amx", text);
  return Backend::generic;
}

bool backend_supported(Backend b) {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_bf16 &&
                      f.avx512_vnni && f.avx512_vbmi && f.f16c && f.fma;
  switch (b) {
    case Backend::generic:
      return true;
    case Backend::avx512:
      return avx512;
    case Backend::amx:
      return avx512 && f.amx_tile && f.amx_bf16 && f.amx_int8 && f.amx_permitted;
  }
  return false;
}

Backend best_backend() {
  if (backend_supported(Backend::amx)) return Backend::amx;
  if (backend_supported(Backend::avx512)) return Backend::avx512;
  return Backend::generic;
}

Backend backend() {
  const int forced = g_forced_backend.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Backend>(forced);
  std::call_once(g_env_backend_once, [] {
    if (auto v = env::lookup("", "BACKEND"); v && !v->empty()) {
      for (Backend b : {Backend::generic, Backend::avx512, Backend::amx})
        if (*v == backend_name(b)) g_env_backend = b;
      DSK_CHECK_ARG(g_env_backend.has_value(), "dsk::backend", "DSK_BACKEND",
                    "generic, avx512 or amx", *v);
    }
  });
  if (g_env_backend) {
    DSK_CHECK_ARG(
        backend_supported(*g_env_backend), "dsk::backend", "DSK_BACKEND",
        "a backend this CPU supports (best: " + std::string(backend_name(best_backend())) + ")",
        backend_name(*g_env_backend));
    return *g_env_backend;
  }
  return best_backend();
}

void set_backend(Backend b) {
  DSK_CHECK_ARG(
      backend_supported(b), "dsk::set_backend", "b",
      "a backend this CPU supports (best: " + std::string(backend_name(best_backend())) + ")",
      backend_name(b));
  g_forced_backend.store(static_cast<int>(b), std::memory_order_relaxed);
}

}  // namespace dsk
