// The packed weight layout of dsk::gemm: one layout that every GEMM kernel (large M and small M, on
// every ISA) reads, written once by pack_panel() when a weight is packed.
//
// B [n, k] is cut into panels of kPanelCols = 64 columns (the last one zero-padded). A panel holds
// all of K, padded with zeros to a multiple of kPanelKAlign = 32, as k_pad / 2 VNNI rows; row k2
// holds, for each of the 64 columns c, the pair (B(c, 2k2), B(c, 2k2 + 1)):
//
//   bf16   4 bytes per pair: the two bf16 (even element in the low half), as in the AMX B-tile
//          row format and the B operand of VDPBF16PS; 256 bytes per row
//   e4m3   2 bytes per pair: the two FP8 codes, even first; 128 bytes per row
//   e2m1   1 byte per pair: the two FP4 codes, even in the low nibble (upstream's packing);
//          64 bytes per row
//
// So a block of K rows of a panel is kc / 2 consecutive rows, and the 16 columns [16j, 16j + 16)
// of a row are pair_bytes(type) * 16 bytes at offset j * pair_bytes(type) * 16: one zmm of bf16
// pairs, or one AMX B tile row, once widened. FP8 and FP4 weights stay in their format in memory
// and are widened to bf16 by the kernels (in registers or in L1).
//
// Scale factors (FP8 / FP4 weights) follow the panel's data: scale_blocks = ceil(k / gran_k) rows
// of 64 f32, row kb holding the scale of K block kb of each column (a gran_n > 1 recipe is
// expanded to one scale per column; padding columns hold 1). Every panel starts on a 64-byte
// boundary of the packed buffer, which is itself 64-byte aligned.
//
// Header-only, no library dependencies: the JIT compiles the kernels that include it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/tile/isa.hpp>
#include <dsk/kernels/tile/pack.hpp>

