// FlashMLA's attention on the tile layer's dot tiles: one "item" is the query rows that share one
// KV head (the h_q heads of a query position, or the s_q x heads-per-KV-head rows of dense
// decode), attending over an ordered list of keys (d_qk bf16 values each; V is the first d_v).
//
// Per chunk of kChunk keys:
//   1. S^T = K . Q^T: the key rows (read where they lie, or dequantized from FP8 into scratch)
//      are the broadcast A side of a dot tile, the query rows, packed once per item into VNNI
//      pairs, the 16-lane B side; so no key is ever transposed.
//   2. Online softmax, 16 query rows per vector: running max m, rescale alpha, row sum l over the
//      unrounded probabilities; the probabilities rounded to bf16 into VNNI pairs of keys.
//   3. O (f32 [rows][d_v]) = alpha * O + P . V, V packed as VNNI pairs of adjacent keys.
// The item's (O, m, l) is then finalized (out = O / (l + e^(sink - m)), lse = m + ln l) or, when
// the keys were split over threads, merged with the other parts first (merge_parts).
//
// Every sum runs in a fixed order that depends only on the inputs and the split, so results
// repeat bit for bit. Header-only; the AVX-512 instances need the avx512 baseline of
// dsk/kernels/abi.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <dsk/kernels/mla/kv_format.hpp>
#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/block.hpp>
#include <dsk/kernels/tile/dot.hpp>
#include <dsk/kernels/tile/pack.hpp>
#include <dsk/kernels/tile/prefetch.hpp>
#include <dsk/kernels/tk/math.hpp>
#include <dsk/kernels/tk/simd.hpp>

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace dsk::kernels::mla {

// Keys per chunk of the dot-tile path: a multiple of 6, 8 and 12 (the key-tile heights) and of 2
// (VNNI pairs).
inline constexpr int64_t kChunk = 96;
// Keys per chunk of the tile-register path: a multiple of 32 (one K step of P . V). Each chunk's
// P . V leaves the tile registers to be merged into O, so longer chunks spend less on moving O;
// 192 keeps the chunk's operands (about 1 MiB at 128 query rows) inside L2.
inline constexpr int64_t kTileChunk = 192;
inline constexpr int64_t kMaxChunk = std::max(kChunk, kTileChunk);
// Query rows are padded to whole 16-lane vectors.
inline constexpr int64_t kRowAlign = 16;

inline namespace DSK_TILE_ABI {

// Where the rows of an item live: row r is (t, g) = (r / group, r % group) and sits at
// base + t * stride_t + g * stride_g (elements of the row's type).
struct RowMap {
  int64_t group = 1;
  int64_t stride_t = 0, stride_g = 0;
  constexpr int64_t offset(int64_t r) const {
    return (r / group) * stride_t + (r % group) * stride_g;
  }
};

struct Problem {
  int64_t rows = 0;      // query rows of an item
  int64_t rows_pad = 0;  // rows rounded up to kRowAlign
  int64_t d_qk = 0, d_v = 0;
  float scale = 0;  // softmax scale (natural units)
  // Key ordinal k is visible to row r only when k < key_limit[r] (bottom-right causal decode);
  // nullptr: every key of the list is visible. Sized rows_pad (0 past rows).
  const int32_t* key_limit = nullptr;
};

// Per-thread working memory (sizes from scratch_floats / scratch_bf16s, laid out by
// carve_scratch). A chunk has up to kMaxChunk keys.
struct Scratch {
  bf16* q_panel;   // [d_qk / 2][rows_pad][2], rows q_panel_ld apart
  bf16* keys;      // [chunk][d_qk]: dequantized (dot tiles) or gathered (tile registers) keys
  bf16* zeros;     // [d_qk] zeros: the rows that pad a chunk
  bf16* v_panel;   // [chunk / 2][d_v][2], rows v_panel_ld apart
  bf16* p_panel;   // [chunk / 2][rows_pad][2]
  bf16* p_rows;    // [rows_pad][kTileChunk]: P row-major, the A side of the tiles' P . V
  float* s;        // [chunk][rows_pad]
  float* alpha;    // [rows_pad]
  float* o_block;  // [32][32]: one block of a chunk's P . V out of the tile registers
  // The tile path's 32-key blocks of a chunk: block b's key rows start at key_block[b], key_ld[b]
  // bf16 apart (in s.keys, or where the source holds them).
  const bf16* key_block[kTileChunk / 32];
  int64_t key_ld[kTileChunk / 32];
};

// The running state of an item (or of one split of it).
struct State {
  float* o;  // [rows][d_v]
  float* m;  // [rows_pad]: max of the scaled scores so far, -inf before any
  float* l;  // [rows_pad]: sum of e^(score - m)
};

constexpr int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}
// Row strides (bf16) of the VNNI panels: two values per column and one cache line more, so that
// the rows of a tile fall in different L1 sets (at 2 KiB apart, 512 bf16 pairs, 16 rows share
// two sets of the 48 KiB L1 and evict each other).
constexpr int64_t q_panel_ld(const Problem& p) {
  return 2 * p.rows_pad + 32;
}
constexpr int64_t v_panel_ld(const Problem& p) {
  return 2 * p.d_v + 32;
}

// The scratch buffers one after another, each starting on a 64-byte line (a tile row that
// straddles two lines costs the tile load both). `Carve` visits them in order with their sizes.
inline constexpr int64_t kScratchAlign = 64;
template <class Carve>
void scratch_buffers(const Problem& p, Scratch& s, Carve&& carve) {
  carve(s.q_panel, p.d_qk / 2 * q_panel_ld(p));
  carve(s.keys, kMaxChunk * p.d_qk);
  carve(s.zeros, p.d_qk);
  carve(s.v_panel, kMaxChunk / 2 * v_panel_ld(p));
  carve(s.p_panel, kMaxChunk * p.rows_pad);
  carve(s.p_rows, p.rows_pad * kTileChunk);
  carve(s.s, kMaxChunk * p.rows_pad);
  carve(s.alpha, p.rows_pad);
  carve(s.o_block, int64_t{32 * 32});
}

// Elements of each type the scratch of p needs, the alignment of the bases included.
template <class T>
int64_t scratch_elements(const Problem& p) {
  constexpr int64_t kPerLine = kScratchAlign / static_cast<int64_t>(sizeof(T));
  int64_t total = kPerLine;
  Scratch s{};
  scratch_buffers(p, s, [&]<class U>(U*&, int64_t n) {
    if constexpr (std::is_same_v<U, T>) total += round_up(n, kPerLine);
  });
  return total;
}
inline int64_t scratch_bf16s(const Problem& p) {
  return scratch_elements<bf16>(p);
}
inline int64_t scratch_floats(const Problem& p) {
  return scratch_elements<float>(p);
}

// The scratch of p in bf16s (scratch_bf16s of them) and floats (scratch_floats).
inline Scratch carve_scratch(const Problem& p, bf16* bf16s, float* floats) {
  const auto align = [](auto* ptr) {
    const auto at = reinterpret_cast<uintptr_t>(ptr);
    return reinterpret_cast<decltype(ptr)>((at + kScratchAlign - 1) / kScratchAlign *
                                           kScratchAlign);
  };
  bf16* next_bf16 = align(bf16s);
  float* next_float = align(floats);
  Scratch s{};
  scratch_buffers(p, s, [&]<class U>(U*& buffer, int64_t n) {
    U*& next = [&]() -> U*& {
      if constexpr (std::is_same_v<U, bf16>)
        return next_bf16;
      else
        return next_float;
    }();
    buffer = next;
    next += round_up(n, kScratchAlign / static_cast<int64_t>(sizeof(U)));
  });
  return s;
}
inline int64_t state_floats(const Problem& p) {
  return p.rows * p.d_v + 2 * p.rows_pad;
}

// ---- key sources: where key ordinal k of an item's list lies ----
// Each source gives row(k, scratch_row), the d_qk bf16 of key k (written into scratch_row when it
// has to be converted), run_stride(k, count), the stride of keys [k, k + count) when they are bf16
// rows at one stride where they lie (else 0), and address(k), the first byte of its stored form,
// with bytes() of them:
// the next chunk's keys are prefetched into L2 while the current one is computed, because the
// gathered rows are scattered and the hardware prefetcher cannot follow them.

// Keys [kc, min(kc + chunk, k1)) of an item's list into L2: the next chunk's keys, fetched while
// the current one is computed.
template <class Source>
void prefetch_keys(const Problem& p, const Source& src, int64_t kc, int64_t chunk, int64_t k1) {
  for (int64_t k = kc; k < std::min(kc + chunk, k1); ++k)
    tile::prefetch_l2(src.address(k), src.bytes(2 * p.d_qk));
}

// Keys [k, k_end) of an item's list as a tile loop's feed (tile::mma_block): feed(lines) prefetches
// their next `lines` cache lines into L2. The tile kernel spreads the next chunk's keys over the
// current chunk's gather and products: all at once, or with each gathered row, they queue on the
// core's fill buffers and the gather's own loads wait behind them.
template <class Source>
struct KeyFeed {
  const Source* src = nullptr;
  int64_t k = 0, k_end = 0, bytes = 0;  // bytes: of one key's stored form
  int64_t offset = 0;                   // the next line of key k
  int64_t lines_left() const { return tile::feed_lines_left(k_end, bytes, k, offset); }
  void feed(int64_t lines) {
    const auto address = [this](int64_t key) -> const void* { return src->address(key); };
    tile::feed_lines(address, k_end, bytes, k, offset, lines);
  }
};

// Sparse prefill: rows of a bf16 kv [s_kv, d_qk] (row stride `stride`), by compacted index.
struct GatherSource {
  const bf16* kv;
  int64_t stride;
  const int32_t* index;  // [keys]: valid rows only
  const bf16* row(int64_t k, bf16*) const { return kv + index[k] * stride; }
  const void* address(int64_t k) const { return row(k, nullptr); }
  static constexpr int64_t bytes(int64_t row_bytes) { return row_bytes; }
  static constexpr int64_t run_stride(int64_t, int64_t) { return 0; }  // scattered rows
};

// Dense decode: position k of a request in a paged bf16 cache [blocks, page, h_kv, d_qk].
struct PagedSource {
  const bf16* cache;  // + the KV head's offset
  int64_t page, block_stride, token_stride;
  const int32_t* block_table;  // the request's row
  const bf16* row(int64_t k, bf16*) const {
    return cache + block_table[k / page] * block_stride + (k % page) * token_stride;
  }
  const void* address(int64_t k) const { return row(k, nullptr); }
  static constexpr int64_t bytes(int64_t row_bytes) { return row_bytes; }
  // Keys [k, k + count) are rows token_stride apart when they share a page, else 0.
  int64_t run_stride(int64_t k, int64_t count) const {
    return k / page == (k + count - 1) / page ? token_stride : 0;
  }
};

// Sparse FP8 decode: 656-byte tokens by global slot, dequantized into the scratch row.
struct Fp8Slots {
  const uint8_t* cache;
  int64_t page, block_stride;  // block_stride in bytes
  const int32_t* slot;         // [keys]: valid slots only
};

template <class I>
struct Fp8Source {
  Fp8Slots slots;
  const uint8_t* address(int64_t k) const {
    const int64_t slot = slots.slot[k];
    return slots.cache + (slot / slots.page) * slots.block_stride +
           (slot % slots.page) * kTokenBytes;
  }
  const bf16* row(int64_t k, bf16* dst) const {
    dequantize(address(k), dst);
    return dst;
  }
  static constexpr int64_t bytes(int64_t) { return kTokenBytes; }
  static constexpr int64_t run_stride(int64_t, int64_t) { return 0; }  // dequantized rows
  // kv_format.hpp's dequantize_token_bf16, 16 values at a time (64 with a power-of-two scale).
  static void dequantize(const uint8_t* token, bf16* dst) {
    using S = tk::kernels::Simd<I>;
    for (int64_t t = 0; t < kNumScales; ++t) {
      if (dequantize_pow2_tile(token, t, dst)) continue;
      const auto scale = S::set1(numeric::round_to_bf16(token_scale(token, t)));
      for (int64_t d = t * kScaleTile; d < (t + 1) * kScaleTile; d += 16)
        S::store(dst + d,
                 S::mul(S::load_e4m3_n(reinterpret_cast<const e4m3*>(token + d), 16), scale));
    }
    std::memcpy(dst + kLatentDim, token + kRopeOffset, 2 * kRopeDim);
  }
  // Tile t when its scale is 2^k (what quantize_kv_tokens writes) and every code times 2^k is a
  // normal bf16: code to bf16 by table, then k added to the exponent of each finite nonzero value
  // (zeros and NaN keep their bits). The product is exact, so the bits equal the f32 route's.
  // Returns false (nothing written) otherwise, or off AVX-512.
  static bool dequantize_pow2_tile([[maybe_unused]] const uint8_t* token,
                                   [[maybe_unused]] int64_t t, [[maybe_unused]] bf16* dst) {
    if constexpr (!std::same_as<tile::vector_isa_t<I>, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
      uint32_t bits;
      const float scale = token_scale(token, t);
      std::memcpy(&bits, &scale, 4);
      const int64_t exponent = bits >> 23;  // the sign must be 0
      // e4m3 values span exponents -9 .. 8: 2^k keeps them normal for k in [-117, 119].
      if ((bits & 0x007FFFFFu) != 0 || exponent < 127 - 117 || exponent > 127 + 119) return false;
      const __m512i add = _mm512_set1_epi16(static_cast<int16_t>((exponent - 127) << 7));
      const __m512i exponent_bits = _mm512_set1_epi16(0x7F80),
                    magnitude = _mm512_set1_epi16(0x7FFF);
      const auto scaled = [&](__m512i v) {
        const __mmask32 finite_nonzero =
            _mm512_test_epi16_mask(v, magnitude) &
            _mm512_cmpneq_epi16_mask(_mm512_and_si512(v, exponent_bits), exponent_bits);
        return _mm512_mask_add_epi16(v, finite_nonzero, v, add);
      };
      for (int64_t d = t * kScaleTile; d < (t + 1) * kScaleTile; d += 64) {
        const auto [lo, hi] = tile::e4m3x64_to_bf16(_mm512_loadu_si512(token + d));
        _mm512_storeu_si512(dst + d, scaled(lo));
        _mm512_storeu_si512(dst + d + 32, scaled(hi));
      }
      return true;
#endif
    }
    return false;
  }
};

namespace attention_detail {

using tile::DotTile;

// dst[2i + j] = bf16 of (j ? b : a)[i] for the 16 lanes: two key rows of probabilities as VNNI
// pairs.
template <class I>
inline void store_pairs(bf16* dst, typename tk::kernels::Simd<I>::F a,
                        typename tk::kernels::Simd<I>::F b) {
  using S = tk::kernels::Simd<I>;
  if constexpr (!std::same_as<tile::vector_isa_t<I>, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
    const __m512i lo = _mm512_cvtepu16_epi32(tile::f32x16_to_bf16(a));
    const __m512i hi = _mm512_cvtepu16_epi32(tile::f32x16_to_bf16(b));
    _mm512_storeu_si512(dst, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
#endif
  } else {
    for (int i = 0; i < 16; ++i) {
      dst[2 * i] = numeric::f32_to_bf16(S::lane(a, i));
      dst[2 * i + 1] = numeric::f32_to_bf16(S::lane(b, i));
    }
  }
}

// dst[2i + j] = (j ? b : a)[i] for i < n: two key rows as VNNI pairs (V's packing).
template <class I>
inline void interleave_rows(const bf16* a, const bf16* b, int64_t n, bf16* dst) {
  int64_t i = 0;
  if constexpr (!std::same_as<tile::vector_isa_t<I>, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
    for (; i + 16 <= n; i += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(a + i)));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + i)));
      _mm512_storeu_si512(dst + 2 * i, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
#endif
  }
  for (; i < n; ++i) {
    dst[2 * i] = a[i];
    dst[2 * i + 1] = b[i];
  }
}

