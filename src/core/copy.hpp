// Row copies that may go around the caches: the EP transports' rows and tk's expanded rows.
// Private to src.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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
inline void copy_row(std::byte* dst, const std::byte* src, size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && bytes % 64 == 0) {
    for (size_t i = 0; i < bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

// Zeroes one row; with `stream`, by non-temporal stores where dst and bytes allow it.
inline void zero_row(std::byte* dst, size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && bytes % 64 == 0) {
    const __m128i zero = _mm_setzero_si128();
    for (size_t i = 0; i < bytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), zero);
    return;
  }
#endif
  (void)stream;
  std::memset(dst, 0, bytes);
}

// Orders the non-temporal stores before what follows (another rank or thread reading them).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace dsk::detail
