// The V3.2 lightning indexer's dense MQA logits on the tile layer:
//     logits[i, j] = sum_h relu(sf[j] * (q[i, h, :] . kv[j, :])) * w[i, h]
// The (query, head) rows of a block of queries form the M side of a product with a panel of 64
// kv rows (bf16 VNNI pairs, widened once per call), K = D: on dot tiles (6 rows x 64), or with
// kTiles on tile registers (32 x 32 blocks; the amx backend, emulated bit for bit elsewhere). The
// relu-weighted reduction over heads is the epilogue, so the scores never leave L1. Heads are
// summed in increasing h, so a logit does not depend on the thread count.
//
// Header-only; the AVX-512 instances need the avx512 baseline of dsk/kernels/abi.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <dsk/kernels/abi.hpp>
#include <dsk/kernels/mla/kv_format.hpp>
#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/block.hpp>
#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/dot.hpp>
#include <dsk/kernels/tile/pack.hpp>
#include <dsk/kernels/tile/prefetch.hpp>

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

namespace dsk::kernels::gemm {

// kv rows per panel: four 16-lane vectors.
inline constexpr int64_t kMqaPanel = 64;
// Queries per block: 3 queries of H (a multiple of 4) heads make a multiple of 12 rows, so the
// block splits into 6-row dot tiles (plus a 2- or 4-row tile only for a short last block).
inline constexpr int64_t kMqaQueries = 3;

inline namespace DSK_TILE_ABI {

struct MqaArgs {
  const bf16* kv_panels = nullptr;  // [panels][D / 2][kMqaPanel][2]
  const float* kv_sf = nullptr;     // [panels * kMqaPanel], zero past skv
  int64_t skv = 0, d = 0, heads = 0;
  const uint8_t* q = nullptr;  // q[i, h, :] at q + i * q_stride_s + h * q_stride_h (bytes)
  int64_t q_stride_s = 0, q_stride_h = 0;
  bool fp4 = false;               // q (and kv) e2m1 pairs with UE8M0 scales, else e4m3
  const int32_t* q_sf = nullptr;  // FP4: the scale word of (i, h) at q_sf[i * q_sf_stride + h]
  int64_t q_sf_stride = 0;
  const float* w = nullptr;  // w[i, h] at w + i * w_stride + h
  int64_t w_stride = 0;
  const int32_t* ks = nullptr;  // [S]
  const int32_t* ke = nullptr;  // [S]
  void* out = nullptr;          // f32 or bf16, row i at out + i * out_stride (elements)
  int64_t out_stride = 0;
  bool out_bf16 = false;
  bool compressed = false;  // column c of row i is kv row ks[i] + c
};

// Per-thread scratch of mqa_logits_block.
struct MqaScratch {
  bf16* q;       // mqa_q_rows(queries, heads) * d
  float* tile;   // kMqaTileFloats
  float* logit;  // queries * kMqaPanel
};

// Rows of MqaScratch::q for blocks of `queries` queries: whole 32-row tile blocks (the rows past
// the queries' are zero).
constexpr int64_t mqa_q_rows(int64_t queries, int64_t heads) {
  return (queries * heads + 31) / 32 * 32;
}
// Floats of MqaScratch::tile: a 6 x 64 dot tile or a 32 x 32 tile block.
inline constexpr int64_t kMqaTileFloats = 32 * 32;

// One row of d values widened to bf16: e4m3 codes, or e2m1 pairs whose UE8M0 scales (byte g of
// sf_word for values [32g, 32g + 32)) are folded in exactly: the API keeps every scale exponent
// within +-100, so each scaled e2m1 value (0.5 .. 6 times a power of two) is a normal bf16.
template <class I>
void widen_row(const uint8_t* src, bool fp4, int32_t sf_word, int64_t d, bf16* dst) {
  if (!fp4) {
    tile::convert_n<I>(reinterpret_cast<const e4m3*>(src), dst, static_cast<size_t>(d));
    return;
  }
  tile::convert_n<I>(reinterpret_cast<const fp4x2*>(src), dst, static_cast<size_t>(d));
  for (int64_t g = 0; g < d / 32; ++g) {
    const int e = static_cast<int>((static_cast<uint32_t>(sf_word) >> (8 * g)) & 0xFFu) - 127;
    for (int64_t k = 32 * g; k < 32 * g + 32; ++k) {
      const uint16_t magnitude = dst[k].bits & 0x7FFFu;
      if (magnitude != 0) dst[k].bits = static_cast<uint16_t>(dst[k].bits + (e << 7));
    }
  }
}

// kv rows [skv, d] (row stride ld bytes; FP4 scale words kv_sf[j]) -> panels [p0, p1) of bf16
// pairs; rows past skv are zero. rows: kMqaPanel * d bf16 of scratch.
template <class I>
void mqa_pack_kv(const uint8_t* kv, int64_t ld, bool fp4, const int32_t* kv_sf, int64_t skv,
                 int64_t d, int64_t p0, int64_t p1, bf16* panels, bf16* rows) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n = std::min(kMqaPanel, skv - p * kMqaPanel);
    if (!fp4) {
      tile::pack_b_vnni_nt_widen<I>(reinterpret_cast<const e4m3*>(kv + p * kMqaPanel * ld), ld,
                                    static_cast<int>(d), static_cast<int>(n),
                                    panels + p * d * kMqaPanel, 2 * kMqaPanel, static_cast<int>(d),
                                    static_cast<int>(kMqaPanel));
      continue;
    }
    for (int64_t c = 0; c < n; ++c) {
      const int64_t j = p * kMqaPanel + c;
      widen_row<I>(kv + j * ld, fp4, fp4 ? kv_sf[j] : 0, d, rows + c * d);
    }
    tile::pack_b_vnni_nt<I>(rows, d, static_cast<int>(d), static_cast<int>(n),
                            panels + p * d * kMqaPanel, 2 * kMqaPanel, static_cast<int>(d),
                            static_cast<int>(kMqaPanel));
  }
}

