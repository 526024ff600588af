// The small-M GEMM kernel (decode: a few rows, bound by reading the weights once from memory). One
// work item is all rows of a segment times a range of panels. Up to 12 rows share one dot tile, as
// wide as the register file allows: 64 columns for up to 6 rows, 32 for up to 12 (24 accumulators
// at most). A narrower tile walks the panel's column groups one after the other over short chunks
// of K, so a cache line of B comes from memory once and its other column groups find it in cache.
// More rows (13 to 16 at M = 16): groups of 6 rows at full width over passes of 128 values of K,
// the first group reading the weights as they arrive and the others re-reading them from L1. FP8 /
// FP4 rows are widened in registers straight into the dot steps, again by every group: on Zen 5
// the shuffles hide behind the VDPBF16PS stream, while storing widened rows once for the other
// groups measured no faster. Every tile that walks a pass prefetches an even share of the next one.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include <dsk/kernels/gemm/args.hpp>
#include <dsk/kernels/gemm/large_m.hpp>
#include <dsk/kernels/gemm/widen.hpp>
#include <dsk/kernels/tile/dot.hpp>

namespace dsk::kernels::gemm {
inline namespace DSK_TILE_ABI {

// How far ahead of its current row a single full-width tile prefetches: at least this many rows
// and bytes (about what one core must keep in flight to cover the DRAM latency).
inline constexpr int64_t kPrefetchRows = 8;
inline constexpr int64_t kPrefetchBytes = 4096;
// K values per pass when several tiles walk it: the pass's B rows (at most 16 KiB of bf16) stay in
// L1 while the other tiles read them, next to the next pass being prefetched.
inline constexpr int64_t kColumnGroupChunk = 128;
// The most rows one dot tile takes (12 x 2 vectors: 24 accumulators).
inline constexpr int kSmallTileRowsMax = 12;

// Vectors (of 16 columns) of the small-M tile for `rows` (1..kSmallTileRowsMax) rows.
constexpr int small_tile_vecs(int rows) {
  return rows <= 6 ? 4 : 2;
}

// What a pass prefetches while it computes: at step s (one VNNI row of B) with s % shares ==
// share, every line of row s of `rows` (rows of the pass's B type). A single full-width tile
// prefetches its own stream a DRAM latency ahead; when several tiles walk a pass (column groups of
// a narrow tile, or groups of rows), each takes its share of the next pass, so the stream from
// memory overlaps the work of every tile at an even rate and each tile finds its rows in cache.
struct Prefetch {
  const std::byte* rows = nullptr;
  int share = 0, shares = 1;
};

namespace small_m_detail {

// Where a tile's prefetching stands within a pass: the next row to prefetch, in `wait` steps.
struct PrefetchCursor {
  const std::byte* row;
  int64_t wait;
};

// `steps` rows of B into an R x 16V tile covering vectors [j0, j0 + V): rows read from `b` (a
// packed panel's rows of type B) and widened in registers, fold[j] applied when kFold; every
// `shares` steps one row of the prefetch stream.
// NOTES: written for few live integer registers (pointers that advance, row size and column offsets
// known at compile time): computed at run time they took registers, the loop spilled them to the
// stack and ran at about 77% of the VDPBF16PS rate on Zen 5 instead of 90%.
template <tile::Isa I, int R, int V, Elem B, bool kFold>
void stream_steps(tile::DotTile<I, R, V>& t, const bf16* a, int64_t lda, const std::byte* b, int j0,
                  int64_t steps, const tile::DotPairs<I> (&fold)[V], PrefetchCursor& prefetch,
                  int shares) {
  constexpr int64_t kRowBytes = int64_t{kPanelCols} * pair_bytes(B);
  const std::byte* row = b + int64_t{16} * pair_bytes(B) * j0;
  for (int64_t s = 0; s < steps; ++s, row += kRowBytes, a += 2) {
    if (prefetch.wait-- == 0) {
      for (int64_t line = 0; line < kRowBytes; line += 64)
        __builtin_prefetch(prefetch.row + line, 0, 3);
      prefetch.row += shares * kRowBytes;
      prefetch.wait = shares - 1;
    }
    tile::DotPairs<I> v[V];
    widen_cols<I, V>(B, row, 0, v);
    if constexpr (kFold)
      for (int j = 0; j < V; ++j) v[j] = apply_fold<I>(v[j], fold[j]);
    tile::dot_step(t, a, lda, v);
  }
}

// Rows [row0, row0 + R), vectors [j0, j0 + V) of one panel over the pass [k0, k0 + kc), into c
// (the panel's C rows, row stride ldc).
template <tile::Isa I, int R, int V, Elem B>
void stream_pass(const Problem& p, const GemmSegment& s, const ScaleModes& modes, const bf16* a,
                 int64_t lda, int64_t row0, int64_t panel, int j0, int64_t k0, int64_t kc,
                 const Prefetch& prefetch, float* c, int64_t ldc) {
  const std::byte* data = panel_data(s.b, p.b, panel) + k0 / 2 * p.b.row_bytes;
  float* out = c + tile::kDotLanes * j0;
  // Promotion restarts the sums per chunk of its granularity; within a chunk, folded B scales
  // change per K block of B's scales (a promotion chunk may span several, as when FP8 A with
  // 128-value blocks meets FP4 B with 32-value ones).
  const int64_t chunk = modes.gran != 0 ? modes.gran : kc;
  const int64_t fold_block = modes.fold_b ? int64_t{p.b.scale_gran_k} : chunk;
  PrefetchCursor cursor{prefetch.rows + prefetch.share * int64_t{kPanelCols} * pair_bytes(B),
                        prefetch.share};
  tile::DotTile<I, R, V> t;
  if (modes.gran == 0) {
    if (k0 == 0)
      tile::dot_zero(t);
    else
      tile::dot_load(t, out, ldc);
  }
  for (int64_t g = 0; g < kc; g += chunk) {
    if (modes.gran != 0) tile::dot_zero(t);
    const int64_t g_end = std::min(g + chunk, kc);
    for (int64_t f = g; f < g_end; f += fold_block) {
      const int64_t steps = (std::min(fold_block, g_end - f) + 1) / 2;
      const std::byte* rows = data + f / 2 * p.b.row_bytes;
      tile::DotPairs<I> fold[V];
      if (modes.fold_b) {
        const float* scales = panel_scales(s.b, p.b, panel, (k0 + f) / p.b.scale_gran_k);
        for (int j = 0; j < V; ++j) fold[j] = fold_shift<I>(scales + 16 * (j0 + j));
        stream_steps<I, R, V, B, true>(t, a + f, lda, rows, j0, steps, fold, cursor,
                                       prefetch.shares);
      } else {
        stream_steps<I, R, V, B, false>(t, a + f, lda, rows, j0, steps, fold, cursor,
                                        prefetch.shares);
      }
    }
    if (modes.gran != 0) {
      float row_scale[kSmallTileRowsMax];
      promotion_row_scales(modes, s, row0, R, k0 + g, row_scale);
      tile::dot_promote(t, out, ldc, row_scale,
                        promotion_col_scales(modes, p, s, panel, k0 + g) + 16 * j0);
    }
  }
  if (modes.gran == 0) tile::dot_store(t, out, ldc);
}

using PassFn = void (*)(const Problem&, const GemmSegment&, const ScaleModes&, const bf16*, int64_t,
                        int64_t, int64_t, int, int64_t, int64_t, const Prefetch&, float*, int64_t);

// stream_pass for R rows (1..kSmallTileRowsMax) with the tile width of R rows; R = 0: a 6-row group
// of a larger item (full width).
template <tile::Isa I, Elem B, int... R>
constexpr auto make_pass_table(std::integer_sequence<int, R...>) {
  return std::array<PassFn, sizeof...(R) + 1>{stream_pass<I, kDotTileRows, 4, B>,
                                              stream_pass<I, R + 1, small_tile_vecs(R + 1), B>...};
}

template <tile::Isa I, Elem B>
inline constexpr auto kPass =
    make_pass_table<I, B>(std::make_integer_sequence<int, kSmallTileRowsMax>{});

// Every row of the item over one pass [k0, k0 + kc) of one panel.
template <tile::Isa I, Elem B>
void panel_pass(const Problem& p, const GemmSegment& s, const ScaleModes& modes, const bf16* a,
                int64_t lda, int64_t row0, int64_t rows, int64_t panel, int64_t k0, int64_t kc,
                float* c) {
  const std::byte* data = panel_data(s.b, p.b, panel) + k0 / 2 * p.b.row_bytes;
  const std::byte* next_pass = data + (kc + 1) / 2 * p.b.row_bytes;
  if (rows <= kSmallTileRowsMax) {  // one tile of every row, column group after column group
    const int vecs = small_tile_vecs(static_cast<int>(rows));
    const int64_t near = std::max(kPrefetchRows * p.b.row_bytes, kPrefetchBytes);
    for (int j0 = 0; j0 < 4; j0 += vecs)
      kPass<I, B>[rows](
          p, s, modes, a, lda, row0, panel, j0, k0, kc,
          vecs == 4 ? Prefetch{data + near} : Prefetch{next_pass, j0 / vecs, 4 / vecs}, c,
          kPanelCols);
    return;
  }
  // Groups of 6 rows at full width, sharing the prefetch of the next pass.
  const int groups = static_cast<int>(ceil_div(rows, int64_t{kDotTileRows}));
  for (int g = 0; g < groups; ++g) {
    const int64_t r = int64_t{g} * kDotTileRows;
    const int64_t n = std::min<int64_t>(kDotTileRows, rows - r);
    kPass<I, B>[n == kDotTileRows ? 0 : n](p, s, modes, a + r * lda, lda, row0 + r, panel, 0, k0,
                                           kc, Prefetch{next_pass, g, groups}, c + r * kPanelCols,
                                           kPanelCols);
  }
}

}  // namespace small_m_detail

// Computes one work item of the small-M kernel.
template <tile::Isa I>
void small_m_item(const Problem& p, const GemmSegment& s, const GemmItem& item,
                  std::byte* scratch) {
  const int64_t rows = item.m1 - item.m0;
  const ScratchPlan plan = scratch_plan(Path::small_m, rows, 1, p.block_k, p.b.k_pad);
  auto* c = reinterpret_cast<float*>(scratch + plan.c);
  const ScaleModes modes = scale_modes(p, s, false);

  // A once for all panels: in place (one row), or widened over the whole of K with a row stride
  // that does not alias in L1 (scratch_plan).
  const bf16* a = static_cast<const bf16*>(s.a.data) + item.m0 * s.a.stride_r;
  int64_t lda = s.a.stride_r;
  if (rows > 1 || !a_in_place(p, s, p.b.k)) {
    auto* a_block = reinterpret_cast<bf16*>(scratch + plan.a);
    widen_a_block<I>(p.a_type, s.a, item.m0, rows, 0, p.b.k, p.b.k_pad, modes.fold_a, a_block,
                     plan.a_cols);
    a = a_block;
    lda = plan.a_cols;
  }

  // Passes: block_k values of K, or short chunks when a tile covers part of the columns.
  const bool one_tile = rows <= kDotTileRows;
  const int64_t pass_k = one_tile ? p.block_k : std::min<int64_t>(p.block_k, kColumnGroupChunk);
  for (int64_t panel = item.p0; panel < item.p1; ++panel) {
    if (modes.gran != 0) std::memset(c, 0, static_cast<size_t>(rows * kPanelCols) * sizeof(float));
    for (int64_t k0 = 0; k0 < p.b.k; k0 += pass_k) {
      const int64_t kc = std::min(pass_k, p.b.k - k0);
      switch (p.b.type) {
        case Elem::bf16:
          small_m_detail::panel_pass<I, Elem::bf16>(p, s, modes, a + k0, lda, item.m0, rows, panel,
                                                    k0, kc, c);
          break;
        case Elem::e4m3:
          small_m_detail::panel_pass<I, Elem::e4m3>(p, s, modes, a + k0, lda, item.m0, rows, panel,
                                                    k0, kc, c);
          break;
        default:
          small_m_detail::panel_pass<I, Elem::e2m1>(p, s, modes, a + k0, lda, item.m0, rows, panel,
                                                    k0, kc, c);
          break;
      }
    }
    const int64_t col0 = panel * int64_t{kPanelCols};
    const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, p.b.n - col0));
    store_output<I>(p, s, item.m0, static_cast<int>(rows), col0, cols, c, kPanelCols,
                    reinterpret_cast<float*>(scratch + plan.row));
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
