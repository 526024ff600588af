// Top-k of one row segment, DeepSelect's design on a CPU core: a threshold taken from a small
// sample of the segment ("sampled filtering"), then one streaming pass over the values with a
// threshold that only rises, a candidate buffer that takes every value the threshold admits, and a
// radix select that cuts the buffer back to k (and raises the threshold) whenever it fills, and
// once at the end.
//
// Order: values compare by an order-preserving 32-bit key of their float bits (bf16 is widened
// exactly); every NaN has the largest key, so NaN ranks above +inf, as in torch.topk. Values that
// compare equal are interchangeable: which of them are kept depends only on the segment (the
// sample, the visiting order and the buffer order are fixed), so results repeat bit for bit.
//
// The per-ISA part is the scan (filter / append_all) and the buffer primitives; the logic is
// shared. Header-only; the AVX-512 scan needs the avx512 baseline of dsk/kernels/abi.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/isa.hpp>
#include <dsk/kernels/tile/prefetch.hpp>

#if DSK_TILE_HAS_AVX512
#include <immintrin.h>
#endif

namespace dsk::select::kernels {
inline namespace DSK_TILE_ABI {

// ---- keys ----

// The float bits of a row value (bf16 widened exactly).
template <class T>
inline uint32_t value_bits(T x) {
  if constexpr (std::is_same_v<T, float>) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
  } else {
    return static_cast<uint32_t>(x.bits) << 16;
  }
}

// Larger float -> larger key; -0 < +0; every NaN -> the largest key.
inline uint32_t order_key(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;
  return (bits & 0x80000000u) ? ~bits : bits ^ 0x80000000u;
}

inline uint32_t bits_of_key(uint32_t key) {
  return (key & 0x80000000u) ? key ^ 0x80000000u : ~key;
}

inline constexpr uint32_t kNanKey = 0xFFFFFFFFu;

// ---- the scan, per ISA ----
// filter<false> appends (bits, position) of every x[j], j in [begin, end), whose value is greater
// than t or NaN, filter<true> of every one greater than or equal to t or NaN; append_all appends
// every one. All return how many they appended and may write up to 16 entries past that (the
// buffer keeps that slack). Both backends append in position order, so they agree bit for bit.

template <class I>
struct Scan;

template <>
struct Scan<tile::generic_t> {
  template <bool kOrEqual, class T>
  static int64_t filter(const T* x, int64_t begin, int64_t end, float t, uint32_t* bits,
                        int32_t* pos) {
    int64_t n = 0;
    for (int64_t j = begin; j < end; ++j) {
      const uint32_t b = value_bits(x[j]);
      float v;
      std::memcpy(&v, &b, 4);
      if (kOrEqual ? !(v < t) : !(v <= t)) {  // above (or equal), or unordered (NaN)
        bits[n] = b;
        pos[n] = static_cast<int32_t>(j);
        ++n;
      }
    }
    return n;
  }
  template <class T>
  static int64_t append_all(const T* x, int64_t begin, int64_t end, uint32_t* bits, int32_t* pos) {
    for (int64_t j = begin; j < end; ++j) {
      bits[j - begin] = value_bits(x[j]);
      pos[j - begin] = static_cast<int32_t>(j);
    }
    return end - begin;
  }

  // out[i] = pos[i] + offset.
  static void offset_positions(const int32_t* pos, int64_t n, int32_t offset, int32_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = pos[i] + offset;
  }

