// The tile layer: the primitives every DSKernels kernel (GEMM, attention, MoE) is written in once
// and instantiated per ISA, with bitwise identical results on all three:
//   amx      real AMX tile registers (TDPBF16PS, TDPB[SU][SU]D)
//   avx512   AMX semantics emulated with AVX-512 FP32 FMA and VNNI integer dot products
//   generic  portable scalar C++
//
//   isa.hpp       ISA tags generic_t / avx512_t / amx_t, the Isa concept, compile-time detection
//   types.hpp     TReg<Id, T, Rows, Cols> and TileA / TileB / TileC, the MmaOperands concept
//   unit.hpp      TileUnit<Isa, Regs...>: zero / load / store / mma, and the numerics contract
//   pack.hpp      B into VNNI form (from K x N or N x K, or e4m3 widened), zero-padded copies
//   block.hpp     a register-blocked C (+)= A . B of up to 32 x 32 on a TileUnit
//   epilogue.hpp  scale rows / columns, accumulate (scaled), f32 rows -> bf16 rows
//   convert.hpp   format converters (bf16, f16, e4m3, e5m2, e2m1) for registers and arrays
//   prefetch.hpp  prefetch_l2: a byte range towards L2
//
// A kernel is a template on the ISA:
//   template <Isa I> void kernel(...) { TileUnit<I, C, A, B> unit; ... unit.mma(C{}, A{}, B{}); }
// and each instantiation needs a translation unit compiled for its ISA (the JIT's -march=native,
// or the library's *_avx512.cpp / *_amx.cpp files). docs/tile.md walks through one.
#pragma once

#include <dsk/kernels/tile/block.hpp>
#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/epilogue.hpp>
#include <dsk/kernels/tile/isa.hpp>
#include <dsk/kernels/tile/pack.hpp>
#include <dsk/kernels/tile/prefetch.hpp>
#include <dsk/kernels/tile/types.hpp>
#include <dsk/kernels/tile/unit.hpp>
