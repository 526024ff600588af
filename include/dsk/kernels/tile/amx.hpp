// The amx backend of the tile layer: real AMX tile registers, the palette configured from the
// unit's register shapes, and one instruction per operation.
#pragma once

#include <dsk/kernels/tile/isa.hpp>

#if DSK_TILE_HAS_AMX

#include <cstdint>

#include <dsk/kernels/tile/generic.hpp>
#include <dsk/kernels/tile/types.hpp>

namespace dsk::tile {
inline namespace DSK_TILE_ABI {
namespace detail {

// The 64-byte operand of LDTILECFG (palette 1): bytes per row and rows of each register; an
// unlisted register keeps 0 x 0 and faults if used.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

template <TileRegister... Regs>
constexpr TileConfig make_tile_config() {
  TileConfig config;
  ((config.colsb[Regs::id] = static_cast<uint16_t>(Regs::colsb),
    config.rows[Regs::id] = static_cast<uint8_t>(Regs::rows)),
   ...);
  return config;
}

// NOTES: the AMX operations are inline asm, not the <immintrin.h> intrinsics. g++ 12's
// _tile_loadconfig passes the configuration through an 8-byte memory operand, so the optimiser
// may drop the stores that fill it (the first tile instruction then raises SIGILL); its
// _tile_loadd/_tile_stored paste the register number into the asm text with #, so the id cannot
// be a template parameter; and its _tile_loadd does not tell the compiler it reads memory. Here
// the whole 64-byte object is the ldtilecfg operand, the register id is an "i" operand printed
// with %c, and loads and stores clobber memory. Each template has an AT&T and an Intel form.
#define DSK_TILE_AMX_MMA(insn)                                                           \
  asm volatile("{" insn " %%tmm%c2, %%tmm%c1, %%tmm%c0|" insn " tmm%c0, tmm%c1, tmm%c2}" \
               :                                                                         \
               : "i"(C::id), "i"(A::id), "i"(B::id))

template <>
struct TileOps<amx_t> {
  struct State {};

  template <TileRegister... Regs>
  static void configure(State&) {
    static constexpr TileConfig kConfig = make_tile_config<Regs...>();
    asm volatile("ldtilecfg %0" : : "m"(kConfig) : "memory");
  }
  static void release(State&) { asm volatile("tilerelease" ::: "memory"); }

  template <TileRegister R>
  static void zero(State&) {
    asm volatile("{tilezero %%tmm%c0|tilezero tmm%c0}" : : "i"(R::id));
  }

  template <TileRegister R>
  static void load(State&, const void* src, int64_t stride) {
    asm volatile("{tileloadd (%0,%1,1), %%tmm%c2|tileloadd tmm%c2, [%0+%1*1]}"
                 :
                 : "r"(src), "r"(stride), "i"(R::id)
                 : "memory");
  }

  // load, with the hint that the rows will not be read again soon (TILELOADDT1).
  template <TileRegister R>
  static void load_once(State&, const void* src, int64_t stride) {
    asm volatile("{tileloaddt1 (%0,%1,1), %%tmm%c2|tileloaddt1 tmm%c2, [%0+%1*1]}"
                 :
                 : "r"(src), "r"(stride), "i"(R::id)
                 : "memory");
  }

  template <TileRegister R>
  static void store(const State&, void* dst, int64_t stride) {
    asm volatile("{tilestored %%tmm%c2, (%0,%1,1)|tilestored [%0+%1*1], tmm%c2}"
                 :
                 : "r"(dst), "r"(stride), "i"(R::id)
                 : "memory");
  }

  template <TileRegister C, TileRegister A, TileRegister B>
  static void mma(State&) {
    constexpr bool kSignedA = std::same_as<typename A::element, int8_t>;
    constexpr bool kSignedB = std::same_as<typename B::element, int8_t>;
    if constexpr (std::same_as<typename A::element, bf16>) {
      DSK_TILE_AMX_MMA("tdpbf16ps");
    } else if constexpr (kSignedA && kSignedB) {
      DSK_TILE_AMX_MMA("tdpbssd");
    } else if constexpr (kSignedA) {
      DSK_TILE_AMX_MMA("tdpbsud");
    } else if constexpr (kSignedB) {
      DSK_TILE_AMX_MMA("tdpbusd");
    } else {
      DSK_TILE_AMX_MMA("tdpbuud");
    }
  }
};

#undef DSK_TILE_AMX_MMA

}  // namespace detail
}  // namespace DSK_TILE_ABI
}  // namespace dsk::tile

#endif  // DSK_TILE_HAS_AMX