  // keys[i] = order_key(bits[i]), and their smallest and largest.
  static void make_keys(const uint32_t* bits, int64_t n, uint32_t* keys, uint32_t& lo,
                        uint32_t& hi) {
    lo = 0xFFFFFFFFu;
    hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      keys[i] = order_key(bits[i]);
      lo = std::min(lo, keys[i]);
      hi = std::max(hi, keys[i]);
    }
  }
  // The keys of `in` whose bin (key - base) >> shift is `bin`, in order; returns how many.
  static int64_t gather_bin(const uint32_t* in, int64_t m, uint32_t base, int shift, uint32_t bin,
                            uint32_t* out) {
    int64_t kept = 0;
    for (int64_t i = 0; i < m; ++i)
      if ((in[i] - base) >> shift == bin) out[kept++] = in[i];
    return kept;
  }
  // Keeps, in order, the candidates whose key is above kth and the first `need` equal to it.
  static int64_t compact(uint32_t* bits, int32_t* pos, const uint32_t* keys, int64_t n,
                         uint32_t kth, int64_t need) {
    int64_t out = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool equal = keys[i] == kth;
      if (keys[i] > kth || (equal && need > 0)) {
        need -= equal;
        bits[out] = bits[i];
        pos[out] = pos[i];
        ++out;
      }
    }
    return out;
  }
};

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp
#if DSK_TILE_HAS_AVX512
template <>
struct Scan<tile::avx512_t> {
  // 16 values as f32 (bf16 widened by a shift of its bits).
  template <class T>
  static __m512 load16(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
      return _mm512_loadu_ps(p);
    } else {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
  template <class T>
  static __m512 load16_masked(const T* p, __mmask16 m) {
    if constexpr (std::is_same_v<T, float>) {
      return _mm512_maskz_loadu_ps(m, p);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(m, p);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }

  // How far ahead of the scan its lines are requested (measured on Zen 5: 4-16 KiB equally good).
  static constexpr int64_t kPrefetchBytes = 8192;

  // Compress in registers, then one full store: the memory form of vpcompressd is microcoded
  // (slow) on AMD cores.
  static int append(__m512 v, __mmask16 m, __m512i lanes, uint32_t* bits, int32_t* pos) {
    _mm512_storeu_si512(bits, _mm512_maskz_compress_epi32(m, _mm512_castps_si512(v)));
    _mm512_storeu_si512(pos, _mm512_maskz_compress_epi32(m, lanes));
    return __builtin_popcount(m);
  }

  template <bool kOrEqual, class T>
  static int64_t filter(const T* x, int64_t begin, int64_t end, float t, uint32_t* bits,
                        int32_t* pos) {
    constexpr int kAdmit =
        kOrEqual ? _CMP_NLT_UQ : _CMP_NLE_UQ;  // NaN compares unordered: admitted
    const __m512 threshold = _mm512_set1_ps(t);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t n = 0, j = begin;
    // Four vectors per step, compressed in registers unless the step admits nothing. Finer
    // branches do not pay on rows that stream from DRAM: a branch on values still on their way
    // from memory stalls the stream whenever it is mispredicted (measured on Zen 5: taking the
    // admitted values one by one, a branch each, is 1.5-2x slower on cold rows though faster on
    // rows in cache; compressing every step, no branch at all, is 10-20% slower on two threads).
    // The lines kPrefetchBytes ahead are requested on the way: the compresses keep the core busy
    // enough that its own lookahead and the hardware prefetcher leave memory partly idle. (A
    // prefetch never faults; past the row it fetches at most kPrefetchBytes of what follows.)
    for (; j + 64 <= end; j += 64) {
      const uintptr_t next = reinterpret_cast<uintptr_t>(x + j) + kPrefetchBytes;
      for (uintptr_t line = 0; line < 64 * sizeof(T); line += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(next + line), 0, 1);
      const __m512 v0 = load16(x + j), v1 = load16(x + j + 16), v2 = load16(x + j + 32),
                   v3 = load16(x + j + 48);
      const __mmask16 m0 = _mm512_cmp_ps_mask(v0, threshold, kAdmit),
                      m1 = _mm512_cmp_ps_mask(v1, threshold, kAdmit),
                      m2 = _mm512_cmp_ps_mask(v2, threshold, kAdmit),
                      m3 = _mm512_cmp_ps_mask(v3, threshold, kAdmit);
      if (((m0 | m1) | (m2 | m3)) == 0) continue;
      const __m512i base = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(j)));
      const __m512i sixteen = _mm512_set1_epi32(16);
      n += append(v0, m0, base, bits + n, pos + n);
      const __m512i base1 = _mm512_add_epi32(base, sixteen);
      n += append(v1, m1, base1, bits + n, pos + n);
      const __m512i base2 = _mm512_add_epi32(base1, sixteen);
      n += append(v2, m2, base2, bits + n, pos + n);
      n += append(v3, m3, _mm512_add_epi32(base2, sixteen), bits + n, pos + n);
    }
    for (; j < end; j += 16) {
      const int left = static_cast<int>(std::min<int64_t>(16, end - j));
      const __mmask16 valid = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
      const __m512 v = load16_masked(x + j, valid);
      const __mmask16 m = _mm512_mask_cmp_ps_mask(valid, v, threshold, kAdmit);
      if (m == 0) continue;
      const __m512i base = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(j)));
      n += append(v, m, base, bits + n, pos + n);
    }
    return n;
  }

  template <class T>
  static int64_t append_all(const T* x, int64_t begin, int64_t end, uint32_t* bits, int32_t* pos) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t j = begin; j < end; j += 16) {
      const int left = static_cast<int>(std::min<int64_t>(16, end - j));
      const __mmask16 valid = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
      const __m512 v = load16_masked(x + j, valid);
      _mm512_storeu_si512(bits + (j - begin), _mm512_castps_si512(v));
      _mm512_storeu_si512(pos + (j - begin),
                          _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(j))));
    }
    return end - begin;
  }

  static __m512i keys16(__m512i v) {
    const __m512i sign = _mm512_srai_epi32(v, 31);
    const __m512i key = _mm512_xor_si512(v, _mm512_or_si512(sign, _mm512_set1_epi32(INT32_MIN)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(v, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    return _mm512_mask_mov_epi32(key, nan, _mm512_set1_epi32(-1));
  }
  static __mmask16 first_lanes(int64_t left) {
    return static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
  }

  static void offset_positions(const int32_t* pos, int64_t n, int32_t offset, int32_t* out) {
    const __m512i add = _mm512_set1_epi32(offset);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 valid = first_lanes(n - i);
      _mm512_mask_storeu_epi32(out + i, valid,
                               _mm512_add_epi32(_mm512_maskz_loadu_epi32(valid, pos + i), add));
    }
  }

  static void make_keys(const uint32_t* bits, int64_t n, uint32_t* keys, uint32_t& lo,
                        uint32_t& hi) {
    __m512i vlo = _mm512_set1_epi32(-1), vhi = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 valid = first_lanes(n - i);
      const __m512i key = keys16(_mm512_maskz_loadu_epi32(valid, bits + i));
      _mm512_mask_storeu_epi32(keys + i, valid, key);
      vlo = _mm512_mask_min_epu32(vlo, valid, vlo, key);
      vhi = _mm512_mask_max_epu32(vhi, valid, vhi, key);
    }
    lo = _mm512_reduce_min_epu32(vlo);
    hi = _mm512_reduce_max_epu32(vhi);
  }
  static int64_t gather_bin(const uint32_t* in, int64_t m, uint32_t base, int shift, uint32_t bin,
                            uint32_t* out) {
    const __m512i offset = _mm512_set1_epi32(static_cast<int32_t>(base));
    const __m512i wanted = _mm512_set1_epi32(static_cast<int32_t>(bin));
    const __m128i count = _mm_cvtsi32_si128(shift);
    int64_t kept = 0;
    for (int64_t i = 0; i < m; i += 16) {
      const __mmask16 valid = first_lanes(m - i);
      const __m512i key = _mm512_maskz_loadu_epi32(valid, in + i);
      const __m512i field = _mm512_srl_epi32(_mm512_sub_epi32(key, offset), count);
      const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(valid, field, wanted);
      _mm512_storeu_si512(out + kept, _mm512_maskz_compress_epi32(hit, key));
      kept += __builtin_popcount(hit);
    }
    return kept;
  }
  // In place: a step stores at out <= i after loading [i, i + 16), so it never overwrites an
  // element that is still to be read.
  static int64_t compact(uint32_t* bits, int32_t* pos, const uint32_t* keys, int64_t n,
                         uint32_t kth, int64_t need) {
    const __m512i threshold = _mm512_set1_epi32(static_cast<int32_t>(kth));
    int64_t out = 0;
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 valid = first_lanes(n - i);
      const __m512i key = _mm512_maskz_loadu_epi32(valid, keys + i);
      uint32_t equal = _mm512_mask_cmpeq_epi32_mask(valid, key, threshold);
      // Ties: only the first `need` of them, in order.
      while (__builtin_popcount(equal) > need) equal ^= 1u << (31 - __builtin_clz(equal));
      need -= __builtin_popcount(equal);
      const __mmask16 keep =
          _mm512_mask_cmpgt_epu32_mask(valid, key, threshold) | static_cast<__mmask16>(equal);
      const __m512i b = _mm512_maskz_loadu_epi32(valid, bits + i);
      const __m512i p = _mm512_maskz_loadu_epi32(valid, pos + i);
      _mm512_storeu_si512(bits + out, _mm512_maskz_compress_epi32(keep, b));
      _mm512_storeu_si512(pos + out, _mm512_maskz_compress_epi32(keep, p));
      out += __builtin_popcount(keep);
    }
    return out;
  }
};