namespace mqa_detail {

// The dot tile of `Rows` (query, head) rows starting at row r0 of the block against one panel,
// then its relu-weighted contribution to the block's logits.
template <class I, int Rows>
inline void rows_into_logits(const MqaArgs& a, int64_t i0, int64_t r0, const bf16* panel,
                             const float* sf, MqaScratch& s) {
  tile::DotTile<I, Rows, kMqaPanel / tile::kDotLanes> t;
  tile::dot_zero(t);
  tile::dot_steps(t, s.q + r0 * a.d, a.d, panel, 2 * kMqaPanel, a.d / 2);
  tile::dot_store(t, s.tile, kMqaPanel);
  int64_t qi = r0 / a.heads, h = r0 % a.heads;  // of row r0 + r, stepped along
  for (int r = 0; r < Rows; ++r, ++h) {
    if (h == a.heads) {
      h = 0;
      ++qi;
    }
    const float w = a.w[(i0 + qi) * a.w_stride + h];
    const float* score = s.tile + r * kMqaPanel;
    float* logit = s.logit + qi * kMqaPanel;
    for (int64_t c = 0; c < kMqaPanel; ++c) {
      const float v = score[c] * sf[c];
      logit[c] += (v > 0.0f ? v : 0.0f) * w;
    }
  }
}

// The relu-weighted contributions of rows [r0, r0 + n) of a 32 x 32 block of scores (s.tile) to
// the logits of columns [c0, c0 + 32), row by row in increasing order: per element
// logit += relu(score * sf) * w, rounded after each operation (no FMA), on every ISA. Row r0 + r
// is head h of query qi, stepped along (a division per row costs more than the row's work).
template <class T>
void block_into_logits(const MqaArgs& a, int64_t i0, int64_t r0, int64_t n, int64_t c0,
                       const float* sf, MqaScratch& s) {
  int64_t qi = r0 / a.heads, h = r0 % a.heads;
  const auto next_row = [&] {
    if (++h == a.heads) {
      h = 0;
      ++qi;
    }
  };
  if constexpr (!std::same_as<tile::vector_isa_t<T>, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
    // The query's two logit vectors stay in registers over its run of rows. max(v, 0) is the
    // select v > 0 ? v : 0 (NaN and -0 give +0).
    const __m512 sf0 = _mm512_loadu_ps(sf + c0), sf1 = _mm512_loadu_ps(sf + c0 + 16);
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < n;) {
      float* logit = s.logit + qi * kMqaPanel + c0;
      __m512 acc0 = _mm512_loadu_ps(logit), acc1 = _mm512_loadu_ps(logit + 16);
      const int64_t query = qi;
      for (; r < n && qi == query; ++r, next_row()) {
        const __m512 w = _mm512_set1_ps(a.w[(i0 + qi) * a.w_stride + h]);
        const float* score = s.tile + r * 32;
        const __m512 v0 = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(score), sf0), zero);
        const __m512 v1 = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(score + 16), sf1), zero);
        acc0 = _mm512_add_ps(acc0, _mm512_mul_ps(v0, w));
        acc1 = _mm512_add_ps(acc1, _mm512_mul_ps(v1, w));
      }
      _mm512_storeu_ps(logit, acc0);
      _mm512_storeu_ps(logit + 16, acc1);
    }
    return;