// S^T rows [k0, k0 + Keys) x query columns [c0, c0 + 16 Vecs) of one chunk. (Passes over d_qk
// small enough to keep the query panel's slice in L1 measured no faster: L2 feeds it in time.)
template <class I, int Keys, int Vecs>
inline void score_tile(const Problem& p, const bf16* const (&keys)[Keys], int64_t k0, int64_t c0,
                       Scratch& s) {
  DotTile<I, Keys, Vecs> t;
  tile::dot_zero(t);
  tile::dot_steps_rows(t, keys, s.q_panel + 2 * c0, q_panel_ld(p), p.d_qk / 2);
  tile::dot_store(t, s.s + k0 * p.rows_pad + c0, p.rows_pad);
}

// S^T of a whole chunk: key tiles of Keys rows against query columns in blocks of 16 Vecs.
template <class I, int Keys, int Vecs>
inline void score_columns(const Problem& p, const bf16* const* key_rows, int64_t c0, Scratch& s) {
  for (int64_t k0 = 0; k0 < kChunk; k0 += Keys) {
    const bf16* keys[Keys];
    for (int r = 0; r < Keys; ++r) keys[r] = key_rows[k0 + r];
    score_tile<I, Keys, Vecs>(p, keys, k0, c0, s);
  }
}