template <>
struct Scan<tile::amx_t> : Scan<tile::avx512_t> {};
#endif
DSK_SILENCE_GCC_BUG_105593_END

// ---- the candidate buffer ----

// Sizes of the buffer for a given k: it is cut back to k when it holds k + slack candidates, and
// a scan step appends at most kStep (plus 16 entries written past the end).
inline constexpr int64_t kStep = 1024;
inline constexpr int64_t slack_for(int64_t k) {
  return std::clamp<int64_t>(2 * k, 2048, 8192);
}
inline constexpr int64_t buffer_capacity(int64_t k) {
  return k + slack_for(k) + kStep + 16;
}

// Scratch for one row segment: candidate bits and positions, plus key space for the select.
struct Buffer {
  uint32_t* bits;  // buffer_capacity(k)
  int32_t* pos;    // buffer_capacity(k)
  uint32_t* keys;  // 2 * buffer_capacity(k): the keys, then the narrowing subsets of the select
};

// Bits per radix round: 256 bins keep the four histogram tables (4 KiB) cheap to clear.
inline constexpr int kRadixBits = 8;

// Counts of the bins (key - base) >> shift (each < bins) over m keys. With many keys, four
// interleaved tables keep runs of keys in one bin from serialising on one counter.
inline void histogram(const uint32_t* keys, int64_t m, uint32_t base, int shift, uint32_t bins,
                      uint32_t* hist) {
  if (m < static_cast<int64_t>(bins)) {  // few keys: clearing four tables would dominate
    std::fill(hist, hist + bins, 0u);
    for (int64_t i = 0; i < m; ++i) ++hist[(keys[i] - base) >> shift];
    return;
  }
  uint32_t part[4][1u << kRadixBits];
  for (auto& p : part) std::fill(p, p + bins, 0u);
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    for (int j = 0; j < 4; ++j) ++part[j][(keys[i + j] - base) >> shift];
  for (; i < m; ++i) ++part[0][(keys[i] - base) >> shift];
  for (uint32_t b = 0; b < bins; ++b) hist[b] = part[0][b] + part[1][b] + part[2][b] + part[3][b];
}