#endif
  }
  for (int64_t r = 0; r < n; ++r, next_row()) {
    const float w = a.w[(i0 + qi) * a.w_stride + h];
    const float* score = s.tile + r * 32;
    float* logit = s.logit + qi * kMqaPanel + c0;
    for (int64_t c = 0; c < 32; ++c) {
      const float v = score[c] * sf[c0 + c];
      logit[c] += (v > 0.0f ? v : 0.0f) * w;
    }
  }
}

// The same on tile registers: blocks of 32 rows (16 at the end) x 32 columns, each block's
// contribution added row by row in increasing row order, as rows_into_logits adds its rows.
// feed: fed lines_per_step at every step of the products.
template <class T, class Feed>
void tile_rows_into_logits(typename tile::BlockRegs<T>::Unit& u, const MqaArgs& a, int64_t i0,
                           int64_t rows, const bf16* panel, const float* sf, MqaScratch& s,
                           Feed* feed, int lines_per_step) {
  for (int64_t r0 = 0; r0 < rows; r0 += 32) {
    const int64_t n = std::min<int64_t>(32, rows - r0);
    for (int64_t c0 = 0; c0 < kMqaPanel; c0 += 32) {
      if (n > 16)
        tile::mma_block<T, 32, 32>(u, s.q + r0 * a.d, a.d, panel + 2 * c0, 2 * kMqaPanel, a.d,
                                   s.tile, 32, false, feed, lines_per_step);
      else
        tile::mma_block<T, 16, 32>(u, s.q + r0 * a.d, a.d, panel + 2 * c0, 2 * kMqaPanel, a.d,
                                   s.tile, 32, false, feed, lines_per_step);
      block_into_logits<T>(a, i0, r0, n, c0, sf, s);
    }
  }
}

// Tile steps of one panel's products for `rows` (query, head) rows of depth d.
inline int64_t tile_steps(int64_t rows, int64_t d) {
  return std::max<int64_t>(1, (rows + 31) / 32 * (kMqaPanel / 32) * (d / 32));
}

inline void store_logit(const MqaArgs& a, int64_t i, int64_t col, float v) {
  if (a.out_bf16)
    static_cast<bf16*>(a.out)[i * a.out_stride + col] = tile::convert_scalar<bf16>(v);
  else
    static_cast<float*>(a.out)[i * a.out_stride + col] = v;
}

}  // namespace mqa_detail

// The (query, head) rows of queries [i0, i0 + nq) widened to bf16 into s.q, zero rows up to the
// next 32.
template <class I>
void widen_queries(const MqaArgs& a, int64_t i0, int64_t nq, MqaScratch& s) {
  for (int64_t qi = 0; qi < nq; ++qi)
    for (int64_t h = 0; h < a.heads; ++h)
      widen_row<I>(a.q + (i0 + qi) * a.q_stride_s + h * a.q_stride_h, a.fp4,
                   a.fp4 ? a.q_sf[(i0 + qi) * a.q_sf_stride + h] : 0, a.d,
                   s.q + (qi * a.heads + h) * a.d);
  std::fill(s.q + nq * a.heads * a.d, s.q + mqa_q_rows(nq, a.heads) * a.d, bf16{});
}

