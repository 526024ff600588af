// ISA tags of the tile layer (generic_t, avx512_t, amx_t) and the compile-time test of which ones
// this translation unit can instantiate (the feature macros are in dsk/kernels/abi.hpp).
#pragma once

#include <concepts>
#include <string_view>

#include <dsk/kernels/abi.hpp>

namespace dsk::tile {

// The three backends. Their names equal dsk::backend_name() of the matching dsk::Backend.
struct generic_t {
  static constexpr std::string_view name = "generic";
};
struct avx512_t {
  static constexpr std::string_view name = "avx512";
};
struct amx_t {
  static constexpr std::string_view name = "amx";
};

inline constexpr generic_t generic{};
inline constexpr avx512_t avx512{};
inline constexpr amx_t amx{};

template <class T>
concept Isa = std::same_as<T, generic_t> || std::same_as<T, avx512_t> || std::same_as<T, amx_t>;

// Whether this translation unit was compiled with the instructions the ISA needs (a kernel
// instantiated for an ISA it lacks fails to compile with a static_assert naming the flags).
template <Isa I>
inline constexpr bool isa_compiled = std::same_as<I, generic_t> ||
                                     (std::same_as<I, avx512_t> && DSK_TILE_HAS_AVX512) ||
                                     (std::same_as<I, amx_t> && DSK_TILE_HAS_AMX);

// The vector unit an ISA uses outside the tile registers (packing, epilogues): AMX CPUs run those
// on AVX-512.
template <Isa I>
using vector_isa_t = std::conditional_t<std::same_as<I, amx_t>, avx512_t, I>;

}  // namespace dsk::tile