// The floor of a radix select over keys[0, m) (lo / hi: their smallest and largest): a key F such
// that at least `want` keys are >= F. Each round splits the keys' range [base, base + 2^undecided)
// into up to 2^kRadixBits equal bins and keeps the one holding the want-th key; it starts from the
// keys' own range [lo, hi], not from aligned bit fields (the keys of a threshold's candidates
// often straddle a power of two, where the highest differing bit would split them into only two
// bins), and each round reads only the keys of the previous round's bin (gathered into `subset`,
// m entries). It stops at the first round whose bin, kept whole with every key above it, holds at
// most max_keep keys (ties = -1: keep every key >= F); with max_keep == want it can run to the
// exact want-th key (ties = how many keys equal to F to keep, the rest being above F).
struct RadixFloor {
  uint32_t key;
  int64_t ties;
};

template <class I>
RadixFloor radix_floor(const uint32_t* keys, int64_t m, uint32_t lo, uint32_t hi, int64_t want,
                       int64_t max_keep, uint32_t* subset) {
  uint32_t base = lo;
  int undecided = lo == hi ? 0 : 32 - __builtin_clz(hi - lo);  // every key - base < 2^undecided
  int64_t need = want;  // how many of the keys from `base` up must still be taken
  int64_t above = 0;    // keys above the current bin
  const uint32_t* in = keys;
  uint32_t hist[1u << kRadixBits];
  while (undecided > 0) {
    const int width = std::min(kRadixBits, undecided), shift = undecided - width;
    const uint32_t bins = 1u << width;
    histogram(in, m, base, shift, bins, hist);
    uint32_t bin = bins - 1;
    while (static_cast<int64_t>(hist[bin]) < need) {
      need -= hist[bin];
      above += hist[bin--];
    }
    const uint32_t bin_base = base;
    base += bin << shift;
    undecided = shift;
    if (above + static_cast<int64_t>(hist[bin]) <= max_keep) return {base, -1};
    if (undecided > 0 && static_cast<int64_t>(hist[bin]) < m) {  // else all are in the bin
      m = Scan<I>::gather_bin(in, m, bin_base, shift, bin, subset);
      in = subset;
    }
  }
  return {base, need};  // base is the want-th key
}