// s.logit[qi][c] = sum_h relu(sf[c] * q(i0 + qi, h) . panel column c) * w(i0 + qi, h) for the nq
// queries whose rows are in s.q and the 64 columns of one panel. feed (optional): fed
// lines_per_step at every step of the tile products; on dot tiles finished before the products.
// The tile unit of the products when kTiles (configured once per block of queries, not per
// panel), else nothing.
template <class I, bool kTiles>
using MqaUnit = std::conditional_t<kTiles, typename tile::BlockRegs<I>::Unit, char>;

template <class I, bool kTiles, class Feed = tile::PrefetchFeed>
void panel_logits(const MqaArgs& a, int64_t i0, int64_t nq, const bf16* panel, const float* sf,
                  MqaScratch& s, [[maybe_unused]] MqaUnit<I, kTiles>& unit, Feed* feed = nullptr,
                  int lines_per_step = 0) {
  const int64_t rows = nq * a.heads;
  std::fill(s.logit, s.logit + nq * kMqaPanel, 0.0f);
  if constexpr (kTiles) {
    mqa_detail::tile_rows_into_logits<I>(unit, a, i0, rows, panel, sf, s, feed, lines_per_step);
  } else {
    if (feed) feed->finish();
    int64_t r0 = 0;
    for (; r0 + 6 <= rows; r0 += 6) mqa_detail::rows_into_logits<I, 6>(a, i0, r0, panel, sf, s);
    if (rows - r0 == 4) mqa_detail::rows_into_logits<I, 4>(a, i0, r0, panel, sf, s);
    if (rows - r0 == 2) mqa_detail::rows_into_logits<I, 2>(a, i0, r0, panel, sf, s);
  }
}

// Logits of queries [i0, i0 + nq) (nq <= kMqaQueries): every kv row in [ks[i], ke[i]).
template <class I, bool kTiles>
void mqa_logits_block(const MqaArgs& a, int64_t i0, int64_t nq, MqaScratch& s) {
  int64_t lo = a.skv, hi = 0;
  for (int64_t qi = 0; qi < nq; ++qi) {
    if (a.ks[i0 + qi] >= a.ke[i0 + qi]) continue;
    lo = std::min<int64_t>(lo, a.ks[i0 + qi]);
    hi = std::max<int64_t>(hi, a.ke[i0 + qi]);
  }
  if (lo >= hi) return;
  widen_queries<tile::vector_isa_t<I>>(a, i0, nq, s);
  MqaUnit<I, kTiles> unit;
  for (int64_t p = lo / kMqaPanel; p * kMqaPanel < hi; ++p) {
    panel_logits<I, kTiles>(a, i0, nq, a.kv_panels + p * a.d * kMqaPanel, a.kv_sf + p * kMqaPanel,
                            s, unit);
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t i = i0 + qi;
      const int64_t j0 = std::max<int64_t>(a.ks[i], p * kMqaPanel);
      const int64_t j1 = std::min<int64_t>(a.ke[i], (p + 1) * kMqaPanel);
      for (int64_t j = j0; j < j1; ++j)
        mqa_detail::store_logit(a, i, a.compressed ? j - a.ks[i] : j,
                                s.logit[qi * kMqaPanel + (j - p * kMqaPanel)]);
    }
  }
}

// ---- paged (decode) ----
// The same product as the dense kernel, with the queries of one batch item (its next_n tokens)
// as the block and each cache block widened and packed into panels on the fly, so a paged logit
// has the same bits as the dense one for the same data. `a` describes q and the weights with
// rows b * next_n + j (q contiguous over (B, next_n)) and the output.