template <class I>
void scores(const Problem& p, const bf16* const* key_rows, Scratch& s) {
  int64_t c0 = 0;
  for (; c0 + 64 <= p.rows_pad; c0 += 64) score_columns<I, 6, 4>(p, key_rows, c0, s);
  switch ((p.rows_pad - c0) / 16) {
    case 3:
      score_columns<I, 6, 3>(p, key_rows, c0, s);
      break;
    case 2:
      score_columns<I, 8, 2>(p, key_rows, c0, s);
      break;
    case 1:
      score_columns<I, 12, 1>(p, key_rows, c0, s);
      break;
    default:
      break;
  }
}

// Online softmax over the n keys [k_begin, k_begin + n) of a chunk (scores in s.s): updates m and
// l, writes alpha (the factor O must be rescaled by) and the bf16 probabilities of `width` keys
// (an even count >= n; those past n are 0).
template <class I>
void softmax_chunk(const Problem& p, int64_t k_begin, int64_t n, int64_t width, Scratch& s,
                   State& st) {
  using S = tk::kernels::Simd<I>;
  using F = typename S::F;
  const F scale = S::set1(p.scale);
  const F neg_inf = S::set1(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < p.rows_pad; c += 16) {
    const auto limit = p.key_limit ? S::iload(p.key_limit + c) : S::iset1(INT32_MAX);
    // Lane i of row r is visible when k_begin + r < limit[i].
    const auto visible = [&](int64_t r) {
      return S::ilt(S::iset1(static_cast<int32_t>(k_begin + r)), limit);
    };
    F chunk_max = neg_inf;
    for (int64_t r = 0; r < n; ++r) {
      const F x = S::select(visible(r), S::mul(S::load(s.s + r * p.rows_pad + c), scale), neg_inf);
      chunk_max = S::max(x, chunk_max);
    }
    const F m_old = S::load(st.m + c);
    const F m_new = S::max(chunk_max, m_old);
    // A row that has seen no visible key keeps m = -inf; subtracting 0 instead keeps e^x = 0.
    const F m_safe = S::select(S::eq(m_new, neg_inf), S::zero(), m_new);
    const F alpha = tk::kernels::exp<S>(S::sub(m_old, m_safe));
    F sum = S::zero();
    for (int64_t r = 0; r < width; r += 2) {
      F pr[2];
      for (int64_t j = 0; j < 2; ++j) {
        pr[j] = S::zero();
        if (r + j >= n) continue;
        const F x = S::select(visible(r + j),
                              S::mul(S::load(s.s + (r + j) * p.rows_pad + c), scale), neg_inf);
        pr[j] = S::select(visible(r + j), tk::kernels::exp<S>(S::sub(x, m_safe)), S::zero());
        sum = S::add(sum, pr[j]);
      }
      store_pairs<I>(s.p_panel + (r / 2) * 2 * p.rows_pad + 2 * c, pr[0], pr[1]);
    }
    S::store(st.l + c, S::add(S::mul(S::load(st.l + c), alpha), sum));
    S::store(st.m + c, m_new);
    S::store(s.alpha + c, alpha);
  }
}