// Cuts the buffer's n > k candidates down to at most max_keep (>= k), in buffer order, and
// returns a floor key F: every kept key is >= F, at least k are kept, so a later value whose key
// is <= F can no longer enter the top k. With max_keep == k it keeps exactly k: everything above
// the k-th key and its ties in buffer order. The keys go to b.keys, the select's subsets behind.
template <class I>
uint32_t cut(Buffer& b, int64_t& n, int64_t k, int64_t max_keep) {
  using S = Scan<I>;
  uint32_t lo = 0, hi = 0;
  S::make_keys(b.bits, n, b.keys, lo, hi);
  const RadixFloor floor = radix_floor<I>(b.keys, n, lo, hi, k, max_keep, b.keys + n);
  if (floor.ties >= 0)
    n = S::compact(b.bits, b.pos, b.keys, n, floor.key, floor.ties);
  else if (floor.key > 0)
    n = S::compact(b.bits, b.pos, b.keys, n, floor.key - 1, 0);
  return floor.key;
}

// ---- the starting threshold ----

// Before the scan, a sample of the segment (kSamplePieces runs of 16 values, evenly spread) gives
// a threshold that about k + slack / 2 values of the segment reach: the scan then admits few
// values and usually ends with one cut, instead of filling and cutting the buffer while its
// threshold climbs. The threshold is a sampled value, so values equal to it are admitted, and when
// fewer than k values of the segment reach it (an unrepresentative sample), the segment is
// scanned again without it.
inline constexpr int64_t kSamplePieces = 64;
inline constexpr int64_t kSampleSize = 16 * kSamplePieces;
// The sample and its radix select use the candidate buffer before the scan starts.
static_assert(buffer_capacity(1) >= kSampleSize + 16);

// How a scan admits values: all of them, those >= a threshold (a sampled one), or those above it
// (a cut's floor). NaN is always admitted.
enum class Admit { all, at_or_above, above };

struct Threshold {
  Admit admit = Admit::all;
  float value = 0.0f;
};