struct MqaPagedArgs {
  const uint8_t* kv_cache = nullptr;  // blocks of indexer tokens (dsk/kernels/mla/kv_format.hpp)
  int64_t block_bytes = 0, block_kv = 0, next_n = 0;
  const int32_t* block_table = nullptr;  // [B, max_blocks]
  int64_t bt_stride = 0;
  const int32_t* context_lens = nullptr;  // [B] or [B, next_n]
  bool lens_2d = false;
};

// Tokens [0, n) of batch item b are valid for its row j: context_lens[b, j], or with one length
// per item the causal rule of the next_n draft tokens, t <= context_lens[b] - next_n + j.
inline int64_t paged_valid_len(const MqaPagedArgs& a, int64_t b, int64_t j) {
  if (a.lens_2d) return a.context_lens[b * a.next_n + j];
  return std::max<int64_t>(0, a.context_lens[b] - a.next_n + j + 1);
}

inline int64_t paged_item_len(const MqaPagedArgs& a, int64_t b) {
  int64_t n = 0;
  for (int64_t j = 0; j < a.next_n; ++j) n = std::max(n, paged_valid_len(a, b, j));
  return n;
}

namespace mqa_detail {

// The next panel of a paged run packed part by part over the tile steps of the current panel's
// products (parts / steps of a part per step, counted without a division), and a later cache
// block prefetched a few lines per step: the packing's vector work then runs beside the tile unit
// instead of between its products. With no codes it only prefetches.
template <class V>
struct PanelFeed {
  tile::PrefetchFeed* prefetch = nullptr;
  const e4m3* codes = nullptr;  // the next panel's kv rows (d codes each), or nullptr
  int64_t d = 0;
  int n = 0;  // kv rows in the next panel
  bf16* panel = nullptr;
  int parts = 0;      // tile::pack_widen_parts of the panel, 0 without codes
  int64_t steps = 1;  // tile steps of the current panel
  int64_t credit = 0;
  int packed = 0;  // parts packed so far

  void feed(int lines) {
    prefetch->feed(lines);
    for (credit += parts; credit > 0 && packed < parts; credit -= steps) pack(packed++);
  }
  void finish() {
    prefetch->finish();
    while (packed < parts) pack(packed++);
  }
  // Out of line: inlined, its loops would sit inside every tile step's loop (the step loop of the
  // paged kernel grew threefold and ran 2-4% slower at next_n = 2).
  [[gnu::noinline]] void pack(int part) const {
    tile::pack_b_vnni_nt_widen_part<V>(codes, d, static_cast<int>(d), n, panel, 2 * kMqaPanel,
                                       static_cast<int>(d), static_cast<int>(kMqaPanel), part);
  }
};

}  // namespace mqa_detail

// Whether the paged kernel packs each panel during the previous panel's products. With up to 64
// query rows (next_n = 1 with 64 heads) the packing's vector work then hides behind the tile unit:
// 1.10-1.21x (one and two threads, EMR). With 128 rows (next_n = 2) it gained nothing (0.97-1.03x
// in alternated rounds): the products' A loads of q (32 KiB), not the packing, bound that case,
// so more rows pack each panel just before its products into one buffer.
constexpr bool mqa_pack_ahead(int64_t next_n, int64_t heads) {
  return mqa_q_rows(next_n, heads) <= kMqaPanel;
}

