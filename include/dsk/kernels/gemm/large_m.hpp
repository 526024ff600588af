// The large-M GEMM kernel: one work item is a block of rows x panels of one segment. For each pass
// of block_k values of K, the A block is read in place (bf16) or widened once into scratch, and
// each panel's K rows are read in place (bf16) or widened once into an L1 buffer, then reused by
// every row tile of the block. Partial sums live in an f32 block in scratch (L2) between passes.
//
//   avx512 / generic: 6 x 64 row tiles of DotTile accumulators (24 zmm, VDPBF16PS)
//   amx:              32 x 32 row tiles of four 16 x 16 tmm accumulators (TDPBF16PS); the same
//                     code on an avx512 / generic TileUnit (AMX emulated bit for bit) is how
//                     machines without AMX test it (gemm_tile_path in gemm.hpp)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/gemm/args.hpp>
#include <dsk/kernels/gemm/widen.hpp>
#include <dsk/kernels/tile/block.hpp>
#include <dsk/kernels/tile/dot.hpp>
#include <dsk/kernels/tile/prefetch.hpp>
#include <dsk/kernels/tile/unit.hpp>

namespace dsk::kernels::gemm {
inline namespace DSK_TILE_ABI {

// Rows of a DotTile row tile: 24 accumulators + 4 B vectors + 1 A broadcast of 32 zmm.
inline constexpr int kDotTileRows = 6;
// amx: items of at least this many rows copy bf16 panels too (fewer row tiles would not repay
// the copy), and at most this many lines of the next panel are prefetched per tile step (more
// stall the loads of the step; a few rows stream the weights faster than the prefetches help).
inline constexpr int kCopyPanelRows = 128;
inline constexpr int kMaxPrefetchPerStep = 4;
// Items of at least this many rows: the next-panel feed of the tile loop (kMaxPrefetchPerStep
// lines a step, 2 x ceil(rows / 32) x 16 steps a pass) covers a whole 32 KiB FP8 pass; fewer
// rows prefetch what they widen in the widening loop.
inline constexpr int kPrefetchedPanelRows = 128;

// What one pass over a block reads: the A rows (bf16, row stride lda elements) and the B rows of
// one panel (bf16 pairs, kPanelRowBf16 of them at row stride ldb), both from the pass's first K.
struct PassOperands {
  const bf16* a = nullptr;
  int64_t lda = 0;
  const bf16* b = nullptr;
  int64_t ldb = 0;
};

namespace large_m_detail {

// c (R x 64, row stride ldc) = (first ? 0 : c) + the pass's `steps` pairs of K.
template <tile::Isa I, int R>
void dot_pass(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t steps, float* c,
              int64_t ldc, bool first) {
  tile::DotTile<I, R, 4> t;
  if (first)
    tile::dot_zero(t);
  else
    tile::dot_load(t, c, ldc);
  tile::dot_steps(t, a, lda, b, ldb, steps);
  tile::dot_store(t, c, ldc);
}

// c += the `steps` pairs of K summed from zero, times row_scale[r] * col_scale[j].
template <tile::Isa I, int R>
void dot_promote_pass(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t steps,
                      float* c, int64_t ldc, const float* row_scale, const float* col_scale) {
  tile::DotTile<I, R, 4> t;
  tile::dot_zero(t);
  tile::dot_steps(t, a, lda, b, ldb, steps);
  tile::dot_promote(t, c, ldc, row_scale, col_scale);
}

// One row tile of `rows` (1..6) rows over the pass [k0, k0 + kc).
template <tile::Isa I>
void dot_row_tile(const Problem& p, const GemmSegment& s, const ScaleModes& modes,
                  const PassOperands& op, int64_t row0, int rows, int64_t panel, int64_t k0,
                  int64_t kc, float* c, int64_t ldc) {
  using Pass = void (*)(const bf16*, int64_t, const bf16*, int64_t, int64_t, float*, int64_t, bool);
  using PromotePass = void (*)(const bf16*, int64_t, const bf16*, int64_t, int64_t, float*, int64_t,
                               const float*, const float*);
  static constexpr Pass kPass[] = {dot_pass<I, 1>, dot_pass<I, 2>, dot_pass<I, 3>,
                                   dot_pass<I, 4>, dot_pass<I, 5>, dot_pass<I, 6>};
  static constexpr PromotePass kPromote[] = {dot_promote_pass<I, 1>, dot_promote_pass<I, 2>,
                                             dot_promote_pass<I, 3>, dot_promote_pass<I, 4>,
                                             dot_promote_pass<I, 5>, dot_promote_pass<I, 6>};
  if (modes.gran == 0) {
    kPass[rows - 1](op.a, op.lda, op.b, op.ldb, (kc + 1) / 2, c, ldc, k0 == 0);
    return;
  }
  for (int64_t g = 0; g < kc; g += modes.gran) {
    float row_scale[kDotTileRows];
    promotion_row_scales(modes, s, row0, rows, k0 + g, row_scale);
    const float* col_scale = promotion_col_scales(modes, p, s, panel, k0 + g);
    const int64_t steps = (std::min(modes.gran, kc - g) + 1) / 2;
    kPromote[rows - 1](op.a + g, op.lda, op.b + g / 2 * op.ldb, op.ldb, steps, c, ldc, row_scale,
                       col_scale);
  }
}

// c[r][j] = fma(t[r][j], row_scale[r] * col_scale[j], c[r][j]) for `rows` rows of 32 columns
// (dot_promote's arithmetic, for partial sums that come out of tile registers).
template <tile::Isa T>
void tile_promote(const float* t, int rows, float* c, int64_t ldc, const float* row_scale,
                  const float* col_scale) {
  for (int r = 0; r < rows; ++r) {
    float* out = c + r * ldc;
    if constexpr (!std::same_as<tile::vector_isa_t<T>, tile::generic_t>) {
#if DSK_TILE_HAS_AVX512
      for (int j = 0; j < 32; j += 16) {
        const __m512 scale =
            _mm512_mul_ps(_mm512_set1_ps(row_scale[r]), _mm512_loadu_ps(col_scale + j));
        _mm512_storeu_ps(out + j, _mm512_fmadd_ps(_mm512_loadu_ps(t + r * 32 + j), scale,
                                                  _mm512_loadu_ps(out + j)));
      }
#endif
    } else {
      for (int j = 0; j < 32; ++j)
        out[j] =
            std::fma(t[r * 32 + j], tile::detail::rounded(row_scale[r] * col_scale[j]), out[j]);
    }
  }
}

// The 32 x 32 block at c, or its top 16 rows when `half` (the other rows would only pad). A is
// streamed past the B tiles, which stay in L1 for the next row tile.
template <tile::Isa T>
void mma_rows(typename tile::BlockRegs<T>::Unit& u, bool half, const bf16* a, int64_t lda,
              const bf16* b, int64_t ldb, int64_t k_pad, float* c, int64_t ldc, bool load_c,
              tile::PrefetchFeed& next, int lines_per_step) {
  if (half)
    tile::mma_block<T, 16, 32, true>(u, a, lda, b, ldb, k_pad, c, ldc, load_c, &next,
                                     lines_per_step);
  else
    tile::mma_block<T, 32, 32, true>(u, a, lda, b, ldb, k_pad, c, ldc, load_c, &next,
                                     lines_per_step);
}

// Every 32-row tile of one panel over the pass (A and C padded with zero rows to whole tiles; a
// last tile of at most 16 rows computes only those: decode batches are that small). Column halves
// outside, row tiles inside: one half of the pass's B (32 KiB at block_k 512) is read from L1 by
// every row tile while A streams from L2.
template <tile::Isa T>
void tile_panel_pass(typename tile::BlockRegs<T>::Unit& u, const Problem& p, const GemmSegment& s,
                     const ScaleModes& modes, const PassOperands& op, int64_t row0, int64_t rows,
                     int64_t panel, int64_t k0, int64_t kc, float* c, int64_t ldc,
                     float* tile_buffer, tile::PrefetchFeed& next) {
  const int64_t kc_pad = round_up(kc, 32);
  const int lines_per_step = static_cast<int>(std::min<int64_t>(
      kMaxPrefetchPerStep, ceil_div(next.lines_left(), 2 * ceil_div(rows, 32) * kc_pad / 32)));
  for (int half = 0; half < 2; ++half) {
    for (int64_t r = 0; r < rows; r += 32) {
      const int tile_rows = static_cast<int>(std::min<int64_t>(32, rows - r));
      const bool half_rows = tile_rows <= 16;
      const bf16* a = op.a + r * op.lda;
      const bf16* b = op.b + 2 * 32 * half;  // columns [32 half, 32 half + 32): bf16 pairs
      float* block = c + r * ldc + 32 * half;
      if (modes.gran == 0) {
        mma_rows<T>(u, half_rows, a, op.lda, b, op.ldb, kc_pad, block, ldc, k0 != 0, next,
                    lines_per_step);
        continue;
      }
      // Each group's sums go to one of two buffers, and the previous group is promoted after the
      // next one's products are issued, so the vector work can run beside the tile unit's.
      float row_scale[2][32];  // rows past the item are zero rows of A: any finite scale
      const float* col_scale[2] = {};
      const int out_rows = half_rows ? 16 : 32;
      constexpr int64_t kBuffer = kTileRows * kTileRows;  // floats of one buffer (scratch_plan)
      int64_t i = 0;
      for (int64_t g = 0; g < kc; g += modes.gran, ++i) {
        const int cur = static_cast<int>(i % 2), prev = 1 - cur;
        std::fill(row_scale[cur], row_scale[cur] + 32, 1.0f);
        promotion_row_scales(modes, s, row0 + r, tile_rows, k0 + g, row_scale[cur]);
        col_scale[cur] = promotion_col_scales(modes, p, s, panel, k0 + g) + 32 * half;
        mma_rows<T>(u, half_rows, a + g, op.lda, b + g / 2 * op.ldb, op.ldb,
                    round_up(std::min(modes.gran, kc - g), 32), tile_buffer + cur * kBuffer, 32,
                    false, next, lines_per_step);
        if (i > 0)
          tile_promote<T>(tile_buffer + prev * kBuffer, out_rows, block, ldc, row_scale[prev],
                          col_scale[prev]);
      }
      const int last = static_cast<int>((i - 1) % 2);
      tile_promote<T>(tile_buffer + last * kBuffer, out_rows, block, ldc, row_scale[last],
                      col_scale[last]);
    }
  }
}

// The VNNI rows [k0 / 2, end) of B a pass from k0 reads: its K values, rounded up to whole tiles
// (kPanelKAlign) on the tile path, to whole pairs on the dot path.
inline int64_t pass_rows_end(const Problem& p, int64_t k0, bool whole_tiles) {
  const int64_t kc = std::min(p.block_k, p.b.k - k0);
  return k0 / 2 + (whole_tiles ? round_up(kc, kPanelKAlign) : kc + 1) / 2;
}

// The packed rows of B the item widens after those of (panel, k0): the next panel of the pass, or
// the first panel of the next pass. The tile loop prefetches them (B is read from L3 or DRAM
// once per item and pass, and widening it would otherwise wait on every line).
inline tile::PrefetchFeed next_panel_rows(const Problem& p, const GemmSegment& s,
                                          const GemmItem& item, int64_t panel, int64_t k0) {
  int64_t next = panel + 1, k0_next = k0;
  if (next == item.p1) next = item.p0, k0_next = k0 + p.block_k;
  if (k0_next >= p.b.k) return {};
  const int64_t k2 = k0_next / 2, k2_end = pass_rows_end(p, k0_next, true);
  return {.base = panel_data(s.b, p.b, next) + k2 * p.b.row_bytes,
          .row_stride = p.b.row_bytes,
          .row_bytes = (k2_end - k2) * p.b.row_bytes,
          .rows = 1};
}

}  // namespace large_m_detail

// Computes one work item of the large-M kernel: with tile registers (kTiles, the amx kernel; on
// another ISA its TileUnit emulates AMX) or with dot tiles.
template <tile::Isa I, bool kTiles = std::same_as<I, tile::amx_t>>
void large_m_item(const Problem& p, const GemmSegment& s, const GemmItem& item,
                  std::byte* scratch) {
  constexpr bool kAmx = kTiles;
  const int64_t rows = item.m1 - item.m0, panels = item.p1 - item.p0;
  const ScratchPlan plan = scratch_plan(Path::large_m, rows, panels, p.block_k, p.b.k_pad);
  const int64_t rows_pad = round_up(rows, kTileRows), ldc = plan.c_cols;
  auto* c = reinterpret_cast<float*>(scratch + plan.c);
  auto* a_block = reinterpret_cast<bf16*>(scratch + plan.a);
  auto* b_block = reinterpret_cast<bf16*>(scratch + plan.b);
  const ScaleModes modes = scale_modes(p, s, kTiles);
  if (modes.gran != 0)
    std::memset(c, 0, static_cast<size_t>((kAmx ? rows_pad : rows) * ldc) * sizeof(float));
  [[maybe_unused]] std::conditional_t<kAmx, typename tile::BlockRegs<I>::Unit, char> unit;

  for (int64_t k0 = 0; k0 < p.b.k; k0 += p.block_k) {
    const int64_t kc = std::min(p.block_k, p.b.k - k0);
    const int64_t kc_pad = round_up(kc, kPanelKAlign);
    PassOperands op;
    if (!kAmx && a_in_place(p, s, kc)) {
      op.a = static_cast<const bf16*>(s.a.data) + item.m0 * s.a.stride_r + k0;
      op.lda = s.a.stride_r;
    } else {
      widen_a_block<I>(p.a_type, s.a, item.m0, rows, k0, kc, kc_pad, modes.fold_a, a_block,
                       plan.a_cols);
      if (kAmx)  // whole tiles: zero rows up to the next multiple of 32
        std::memset(static_cast<void*>(a_block + rows * plan.a_cols), 0,
                    static_cast<size_t>((rows_pad - rows) * plan.a_cols) * sizeof(bf16));
      op.a = a_block;
      op.lda = plan.a_cols;
    }
    for (int64_t panel = item.p0; panel < item.p1; ++panel) {
      const int64_t k2 = k0 / 2, k2_end = large_m_detail::pass_rows_end(p, k0, kAmx);
      // amx with more than a few row tiles: bf16 too is copied, into rows that do not share L1
      // sets (scratch_plan), since every row tile reads the pass's B from L1.
      if (p.b.type == Elem::bf16 && (!kAmx || rows < kCopyPanelRows)) {
        op.b = reinterpret_cast<const bf16*>(panel_data(s.b, p.b, panel) + k2 * p.b.row_bytes);
        op.ldb = kPanelRowBf16;
      } else {
        // Items of fewer rows than kPrefetchedPanelRows leave the next-panel feed too few steps to
        // bring the whole panel in: the widening prefetches its rows itself.
        widen_panel_rows<I>(p.b, s.b, panel, k2, k2_end, modes.fold_b, b_block, plan.b_cols,
                            rows < kPrefetchedPanelRows ? k2_end : 0);
        op.b = b_block;
        op.ldb = plan.b_cols;
      }
      float* c_panel = c + (panel - item.p0) * kPanelCols;
      if constexpr (kAmx) {
        tile::PrefetchFeed next = large_m_detail::next_panel_rows(p, s, item, panel, k0);
        large_m_detail::tile_panel_pass<I>(unit, p, s, modes, op, item.m0, rows, panel, k0, kc,
                                           c_panel, ldc,
                                           reinterpret_cast<float*>(scratch + plan.tile), next);
      } else {
        for (int64_t r = 0; r < rows; r += kDotTileRows) {
          const int tile_rows = static_cast<int>(std::min<int64_t>(kDotTileRows, rows - r));
          PassOperands row_op = op;
          row_op.a += r * op.lda;
          large_m_detail::dot_row_tile<I>(p, s, modes, row_op, item.m0 + r, tile_rows, panel, k0,
                                          kc, c_panel + r * ldc, ldc);
        }
      }
    }
  }
  const int64_t col0 = item.p0 * int64_t{kPanelCols};
  const int cols = static_cast<int>(std::min(panels * kPanelCols, p.b.n - col0));
  store_output<I>(p, s, item.m0, static_cast<int>(rows), col0, cols, c, ldc,
                  reinterpret_cast<float*>(scratch + plan.row));
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
