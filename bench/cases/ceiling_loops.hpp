// The loops that measure this machine's ceilings (`dsk bench ceilings`). Each lives in a
// translation unit built for its ISA (*_avx512.cpp, *_amx.cpp) and must only be called when
// dsk::cpu_features() reports that ISA (and, for AMX, the tile permission).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsk::bench {

// AVX-512 FP32 FMA peak: `iterations` (>= 1) rounds of kFp32FmaAccumulators independent
// vfmadd231ps zmm, operands and accumulators in registers.
inline constexpr int kFp32FmaAccumulators = 24;
inline constexpr double kFp32FlopPerIteration = kFp32FmaAccumulators * 16 * 2;
// Returns one accumulator lane so the work is observable.
float fp32_fma_peak_avx512(int64_t iterations);

// AVX512-BF16 peak: `iterations` (>= 1) rounds of kBf16DotAccumulators independent
// vdpbf16ps zmm (16 lanes x 2 products x 2 flop each), operands and accumulators in registers:
// the bf16 roof of CPUs without AMX, which the GEMM kernels are measured against there.
inline constexpr int kBf16DotAccumulators = 24;
inline constexpr double kBf16DotFlopPerIteration = kBf16DotAccumulators * 16 * 2 * 2;
float bf16_dot_peak_avx512(int64_t iterations);

// AMX peaks: `iterations` (>= 1) rounds of 4 tile dot products in a 2x2 pattern,
// tmm0..3 += tmm4/5 . tmm6/7, every tile 16 rows x 64 bytes, no memory traffic in the loop.
// Each configures the tiles of the calling thread and releases them before returning.
inline constexpr double kAmxBf16FlopPerIteration = 4.0 * 16 * 16 * 32 * 2;  // TDPBF16PS
inline constexpr double kAmxInt8OpPerIteration = 4.0 * 16 * 16 * 64 * 2;    // TDPBSSD
void amx_bf16_peak(int64_t iterations);
void amx_int8_peak(int64_t iterations);

// Reads `bytes` (a multiple of 512) from 64-byte aligned `data` and sums it as 64-bit integers
// into 8 independent accumulators; returns the sum so the loads cannot be dropped.
uint64_t read_sum_avx512(const void* data, size_t bytes);
// The same for any x86-64 CPU (what the compiler makes of a plain 8-accumulator loop).
uint64_t read_sum_generic(const void* data, size_t bytes);

// Writes `bytes` (a multiple of 512) to 64-byte aligned `data` by 64-byte non-temporal stores of
// `value`, then fences: memory written around the caches, as the kernels that scatter large
// outputs (expand_to_fused, the EP exchanges) write it.
void stream_write_avx512(void* data, size_t bytes, uint64_t value);
// The same with 16-byte non-temporal stores (SSE2, any x86-64 CPU), or memset elsewhere.
void stream_write_generic(void* data, size_t bytes, uint64_t value);

}  // namespace dsk::bench
