// CPU feature detection (CPUID + XGETBV), the Linux AMX permission request, and the choice of
// kernel backend (DESIGN §4): the best the CPU supports, or the one DSK_BACKEND / set_backend()
// forces.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace dsk {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string model;   // brand string
  int family = 0, model_id = 0, stepping = 0;
  // Instruction sets, each true only when the OS also enables the register state it needs.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vnni = false, avx512_vbmi = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // The kernel granted this process the AMX tile data state (arch_prctl XCOMP_PERM).
  bool amx_permitted = false;

  // "avx2 fma f16c avx512f ... amx_int8"
  std::string list() const;
};

// Detected once (thread-safe) on first use; also requests AMX permission when the CPU has AMX.
const CpuFeatures& cpu_features();

enum class Backend { generic, avx512, amx };

std::string_view backend_name(Backend b);
std::ostream& operator<<(std::ostream& os, Backend b);
// Parses "generic" | "avx512" | "amx"; raises dsk::Error otherwise.
Backend parse_backend(std::string_view text);

// Whether this CPU (and OS) can run the backend: avx512 needs AVX-512 F/BW/VL/DQ + BF16 + VNNI
// + VBMI and F16C/FMA; amx additionally AMX-TILE/BF16/INT8 with the tile permission granted.
bool backend_supported(Backend b);
Backend best_backend();

// The backend kernels use: DSK_BACKEND if set (dsk::Error if this CPU cannot run it), else the
// best supported. set_backend overrides both for this process (tests compare backends with it).
Backend backend();
void set_backend(Backend b);

}  // namespace dsk