// O rows [r0, r0 + Rows) x columns [c0, c0 + 64) += P . V over the chunk's key pairs.
template <class I, int Rows>
inline void pv_tile(const Problem& p, int64_t r0, int64_t c0, int64_t pairs, const Scratch& s,
                    State& st) {
  DotTile<I, Rows, 4> t;
  float* o = st.o + r0 * p.d_v + c0;
  tile::dot_load(t, o, p.d_v);
  for (int64_t k2 = 0; k2 < pairs; ++k2) {
    tile::DotPairs<I> b[4];
    for (int v = 0; v < 4; ++v)
      b[v] = tile::dot_load_pairs<I>(s.v_panel + k2 * v_panel_ld(p) + 2 * (c0 + 16 * v));
    tile::dot_step(t, s.p_panel + k2 * 2 * p.rows_pad + 2 * r0, 2, b);
  }
  tile::dot_store(t, o, p.d_v);
}

// The last rows of a column block (left < 6 of them) as one tile of exactly that height.
template <class I, int... H>
inline void pv_tail(std::integer_sequence<int, H...>, int64_t left, const Problem& p, int64_t r0,
                    int64_t c0, int64_t pairs, const Scratch& s, State& st) {
  ((left == H + 1 ? pv_tile<I, H + 1>(p, r0, c0, pairs, s, st) : void()), ...);
}

