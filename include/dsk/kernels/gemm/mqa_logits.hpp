// The V3.2 lightning indexer's dense MQA logits on the tile layer's dot tiles:
//     logits[i, j] = sum_h relu(sf[j] * (q[i, h, :] . kv[j, :])) * w[i, h]
// The (query, head) rows of a block of queries form the M side of a dot-tile product with a panel
// of 64 kv rows (bf16 VNNI pairs, widened once per call), K = D; the relu-weighted reduction over
// heads is the epilogue, so the scores never leave L1. Heads are summed in increasing h, so a
// logit does not depend on the thread count.
//
// Header-only; the AVX-512 instances need the avx512 baseline of dsk/kernels/abi.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/mla/kv_format.hpp>
#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/dot.hpp>
#include <dsk/kernels/tile/pack.hpp>

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
  bf16* q;       // kMqaQueries * heads * d
  float* tile;   // 6 * kMqaPanel
  float* logit;  // kMqaQueries * kMqaPanel
};

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
  for (int r = 0; r < Rows; ++r) {
    const int64_t row = r0 + r, qi = row / a.heads, h = row % a.heads;
    const float w = a.w[(i0 + qi) * a.w_stride + h];
    const float* score = s.tile + r * kMqaPanel;
    float* logit = s.logit + qi * kMqaPanel;
    for (int64_t c = 0; c < kMqaPanel; ++c) {
      const float v = score[c] * sf[c];
      logit[c] += (v > 0.0f ? v : 0.0f) * w;
    }
  }
}

inline void store_logit(const MqaArgs& a, int64_t i, int64_t col, float v) {
  if (a.out_bf16)
    static_cast<bf16*>(a.out)[i * a.out_stride + col] = tile::convert_scalar<bf16>(v);
  else
    static_cast<float*>(a.out)[i * a.out_stride + col] = v;
}

}  // namespace mqa_detail

// The (query, head) rows of queries [i0, i0 + nq) widened to bf16 into s.q.
template <class I>
void widen_queries(const MqaArgs& a, int64_t i0, int64_t nq, MqaScratch& s) {
  for (int64_t qi = 0; qi < nq; ++qi)
    for (int64_t h = 0; h < a.heads; ++h)
      widen_row<I>(a.q + (i0 + qi) * a.q_stride_s + h * a.q_stride_h, a.fp4,
                   a.fp4 ? a.q_sf[(i0 + qi) * a.q_sf_stride + h] : 0, a.d,
                   s.q + (qi * a.heads + h) * a.d);
}

// s.logit[qi][c] = sum_h relu(sf[c] * q(i0 + qi, h) . panel column c) * w(i0 + qi, h) for the nq
// queries whose rows are in s.q and the 64 columns of one panel.
template <class I>
void panel_logits(const MqaArgs& a, int64_t i0, int64_t nq, const bf16* panel, const float* sf,
                  MqaScratch& s) {
  const int64_t rows = nq * a.heads;
  std::fill(s.logit, s.logit + nq * kMqaPanel, 0.0f);
  int64_t r0 = 0;
  for (; r0 + 6 <= rows; r0 += 6) mqa_detail::rows_into_logits<I, 6>(a, i0, r0, panel, sf, s);
  if (rows - r0 == 4) mqa_detail::rows_into_logits<I, 4>(a, i0, r0, panel, sf, s);
  if (rows - r0 == 2) mqa_detail::rows_into_logits<I, 2>(a, i0, r0, panel, sf, s);
}

// Logits of queries [i0, i0 + nq) (nq <= kMqaQueries): every kv row in [ks[i], ke[i]).
template <class I>
void mqa_logits_block(const MqaArgs& a, int64_t i0, int64_t nq, MqaScratch& s) {
  int64_t lo = a.skv, hi = 0;
  for (int64_t qi = 0; qi < nq; ++qi) {
    if (a.ks[i0 + qi] >= a.ke[i0 + qi]) continue;
    lo = std::min<int64_t>(lo, a.ks[i0 + qi]);
    hi = std::max<int64_t>(hi, a.ke[i0 + qi]);
  }
  if (lo >= hi) return;
  widen_queries<I>(a, i0, nq, s);
  for (int64_t p = lo / kMqaPanel; p * kMqaPanel < hi; ++p) {
    panel_logits<I>(a, i0, nq, a.kv_panels + p * a.d * kMqaPanel, a.kv_sf + p * kMqaPanel, s);
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

// Per-thread buffers of mqa_paged_block besides MqaScratch (sized for next_n queries).
struct MqaPagedBuffers {
  bf16* kv;     // [block_kv][d]
  bf16* panel;  // [d / 2][kMqaPanel][2]
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

// The logits of batch item b (its query rows already in s.q) against its cache block blk.
template <class I>
void mqa_paged_block(const MqaPagedArgs& pa, const MqaArgs& a, int64_t b, int64_t blk,
                     MqaScratch& s, MqaPagedBuffers& buf) {
  const uint8_t* block = pa.kv_cache + pa.block_table[b * pa.bt_stride + blk] * pa.block_bytes;
  tile::convert_n<I>(reinterpret_cast<const e4m3*>(block + mla::indexer_codes_offset(0, a.d)),
                     buf.kv, static_cast<size_t>(pa.block_kv * a.d));
  for (int64_t c0 = 0; c0 < pa.block_kv; c0 += kMqaPanel) {
    const int64_t n = std::min(kMqaPanel, pa.block_kv - c0);
    tile::pack_b_vnni_nt<I>(buf.kv + c0 * a.d, a.d, static_cast<int>(a.d), static_cast<int>(n),
                            buf.panel, 2 * kMqaPanel, static_cast<int>(a.d),
                            static_cast<int>(kMqaPanel));
    float sf[kMqaPanel] = {};  // the scales may sit at any 4-byte offset
    std::memcpy(sf, block + mla::indexer_scale_offset(c0, pa.block_kv, a.d),
                static_cast<size_t>(n) * sizeof(float));
    const int64_t i0 = b * pa.next_n, t0 = blk * pa.block_kv + c0;
    panel_logits<I>(a, i0, pa.next_n, buf.panel, sf, s);
    for (int64_t j = 0; j < pa.next_n; ++j) {
      const int64_t end = std::min(paged_valid_len(pa, b, j), t0 + n);
      for (int64_t t = t0; t < end; ++t)
        mqa_detail::store_logit(a, i0 + j, t, s.logit[j * kMqaPanel + (t - t0)]);
    }
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
