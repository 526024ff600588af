// AVX-512 ceiling loops: the FP32 FMA peak (inline assembly) and the read-bandwidth sum.
//
// NOTES: the FMA loop is inline assembly because an intrinsics version is free to spill its
// accumulators (spec/cpu.md §8 measured 82 vs 218 GFLOPS for exactly that). Checked with
// `objdump -d --no-show-raw-insn` on g++ 12 and clang++ 14 -O3 builds: the FMA loop body is 24
// vfmadd231ps on zmm0..23 plus dec/jnz (the BF16 loop the same with vdpbf16ps), and the read loop
// keeps its 8 accumulators in zmm registers (8 vpaddq with memory operands, no stack access in the
// loop). Nothing here may instantiate a template or inline function shared with baseline code: the
// linker could keep this TU's AVX-512 copy for the whole program.
#include <immintrin.h>

#include "bench/cases/ceiling_loops.hpp"

namespace dsk::bench {

#define DSK_FMA(i) "vfmadd231ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"
#define DSK_ZERO(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define DSK_EIGHT(M, a, b, c, d, e, f, g, h) M(a) M(b) M(c) M(d) M(e) M(f) M(g) M(h)
#define DSK_ALL24(M)                         \
  DSK_EIGHT(M, 0, 1, 2, 3, 4, 5, 6, 7)       \
  DSK_EIGHT(M, 8, 9, 10, 11, 12, 13, 14, 15) \
  DSK_EIGHT(M, 16, 17, 18, 19, 20, 21, 22, 23)

float fp32_fma_peak_avx512(int64_t iterations) {
  static_assert(kFp32FmaAccumulators == 24, "the assembly below names 24 accumulators");
  // acc += 1 * 2^-20 stays finite and normal for any iteration count (no assists).
  const float one = 1.0f, step = 0x1p-20f;
  alignas(64) float lane[16];
  asm volatile(
      "vbroadcastss %[one], %%zmm30\n\t"
      "vbroadcastss %[step], %%zmm31\n\t" DSK_ALL24(DSK_ZERO)
      "1:\n\t" DSK_ALL24(DSK_FMA)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vmovaps %%zmm0, %[lane]\n\t"
      : [n] "+r"(iterations), [lane] "=m"(lane)
      : [one] "m"(one), [step] "m"(step)
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19",
        "xmm20", "xmm21", "xmm22", "xmm23", "xmm30", "xmm31");
  return lane[0];
}

#define DSK_DOT(i) "vdpbf16ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"

float bf16_dot_peak_avx512(int64_t iterations) {
  static_assert(kBf16DotAccumulators == 24, "the assembly below names 24 accumulators");
  // acc += 1 * 2^-20 + 1 * 2^-20 (bf16 pairs) stays finite and normal for any iteration count.
  const uint32_t ones = 0x3F803F80u, step = 0x35803580u;
  alignas(64) float lane[16];
  asm volatile(
      "vpbroadcastd %[ones], %%zmm30\n\t"
      "vpbroadcastd %[step], %%zmm31\n\t" DSK_ALL24(DSK_ZERO)
      "1:\n\t" DSK_ALL24(DSK_DOT)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vmovaps %%zmm0, %[lane]\n\t"
      : [n] "+r"(iterations), [lane] "=m"(lane)
      : [ones] "m"(ones), [step] "m"(step)
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19",
        "xmm20", "xmm21", "xmm22", "xmm23", "xmm30", "xmm31");
  return lane[0];
}

#undef DSK_DOT
#undef DSK_ALL24
#undef DSK_EIGHT
#undef DSK_ZERO
#undef DSK_FMA

uint64_t read_sum_avx512(const void* data, size_t bytes) {
  const __m512i* p = static_cast<const __m512i*>(data);
  const size_t lines = bytes / 64;
  // set1(0) rather than setzero: g++ 12's _mm512_setzero_si512 trips -Wuninitialized.
  __m512i s0 = _mm512_set1_epi64(0), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  for (size_t i = 0; i + 8 <= lines; i += 8) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i + 0));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 1));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 2));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 3));
    s4 = _mm512_add_epi64(s4, _mm512_load_si512(p + i + 4));
    s5 = _mm512_add_epi64(s5, _mm512_load_si512(p + i + 5));
    s6 = _mm512_add_epi64(s6, _mm512_load_si512(p + i + 6));
    s7 = _mm512_add_epi64(s7, _mm512_load_si512(p + i + 7));
  }
  const __m512i s =
      _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)),
                       _mm512_add_epi64(_mm512_add_epi64(s4, s5), _mm512_add_epi64(s6, s7)));
  // Reduced through memory: g++ 12's _mm512_reduce_add_epi64 trips -Wuninitialized in its header.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

void stream_write_avx512(void* data, size_t bytes, uint64_t value) {
  __m512i* p = static_cast<__m512i*>(data);
  const __m512i v = _mm512_set1_epi64(static_cast<long long>(value));
  for (size_t i = 0; i < bytes / 64; ++i) _mm512_stream_si512(p + i, v);
  _mm_sfence();
}

}  // namespace dsk::bench