template <class I>
void accumulate_pv(const Problem& p, int64_t pairs, const Scratch& s, State& st) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float a = s.alpha[r];
    if (a == 1.0f) continue;
    float* o = st.o + r * p.d_v;
    for (int64_t c = 0; c < p.d_v; ++c) o[c] *= a;
  }
  for (int64_t c0 = 0; c0 < p.d_v; c0 += 64) {
    int64_t r0 = 0;
    for (; r0 + 6 <= p.rows; r0 += 6) pv_tile<I, 6>(p, r0, c0, pairs, s, st);
    pv_tail<I>(std::make_integer_sequence<int, 5>{}, p.rows - r0, p, r0, c0, pairs, s, st);
  }
}

// ---- the tile-register path: S^T and P . V as bf16 tile products (amx; the avx512 and generic
// units emulate AMX bit for bit, which is how machines without AMX test it) ----

template <tile::Isa T>
using TileUnitOf = typename tile::BlockRegs<T>::Unit;

// bytes from src to dst: inline vector moves when whole lines, where memcpy's call and its
// string-move strategy cost more than the copy of a 1 KiB key row.
template <class V>
inline void copy_row(const bf16* src, size_t bytes, bf16* dst) {
  if constexpr (!std::same_as<V, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
    if (bytes % 64 == 0) {
      const auto* from = reinterpret_cast<const char*>(src);
      auto* to = reinterpret_cast<char*>(dst);
      for (size_t b = 0; b < bytes; b += 64)
        _mm512_storeu_si512(to + b, _mm512_loadu_si512(from + b));
      return;
    }
#endif
  }
  std::memcpy(static_cast<void*>(dst), src, bytes);
}