// The rank in the sample whose value about k + slack / 2 values of a segment of `length` reach,
// or 0 when sampling does not pay: a short segment, or a threshold that would admit an eighth of
// it or more.
inline int64_t sample_rank(int64_t length, int64_t k) {
  if (length < 16 * kSampleSize) return 0;
  const int64_t target = k + slack_for(k) / 2;
  const int64_t rank = (target * kSampleSize + length - 1) / length;
  return 8 * rank <= kSampleSize ? rank : 0;
}

// Where sample piece p (of kSamplePieces) of [begin, end) starts.
inline int64_t sample_piece(int64_t begin, int64_t end, int64_t p) {
  return begin + (end - begin - 16) * p / (kSamplePieces - 1);
}

// Asks for the sample's cache lines ahead of time: they are scattered over the segment, so each
// one is a separate trip to memory.
template <class T>
inline void prefetch_sample(const T* x, int64_t begin, int64_t end, int64_t k) {
  if (sample_rank(end - begin, k) == 0) return;
  for (int64_t p = 0; p < kSamplePieces; ++p) __builtin_prefetch(x + sample_piece(begin, end, p));
}

// The sampled starting threshold of x[begin, end) for a top k (none when sampling does not pay).
template <class I, class T>
Threshold sampled_threshold(const T* x, int64_t begin, int64_t end, int64_t k, Buffer& b) {
  const int64_t rank = sample_rank(end - begin, k);
  if (rank == 0) return {};
  for (int64_t p = 0; p < kSamplePieces; ++p) {
    const int64_t j = sample_piece(begin, end, p);
    Scan<I>::append_all(x, j, j + 16, b.bits + 16 * p, b.pos + 16 * p);
  }
  uint32_t lo = 0, hi = 0;
  Scan<I>::make_keys(b.bits, kSampleSize, b.keys, lo, hi);
  // At least `rank` sampled values are >= key. Keys above +inf's are NaN's, whose threshold +inf
  // also admits; keys at or below -inf's admit every value.
  const uint32_t key =
      std::min(radix_floor<I>(b.keys, kSampleSize, lo, hi, rank, rank, b.keys + kSampleSize).key,
               order_key(0x7F800000u));
  if (key <= order_key(0xFF800000u)) return {};
  const uint32_t bits = bits_of_key(key);
  Threshold t{Admit::at_or_above, 0.0f};
  std::memcpy(&t.value, &bits, 4);
  return t;
}

// ---- the scan of a segment ----

// Without a sampled threshold, the row is visited in blocks of kVisit values in a fixed scattered
// order (a stride coprime with their count), so that a rising sequence (sorted input) does not send
// every value into the buffer; a block is long enough for the hardware prefetcher to stream it.
// A sampled threshold already sits near the k-th value whatever the order, so those rows are read
// front to back, where the hardware prefetcher needs no help.
inline constexpr int64_t kVisit = 8 * kStep;

inline int64_t visiting_stride(int64_t blocks, const Threshold& start) {
  if (blocks <= 2 || start.admit != Admit::all) return 1;
  int64_t s = blocks / 2 + 1;
  while (std::gcd(s, blocks) != 1) ++s;
  return s;
}

// Prefetches the cache lines of x[j0, j1) into L2.
template <class T>
inline void prefetch_range(const T* x, int64_t j0, int64_t j1) {
  tile::prefetch_l2(x + j0, (j1 - j0) * static_cast<int64_t>(sizeof(T)));
}

// Appends the candidates of x[j0, j1) that `t` admits; returns how many.
template <class I, class T>
int64_t admit(const T* x, int64_t j0, int64_t j1, const Threshold& t, Buffer& b, int64_t n) {
  switch (t.admit) {
    case Admit::all:
      return Scan<I>::append_all(x, j0, j1, b.bits + n, b.pos + n);
    case Admit::at_or_above:
      return Scan<I>::template filter<true>(x, j0, j1, t.value, b.bits + n, b.pos + n);
    case Admit::above:
      break;
  }
  return Scan<I>::template filter<false>(x, j0, j1, t.value, b.bits + n, b.pos + n);
}

