// AMX ceiling loops: register-resident TDPBF16PS / TDPBSSD, the peak the tile unit can issue.
//
// NOTES: every tile is 16 rows x 64 bytes (palette 1), which makes each instruction a full
// 16x16x32 (bf16) or 16x16x64 (int8) product. Four accumulators in a 2x2 pattern
// (tmm0..3 += tmm4/5 . tmm6/7) keep four independent dependency chains; the inputs are loaded
// once before the loop, so the loop itself touches no memory. The configuration goes through
// inline-asm ldtilecfg naming the whole 64-byte struct: g++ 12's _tile_loadconfig passes only
// 8 bytes as its operand, and the optimiser may then drop the stores of the shape bytes
// (spec/cpu.md §9). Checked with objdump -d (g++ 12 and clang++ 14, -O3): ldtilecfg reads the
// fully written struct, and the loop is the 4 tdp* plus dec/jnz, with no memory access.
// This TU uses inline assembly only, so it does not depend on the compiler's AMX intrinsics.
#include <cstdint>
#include <cstring>

#include "bench/cases/ceiling_loops.hpp"

namespace dsk::bench {
namespace {

// The 64-byte operand of ldtilecfg (Intel SDM vol. 2, LDTILECFG).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i
  uint8_t rows[16];    // rows of tile i
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads exactly 64 bytes");

void configure_full_tiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(*reinterpret_cast<const unsigned char(*)[64]>(&cfg))
               : "memory");
}

void release_tiles() {
  asm volatile("tilerelease" ::: "memory");
}

// Loads tmm4..7 from four 1 KiB blocks of `inputs` (row stride 64 bytes) and zeroes tmm0..3.
void load_inputs(const unsigned char* inputs) {
  const int64_t stride = 64;
  asm volatile(
      "tileloadd (%[a0],%[s],1), %%tmm4\n\t"
      "tileloadd (%[a1],%[s],1), %%tmm5\n\t"
      "tileloadd (%[b0],%[s],1), %%tmm6\n\t"
      "tileloadd (%[b1],%[s],1), %%tmm7\n\t"
      "tilezero %%tmm0\n\t"
      "tilezero %%tmm1\n\t"
      "tilezero %%tmm2\n\t"
      "tilezero %%tmm3\n\t"
      :
      : [a0] "r"(inputs), [a1] "r"(inputs + 1024), [b0] "r"(inputs + 2048), [b1] "r"(inputs + 3072),
        [s] "r"(stride)
      : "memory");
}

// 4 KiB of inputs. bf16: values +-2^-8 (0x3B80 / 0xBB80), so the fp32 sums stay small and finite
// for any iteration count; int8: small non-zero bytes (int32 sums wrap harmlessly).
struct alignas(64) Inputs {
  unsigned char bytes[4096];
};

Inputs make_inputs(bool bf16) {
  Inputs in;
  uint32_t state = 0x9E3779B9u;
  for (int i = 0; i < 4096; i += 2) {
    state = state * 1664525u + 1013904223u;
    const bool negative = (state >> 31) != 0;
    if (bf16) {
      const uint16_t v = negative ? 0xBB80 : 0x3B80;
      std::memcpy(in.bytes + i, &v, 2);
    } else {
      in.bytes[i] = static_cast<unsigned char>(((state >> 24) & 0x7) + 1);
      in.bytes[i + 1] = static_cast<unsigned char>(negative ? 0xFD : 0x03);
    }
  }
  return in;
}

}  // namespace

void amx_bf16_peak(int64_t iterations) {
  static const Inputs inputs = make_inputs(true);
  configure_full_tiles();
  load_inputs(inputs.bytes);
  asm volatile(
      "1:\n\t"
      "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"  // tmm0 += tmm4 . tmm6 (AT&T: B, A, C)
      "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
      "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
      "tdpbf16ps %%tmm7, %%tmm5, %%tmm3\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      : [n] "+r"(iterations)
      :
      : "cc");
  release_tiles();
}

void amx_int8_peak(int64_t iterations) {
  static const Inputs inputs = make_inputs(false);
  configure_full_tiles();
  load_inputs(inputs.bytes);
  asm volatile(
      "1:\n\t"
      "tdpbssd %%tmm6, %%tmm4, %%tmm0\n\t"
      "tdpbssd %%tmm7, %%tmm4, %%tmm1\n\t"
      "tdpbssd %%tmm6, %%tmm5, %%tmm2\n\t"
      "tdpbssd %%tmm7, %%tmm5, %%tmm3\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      : [n] "+r"(iterations)
      :
      : "cc");
  release_tiles();
}

}  // namespace dsk::bench