// The chunk's keys [kc, kc + n) as the 32-key blocks of s.key_block, zero rows up to `width`,
// and V's key pairs of those rows into s.v_panel: a whole block of rows one stride apart where
// they lie (a page of the dense decode's cache) is read there, by the tile loads and the pairing;
// any other block is copied (or dequantized) into s.keys first. Either way each key is read from
// its source once and packed from L1. With each row, lines_per_row lines of `next` (the next
// chunk's keys) are prefetched.
template <class V, class Source>
void gather_chunk(const Problem& p, const Source& src, int64_t kc, int64_t n, int64_t width,
                  KeyFeed<Source>& next, int lines_per_row, Scratch& s) {
  const auto row_bytes = static_cast<size_t>(2 * p.d_qk);
  for (int64_t r0 = 0; r0 < width; r0 += 32) {
    const int64_t ld = r0 + 32 <= n ? src.run_stride(kc + r0, 32) : 0;
    const bf16* block = ld != 0 ? src.row(kc + r0, nullptr) : s.keys + r0 * p.d_qk;
    s.key_block[r0 / 32] = block;
    s.key_ld[r0 / 32] = ld != 0 ? ld : p.d_qk;
    for (int64_t r = r0; r < r0 + 32; ++r) {
      next.feed(lines_per_row);
      if (ld == 0) {
        bf16* dst = s.keys + r * p.d_qk;
        if (r < n) {
          const bf16* row = src.row(kc + r, dst);
          if (row != dst) copy_row<V>(row, row_bytes, dst);
        } else {
          std::memset(static_cast<void*>(dst), 0, row_bytes);
        }
      }
      if (r % 2 == 1) {  // width is even
        const bf16* pair = block + (r - 1 - r0) * s.key_ld[r0 / 32];
        interleave_rows<V>(pair, pair + s.key_ld[r0 / 32], p.d_v,
                           s.v_panel + r / 2 * v_panel_ld(p));
      }
    }
  }
}

// S^T [width keys][rows_pad] = keys . Q^T (the blocks of s.key_block), in 32 x 32 blocks over d_qk.
template <tile::Isa T, class Feed>
void tile_scores(TileUnitOf<T>& u, const Problem& p, int64_t width, Scratch& s, Feed& feed,
                 int lines_per_step) {
  for (int64_t k0 = 0; k0 < width; k0 += 32) {
    const bf16* a = s.key_block[k0 / 32];
    const int64_t lda = s.key_ld[k0 / 32];
    float* c = s.s + k0 * p.rows_pad;
    int64_t c0 = 0;
    for (; c0 + 32 <= p.rows_pad; c0 += 32)
      tile::mma_block<T, 32, 32>(u, a, lda, s.q_panel + 2 * c0, q_panel_ld(p), p.d_qk, c + c0,
                                 p.rows_pad, false, &feed, lines_per_step);
    if (c0 < p.rows_pad)
      tile::mma_block<T, 32, 16>(u, a, lda, s.q_panel + 2 * c0, q_panel_ld(p), p.d_qk, c + c0,
                                 p.rows_pad, false, &feed, lines_per_step);
  }
}

// Tile steps of tile_scores and tile_pv for a chunk of `width` keys.
inline int64_t chunk_tile_steps(const Problem& p, int64_t width) {
  const int64_t scores = width / 32 * ((p.rows_pad + 31) / 32) * (p.d_qk / 32);
  const int64_t pv = (p.rows + 31) / 32 * (p.d_v / 32) * (width / 32);
  return scores + pv;
}

// O = alpha * O + P . V for the chunk: each 32 x 32 block of P . V is summed from zero in the
// tile registers over the chunk's keys, then merged into O with one FMA per element (the rescale
// and the accumulation in one pass over O).
template <tile::Isa T, class Feed>
void tile_pv(TileUnitOf<T>& u, const Problem& p, int64_t width, Scratch& s, State& st, Feed& feed,
             int lines_per_step) {
  using S = tk::kernels::SimdOf<T>;
  // P from its VNNI pairs of keys to rows of keys: a dword transpose, which is what packing an
  // N x K matrix into VNNI form does (N = key pairs, K = the rows' pairs of bf16).
  const int rows2 = static_cast<int>(2 * p.rows_pad), pairs = static_cast<int>(width / 2);
  tile::pack_b_vnni_nt<T>(s.p_panel, rows2, rows2, pairs, s.p_rows, kTileChunk, rows2, pairs);
  for (int64_t r0 = 0; r0 < p.rows; r0 += 32) {
    const bf16* a = s.p_rows + r0 * kTileChunk;
    const int64_t rows = std::min<int64_t>(32, p.rows - r0);
    for (int64_t c0 = 0; c0 < p.d_v; c0 += 32) {
      const bf16* b = s.v_panel + 2 * c0;
      if (p.rows_pad - r0 >= 32)
        tile::mma_block<T, 32, 32>(u, a, kTileChunk, b, v_panel_ld(p), width, s.o_block, 32, false,
                                   &feed, lines_per_step);
      else
        tile::mma_block<T, 16, 32>(u, a, kTileChunk, b, v_panel_ld(p), width, s.o_block, 32, false,
                                   &feed, lines_per_step);
      for (int64_t r = 0; r < rows; ++r) {
        float* o = st.o + (r0 + r) * p.d_v + c0;
        const auto alpha = S::set1(s.alpha[r0 + r]);
        for (int64_t j = 0; j < 32; j += 16)
          S::store(o + j, S::fma(S::load(o + j), alpha, S::load(s.o_block + r * 32 + j)));
      }
    }
  }
}

}  // namespace attention_detail

