// Row copies that may go around the caches: the EP transports' rows and tk's expanded rows.
// Private to src.
#pragma once

#include <cstddef>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dsk::detail {

// From how many bytes per call (an exchange, an expansion) rows are written around the caches:
// well above what the caches keep, and what nothing reads before the call ends.
inline constexpr size_t kStreamCopyBytes = size_t{8} << 20;

// Copies one row; with `stream`, by non-temporal stores where dst and bytes allow it.
// NOTES: a plain store first reads its line (to own it), so a copy to memory that is not in the
// caches moves three bytes per byte copied; a non-temporal store moves two. glibc's memcpy
// streams only copies larger than most of the last-level cache, never a 14 KB row.
void copy_row(std::byte* dst, const std::byte* src, size_t bytes, bool stream);

// Zeroes one row; with `stream`, by non-temporal stores where dst and bytes allow it.
void zero_row(std::byte* dst, size_t bytes, bool stream);

// Orders the non-temporal stores before what follows (another rank or thread reading them).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace dsk::detail

// The AVX-512 forms (copy_avx512.cpp), for whole 64-byte lines at a 64-byte aligned dst: one
// store per line. In the ISA's ABI namespace (dsk/kernels/abi.hpp), as all AVX-512 code is.
// NOTES: on Zen 5 (two cores), 4 KB rows scattered at random reach 32-35 GB/s by 16-byte
// non-temporal stores and 63-65 GB/s by 64-byte ones; expand_to_fused, whose rows go to eight
// expert-ordered streams per thread, gains 1.03-1.10x.
namespace dsk::detail::abi_avx512 {
void stream_lines(std::byte* dst, const std::byte* src, size_t bytes);
void stream_zero_lines(std::byte* dst, size_t bytes);
}  // namespace dsk::detail::abi_avx512