// The logits of batch item b (its query rows already in s.q) against its cache blocks
// [blk0, blk1), on one tile unit for the run (a block is only 64 x 64 x D of products).
// panels: 2 * kMqaPanel * d bf16 of scratch: the panel of the products and, with
// mqa_pack_ahead, the next one, widened into VNNI form while the current one's products run.
template <class I, bool kTiles>
void mqa_paged_blocks(const MqaPagedArgs& pa, const MqaArgs& a, int64_t b, int64_t blk0,
                      int64_t blk1, MqaScratch& s, bf16* panels) {
  using V = tile::vector_isa_t<I>;
  MqaUnit<I, kTiles> unit;
  const int32_t* ids = pa.block_table + b * pa.bt_stride;
  const int64_t i0 = b * pa.next_n;
  const int64_t panel_elems = kMqaPanel * a.d;
  const int64_t block_panels = (pa.block_kv + kMqaPanel - 1) / kMqaPanel;
  const int64_t steps = mqa_detail::tile_steps(pa.next_n * a.heads, a.d);
  const bool ahead = mqa_pack_ahead(pa.next_n, a.heads);
  const auto block_at = [&](int64_t blk) { return pa.kv_cache + ids[blk] * pa.block_bytes; };
  // The kv rows [c0, c0 + 64) of block blk.
  const auto codes_of = [&](int64_t blk, int64_t c0) {
    return reinterpret_cast<const e4m3*>(block_at(blk) + mla::indexer_codes_offset(0, a.d)) +
           c0 * a.d;
  };
  const auto rows_of = [&](int64_t c0) {
    return static_cast<int>(std::min(kMqaPanel, pa.block_kv - c0));
  };
  const auto pack_now = [&](int64_t blk, int64_t c0, bf16* panel) {
    tile::pack_b_vnni_nt_widen<V>(codes_of(blk, c0), a.d, static_cast<int>(a.d), rows_of(c0), panel,
                                  2 * kMqaPanel, static_cast<int>(a.d),
                                  static_cast<int>(kMqaPanel));
  };
  // Blocks sit anywhere in the cache, so the hardware prefetchers would meet each one cold: the
  // block packed next after this one's (blk + 2 when packing ahead) is brought towards L2 during
  // this one's products, a few lines per tile step (a burst of 132 prefetches stalls the loads of
  // the products).
  const int64_t distance = ahead ? 2 : 1;
  if (ahead) {
    if (blk0 + 1 < blk1) tile::prefetch_l2(block_at(blk0 + 1), pa.block_bytes);
    pack_now(blk0, 0, panels);
  }
  int64_t current = 0;  // which of the two panels holds the products' operand
  for (int64_t blk = blk0; blk < blk1; ++blk) {
    tile::PrefetchFeed later;
    if (blk + distance < blk1)
      later = {.base = reinterpret_cast<const std::byte*>(block_at(blk + distance)),
               .row_bytes = pa.block_bytes,
               .rows = 1};
    const int lines_per_step =
        static_cast<int>((later.lines_left() + block_panels * steps - 1) / (block_panels * steps));
    const uint8_t* block = block_at(blk);
    for (int64_t c0 = 0; c0 < pa.block_kv; c0 += kMqaPanel) {
      const int64_t n = std::min(kMqaPanel, pa.block_kv - c0);
      bf16* operand = panels + current * panel_elems;
      mqa_detail::PanelFeed<V> feed{.prefetch = &later, .steps = steps};
      if (!ahead) {
        pack_now(blk, c0, operand);
      } else if (const int64_t next = c0 + kMqaPanel < pa.block_kv ? blk : blk + 1; next < blk1) {
        const int64_t next_c0 = next == blk ? c0 + kMqaPanel : 0;
        feed.codes = codes_of(next, next_c0);
        feed.d = a.d;
        feed.n = rows_of(next_c0);
        feed.panel = panels + (current ^ 1) * panel_elems;
        feed.parts = tile::pack_widen_parts(static_cast<int>(a.d), kMqaPanel);
      }
      float sf[kMqaPanel] = {};  // the scales may sit at any 4-byte offset
      std::memcpy(sf, block + mla::indexer_scale_offset(c0, pa.block_kv, a.d),
                  static_cast<size_t>(n) * sizeof(float));
      panel_logits<I, kTiles>(a, i0, pa.next_n, operand, sf, s, unit, &feed, lines_per_step);
      feed.finish();
      if (ahead) current ^= 1;
      const int64_t t0 = blk * pa.block_kv + c0;
      for (int64_t j = 0; j < pa.next_n; ++j) {
        const int64_t end = std::min(paged_valid_len(pa, b, j), t0 + n);
        for (int64_t t = t0; t < end; ++t)
          mqa_detail::store_logit(a, i0 + j, t, s.logit[j * kMqaPanel + (t - t0)]);
      }
    }
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm

DSK_SILENCE_GCC_BUG_105593_END