// The query rows of an item into s.q_panel: row r at q + map.offset(r) (d_qk contiguous bf16);
// rows past p.rows are zero. A dword transpose (the panel's row g holds pair g of every query
// row), done 16 x 16 in registers on AVX-512.
template <class I>
void pack_queries(const Problem& p, const bf16* q, const RowMap& map, Scratch& s) {
  auto* panel = reinterpret_cast<uint32_t*>(s.q_panel);
  const int64_t ld = q_panel_ld(p) / 2, pairs = p.d_qk / 2;  // in pairs
  std::fill(s.zeros, s.zeros + p.d_qk, bf16{});
  if constexpr (!std::same_as<tile::vector_isa_t<I>, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
    if (pairs % 16 == 0) {
      for (int64_t r0 = 0; r0 < p.rows_pad; r0 += 16) {
        const bf16* rows[16];
        for (int i = 0; i < 16; ++i) rows[i] = r0 + i < p.rows ? q + map.offset(r0 + i) : nullptr;
        for (int64_t g0 = 0; g0 < pairs; g0 += 16) {
          __m512i v[16];
          for (int i = 0; i < 16; ++i)
            v[i] = rows[i] ? _mm512_loadu_si512(rows[i] + 2 * g0) : _mm512_setzero_si512();
          tile::detail::transpose_16x16_epi32(v);
          for (int j = 0; j < 16; ++j) _mm512_storeu_si512(panel + (g0 + j) * ld + r0, v[j]);
        }
      }
      return;
    }
#endif
  }
  for (int64_t r = 0; r < p.rows_pad; ++r) {
    if (r >= p.rows) {
      for (int64_t k2 = 0; k2 < pairs; ++k2) panel[k2 * ld + r] = 0;
      continue;
    }
    const bf16* row = q + map.offset(r);
    for (int64_t k2 = 0; k2 < pairs; ++k2) std::memcpy(panel + k2 * ld + r, row + 2 * k2, 4);
  }
}

template <class I>
void reset_state(const Problem& p, State& st) {
  std::fill(st.o, st.o + p.rows * p.d_v, 0.0f);
  std::fill(st.m, st.m + p.rows_pad, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + p.rows_pad, 0.0f);
}

// Keys [k0, k1) of the item's list into the state (pack_queries and reset_state first).
template <class I, class Source>
void attend(const Problem& p, const Source& src, int64_t k0, int64_t k1, Scratch& s, State& st) {
  const bf16* key_rows[kChunk];
  const auto prefetch_chunk = [&](int64_t kc) { prefetch_keys(p, src, kc, kChunk, k1); };
  prefetch_chunk(k0);
  for (int64_t kc = k0; kc < k1; kc += kChunk) {
    const int64_t n = std::min(kChunk, k1 - kc);
    prefetch_chunk(kc + kChunk);
    for (int64_t r = 0; r < kChunk; ++r)
      key_rows[r] = r < n ? src.row(kc + r, s.keys + r * p.d_qk) : s.zeros;
    attention_detail::scores<I>(p, key_rows, s);
    attention_detail::softmax_chunk<I>(p, kc, n, kChunk, s, st);
    for (int64_t r = 0; r < n; r += 2)
      attention_detail::interleave_rows<I>(key_rows[r], r + 1 < n ? key_rows[r + 1] : s.zeros,
                                           p.d_v, s.v_panel + r / 2 * v_panel_ld(p));
    attention_detail::accumulate_pv<I>(p, (n + 1) / 2, s, st);
  }
}

