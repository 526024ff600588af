// What instruction sets this translation unit is compiled for, and the per-ISA ABI namespace that
// keeps inline code compiled for different instruction sets apart at link time. Included by every
// header under dsk/kernels that defines functions.
#pragma once

// ---- What this translation unit is compiled for ----
// g++ spells the AMX feature macros __AMX_TILE__/__AMX_BF16__/__AMX_INT8__, clang 14
// __AMXTILE__/__AMXBF16__/__AMXINT8__; accept both.
// The avx512 backend's baseline: what every CPU with AVX512-BF16 and VBMI has (Sapphire Rapids
// and later, Zen 4 and later); dsk::backend_supported(Backend::avx512) checks the same set.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&      \
    defined(__AVX512DQ__) && defined(__AVX512BF16__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__) && defined(__FMA__)
#define DSK_TILE_HAS_AVX512 1
#else
#define DSK_TILE_HAS_AVX512 0
#endif

#if defined(__AMX_TILE__) || defined(__AMXTILE__)
#define DSK_TILE_HAS_AMX_TILE 1
#else
#define DSK_TILE_HAS_AMX_TILE 0
#endif
#if defined(__AMX_BF16__) || defined(__AMXBF16__)
#define DSK_TILE_HAS_AMX_BF16 1
#else
#define DSK_TILE_HAS_AMX_BF16 0
#endif
#if defined(__AMX_INT8__) || defined(__AMXINT8__)
#define DSK_TILE_HAS_AMX_INT8 1
#else
#define DSK_TILE_HAS_AMX_INT8 0
#endif

// The amx backend also runs its packing and epilogues on AVX-512, so it needs both.
#if DSK_TILE_HAS_AVX512 && DSK_TILE_HAS_AMX_TILE && DSK_TILE_HAS_AMX_BF16 && DSK_TILE_HAS_AMX_INT8
#define DSK_TILE_HAS_AMX 1
#else
#define DSK_TILE_HAS_AMX 0
#endif

// NOTES: every function of the tile layer is inline, and the same inline function (say
// dsk::tile::pack_b_vnni_nt<generic_t>) may be instantiated both in a baseline translation unit and
// in one built with -mavx512f, where the compiler is free to vectorise it with AVX-512. The linker
// keeps one copy of each inline symbol, possibly the AVX-512 one, which would then crash on a CPU
// without AVX-512. Putting the code in an inline namespace named after the TU's instruction set
// gives each flavour its own symbols, so no copy can replace another. Types without code (tags,
// TReg, dsk::bf16) stay outside it so that they are the same type everywhere.
#if DSK_TILE_HAS_AMX
#define DSK_TILE_ABI abi_amx
#elif DSK_TILE_HAS_AVX512
#define DSK_TILE_ABI abi_avx512
#elif defined(__AVX2__)
#define DSK_TILE_ABI abi_avx2
#else
#define DSK_TILE_ABI abi_base
#endif

// NOTES: g++ 12 (before 12.3) reports the _mm512_undefined_*() placeholder inside many AVX-512
// intrinsics as used uninitialised once the intrinsic is inlined (GCC bug 105593). Headers with
// AVX-512 code open with DSK_SILENCE_GCC_BUG_105593_BEGIN and close with ..._END; g++ honours that
// for every function inlined from those headers.
#if defined(__GNUC__) && !defined(__clang__)
#define DSK_SILENCE_GCC_BUG_105593_BEGIN                                               \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DSK_SILENCE_GCC_BUG_105593_END _Pragma("GCC diagnostic pop")
#else
#define DSK_SILENCE_GCC_BUG_105593_BEGIN
#define DSK_SILENCE_GCC_BUG_105593_END
#endif
