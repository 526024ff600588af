// Row copies that may go around the caches (copy.hpp): the widest non-temporal store the backend
// allows, else plain memcpy / memset.
#include "copy.hpp"

#include <cstdint>
#include <cstring>

#include <dsk/core/cpu.hpp>

namespace dsk::detail {
namespace {

bool aligned(const std::byte* p, size_t to) {
  return reinterpret_cast<uintptr_t>(p) % to == 0;
}

// Whether the 64-byte stores may run: the generic backend (forced or the only one) uses baseline
// instructions only.
bool wide_stores(const std::byte* dst, size_t bytes) {
  return aligned(dst, 64) && bytes % 64 == 0 && backend() != Backend::generic;
}

}  // namespace

void copy_row(std::byte* dst, const std::byte* src, size_t bytes, bool stream) {
  if (stream && wide_stores(dst, bytes)) return abi_avx512::stream_lines(dst, src, bytes);
#if defined(__SSE2__)
  if (stream && aligned(dst, 16) && bytes % 64 == 0) {
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
  std::memcpy(dst, src, bytes);
}

void zero_row(std::byte* dst, size_t bytes, bool stream) {
  if (stream && wide_stores(dst, bytes)) return abi_avx512::stream_zero_lines(dst, bytes);
#if defined(__SSE2__)
  if (stream && aligned(dst, 16) && bytes % 64 == 0) {
    const __m128i zero = _mm_setzero_si128();
    for (size_t i = 0; i < bytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), zero);
    return;
  }
#endif
  std::memset(dst, 0, bytes);
}

}  // namespace dsk::detail