// attend on the tile registers of ISA T (amx, or an AMX emulation): chunks of kTileChunk keys,
// of which only whole 32-key steps up to the chunk's last key are computed.
template <tile::Isa T, class Source>
void attend_tiles(const Problem& p, const Source& src, int64_t k0, int64_t k1, Scratch& s,
                  State& st) {
  using V = tile::vector_isa_t<T>;
  attention_detail::TileUnitOf<T> unit;
  prefetch_keys(p, src, k0, kTileChunk, k1);  // later chunks: during the chunk before them
  for (int64_t kc = k0; kc < k1; kc += kTileChunk) {
    const int64_t n = std::min(kTileChunk, k1 - kc), width = round_up(n, 32);
    // The next chunk's keys, spread over this chunk's gathered rows and tile steps.
    KeyFeed<Source> next{.src = &src,
                         .k = std::min(kc + kTileChunk, k1),
                         .k_end = std::min(kc + 2 * kTileChunk, k1),
                         .bytes = src.bytes(2 * p.d_qk)};
    const int64_t units = width + attention_detail::chunk_tile_steps(p, width);
    const int per_unit = static_cast<int>((next.lines_left() + units - 1) / units);
    attention_detail::gather_chunk<V>(p, src, kc, n, width, next, per_unit, s);
    attention_detail::tile_scores<T>(unit, p, width, s, next, per_unit);
    attention_detail::softmax_chunk<V>(p, kc, n, width, s, st);
    attention_detail::tile_pv<T>(unit, p, width, s, st, next, per_unit);
    next.feed(next.lines_left());
  }
}

// The entry points of a kernel table: on the tile registers of T when kTiles (T = amx always),
// else on T's dot tiles.
template <class T, bool kTiles>
void attend_gather(const Problem& p, const GatherSource& src, int64_t k0, int64_t k1, Scratch& s,
                   State& st) {
  if constexpr (kTiles)
    attend_tiles<T>(p, src, k0, k1, s, st);
  else
    attend<T>(p, src, k0, k1, s, st);
}
template <class T, bool kTiles>
void attend_paged(const Problem& p, const PagedSource& src, int64_t k0, int64_t k1, Scratch& s,
                  State& st) {
  if constexpr (kTiles)
    attend_tiles<T>(p, src, k0, k1, s, st);
  else
    attend<T>(p, src, k0, k1, s, st);
}
template <class T, bool kTiles>
void attend_fp8(const Problem& p, const Fp8Slots& src, int64_t k0, int64_t k1, Scratch& s,
                State& st) {
  using Source = Fp8Source<tile::vector_isa_t<T>>;
  if constexpr (kTiles)
    attend_tiles<T>(p, Source{src}, k0, k1, s, st);
  else
    attend<T>(p, Source{src}, k0, k1, s, st);
}

// Merges the states of the splits of one item into parts[0] (a fixed order: split 0, 1, ...).
inline void merge_parts(const Problem& p, State* parts, int64_t count) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < count; ++i) m = std::max(m, parts[i].m[r]);
    if (m == -std::numeric_limits<float>::infinity()) continue;  // no visible key anywhere
    float l = 0.0f;
    float* o = parts[0].o + r * p.d_v;
    for (int64_t i = 0; i < count; ++i) {
      const float w = parts[i].m[r] == -std::numeric_limits<float>::infinity()
                          ? 0.0f
                          : std::exp(parts[i].m[r] - m);
      l += parts[i].l[r] * w;
      const float* oi = parts[i].o + r * p.d_v;
      for (int64_t c = 0; c < p.d_v; ++c) o[c] = i == 0 ? oi[c] * w : o[c] + oi[c] * w;
    }
    parts[0].m[r] = m;
    parts[0].l[r] = l;
  }
}

// The outputs of an item: out row r (bf16, d_v) at out + out_map.offset(r), lse at
// lse + lse_map.offset(r), max_logits likewise when given; sink: f32 per row or nullptr.
template <class I>
void finalize(const Problem& p, const State& st, const float* sink, bf16* out,
              const RowMap& out_map, float* lse, const RowMap& lse_map, float* max_logits,
              const RowMap& max_map) {
  using S = tk::kernels::Simd<I>;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < p.rows; ++r) {
    const float m = st.m[r], l = st.l[r];
    bf16* o = out + out_map.offset(r);
    const bool empty = !(l > 0.0f) && !std::isnan(l);
    if (max_logits) max_logits[max_map.offset(r)] = empty ? -kInf : m;
    lse[lse_map.offset(r)] = empty ? kInf : m + std::log(l);
    float denominator = l;
    if (sink && !empty) denominator = l + std::exp(sink[r] - m);
    const float inv = empty ? 0.0f : 1.0f / denominator;
    const typename S::F scale = S::set1(inv);
    const float* src = st.o + r * p.d_v;
    for (int64_t c = 0; c < p.d_v; c += 16)
      S::store(o + c, empty ? S::zero() : S::mul(S::load(src + c), scale));
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::mla

DSK_SILENCE_GCC_BUG_105593_END
