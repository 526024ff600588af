// The GEMM kernels' contract with their host (src/gemm/engine*.cpp): the compile-time knobs
// (GemmConfig), the run-time arguments (GemmArgs: segments, work items, the packed weight layout),
// the per-thread scratch they need, how scales are applied, and the epilogue that writes D.
//
// A call computes, for each work item in [item_begin, item_end), the rows [m0, m1) and panels
// [p0, p1) of one segment's D = (accumulate ? D : 0) + A . B^T. Items never share a D element and
// every element is summed in one fixed order (K ascending; partial sums restarted only at the
// fixed promotion boundaries), so the result does not depend on how the host blocks and threads
// the work, nor on the knobs below. Callers guarantee valid input (DESIGN §2).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/gemm/layout.hpp>
#include <dsk/kernels/gemm/widen.hpp>
#include <dsk/kernels/tile/convert.hpp>
#include <dsk/kernels/tile/epilogue.hpp>

namespace dsk::kernels::gemm {

// Which kernel family runs the items: large M (B panels widened once per block into L1 and
// reused by every row tile) or small M (weights streamed from memory once, widened in registers).
enum class Path : uint8_t { large_m, small_m };

// Compile-time knobs. Zero / `any` means "read it from GemmArgs" (the runtime-shape variant that
// libdsk carries as the JIT's fallback).
struct GemmConfig {
  Path path = Path::large_m;
  Elem a_type = Elem::any;
  Elem b_type = Elem::any;
  OutType d_type = OutType::any;
  int n = 0;        // columns of B (GemmArgs::b.n)
  int k = 0;        // K (GemmArgs::b.k)
  int block_k = 0;  // K values per pass (GemmArgs::block_k)
};

// One product: A [m, k] (rows of the segment), the packed B, D [m, n] row-major.
struct GemmSegment {
  OperandA a;
  bool a_foldable = false;  // A's scales are powers of two within kMaxFoldExponent
  const std::byte* b = nullptr;
  void* d = nullptr;
  int64_t ldd = 0;
  int64_t m = 0;
};

struct GemmItem {
  int32_t segment = 0;
  int32_t m0 = 0, m1 = 0;  // rows of the segment
  int32_t p0 = 0, p1 = 0;  // panels of B (columns [64 p0, min(64 p1, n)))
};

struct GemmArgs {
  const GemmSegment* segments = nullptr;
  const GemmItem* items = nullptr;
  int64_t item_begin = 0, item_end = 0;
  PackedLayout b;  // every segment's B has this layout
  Elem a_type = Elem::bf16;
  OutType d_type = OutType::f32;
  bool accumulate = false;
  int block_k = 256;  // a multiple of kPanelKAlign and of the scales' K granularity
  // scratch_plan(...).bytes bytes for the largest item, 64-byte aligned, private to the thread.
  std::byte* scratch = nullptr;
};

// ---- scratch ----
inline constexpr int kTileRows = 32;  // row padding of scratch blocks (two AMX tile heights)

struct ScratchPlan {
  int64_t c = 0, a = 0, b = 0, row = 0, tile = 0;  // byte offsets
  int64_t bytes = 0;
  int64_t a_cols = 0;  // bf16 per row of the A block
  int64_t b_cols = 0;  // bf16 per row of the widened panel rows
  int64_t c_cols = 0;  // f32 per row of the C block
};

// The problem as one call sees it: GemmArgs with the config's compile-time values filled in.
struct Problem {
  PackedLayout b;
  Elem a_type = Elem::bf16;
  OutType d_type = OutType::f32;
  bool accumulate = false;
  int64_t block_k = 256;
};

// How one segment applies its scales: each operand's are folded into its widening when they
// allow it, the others multiply the partial sums of every `gran` values of K (promotion).
struct ScaleModes {
  bool fold_a = false, fold_b = false;
  bool promote_a = false, promote_b = false;
  int64_t gran = 0;  // promotion granularity (K values); 0 without promotion
};

// The functions live in the per-ISA ABI namespace (dsk/kernels/abi.hpp), the types above do not.
inline namespace DSK_TILE_ABI {

// Scratch for items of up to `rows` rows and `panels` panels, passes of block_k values of K (the
// small-M kernels keep all of A's K: a_cols = k_pad).
constexpr ScratchPlan scratch_plan(Path path, int64_t rows, int64_t panels, int64_t block_k,
                                   int64_t k_pad) {
  const int64_t rows_pad = round_up(rows, kTileRows);
  const int64_t kc_pad = round_up(block_k < k_pad ? block_k : k_pad, kPanelKAlign);
  ScratchPlan s;
  // NOTES: every scratch row is one cache line longer than its data. Rows a power of two apart
  // map to a few L1 sets: the small-M kernels broadcast from up to 16 rows of A at once (4 KiB
  // apart when K is a multiple of 2048), and a tile load reads 16 rows of A, of B (a 32-column
  // half of 256-byte panel rows, so a pass of B used a quarter of the sets) or of C. With the extra
  // line, consecutive rows fall in different sets (measured on the AMX VM: a 192 x 512 x 512 pass
  // with B kept in L1 1.3x faster than with unpadded rows).
  constexpr int64_t kLineBf16 = kLayoutAlign / 2, kLineF32 = kLayoutAlign / 4;
  s.a_cols = (path == Path::small_m ? k_pad : kc_pad) + kLineBf16;
  s.b_cols = kPanelRowBf16 + kLineBf16;
  s.c_cols = panels * kPanelCols + kLineF32;
  int64_t at = 0;
  const auto take = [&at](int64_t bytes) {
    const int64_t offset = at;
    at += round_up(bytes, kLayoutAlign);
    return offset;
  };
  s.c = take(rows_pad * s.c_cols * 4);
  s.a = take(rows_pad * s.a_cols * 2);
  s.b = take(kc_pad / 2 * s.b_cols * 2);
  s.row = take(panels * kPanelCols * 4);
  s.tile = take(2 * kTileRows * kTileRows * 4);  // two 32 x 32 f32 blocks (promotion)
  s.bytes = at;
  return s;
}

template <GemmConfig kConfig>
Problem resolve_problem(const GemmArgs& args) {
  Problem p;
  const Elem b_type = kConfig.b_type != Elem::any ? kConfig.b_type : args.b.type;
  const int64_t n = kConfig.n != 0 ? kConfig.n : args.b.n;
  const int64_t k = kConfig.k != 0 ? kConfig.k : args.b.k;
  p.b = make_layout(b_type, n, k, args.b.scale_gran_k);
  p.b.scales_foldable = args.b.scales_foldable;
  p.a_type = kConfig.a_type != Elem::any ? kConfig.a_type : args.a_type;
  p.d_type = kConfig.d_type != OutType::any ? kConfig.d_type : args.d_type;
  p.accumulate = args.accumulate;
  p.block_k = kConfig.block_k != 0 ? kConfig.block_k : args.block_k;
  return p;
}

// Whether foldable scales of blocks of gran_k values are folded into the widening rather than
// promoted. The tile kernels always fold: their widening is shared by a block of rows, while
// promotion would store, scale and reload the accumulator tiles once per block of K. The register
// kernels fold only short blocks: folding costs two vector operations per widened vector of every
// row they stream, promotion a few per block and accumulator tile; measured on one Zen 5 core
// (docs/gemm.md), promoting wins from 128 values per block up (5.8 against 10.7 cycles per e4m3
// row in the small-M kernel), while FP4's 32-value blocks would promote too often.
inline constexpr int kFoldBelowGranK = 128;
constexpr bool folds(bool foldable, int64_t gran_k, bool tiles) {
  return foldable && (tiles || gran_k < kFoldBelowGranK);
}

inline ScaleModes scale_modes(const Problem& p, const GemmSegment& s, bool tiles) {
  ScaleModes m;
  const bool has_a = s.a.sf != nullptr, has_b = p.b.scale_gran_k > 0;
  m.fold_a = has_a && folds(s.a_foldable, s.a.sf_gran_k, tiles);
  m.fold_b = has_b && folds(p.b.scales_foldable, p.b.scale_gran_k, tiles);
  m.promote_a = has_a && !m.fold_a;
  m.promote_b = has_b && !m.fold_b;
  if (m.promote_a) m.gran = s.a.sf_gran_k;
  if (m.promote_b && (m.gran == 0 || p.b.scale_gran_k < m.gran)) m.gran = p.b.scale_gran_k;
  return m;
}

// Row scales of a promotion chunk starting at K value g0: A's, or 1 when A is not promoted.
// Row r takes the scale of row block r / sf_gran_m, stepped along: the amx path asks for 32 rows
// every 128 values of K, and two 64-bit divisions per row drew half of its loop's own samples.
inline void promotion_row_scales(const ScaleModes& m, const GemmSegment& s, int64_t row0, int rows,
                                 int64_t g0, float* out) {
  if (!m.promote_a) {
    std::fill(out, out + rows, 1.0f);
    return;
  }
  const float* column = s.a.sf + g0 / s.a.sf_gran_k;
  int64_t block = row0 / s.a.sf_gran_m, within = row0 % s.a.sf_gran_m;
  for (int i = 0; i < rows; ++i) {
    out[i] = column[block * s.a.sf_ld];
    if (++within == s.a.sf_gran_m) {
      within = 0;
      ++block;
    }
  }
}

// Column scales of a promotion chunk: the panel's B scales, or ones.
inline const float* promotion_col_scales(const ScaleModes& m, const Problem& p,
                                         const GemmSegment& s, int64_t panel, int64_t g0) {
  alignas(64) static constexpr float kOnes[kPanelCols] = {
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  return m.promote_b ? panel_scales(s.b, p.b, panel, g0 / p.b.scale_gran_k) : kOnes;
}

// Whether A rows can be read in place for a pass of `kc` values of K: bf16, unit stride along K,
// and whole pairs (an odd pass would read one element past the row).
inline bool a_in_place(const Problem& p, const GemmSegment& s, int64_t kc) {
  return p.a_type == Elem::bf16 && s.a.stride_k == 1 && kc % 2 == 0;
}

// ---- epilogue ----

// D rows [row0, row0 + rows), columns [col0, col0 + cols) = (accumulate ? D : 0) + c (f32, row
// stride ldc), rounded once to D's type. `row` holds cols f32 of scratch.
template <tile::Isa I>
void store_output(const Problem& p, const GemmSegment& s, int64_t row0, int rows, int64_t col0,
                  int cols, const float* c, int64_t ldc, float* row) {
  for (int i = 0; i < rows; ++i) {
    const float* src = c + i * ldc;
    if (p.d_type == OutType::f32) {
      float* d = static_cast<float*>(s.d) + (row0 + i) * s.ldd + col0;
      if (p.accumulate)
        tile::accumulate<I>(d, 0, src, 0, 1, cols);
      else
        std::memcpy(d, src, static_cast<size_t>(cols) * sizeof(float));
    } else {
      bf16* d = static_cast<bf16*>(s.d) + (row0 + i) * s.ldd + col0;
      if (p.accumulate) {
        tile::convert_n<I>(d, row, static_cast<size_t>(cols));
        tile::accumulate<I>(row, 0, src, 0, 1, cols);
        src = row;
      }
      tile::convert_n<I>(src, d, static_cast<size_t>(cols));
    }
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
