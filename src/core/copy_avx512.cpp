// Non-temporal row copies with 64-byte stores; built with the AVX-512 flags.
#include <immintrin.h>

#include "copy.hpp"

namespace dsk::detail::abi_avx512 {

void stream_lines(std::byte* dst, const std::byte* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
}

void stream_zero_lines(std::byte* dst, size_t bytes) {
  const __m512i zero = _mm512_setzero_si512();
  for (size_t i = 0; i < bytes; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), zero);
}

}  // namespace dsk::detail::abi_avx512