// One pass over x[begin, end) starting from threshold t, leaving the candidates in the buffer:
// exactly k, or fewer when t admitted fewer than k values (then false). Whenever the buffer fills,
// it is cut and the threshold rises to the cut's floor.
template <class I, class T>
bool scan_segment(const T* x, int64_t begin, int64_t end, int64_t k, Threshold t, Buffer& b) {
  const int64_t slack = slack_for(k);
  const int64_t blocks = (end - begin + kVisit - 1) / kVisit;
  const int64_t stride = visiting_stride(blocks, t);
  int64_t n = 0;
  for (int64_t visit = 0, block = 0; visit < blocks; ++visit, block = (block + stride) % blocks) {
    const int64_t block_end = std::min(end, begin + (block + 1) * kVisit);
    // A next block that does not follow this one starts where the hardware prefetcher cannot
    // guess: fetch it piece by piece while this one is scanned.
    const int64_t ahead = visit + 1 < blocks ? ((block + stride) % blocks - block) * kVisit : 0;
    for (int64_t j0 = begin + block * kVisit; j0 < block_end; j0 += kStep) {
      const int64_t j1 = std::min(block_end, j0 + kStep);
      if (ahead != 0 && ahead != kVisit) prefetch_range(x, j0 + ahead, std::min(end, j1 + ahead));
      n += admit<I>(x, j0, j1, t, b, n);
      if (n < k + slack) continue;
      // Free at least half the slack; later values must rank above the floor to matter.
      const uint32_t floor = cut<I>(b, n, k, k + slack / 2);
      if (floor == kNanKey) {  // at least k NaNs: nothing ranks above them
        cut<I>(b, n, k, k);
        return true;
      }
      const uint32_t bits = bits_of_key(floor);
      t.admit = Admit::above;
      std::memcpy(&t.value, &bits, 4);
    }
  }
  if (n > k) cut<I>(b, n, k, k);
  return n == k;
}

// The top k of x[begin, end) (end - begin > k) into the buffer: returns with exactly k candidates
// in b.bits / b.pos (positions absolute in x).
template <class I, class T>
void select_segment(const T* x, int64_t begin, int64_t end, int64_t k, Buffer& b) {
  const Threshold sampled = sampled_threshold<I>(x, begin, end, k, b);
  if (scan_segment<I>(x, begin, end, k, sampled, b)) return;
  scan_segment<I>(x, begin, end, k, Threshold{}, b);  // the sample overestimated the k-th value
}

// ---- whole rows ----

// What a launch over rows needs (pointers to the API layer's checked tensors).
struct RowArgs {
  const void* x = nullptr;  // T [b, N]
  int64_t x_stride = 0;
  int64_t cols = 0;                 // N
  const int32_t* starts = nullptr;  // [b] or null (0)
  const int32_t* ends = nullptr;    // [b] or null (N)
  int64_t k = 0;
  int32_t* indices = nullptr;           // [b, k]
  void* values = nullptr;               // T [b, k] or null
  const int32_t* offsets = nullptr;     // [b] or null
  const int32_t* page_table = nullptr;  // [b, max_blocks] or null
  int64_t page_stride = 0;
  int64_t page_block_size = 0;
  int32_t fill = -1;
  bool sorted_index = false;
};

inline int64_t row_begin(const RowArgs& a, int64_t row) {
  return a.starts ? a.starts[row] : 0;
}
inline int64_t row_end(const RowArgs& a, int64_t row) {
  return a.ends ? a.ends[row] : a.cols;
}