namespace dsk::kernels::gemm {

// Element types of GEMM operands as the kernels see them. `any` is the JIT configs' "read it from
// the arguments" value.
enum class Elem : uint8_t { bf16, e4m3, e2m1, any };
// Element type of D.
enum class OutType : uint8_t { f32, bf16, any };

inline constexpr int kPanelCols = 64;    // columns per panel: 4 zmm of pairs, 4 AMX B tiles
inline constexpr int kPanelKAlign = 32;  // K of a panel is padded to this (one AMX bf16 K step)
inline constexpr int kLayoutAlign = 64;  // bytes: every panel starts on a cache line
inline constexpr int kPanelRowBf16 = 2 * kPanelCols;  // bf16 elements of a widened panel row

struct PackedLayout {
  Elem type = Elem::bf16;
  int64_t n = 0, k = 0;
  int64_t k_pad = 0;         // k rounded up to kPanelKAlign
  int64_t panels = 0;        // ceil(n / kPanelCols)
  int scale_gran_k = 0;      // K values per scale; 0: no scales (bf16)
  int64_t scale_blocks = 0;  // ceil(k / scale_gran_k)
  int64_t row_bytes = 0;     // one VNNI row of a panel: kPanelCols pairs
  int64_t data_bytes = 0;    // the rows of one panel
  int64_t panel_bytes = 0;   // data and scales of one panel, rounded up to kLayoutAlign
  // The scales may be folded into the widening of the weights: each is an exact power of two
  // 2^e with |e| <= kMaxFoldExponent and the weight holds no NaN (set by the packer's caller).
  // Whether a kernel does is kg::folds.
  bool scales_foldable = false;
};

// What pack_panel reads: B [n, k] with element (c, kk) at data + c * stride_r + kk * stride_k
// (elements; e2m1 is K-major with stride_k == 1 counting bytes, value kk in nibble kk % 2 of byte
// kk / 2), and its f32 scales, scale (c, kb) at sf[(c / sf_gran_n) * sf_ld + kb].
struct PackSource {
  const void* data = nullptr;
  int64_t stride_r = 0, stride_k = 1;
  const float* sf = nullptr;
  int64_t sf_ld = 0;
  int sf_gran_n = 1;
};

// The functions live in the per-ISA ABI namespace (dsk/kernels/abi.hpp), the types above do not.
inline namespace DSK_TILE_ABI {

constexpr int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}
constexpr int64_t ceil_div(int64_t x, int64_t y) {
  return (x + y - 1) / y;
}

// Bytes of one (even, odd) pair of K values of one column.
constexpr int pair_bytes(Elem type) {
  return type == Elem::bf16 ? 4 : type == Elem::e4m3 ? 2 : 1;
}

constexpr int64_t layout_bytes(const PackedLayout& l) {
  return l.panels * l.panel_bytes;
}
// VNNI rows of one panel.
constexpr int64_t layout_rows(const PackedLayout& l) {
  return l.k_pad / 2;
}

constexpr PackedLayout make_layout(Elem type, int64_t n, int64_t k, int scale_gran_k) {
  PackedLayout l;
  l.type = type;
  l.n = n;
  l.k = k;
  l.k_pad = round_up(k, kPanelKAlign);
  l.panels = ceil_div(n, kPanelCols);
  l.scale_gran_k = scale_gran_k;
  l.scale_blocks = scale_gran_k > 0 ? ceil_div(k, scale_gran_k) : 0;
  l.row_bytes = int64_t{kPanelCols} * pair_bytes(type);
  l.data_bytes = layout_rows(l) * l.row_bytes;
  const int64_t scale_bytes = l.scale_blocks * kPanelCols * int64_t{sizeof(float)};
  l.panel_bytes = round_up(l.data_bytes + scale_bytes, kLayoutAlign);
  return l;
}

inline const std::byte* panel_data(const std::byte* base, const PackedLayout& l, int64_t panel) {
  return base + panel * l.panel_bytes;
}
// Row kb of the panel's scales: the 64 columns' scales of K block kb.
inline const float* panel_scales(const std::byte* base, const PackedLayout& l, int64_t panel,
                                 int64_t kb) {
  return reinterpret_cast<const float*>(base + panel * l.panel_bytes + l.data_bytes) +
         kb * kPanelCols;
}

namespace layout_detail {

// The two bytes of pair k2 of column c of an FP8 weight (zero past k).
inline uint16_t e4m3_pair(const uint8_t* b, const PackSource& s, int64_t k, int64_t c, int64_t k2) {
  const int64_t k0 = 2 * k2;
  const uint8_t even = k0 < k ? b[c * s.stride_r + k0 * s.stride_k] : 0;
  const uint8_t odd = k0 + 1 < k ? b[c * s.stride_r + (k0 + 1) * s.stride_k] : 0;
  return static_cast<uint16_t>(even | (odd << 8));
}

template <tile::Isa I>
void pack_bf16_panel(const PackedLayout& l, const PackSource& s, int64_t c0, int cols,
                     std::byte* dst) {
  const auto* b = static_cast<const bf16*>(s.data) + c0 * s.stride_r;
  auto* out = reinterpret_cast<bf16*>(dst);
  const int k = static_cast<int>(l.k), k_pad = static_cast<int>(l.k_pad);
  if (s.stride_k == 1) {
    tile::pack_b_vnni_nt<I>(b, s.stride_r, k, cols, out, kPanelRowBf16, k_pad, kPanelCols);
  } else if (s.stride_r == 1) {
    tile::pack_b_vnni_nn<I>(b, s.stride_k, k, cols, out, kPanelRowBf16, k_pad, kPanelCols);
  } else {
    const auto at = [&](int kk, int c) { return b[c * s.stride_r + kk * s.stride_k]; };
    tile::detail::pack_vnni_generic<bf16>(at, k, cols, out, kPanelRowBf16, k_pad, kPanelCols);
  }
}

inline void pack_e4m3_panel(const PackedLayout& l, const PackSource& s, int64_t c0, int cols,
                            std::byte* dst) {
  const auto* b = static_cast<const uint8_t*>(s.data) + c0 * s.stride_r;
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t k2 = 0; k2 < layout_rows(l); ++k2)
    for (int c = 0; c < kPanelCols; ++c)
      out[k2 * kPanelCols + c] = c < cols ? e4m3_pair(b, s, l.k, c, k2) : 0;
}

// FP4 is K-major: pair k2 of column c is byte k2 of the column's row, as stored.
inline void pack_e2m1_panel(const PackedLayout& l, const PackSource& s, int64_t c0, int cols,
                            std::byte* dst) {
  const auto* b = static_cast<const uint8_t*>(s.data) + c0 * s.stride_r;
  auto* out = reinterpret_cast<uint8_t*>(dst);
  const int64_t k_bytes = ceil_div(l.k, 2);
  for (int64_t k2 = 0; k2 < layout_rows(l); ++k2)
    for (int c = 0; c < kPanelCols; ++c)
      out[k2 * kPanelCols + c] = (c < cols && k2 < k_bytes) ? b[c * s.stride_r + k2] : 0;
}

}  // namespace layout_detail

// Writes panel `panel` of the packed form of `s` (l.panel_bytes bytes at dst, 64-byte aligned).
template <tile::Isa I>
void pack_panel(const PackedLayout& l, const PackSource& s, int64_t panel, std::byte* dst) {
  const int64_t c0 = panel * kPanelCols;
  const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, l.n - c0));
  switch (l.type) {
    case Elem::bf16:
      layout_detail::pack_bf16_panel<I>(l, s, c0, cols, dst);
      break;
    case Elem::e4m3:
      layout_detail::pack_e4m3_panel(l, s, c0, cols, dst);
      break;
    default:
      layout_detail::pack_e2m1_panel(l, s, c0, cols, dst);
      break;
  }
  auto* scales = reinterpret_cast<float*>(dst + l.data_bytes);
  for (int64_t kb = 0; kb < l.scale_blocks; ++kb)
    for (int c = 0; c < kPanelCols; ++c)
      scales[kb * kPanelCols + c] = c < cols ? s.sf[((c0 + c) / s.sf_gran_n) * s.sf_ld + kb] : 1.0f;
  const int64_t used = l.data_bytes + l.scale_blocks * kPanelCols * int64_t{sizeof(float)};
  std::memset(dst + used, 0, static_cast<size_t>(l.panel_bytes - used));
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::gemm