// The output index of position j of row `row`: the position plus the offset, or its global slot.
inline int32_t output_index(const RowArgs& a, int64_t row, int32_t j) {
  if (a.page_table) {
    const int64_t block = a.page_table[row * a.page_stride + j / a.page_block_size];
    return static_cast<int32_t>(block * a.page_block_size + j % a.page_block_size);
  }
  return a.offsets ? j + a.offsets[row] : j;
}

template <class T>
inline T value_of_bits(uint32_t bits) {
  if constexpr (std::is_same_v<T, float>) {
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  } else {
    return T{static_cast<uint16_t>(bits >> 16)};
  }
}

// Writes row `row`'s outputs from its n <= k selected (bits, positions) and pads the rest.
// scratch: n entries, used to sort by position when sorted_index.
template <class I, class T>
void write_row(const RowArgs& a, int64_t row, uint32_t* bits, int32_t* pos, int64_t n,
               uint64_t* scratch) {
  if (a.sorted_index && n > 1) {
    // Positions are distinct and non-negative: sorting (position << 32 | bits) sorts the pairs.
    for (int64_t i = 0; i < n; ++i)
      scratch[i] = static_cast<uint64_t>(static_cast<uint32_t>(pos[i])) << 32 | bits[i];
    std::sort(scratch, scratch + n);
    for (int64_t i = 0; i < n; ++i) {
      pos[i] = static_cast<int32_t>(scratch[i] >> 32);
      bits[i] = static_cast<uint32_t>(scratch[i]);
    }
  }
  int32_t* idx = a.indices + row * a.k;
  if (a.page_table)
    for (int64_t i = 0; i < n; ++i) idx[i] = output_index(a, row, pos[i]);
  else
    Scan<I>::offset_positions(pos, n, a.offsets ? a.offsets[row] : 0, idx);
  for (int64_t i = n; i < a.k; ++i) idx[i] = a.fill;
  if (a.values) {
    T* v = static_cast<T*>(a.values) + row * a.k;
    for (int64_t i = 0; i < n; ++i) v[i] = value_of_bits<T>(bits[i]);
    for (int64_t i = n; i < a.k; ++i) v[i] = value_of_bits<T>(0xFF800000u);  // -inf
  }
}

// Every position of [begin, end) as candidates (a row or segment no longer than k).
template <class I, class T>
int64_t take_all(const RowArgs& a, int64_t row, int64_t begin, int64_t end, Buffer& b) {
  const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
  return Scan<I>::append_all(x, begin, end, b.bits, b.pos);
}

// The candidates of positions [begin, end) of row `row` into b: all of them when there are at
// most k, else the top k. Returns how many.
template <class I, class T>
int64_t segment_candidates(const RowArgs& a, int64_t row, int64_t begin, int64_t end, Buffer& b) {
  if (end - begin <= a.k) return take_all<I, T>(a, row, begin, end, b);
  select_segment<I>(static_cast<const T*>(a.x) + row * a.x_stride, begin, end, a.k, b);
  return a.k;
}

// Rows [row0, row1), each by one thread.
template <class I, class T>
void topk_rows(const RowArgs& a, int64_t row0, int64_t row1, Buffer& b) {
  for (int64_t row = row0; row < row1; ++row) {
    if (row + 1 < row1)  // its sample lines arrive while this row is selected
      prefetch_sample(static_cast<const T*>(a.x) + (row + 1) * a.x_stride, row_begin(a, row + 1),
                      row_end(a, row + 1), a.k);
    const int64_t n = segment_candidates<I, T>(a, row, row_begin(a, row), row_end(a, row), b);
    write_row<I, T>(a, row, b.bits, b.pos, n, reinterpret_cast<uint64_t*>(b.keys));
  }
}

// One row from the candidates of its segments, gathered in b (n of them, any n).
template <class I, class T>
void merge_row(const RowArgs& a, int64_t row, int64_t n, Buffer& b) {
  if (n > a.k) cut<I>(b, n, a.k, a.k);
  write_row<I, T>(a, row, b.bits, b.pos, n, reinterpret_cast<uint64_t*>(b.keys));
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::select::kernels
