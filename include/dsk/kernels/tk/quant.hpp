// Quantisation kernels: per-token (1 x g blocks), per-block (bm x bk) and per-channel (g x 1)
// casts to e4m3 or e2m1 with f32 or UE8M0 scales, the fused SwiGLU + per-token cast and
// RMSNorm + per-token cast, and the cast back to f32 / bf16.
//
// Every scale and code follows dsk/kernels/quant.hpp (DeepGEMM's rule, shared with dsk::gemm's
// reference quantizers), so they are bit-identical to it:
//   amax = max |x| over the block, sf = block_scale(amax, fmt_max, ue8m0),
//   code = to_format(x * inverse_scale(sf)),
// with torch's NaN rule as dsk::gemm's reference applies it: a NaN in a block makes its amax NaN,
// and sf NaN (2^127 = ceil_to_ue8m0(NaN) with UE8M0), so the block's codes are NaN (about 0).
// Fused kernels first compute the row in f32 (into a caller-provided scratch row; with UE8M0 e4m3
// scales, both keep it as bf16 rounded to odd, which changes no code), then quantize it with
// the plain cast's scale rule and conversions (RMSNorm + cast block by block as it writes the
// row), so fused == unfused-then-cast, bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <dsk/kernels/numeric.hpp>
#include <dsk/kernels/quant.hpp>
#include <dsk/kernels/tk/math.hpp>
#include <dsk/kernels/tk/norm.hpp>
#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {

enum class QuantFormat : int { e4m3 = 0, e2m1 = 1 };

// Where scale (row r, block kb) goes: f32 element data[r * row_stride + kb * col_stride], or, when
// packed, byte kb % 4 of int32 word data[r * row_stride + (kb / 4) * col_stride] (the UE8M0
// exponent byte; strides count int32 words).
struct ScaleLayout {
  void* data = nullptr;
  bool packed = false;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
};

// Codes of row r start at out + r * out_stride bytes; e4m3 rows hold `cols` bytes, e2m1 rows
// cols / 2 (two codes per byte, even column in the low nibble).
struct QuantOut {
  QuantFormat fmt = QuantFormat::e4m3;
  bool round_sf = false;  // UE8M0 scales (powers of two)
  void* out = nullptr;
  int64_t out_stride = 0;
  ScaleLayout sf;
  // Codes may be written around the caches (an output too large to stay in them, which nothing
  // reads before the call returns); only per_block_cast's bf16 codes are, so far.
  bool stream = false;
};

// per_token_cast: rows [r0, r1) of x [rows, cols] (T elements, x_stride apart), blocks of `group`
// columns (the last one may be shorter).
struct TokenCastArgs {
  const void* x = nullptr;
  int64_t x_stride = 0;
  int64_t cols = 0;
  int64_t group = 128;
  QuantOut q;
};

// swiglu_forward_and_per_token_cast: row r of x holds gate [0, cols) and up [cols, 2 cols);
//   g = min(gate, clamp), u = min(max(up, -clamp), clamp)     (when has_clamp)
//   y = silu(g) * u, then y * weight[pos_to_token_topk[r]]    (when weights)
// Rows with pos_to_expert[r] < 0 or pos_to_token_topk[r] < 0 (when given) are all zeros.
struct SwigluCastArgs {
  TokenCastArgs cast;  // cast.cols is the output width (half of x's)
  bool has_clamp = false;
  float clamp = 0.0f;
  const int32_t* pos_to_expert = nullptr;
  const int32_t* pos_to_token_topk = nullptr;
  const float* weights = nullptr;  // flat [num_tokens * num_topk]
  // When set, y rows go here (cols floats apart) and are not cast (swiglu_forward).
  float* f32_out = nullptr;
};

// rmsnorm_forward_and_per_token_cast: y = RMSNorm(x) (norm.hpp), then the per-token cast.
struct NormCastArgs {
  TokenCastArgs cast;
  const void* weight = nullptr;
  float eps = 1e-6f;
  bool prefetch_rows = false;  // fetch the next row into L1 while normalising this one
};

// per_block_cast: blocks of block_rows x block_cols; rows [br0, br1) of blocks.
struct BlockCastArgs {
  const void* x = nullptr;
  int64_t x_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  QuantOut q;
};

// cast_back: out[r, c] = value(code[r, c]) * sf(r / block_rows, c / block_cols), rows [r0, r1).
struct CastBackArgs {
  QuantFormat fmt = QuantFormat::e4m3;
  const void* x = nullptr;  // codes, row r at x + r * x_stride bytes
  int64_t x_stride = 0;
  int64_t cols = 0;
  int64_t block_rows = 1;
  int64_t block_cols = 128;
  ScaleLayout sf;  // read the same way ScaleLayout is written
  void* out = nullptr;
  int64_t out_stride = 0;  // elements
};

inline namespace DSK_TILE_ABI {

DSK_TK_INLINE void store_scale(const ScaleLayout& l, int64_t r, int64_t kb, float sf) {
  if (!l.packed) {
    static_cast<float*>(l.data)[r * l.row_stride + kb * l.col_stride] = sf;
  } else {
    uint8_t* word = reinterpret_cast<uint8_t*>(static_cast<int32_t*>(l.data) + r * l.row_stride +
                                               (kb / 4) * l.col_stride);
    word[kb % 4] = numeric::f32_to_ue8m0_exact(sf).bits;
  }
}

DSK_TK_INLINE float load_scale(const ScaleLayout& l, int64_t r, int64_t kb) {
  if (!l.packed) return static_cast<const float*>(l.data)[r * l.row_stride + kb * l.col_stride];
  const uint8_t* word = reinterpret_cast<const uint8_t*>(
      static_cast<const int32_t*>(l.data) + r * l.row_stride + (kb / 4) * l.col_stride);
  return numeric::ue8m0_to_f32(ue8m0{word[kb % 4]});
}

DSK_TK_INLINE float format_max(QuantFormat fmt) {
  return fmt == QuantFormat::e4m3 ? numeric::kE4m3Max : numeric::kE2m1Max;
}

namespace quant_detail {

// The scale of a block whose |x| maximum is amax (NaN when the block holds a NaN).
DSK_TK_INLINE float scale_of(float amax, float fmt_max, bool round_sf) {
  if (amax != amax) return round_sf ? numeric::ceil_to_ue8m0(amax) : amax;
  return quant::block_scale(amax, fmt_max, round_sf);
}

// A running |x| maximum kept as the integer bits of |x|: for non-negative floats integer order is
// value order, and NaN (abs bits above inf's) wins, as torch's amax makes it.
template <class S>
struct Amax {
  typename S::I32 bits = S::iset1(0);
  void add(typename S::F x) { bits = S::imax(S::iand(S::bits(x), S::iset1(0x7FFFFFFF)), bits); }
  float value() const { return finish(S::ireduce_max(bits)); }
  static float finish(int32_t b) {
    return static_cast<uint32_t>(b) > 0x7F800000u ? numeric::float_of(0x7FC00000u)
                                                  : numeric::float_of(static_cast<uint32_t>(b));
  }
};

// The scale of a block whose Amax bits are amax_bits (scale_of), and the inverse its codes take.
template <class S>
DSK_TK_INLINE void scale_of_bits(int32_t amax_bits, float fmt_max, bool round_sf, float* sf,
                                 float* inv) {
  *sf = scale_of(Amax<S>::finish(amax_bits), fmt_max, round_sf);
  *inv = quant::inverse_scale(*sf);
}

// Stores the codes of n values starting at column c of a row (c even for e2m1, n even or the row
// end); v holds 16 values.
template <class S>
DSK_TK_INLINE void store_codes(const QuantOut& q, uint8_t* row, int64_t c, typename S::F v, int n) {
  if (q.fmt == QuantFormat::e4m3) {
    e4m3* p = reinterpret_cast<e4m3*>(row) + c;
    if (n == 16)
      S::store_e4m3(p, v);
    else
      S::store_e4m3_n(p, v, n);
  } else {
    fp4x2* p = reinterpret_cast<fp4x2*>(row) + c / 2;
    if (n == 16)
      S::store_e2m1(p, v);
    else
      S::store_e2m1_n(p, v, n);
  }
}

template <class S, class T>
DSK_TK_INLINE typename S::F load_part(const T* p, int n) {
  return n == 16 ? S::load(p) : S::load_n(p, n);
}

// x * inv with quant::quantize_e4m3's NaN rule (a NaN x keeps its own NaN). Only a block with a
// NaN (NaN amax, NaN inverse scale) makes the product's NaN ambiguous, so the row quantizers and
// per_block_cast's e4m3 codes branch once per block and use S::mul for the others; this select
// serves the rest (NaN blocks, e2m1, partial vectors). A branch per vector instead had made
// per_block_cast 10% slower.
template <class S>
DSK_TK_INLINE typename S::F scaled(typename S::F x, typename S::F inv) {
  return S::select(S::isnan(x), x, S::mul(x, inv));
}

// Any block (any length, any start): amax over the block, then codes, reading v twice.
template <class S, class T>
DSK_TK_INLINE void quantize_block_any(const T* v, int64_t start, int64_t end, const QuantOut& q,
                                      uint8_t* out, int64_t r, int64_t kb) {
  Amax<S> amax;
  for (int64_t c = start; c < end; c += 16) {
    const int n = static_cast<int>(end - c < 16 ? end - c : 16);
    amax.add(load_part<S>(v + c, n));
  }
  const float sf = scale_of(amax.value(), format_max(q.fmt), q.round_sf);
  store_scale(q.sf, r, kb, sf);
  const auto inv = S::set1(quant::inverse_scale(sf));
  for (int64_t c = start; c < end; c += 16) {
    const int n = static_cast<int>(end - c < 16 ? end - c : 16);
    store_codes<S>(q, out, c, scaled<S>(load_part<S>(v + c, n), inv), n);
  }
}

// scale_of and quant::inverse_scale of 16 blocks in Simd lanes, from their amax bits: the same
// IEEE operations lane by lane (the floor as S::max, the division by the format's largest value,
// ceil_to_ue8m0 on the bits, the reciprocal), so the same bits. False, with nothing written, when
// a block's amax is NaN (those take scale_of's NaN rule). Sixteen blocks share two vector
// divisions where each block had a scalar chain with two divisions (for blocks of 32 values the
// chains were most of the row's time).
template <class S>
DSK_TK_INLINE bool scales16(const int32_t* amax_bits, float fmt_max, bool round_sf, float* sf,
                            float* inv) {
  const auto bits = S::iload(amax_bits);
  if (S::ilt(S::iset1(0x7F800000), bits) != 0) return false;  // NaN (the bits are >= 0)
  auto scale = S::div(S::max(S::from_bits(bits), S::set1(quant::kAmaxFloor)), S::set1(fmt_max));
  if (round_sf) {
    // numeric::ceil_to_ue8m0 of a positive value: exponent + (mantissa != 0), clamped to [1, 254].
    const auto b = S::bits(scale);
    auto e = S::template sra<23>(b);
    const auto exact = S::ieq(S::iand(b, S::iset1(0x7FFFFF)), S::iset1(0));
    e = S::iselect(exact, e, S::iadd(e, S::iset1(1)));
    e = S::imax(e, S::iset1(1));
    e = S::iselect(S::ilt(S::iset1(254), e), S::iset1(254), e);
    scale = S::from_bits(S::template shl<23>(e));
  }
  S::store(sf, scale);
  S::store(inv, S::div(S::set1(1.0f), scale));
  return true;
}

// The row quantizers' loop over the whole blocks of kGroup values of row r, a chunk of
// kChunkValues / kGroup blocks at a time, in three passes per chunk: block_amax(x) gives the amax
// bits (as Amax<S>) of the block at x, then every scale of the chunk is stored, then block_codes(x,
// kb, inv) writes the codes of block kb. Done block by block, each block's scalar chain (reduction,
// two divisions) stalled its codes; done a chunk at a time, the chains of a chunk are independent
// and overlap, and the second read of the chunk (16 KiB of bf16, 32 KiB of f32) hits L1. A last
// partial block goes through quantize_block_any. block_amax16(x, bits), when given, writes the
// amax bits of the 16 blocks from x at once (see Simd::bf16_absmax16_f32_bits); block_codes16(x,
// kb, inv, count), when given, writes the codes of the `count` (at most 16) blocks from x, or
// returns false for block_codes to write them; inv[count .. 15] hold 1 then.
inline constexpr int64_t kChunkValues = 8192;

// store_scale of the scales sf[0..n) of blocks kb0 .. kb0 + n - 1 of row r, kb0 a multiple of 4.
// Packed UE8M0 scales are written a whole word (four blocks) at a time where the row's blocks
// fill it: a byte store and its address arithmetic per block had been a fifth of the time of a
// cast in blocks of 32.
DSK_TK_INLINE void store_scales(const ScaleLayout& l, int64_t r, int64_t kb0, const float* sf,
                                int n) {
  int b = 0;
  if (l.packed) {
    int32_t* row = static_cast<int32_t*>(l.data) + r * l.row_stride;
    for (; b + 4 <= n; b += 4) {
      uint32_t word = 0;
      for (int j = 0; j < 4; ++j)
        word |= static_cast<uint32_t>(numeric::f32_to_ue8m0_exact(sf[b + j]).bits) << (8 * j);
      row[(kb0 + b) / 4 * l.col_stride] = static_cast<int32_t>(word);
    }
  }
  for (; b < n; ++b) store_scale(l, r, kb0 + b, sf[b]);
}

// No block_amax16 or block_codes16 for quantize_row_chunked.
struct NoBlockHook16 {};

// No call after each block of a fused row writer (rms_norm_blocks).
struct NoBlockDone {
  void operator()(int64_t) const {}
};

template <class S, QuantFormat kFmt, int64_t kGroup, class T, class BlockAmax, class BlockCodes,
          class BlockAmax16 = NoBlockHook16, class BlockCodes16 = NoBlockHook16>
DSK_TK_INLINE void quantize_row_chunked(const T* v, int64_t cols, const QuantOut& q, int64_t r,
                                        BlockAmax block_amax, BlockCodes block_codes,
                                        BlockAmax16 block_amax16 = {},
                                        BlockCodes16 block_codes16 = {}) {
  constexpr int kChunk = static_cast<int>(kChunkValues / kGroup);
  static_assert(kChunk % 4 == 0, "store_scales takes whole packed words");
  constexpr float kMax = kFmt == QuantFormat::e4m3 ? numeric::kE4m3Max : numeric::kE2m1Max;
  const int64_t whole = cols / kGroup;
  alignas(64) int32_t amax_bits[kChunk];
  alignas(64) float sf[kChunk];
  alignas(64) float inv[kChunk];
  for (int64_t kb0 = 0; kb0 < whole; kb0 += kChunk) {
    const int n = static_cast<int>(whole - kb0 < kChunk ? whole - kb0 : kChunk);
    int b = 0;
    if constexpr (!std::is_same_v<BlockAmax16, NoBlockHook16>)
      for (; b + 16 <= n; b += 16) block_amax16(v + (kb0 + b) * kGroup, amax_bits + b);
    for (; b < n; ++b) amax_bits[b] = block_amax(v + (kb0 + b) * kGroup);
    b = 0;
    for (; b + 16 <= n; b += 16)
      if (!scales16<S>(amax_bits + b, kMax, q.round_sf, sf + b, inv + b)) break;
    for (; b < n; ++b) {
      scale_of_bits<S>(amax_bits[b], kMax, q.round_sf, &sf[b], &inv[b]);
    }
    store_scales(q.sf, r, kb0, sf, n);
    b = 0;
    if constexpr (!std::is_same_v<BlockCodes16, NoBlockHook16>)
      for (; b < n; b += 16) {
        const int count = n - b < 16 ? n - b : 16;
        for (int i = b + count; i < b + 16; ++i) inv[i] = 1.0f;  // past the row: a valid 2^0
        if (!block_codes16(v + (kb0 + b) * kGroup, kb0 + b, inv + b, count))
          for (int i = b; i < b + count; ++i) block_codes(v + (kb0 + i) * kGroup, kb0 + i, inv[i]);
      }
    for (; b < n; ++b) block_codes(v + (kb0 + b) * kGroup, kb0 + b, inv[b]);
  }
  if (whole * kGroup < cols)
    quantize_block_any<S>(v, whole * kGroup, cols, q,
                          static_cast<uint8_t*>(q.out) + r * q.out_stride, r, whole);
}

// The e4m3 codes of kVectors vectors times 2^k (Simd::E4m3Pow2 s) to out: vector(i) gives values
// 16i .. 16i + 15. Four vectors at a time where they fill 64 codes (one narrowing for the four).
template <class S, int64_t kVectors, class Vector>
DSK_TK_INLINE void store_e4m3_pow2_vectors(e4m3* out, const typename S::E4m3Pow2& s,
                                           Vector vector) {
  for (int64_t j = 0; j < kVectors / 4; ++j)
    S::store_e4m3_pow2_x64(out + 64 * j, vector(4 * j), vector(4 * j + 1), vector(4 * j + 2),
                           vector(4 * j + 3), s);
  for (int64_t i = kVectors / 4 * 4; i < kVectors; ++i)
    S::store_e4m3_pow2(out + 16 * i, vector(i), s);
}

// The codes of a block of kGroup values at x by the f32 product x * inv, to `codes` (the block's
// first code byte): the path of scales that are not powers of two and of NaN blocks. The e4m3
// codes of a block without a NaN are those of store_e4m3_pow2 with 2^0, as in block_cast_strips:
// integer rounding where every lane of a vector is an e4m3 normal, the general conversion
// otherwise (f32 scales, 4096 x 7168 bf16 in blocks of 128, one thread: 4.6 -> 4.1 ms).
template <class S, QuantFormat kFmt, int64_t kGroup, class T>
DSK_TK_INLINE void block_codes_f32(const T* x, float inv, uint8_t* codes) {
  const auto s = S::set1(inv);
  const bool nan_block = inv != inv;
  if (kFmt == QuantFormat::e4m3 && !nan_block) {
    store_e4m3_pow2_vectors<S, kGroup / 16>(
        reinterpret_cast<e4m3*>(codes), S::e4m3_pow2(0),
        [&](int64_t i) { return S::mul(S::load(x + 16 * i), s); });
    return;
  }
  for (int64_t i = 0; i < kGroup / 16; ++i) {
    const auto y = S::load(x + 16 * i);
    const auto scaled_y = nan_block ? scaled<S>(y, s) : S::mul(y, s);
    if constexpr (kFmt == QuantFormat::e4m3)
      S::store_e4m3(reinterpret_cast<e4m3*>(codes) + 16 * i, scaled_y);
    else
      S::store_e2m1(reinterpret_cast<fp4x2*>(codes) + 8 * i, scaled_y);
  }
}

// Rows of any T in blocks of 16 * kVectors values; e4m3 codes of power-of-two inverse scales by
// integer rounding (Simd::store_e4m3_pow2: no product), the rest by block_codes_f32.
template <class S, QuantFormat kFmt, int kVectors, class T>
DSK_TK_INLINE void quantize_row_fixed(const T* v, int64_t cols, const QuantOut& q, int64_t r,
                                      const int32_t* block_amax) {
  constexpr int64_t kGroup = 16 * kVectors;
  constexpr int64_t kGroupBytes = kFmt == QuantFormat::e4m3 ? kGroup : kGroup / 2;
  uint8_t* out = static_cast<uint8_t*>(q.out) + r * q.out_stride;
  // e4m3: the constants of 16 blocks at once (Simd::e4m3_pow2_x16), as quantize_row_bf16 does.
  // SwiGLU + cast (f32 rows in blocks of 128), same process, alternated: hot (64 rows, one
  // thread) 1.04x, cold (16384 x 8192, two threads) 1.04-1.05x.
  const auto codes16 = [&] {
    if constexpr (kFmt == QuantFormat::e4m3) {
      return [&](const T* x, int64_t kb, const float* inv, int count) {
        typename S::E4m3Pow2x16 s;
        if (!S::e4m3_pow2_x16(inv, &s)) return false;
        for (int b = 0; b < count; ++b) {
          const T* xb = x + b * kGroup;
          store_e4m3_pow2_vectors<S, kVectors>(reinterpret_cast<e4m3*>(out) + (kb + b) * kGroup,
                                               S::e4m3_pow2_of(s, b),
                                               [&](int64_t i) { return S::load(xb + 16 * i); });
        }
        return true;
      };
    } else {
      return NoBlockHook16{};
    }
  }();
  quantize_row_chunked<S, kFmt, kGroup>(
      v, cols, q, r,
      [&](const T* x) {
        if (block_amax != nullptr) return block_amax[(x - v) / kGroup];
        Amax<S> amax;
        for (int i = 0; i < kVectors; ++i) amax.add(S::load(x + 16 * i));
        return S::ireduce_max(amax.bits);
      },
      [&](const T* x, int64_t kb, float inv) {
        const int k = kFmt == QuantFormat::e4m3 ? pow2_exponent(inv) : kNotPow2;
        if (k == kNotPow2) return block_codes_f32<S, kFmt, kGroup>(x, inv, out + kb * kGroupBytes);
        store_e4m3_pow2_vectors<S, kVectors>(reinterpret_cast<e4m3*>(out) + kb * kGroup,
                                             S::e4m3_pow2(k),
                                             [&](int64_t i) { return S::load(x + 16 * i); });
      },
      NoBlockHook16{}, codes16);
}

// The codes of a block of 32 * kVectors bf16 values at x with the inverse scale inv, to `codes`
// (the block's first code byte): on the bf16 bits where inv is a power of two 2^k (see
// quantize_row_bf16), else by the f32 product.
template <class S, QuantFormat kFmt, int kVectors>
DSK_TK_INLINE void block_codes_bf16(const bf16* x, float inv, uint8_t* codes) {
  constexpr bool kE4m3 = kFmt == QuantFormat::e4m3;
  // The smallest 2^k the integer path takes: e2m1 from 2^-125, below which a threshold * 2^-k
  // would not be a bf16 normal.
  constexpr int kMinPow2 = kE4m3 ? -126 : -125;
  const int k = pow2_exponent<kMinPow2>(inv);
  if (k == kNotPow2) return block_codes_f32<S, kFmt, 32 * kVectors>(x, inv, codes);
  if constexpr (kE4m3) {
    const auto s = S::e4m3_pow2(k);
    for (int i = 0; i < kVectors; ++i)
      S::store_e4m3_bf16x32_pow2(reinterpret_cast<e4m3*>(codes) + 32 * i, x + 32 * i, s);
  } else {
    const auto s = S::e2m1_pow2(k);
    for (int i = 0; i < kVectors; ++i)
      S::store_e2m1_bf16x32_pow2(reinterpret_cast<fp4x2*>(codes) + 16 * i, x + 32 * i, s);
  }
}

// quantize_row_fixed for bf16 rows in blocks of 32 * kVectors values, on 32-lane 16-bit vectors:
// the amax over the bf16 bits (no widening), and, where the inverse scale is a power of two 2^k,
// the codes on the bf16 bits: Simd::store_e4m3_bf16x32_pow2 (rebias and integer rounding) or
// Simd::store_e2m1_bf16x32_pow2 (thresholds scaled by 2^-k). The product by 2^k is exact, so
// these are the codes of the f32 path, bit for bit. Other blocks (f32 scales that are not powers
// of two, NaN blocks, k outside the e2m1 range) take the f32 path. `block_amax`, when given,
// holds the Amax bits of each whole block (of the f32 row v holds rounded to odd: norm_cast_rows).
template <class S, QuantFormat kFmt, int kVectors>
DSK_TK_INLINE void quantize_row_bf16(const bf16* v, int64_t cols, const QuantOut& q, int64_t r,
                                     const int32_t* block_amax) {
  constexpr bool kE4m3 = kFmt == QuantFormat::e4m3;
  constexpr int64_t kGroup = 32 * kVectors;
  constexpr int64_t kGroupBytes = kE4m3 ? kGroup : kGroup / 2;
  uint8_t* out = static_cast<uint8_t*>(q.out) + r * q.out_stride;
  const auto lane_max = [](const bf16* x) {
    auto amax = S::bf16_absmax_zero();
    for (int i = 0; i < kVectors; ++i) amax = S::bf16_absmax_add(amax, x + 32 * i);
    return amax;
  };
  // The exponents of 16 blocks at once (Simd::e2m1_pow2_x16, e4m3_pow2_x16) instead of
  // block_codes' scalar exponent and constants per block, hot, one thread: e2m1 in blocks of 32
  // 1.2x faster; e4m3 in blocks of 128, 32 x 7168, per_token_cast 0.070 -> 0.060 ns per value
  // and RMSNorm + cast 0.175 -> 0.159.
  const auto codes16 = [&] {
    if constexpr (kE4m3) {
      return [&](const bf16* x, int64_t kb, const float* inv, int count) {
        typename S::E4m3Pow2x16 s;
        if (!S::e4m3_pow2_x16(inv, &s)) return false;
        for (int b = 0; b < count; ++b) {
          const bf16* xb = x + b * kGroup;
          e4m3* codes = reinterpret_cast<e4m3*>(out) + (kb + b) * kGroup;
          const auto sb = S::e4m3_pow2_of(s, b);
          for (int i = 0; i < kVectors; ++i) prefetch_ahead(xb + 32 * i, kChunkValues);
          for (int i = 0; i < kVectors; ++i)
            S::store_e4m3_bf16x32_pow2(codes + 32 * i, xb + 32 * i, sb);
        }
        return true;
      };
    } else if constexpr (kVectors != 1) {
      return NoBlockHook16{};
    } else {
      return [&](const bf16* x, int64_t kb, const float* inv, int count) {
        typename S::E2m1Pow2x16 s;
        if (count % 4 != 0 || !S::e2m1_pow2_x16(inv, &s)) return false;
        for (int b = 0; b < count; b += 4) {
          for (int i = 0; i < 4; ++i) prefetch_ahead(x + (b + i) * kGroup, kChunkValues);
          S::store_e2m1_bf16x32_pow2_of_x4(reinterpret_cast<fp4x2*>(out + (kb + b) * kGroupBytes),
                                           x + b * kGroup, s, b);
        }
        return true;
      };
    }
  }();
  quantize_row_chunked<S, kFmt, kGroup>(
      v, cols, q, r,
      [&](const bf16* x) {
        if (block_amax != nullptr) return block_amax[(x - v) / kGroup];
        return S::bf16_absmax_f32_bits(lane_max(x));
      },
      [&](const bf16* x, int64_t kb, float inv) {
        // The next chunk's block: its loads overlap this chunk's conversions, which otherwise
        // leave the memory idle (1.3x on one thread for a cold 4096 x 7168 cast).
        for (int i = 0; i < kVectors; ++i) prefetch_ahead(x + 32 * i, kChunkValues);
        block_codes_bf16<S, kFmt, kVectors>(x, inv, out + kb * kGroupBytes);
      },
      [&](const bf16* x, int32_t* amax_bits) {
        if (block_amax != nullptr) {
          std::memcpy(amax_bits, block_amax + (x - v) / kGroup, 16 * sizeof(int32_t));
          return;
        }
        typename S::Bf16AbsMax m[16];
        for (int b = 0; b < 16; ++b) m[b] = lane_max(x + b * kGroup);
        S::bf16_absmax16_f32_bits(m, amax_bits);
      },
      codes16);
}

}  // namespace quant_detail

// Quantizes one row of `cols` values (any T) in blocks of `group`, as row r of the output. Blocks
// of 16, 32, 64 and 128 values go a chunk of blocks at a time (quantize_row_fixed); other sizes
// block by block. `block_amax`, when given (those four sizes), holds the Amax bits of each whole
// block, computed by the caller as it wrote the row (fused_amax_group).
template <class S, class T>
DSK_TK_INLINE void quantize_row(const T* v, int64_t cols, int64_t group, const QuantOut& q,
                                int64_t r, const int32_t* block_amax = nullptr) {
  using namespace quant_detail;
  const bool e4m3 = q.fmt == QuantFormat::e4m3;
  if constexpr (std::is_same_v<T, bf16>) {
    const int32_t* a = block_amax;
    if (e4m3 && group == 128) return quantize_row_bf16<S, QuantFormat::e4m3, 4>(v, cols, q, r, a);
    if (e4m3 && group == 64) return quantize_row_bf16<S, QuantFormat::e4m3, 2>(v, cols, q, r, a);
    if (e4m3 && group == 32) return quantize_row_bf16<S, QuantFormat::e4m3, 1>(v, cols, q, r, a);
    if (!e4m3 && group == 32) return quantize_row_bf16<S, QuantFormat::e2m1, 1>(v, cols, q, r, a);
  }
  switch (group) {
    case 16:
      return e4m3 ? quantize_row_fixed<S, QuantFormat::e4m3, 1>(v, cols, q, r, block_amax)
                  : quantize_row_fixed<S, QuantFormat::e2m1, 1>(v, cols, q, r, block_amax);
    case 32:
      return e4m3 ? quantize_row_fixed<S, QuantFormat::e4m3, 2>(v, cols, q, r, block_amax)
                  : quantize_row_fixed<S, QuantFormat::e2m1, 2>(v, cols, q, r, block_amax);
    case 64:
      return e4m3 ? quantize_row_fixed<S, QuantFormat::e4m3, 4>(v, cols, q, r, block_amax)
                  : quantize_row_fixed<S, QuantFormat::e2m1, 4>(v, cols, q, r, block_amax);
    case 128:
      return e4m3 ? quantize_row_fixed<S, QuantFormat::e4m3, 8>(v, cols, q, r, block_amax)
                  : quantize_row_fixed<S, QuantFormat::e2m1, 8>(v, cols, q, r, block_amax);
    default:
      break;
  }
  uint8_t* out = static_cast<uint8_t*>(q.out) + r * q.out_stride;
  for (int64_t start = 0, kb = 0; start < cols; start += group, ++kb)
    quantize_block_any<S>(v, start, start + group < cols ? start + group : cols, q, out, r, kb);
}

namespace quant_detail {

// Column-major scales (DeepGEMM's TMA-aligned layout) put a row's scales col_stride words apart:
// at 4096 rows, 16 KiB, so every scale of a row maps to the same L1 set, and a cast in blocks of
// 32 wrote 56 lines per row, each missing (4096 x 7168 bf16 to e2m1, two threads: 1.71 ms against
// 1.25 ms with row-major scales). for_rows_with_scale_tiles therefore hands the row quantizer
// a tile of kScaleTileRows rows in the same layout on the stack and copies each of its columns
// out whole (kScaleTileRows words, one 64-byte line).
inline constexpr int64_t kScaleTileRows = 16;
inline constexpr int64_t kMaxScaleTileCols = 512;

// quantize(q, out_row, r) for every row r in [r0, r1): it casts row r of the input into row
// out_row of q. The scales a quantizer does not write (the unused bytes of a row's last packed
// word) keep their value: that column of a tile starts as a copy of its rows' words.
template <class Quantize>
DSK_TK_INLINE void for_rows_with_scale_tiles(const QuantOut& q, int64_t cols, int64_t group,
                                             int64_t r0, int64_t r1, Quantize quantize) {
  const ScaleLayout& l = q.sf;
  const int64_t blocks = (cols + group - 1) / group;
  const int64_t words = l.packed ? (blocks + 3) / 4 : blocks;  // f32 and int32 alike: 4 bytes
  if (l.data == nullptr || l.row_stride != 1 || words > kMaxScaleTileCols) {
    for (int64_t r = r0; r < r1; ++r) quantize(q, r, r);
    return;
  }
  // Only a last packed word that the blocks do not fill has bytes the quantizer leaves alone.
  const bool partial_word = l.packed && blocks % 4 != 0;
  alignas(64) int32_t tile[kMaxScaleTileCols * kScaleTileRows];
  int32_t* scales = static_cast<int32_t*>(l.data);
  for (int64_t t0 = r0; t0 < r1; t0 += kScaleTileRows) {
    const int64_t rows = r1 - t0 < kScaleTileRows ? r1 - t0 : kScaleTileRows;
    const auto bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    if (partial_word) {
      const int64_t w = words - 1;
      std::memcpy(tile + w * kScaleTileRows, scales + w * l.col_stride + t0, bytes);
    }
    QuantOut local = q;
    local.out = static_cast<uint8_t*>(q.out) + t0 * q.out_stride;
    local.sf = {tile, l.packed, 1, kScaleTileRows};
    for (int64_t i = 0; i < rows; ++i) quantize(local, i, t0 + i);
    for (int64_t w = 0; w < words; ++w)
      std::memcpy(scales + w * l.col_stride + t0, tile + w * kScaleTileRows, bytes);
  }
}

}  // namespace quant_detail

template <tile::Isa I, class T>
void token_cast_rows(const TokenCastArgs& a, int64_t r0, int64_t r1) {
  using S = SimdOf<I>;
  quant_detail::for_rows_with_scale_tiles(
      a.q, a.cols, a.group, r0, r1, [&](const QuantOut& q, int64_t out_row, int64_t r) {
        quantize_row<S>(static_cast<const T*>(a.x) + r * a.x_stride, a.cols, a.group, q, out_row);
      });
}

namespace quant_detail {

// The block sizes whose amax a row writer can compute as it goes (quantize_row_fixed's), and the
// most blocks per row it does that for (the amax array lives on the stack).
inline constexpr int64_t kMaxFusedBlocks = 512;
inline bool fused_amax_group(int64_t group, int64_t cols) {
  return (group == 16 || group == 32 || group == 64 || group == 128) &&
         cols / group <= kMaxFusedBlocks;
}

// Fused rows kept as bf16 rounded to odd (norm_cast_rows, swiglu_cast_rows): e4m3 codes with
// UE8M0 scales, whole blocks of 32, 64 or 128. The product by a power of two is exact and bf16
// keeps more than two bits past e4m3's three, so the codes of the odd-rounded row are those of
// the f32 row; the amax is taken of the f32 values.
inline bool odd_rounded_rows(const QuantOut& q, int64_t group, int64_t cols) {
  return fused_amax_group(group, cols) && group >= 32 && cols % group == 0 &&
         q.fmt == QuantFormat::e4m3 && q.round_sf;
}

// The codes and scales of a row kept as bf16 rounded to odd (odd_rounded_rows), in blocks of
// kGroup, as the row's writer goes: block_done(kb) is called once block kb of y and
// block_amax[kb] are written. It starts block kb's scale (a scalar chain of about 70 cycles: the
// bits, the division, the ceiling, the reciprocal) and writes the codes of block kb - kLag, whose
// scale is ready by then; row_done writes the last kLag blocks. Codes that followed their own
// chain waited in the schedulers and stalled the writer's next block (RMSNorm + cast hot, 32 x
// 7168, one thread: 0.84x of the two-pass row, against 0.96-0.98x with a lag of 1-3 blocks). The
// scales go to sf, for one store_scales per row.
template <class S, int64_t kGroup>
struct OddRowCodes {
  const bf16* y;
  const int32_t* block_amax;
  uint8_t* codes;
  float* sf;
  float* inv;
  static constexpr int64_t kLag = 2;
  DSK_TK_INLINE void block_done(int64_t kb) const {
    scale_of_bits<S>(block_amax[kb], numeric::kE4m3Max, true, &sf[kb], &inv[kb]);
    if (kb >= kLag) block_codes(kb - kLag);
  }
  DSK_TK_INLINE void row_done(int64_t blocks) const {
    for (int64_t kb = blocks > kLag ? blocks - kLag : 0; kb < blocks; ++kb) block_codes(kb);
  }
  DSK_TK_INLINE void block_codes(int64_t kb) const {
    block_codes_bf16<S, QuantFormat::e4m3, static_cast<int>(kGroup / 32)>(y + kb * kGroup, inv[kb],
                                                                          codes + kb * kGroup);
  }
};

// SwiGLU of one gate and up value: silu(g) * u (clamped when kClamp, times the routing weight
// when kWeight). The clamps put the value second: S::min and S::max return their second operand
// when either is NaN (as MINPS / MAXPS do), so a NaN gate or up stays NaN, as in the reference,
// where the other order had turned it into a clamp bound.
template <class S, bool kClamp, bool kWeight>
struct SwigluValue {
  using F = typename S::F;
  F lim, neg_lim, w;
  SwigluValue(float clamp, float weight)
      : lim(S::set1(clamp)), neg_lim(S::set1(-clamp)), w(S::set1(weight)) {}
  DSK_TK_INLINE F operator()(F g, F u) const {
    if constexpr (kClamp) {
      g = S::min(lim, g);
      u = S::min(lim, S::max(neg_lim, u));
    }
    const F v = S::mul(silu<S>(g), u);
    if constexpr (kWeight)
      return S::mul(v, w);
    else
      return v;
  }
};

// One row of swiglu_cast_rows into an f32 y: y[c] = SwigluValue(g[c], u[c]) for c < cols. Eight
// vectors at a time: their exp chains are independent, and written together the core overlaps
// them (one chain is about 60 cycles of latency; four were 1.13x one hot, eight 1.02-1.06x four).
template <class S, bool kClamp, bool kWeight, class T>
DSK_TK_INLINE void swiglu_row(const T* gate, const T* up, int64_t cols, int64_t row_stride,
                              float clamp, float weight, float* y) {
  using F = typename S::F;
  const SwigluValue<S, kClamp, kWeight> value(clamp, weight);
  constexpr int kVectors = 8;
  int64_t c = 0;
  for (; c + 16 * kVectors <= cols; c += 16 * kVectors) {
    constexpr int kLineValues = 64 / sizeof(T);
#pragma GCC unroll 4
    for (int i = 0; i < 16 * kVectors; i += kLineValues) {
      prefetch_ahead(gate + c + i, row_stride);
      prefetch_ahead(up + c + i, row_stride);
    }
    F v[kVectors];
#pragma GCC unroll 8
    for (int k = 0; k < kVectors; ++k)
      v[k] = value(S::load(gate + c + 16 * k), S::load(up + c + 16 * k));
#pragma GCC unroll 8
    for (int k = 0; k < kVectors; ++k) S::store(y + c + 16 * k, v[k]);
  }
  for (; c < cols; c += 16) {
    const int n = static_cast<int>(cols - c < 16 ? cols - c : 16);
    S::store_n(y + c, value(load_part<S>(gate + c, n), load_part<S>(up + c, n)), n);
  }
}

// swiglu_row of bf16 rows in `blocks` whole blocks of kGroup values (a multiple of 32), into a
// bf16 y rounded to odd (odd_rounded_rows) with the amax bits of each block's f32 values into
// block_amax. Gate and up are loaded in pairs (Simd::load_bf16_pairs: one operation per 16 values
// where widening takes two), which the element-wise math keeps, and the pairs narrow back in
// order without permutes (Simd::store_bf16_pairs_round_odd). Against swiglu_row and the f32 codes
// pass, blocks of 128, alternated in one process: hot (64 x 2048, one thread) 1.05x.
template <class S, int64_t kGroup, bool kClamp, bool kWeight>
DSK_TK_INLINE void swiglu_blocks_odd(const bf16* gate, const bf16* up, int64_t blocks,
                                     int64_t row_stride, float clamp, float weight, bf16* y,
                                     int32_t* block_amax) {
  using F = typename S::F;
  static_assert(kGroup % 32 == 0);
  constexpr int kPairs = static_cast<int>(kGroup / 32);
  const SwigluValue<S, kClamp, kWeight> value(clamp, weight);
  for (int64_t kb = 0; kb < blocks; ++kb, gate += kGroup, up += kGroup, y += kGroup) {
#pragma GCC unroll 4
    for (int i = 0; i < kGroup; i += 32) {
      prefetch_ahead(gate + i, row_stride);
      prefetch_ahead(up + i, row_stride);
    }
    // All of the block's values first, so that their exp chains overlap (as in swiglu_row).
    F v[2 * kPairs], u[2 * kPairs];
#pragma GCC unroll 4
    for (int i = 0; i < kPairs; ++i) {
      S::load_bf16_pairs(gate + 32 * i, &v[2 * i], &v[2 * i + 1]);
      S::load_bf16_pairs(up + 32 * i, &u[2 * i], &u[2 * i + 1]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 2 * kPairs; ++i) v[i] = value(v[i], u[i]);
    Amax<S> even, odd;
#pragma GCC unroll 4
    for (int i = 0; i < kPairs; ++i) {
      even.add(v[2 * i]);
      odd.add(v[2 * i + 1]);
      S::store_bf16_pairs_round_odd(y + 32 * i, v[2 * i], v[2 * i + 1]);
    }
    block_amax[kb] = S::ireduce_max(S::imax(even.bits, odd.bits));
  }
}

// Row r of a SwiGLU op: padding() for a padding row, else row.template operator()<kClamp,
// kWeight>(gate, up, weight) with the row's clamp and routing weight.
template <class T, class Padding, class Row>
DSK_TK_INLINE void with_swiglu_row(const SwigluCastArgs& a, int64_t r, Padding padding, Row row) {
  if ((a.pos_to_expert != nullptr && a.pos_to_expert[r] < 0) ||
      (a.pos_to_token_topk != nullptr && a.pos_to_token_topk[r] < 0))
    return padding();
  const T* gate = static_cast<const T*>(a.cast.x) + r * a.cast.x_stride;
  const T* up = gate + a.cast.cols;
  if (a.weights != nullptr) {
    const float w = a.weights[a.pos_to_token_topk[r]];
    if (a.has_clamp) return row.template operator()<true, true>(gate, up, w);
    return row.template operator()<false, true>(gate, up, w);
  }
  if (a.has_clamp) return row.template operator()<true, false>(gate, up, 1.0f);
  return row.template operator()<false, false>(gate, up, 1.0f);
}

// Row r of swiglu_cast_rows's y into an f32 y_row (zeros for a padding row).
template <class S, class T>
DSK_TK_INLINE void swiglu_y_row(const SwigluCastArgs& a, int64_t r, float* y_row) {
  const int64_t cols = a.cast.cols;
  with_swiglu_row<T>(
      a, r,
      [&] {
        for (int64_t c = 0; c < cols; c += 16)
          S::store_n(y_row + c, S::zero(), static_cast<int>(cols - c < 16 ? cols - c : 16));
      },
      [&]<bool kClamp, bool kWeight>(const T* gate, const T* up, float w) {
        swiglu_row<S, kClamp, kWeight>(gate, up, cols, a.cast.x_stride, a.clamp, w, y_row);
      });
}

// Row r of swiglu_cast_rows as a bf16 y rounded to odd, in blocks of kGroup, with the blocks'
// amax bits (zeros for a padding row).
template <class S, int64_t kGroup>
DSK_TK_INLINE void swiglu_odd_row(const SwigluCastArgs& a, int64_t r, bf16* y,
                                  int32_t* block_amax) {
  const int64_t cols = a.cast.cols, blocks = cols / kGroup;
  with_swiglu_row<bf16>(
      a, r,
      [&] {
        std::memset(y, 0, static_cast<size_t>(cols) * sizeof(bf16));
        std::memset(block_amax, 0, static_cast<size_t>(blocks) * sizeof(int32_t));
      },
      [&]<bool kClamp, bool kWeight>(const bf16* gate, const bf16* up, float w) {
        swiglu_blocks_odd<S, kGroup, kClamp, kWeight>(gate, up, blocks, a.cast.x_stride, a.clamp, w,
                                                      y, block_amax);
      });
}

}  // namespace quant_detail

// `scratch` holds cols floats (one per calling thread); unused with f32_out. bf16 rows cast with
// UE8M0 e4m3 scales keep their y as bf16 rounded to odd in it (quant_detail::odd_rounded_rows).
template <tile::Isa I, class T>
void swiglu_cast_rows(const SwigluCastArgs& a, int64_t r0, int64_t r1, float* scratch) {
  using S = SimdOf<I>;
  const int64_t cols = a.cast.cols, group = a.cast.group;
  const QuantOut no_cast{};  // f32_out: nothing is quantized
  const QuantOut& cast = a.f32_out != nullptr ? no_cast : a.cast.q;
  if constexpr (std::is_same_v<T, bf16>) {
    if (a.f32_out == nullptr && quant_detail::odd_rounded_rows(cast, group, cols)) {
      alignas(64) int32_t block_amax[quant_detail::kMaxFusedBlocks];
      bf16* y = reinterpret_cast<bf16*>(scratch);
      quant_detail::for_rows_with_scale_tiles(
          cast, cols, group, r0, r1, [&](const QuantOut& q, int64_t out_row, int64_t r) {
            if (group == 32) quant_detail::swiglu_odd_row<S, 32>(a, r, y, block_amax);
            if (group == 64) quant_detail::swiglu_odd_row<S, 64>(a, r, y, block_amax);
            if (group == 128) quant_detail::swiglu_odd_row<S, 128>(a, r, y, block_amax);
            quantize_row<S>(y, cols, group, q, out_row, block_amax);
          });
      return;
    }
  }
  quant_detail::for_rows_with_scale_tiles(
      cast, cols, group, r0, r1, [&](const QuantOut& q, int64_t out_row, int64_t r) {
        float* y_row = a.f32_out != nullptr ? a.f32_out + r * cols : scratch;
        quant_detail::swiglu_y_row<S, T>(a, r, y_row);
        if (a.f32_out == nullptr) quantize_row<S>(y_row, cols, group, q, out_row);
      });
}

namespace quant_detail {

// rms_norm_row's y = (x * rstd) * w of the first `blocks` whole blocks of kGroup values of a row,
// into y, with each block's amax bits into block_amax, then on_block(kb) (norm_cast_rows writes
// the codes of odd-rounded rows there as the row goes; otherwise the quantizer reads y once
// afterwards). A function of plain pointers because in the row lambda GCC reloaded the weight, y
// and group through the closure after every vector store (an intrinsic's store may alias anything)
// and divided by the group once per block: hot, one thread, 0.22 -> 0.18 ns per value.
// With a bf16 y (kGroup a multiple of 32), y holds the values rounded to odd, two vectors at a
// time (Simd::store_bf16_pairs_round_odd of a bf16 row's pairs, else store_bf16_round_odd), and
// block_amax those of the f32 values.
// A nonzero prefetch_stride fetches the same columns of the row that far ahead into L1, so that
// the next row's first pass finds it there. With the f32 y of 28 KiB per row of 7168 every
// variant of it had made the cold cast 5-15% slower; with the bf16 y it makes it 10-20% faster
// (4096 x 7168, two threads), but costs 4-5% where the rows are in L2 (32 x 7168, one thread),
// hence only for inputs of kStreamCopyBytes or more (rmsnorm_forward_and_per_token_cast).
template <class S, int64_t kGroup, class T, class W, class Y, class OnBlock = NoBlockDone>
DSK_TK_INLINE void rms_norm_blocks(const T* row, const W* weight, float rstd, int64_t blocks, Y* y,
                                   int32_t* block_amax, int64_t prefetch_stride,
                                   OnBlock on_block = {}) {
  constexpr int kVectors = static_cast<int>(kGroup / 16);
  constexpr int kLineValues = 64 / sizeof(T);
  static_assert(std::is_same_v<Y, float> || kVectors % 2 == 0);
  const auto rs = S::set1(rstd);
  for (int64_t kb = 0; kb < blocks; ++kb, row += kGroup, weight += kGroup, y += kGroup) {
    if (prefetch_stride != 0)
      for (int i = 0; i < kGroup; i += kLineValues) prefetch_ahead(row + i, prefetch_stride);
    // Two accumulators, so that the maxima do not make one dependent chain.
    Amax<S> even, odd;
    typename S::F v[kVectors];
    if constexpr (std::is_same_v<T, bf16> && std::is_same_v<Y, bf16>) {
      // In pairs, as swiglu_blocks_odd: the row split by position, the weight alike (its f32 pairs
      // by two permutes), narrowed back in order. Same bits; hot, one thread, 1.04x.
#pragma GCC unroll 4
      for (int i = 0; i < kVectors; i += 2) {
        typename S::F w_even, w_odd;
        S::load_bf16_pairs(row + 16 * i, &v[i], &v[i + 1]);
        if constexpr (std::is_same_v<W, bf16>)
          S::load_bf16_pairs(weight + 16 * i, &w_even, &w_odd);
        else
          S::load_f32_pairs(weight + 16 * i, &w_even, &w_odd);
        v[i] = S::mul(S::mul(v[i], rs), w_even);
        v[i + 1] = S::mul(S::mul(v[i + 1], rs), w_odd);
        even.add(v[i]);
        odd.add(v[i + 1]);
        S::store_bf16_pairs_round_odd(y + 16 * i, v[i], v[i + 1]);
      }
      block_amax[kb] = S::ireduce_max(S::imax(even.bits, odd.bits));
      on_block(kb);
      continue;
    }
#pragma GCC unroll 8
    for (int i = 0; i < kVectors; ++i) {
      v[i] = S::mul(S::mul(S::load(row + 16 * i), rs), S::load(weight + 16 * i));
      (i % 2 == 0 ? even : odd).add(v[i]);
    }
    if constexpr (std::is_same_v<Y, bf16>) {
#pragma GCC unroll 4
      for (int i = 0; i < kVectors; i += 2) S::store_bf16_round_odd(y + 16 * i, v[i], v[i + 1]);
    } else {
#pragma GCC unroll 8
      for (int i = 0; i < kVectors; ++i) S::store(y + 16 * i, v[i]);
    }
    block_amax[kb] = S::ireduce_max(S::imax(even.bits, odd.bits));
    on_block(kb);
  }
}

}  // namespace quant_detail

// With power-of-two e4m3 scales and whole blocks of 32, 64 or 128 values, y is kept as bf16
// rounded to odd, which gives the same codes (numeric::f32_to_bf16_round_odd), with the amax of
// the f32 values; the codes are then those of a bf16 row (32 values per integer rounding, where
// an f32 row takes 16). 4096 x 7168 bf16 with f32 weights in blocks of 128, against the f32 y in
// the same process: 1.07-1.13x faster hot (32 rows, one thread), 1.09x cold (two threads), before
// the prefetch of rms_norm_blocks. Those codes are written block by block as the row is
// normalised (OddRowCodes), not by a second pass of quantize_row over the row: cold (two
// threads) 1.35-1.47x, the next row's prefetches then spread over all of this row's work; hot
// 0.96-0.98x (a scalar scale per block instead of 16 in vectors).
template <tile::Isa I, class T, class W>
void norm_cast_rows(const NormCastArgs& a, int64_t r0, int64_t r1, float* scratch) {
  using S = SimdOf<I>;
  const int64_t cols = a.cast.cols;
  const int64_t group = a.cast.group;
  const W* weight = static_cast<const W*>(a.weight);
  const bool fused = quant_detail::fused_amax_group(group, cols);
  const bool odd_rows = quant_detail::odd_rounded_rows(a.cast.q, group, cols);
  const int64_t x_stride = a.cast.x_stride;
  const float eps = a.eps;
  alignas(64) int32_t block_amax[quant_detail::kMaxFusedBlocks];
  alignas(64) float sf[quant_detail::kMaxFusedBlocks];
  alignas(64) float inv[quant_detail::kMaxFusedBlocks];
  quant_detail::for_rows_with_scale_tiles(
      a.cast.q, cols, group, r0, r1, [&](const QuantOut& q, int64_t out_row, int64_t r) {
        const T* row = static_cast<const T*>(a.cast.x) + r * x_stride;
        const float rstd = rms_rstd<S>(row, cols, eps);
        const int64_t blocks = fused ? cols / group : 0;
        const auto fused_blocks = [&]<int64_t kGroup>(auto* y) {
          quant_detail::rms_norm_blocks<S, kGroup>(row, weight, rstd, blocks, y, block_amax,
                                                   a.prefetch_rows ? x_stride : 0);
        };
        if (odd_rows) {
          bf16* y = reinterpret_cast<bf16*>(scratch);
          uint8_t* codes = static_cast<uint8_t*>(q.out) + out_row * q.out_stride;
          const auto odd_blocks = [&]<int64_t kGroup>() {
            const quant_detail::OddRowCodes<S, kGroup> row_codes{y, block_amax, codes, sf, inv};
            quant_detail::rms_norm_blocks<S, kGroup>(row, weight, rstd, blocks, y, block_amax,
                                                     a.prefetch_rows ? x_stride : 0,
                                                     [&](int64_t kb) { row_codes.block_done(kb); });
            row_codes.row_done(blocks);
          };
          if (group == 32) odd_blocks.template operator()<32>();
          if (group == 64) odd_blocks.template operator()<64>();
          if (group == 128) odd_blocks.template operator()<128>();
          quant_detail::store_scales(q.sf, out_row, 0, sf, static_cast<int>(blocks));
          return;
        }
        float* y = scratch;
        switch (fused ? group : 0) {
          case 16:
            fused_blocks.template operator()<16>(y);
            break;
          case 32:
            fused_blocks.template operator()<32>(y);
            break;
          case 64:
            fused_blocks.template operator()<64>(y);
            break;
          case 128:
            fused_blocks.template operator()<128>(y);
            break;
          default:
            break;
        }
        const int64_t done = blocks * group;
        if (done < cols)
          rms_norm_row<S>(row + done, weight + done, cols - done, rstd,
                          [&](int64_t i, int live, auto v) { S::store_n(y + done + i, v, live); });
        quantize_row<S>(y, cols, group, q, out_row, fused ? block_amax : nullptr);
      });
}

namespace quant_detail {

// Column strips of block_cast_rows: at most kStripCols columns (whole blocks) at a time.
inline constexpr int kStripCols = 2048;

// The amax of each block of a strip (columns [s0, s1) of rows [r_begin, r_end)), read row by row,
// into amax[b]. Blocks of f32 or of block_cols not a multiple of 32: the lane-wise amax of every
// 16 columns, four rows per visit of an accumulator (one load and store of it per four vectors).
template <class S, class T>
DSK_TK_INLINE void strip_amax(const BlockCastArgs& a, int64_t s0, int64_t s1, int64_t r_begin,
                              int64_t r_end, float* amax) {
  const int64_t per_block = a.block_cols / 16;
  Amax<S> acc[kStripCols / 16];
  const int64_t vectors = (s1 - s0 + 15) / 16;
  for (int64_t v = 0; v < vectors; ++v) acc[v] = Amax<S>{};
  const int64_t full = (s1 - s0) / 16;
  const auto row_at = [&](int64_t r) { return static_cast<const T*>(a.x) + r * a.x_stride + s0; };
  int64_t r = r_begin;
  for (; r + 4 <= r_end; r += 4) {
    const T* p0 = row_at(r);
    const T* p1 = row_at(r + 1);
    const T* p2 = row_at(r + 2);
    const T* p3 = row_at(r + 3);
    for (int64_t v = 0; v < full; ++v) {
      Amax<S> m = acc[v];
      m.add(S::load(p0 + 16 * v));
      m.add(S::load(p1 + 16 * v));
      m.add(S::load(p2 + 16 * v));
      m.add(S::load(p3 + 16 * v));
      acc[v] = m;
    }
  }
  for (; r < r_end; ++r)
    for (int64_t v = 0; v < full; ++v) acc[v].add(S::load(row_at(r) + 16 * v));
  if (full < vectors)  // the strip's last 1 to 15 columns
    for (r = r_begin; r < r_end; ++r)
      acc[full].add(S::load_n(row_at(r) + 16 * full, static_cast<int>(s1 - s0 - 16 * full)));
  const int64_t blocks = (vectors + per_block - 1) / per_block;
  for (int64_t b = 0; b < blocks; ++b) {
    Amax<S> m = acc[b * per_block];
    for (int64_t v = b * per_block + 1; v < (b + 1) * per_block && v < vectors; ++v)
      m.bits = S::imax(acc[v].bits, m.bits);
    amax[b] = m.value();
  }
}

// strip_amax for bf16 blocks whose columns are a multiple of 32, on the bf16 bits (32 lanes, no
// widening, as quantize_row_bf16): the same maxima, as max is exact and the bits order the
// magnitudes as the f32 bits do. One accumulator per block, fed the block's vectors of four rows
// per visit. Three operations per 32 values where strip_amax widens every value first.
template <class S>
DSK_TK_INLINE void strip_amax_bf16(const BlockCastArgs& a, int64_t s0, int64_t s1, int64_t r_begin,
                                   int64_t r_end, float* amax) {
  const int64_t per_block = a.block_cols / 32;
  const int64_t blocks = (s1 - s0) / a.block_cols;
  typename S::Bf16AbsMax acc[kStripCols / 32];
  for (int64_t b = 0; b < blocks; ++b) acc[b] = S::bf16_absmax_zero();
  const auto row_at = [&](int64_t r) {
    return static_cast<const bf16*>(a.x) + r * a.x_stride + s0;
  };
  int64_t r = r_begin;
  for (; r + 4 <= r_end; r += 4)
    for (int64_t b = 0; b < blocks; ++b) {
      auto m = acc[b];
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t v = b * per_block; v < (b + 1) * per_block; ++v)
          m = S::bf16_absmax_add(m, row_at(r + i) + 32 * v);
      acc[b] = m;
    }
  for (; r < r_end; ++r)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t v = b * per_block; v < (b + 1) * per_block; ++v)
        acc[b] = S::bf16_absmax_add(acc[b], row_at(r) + 32 * v);
  for (int64_t b = 0; b < blocks; ++b) amax[b] = Amax<S>::finish(S::bf16_absmax_f32_bits(acc[b]));
}

// The row block br of per_block_cast in column strips, each read row by row: the amax of the
// strip's blocks (strip_amax, strip_amax_bf16), their scales, then the codes from the strip (now
// in L2). Block by block, the rows of a block lie a row stride apart and share L1 sets, so the
// second read missed L1. Block columns must be a multiple of 16 and at most kStripCols. Max is
// exact, so the scales and codes are those of the block-by-block loop.
template <class S, class T>
DSK_TK_INLINE void block_cast_strips(const BlockCastArgs& a, int64_t br, int64_t r_begin,
                                     int64_t r_end) {
  const int64_t strip = kStripCols / a.block_cols * a.block_cols;
  const float fmt_max = format_max(a.q.fmt);
  const bool to_e4m3 = a.q.fmt == QuantFormat::e4m3;
  const auto unit_pow2 = S::e4m3_pow2(0);
  float amax[kStripCols / 16];
  float inv[kStripCols / 16];
  for (int64_t s0 = 0; s0 < a.cols; s0 += strip) {
    const int64_t s1 = s0 + strip < a.cols ? s0 + strip : a.cols;
    const int64_t blocks = (s1 - s0 + a.block_cols - 1) / a.block_cols;
    bool bf16_bits = false;
    if constexpr (std::is_same_v<T, bf16>)
      bf16_bits = a.block_cols % 32 == 0 && (s1 - s0) % a.block_cols == 0;
    if (bf16_bits)
      strip_amax_bf16<S>(a, s0, s1, r_begin, r_end, amax);
    else
      strip_amax<S, T>(a, s0, s1, r_begin, r_end, amax);
    for (int64_t b = 0; b < blocks; ++b) {
      const float sf = scale_of(amax[b], fmt_max, a.q.round_sf);
      store_scale(a.q.sf, br, s0 / a.block_cols + b, sf);
      inv[b] = quant::inverse_scale(sf);
    }
    // Block by block within the row (the block of vector v was v / per_block, an integer
    // division by a runtime value per vector).
    // The codes pass computes from L2 while the next strip (the next row block's first strip
    // after the last) is prefetched into L2, so that its amax pass does not wait on DRAM.
    const int64_t next_strip =
        s1 < a.cols ? strip : (r_end - r_begin) * a.x_stride - s0;  // elements ahead
    for (int64_t r = r_begin; r < r_end; ++r) {
      const T* row = static_cast<const T*>(a.x) + r * a.x_stride;
      uint8_t* out = static_cast<uint8_t*>(a.q.out) + r * a.q.out_stride;
      for (int64_t b = 0, c = s0; b < blocks; ++b) {
        const auto block_inv = S::set1(inv[b]);
        const int64_t c_end = c + a.block_cols < s1 ? c + a.block_cols : s1;
        // A block whose amax is a number has no NaN lane, and its inverse scale is a number: the
        // product alone is scaled()'s value, and its e4m3 code is that of store_e4m3_pow2 with
        // 2^0 (the integer rounding where the lane is an e4m3 normal, store_e4m3 elsewhere).
        if (to_e4m3 && amax[b] == amax[b]) {
          for (; c + 64 <= c_end; c += 64) {
            for (int64_t e = 0; e < 64; e += 64 / static_cast<int64_t>(sizeof(T)))  // each line
              prefetch_ahead<2>(row + c + e, next_strip);
            e4m3* codes = reinterpret_cast<e4m3*>(out) + c;
            if constexpr (std::is_same_v<T, bf16>) {
              S::store_e4m3_pow2_bf16x64_times(codes, row + c, block_inv, unit_pow2, a.q.stream);
            } else {
              const auto y = [&](int64_t i) {
                return S::mul(S::load(row + c + 16 * i), block_inv);
              };
              S::store_e4m3_pow2_x64(codes, y(0), y(1), y(2), y(3), unit_pow2);
            }
          }
          for (; c + 16 <= c_end; c += 16) {
            prefetch_ahead<2>(row + c, next_strip);
            S::store_e4m3_pow2(reinterpret_cast<e4m3*>(out) + c,
                               S::mul(S::load(row + c), block_inv), unit_pow2);
          }
        } else {
          for (; c + 16 <= c_end; c += 16) {
            prefetch_ahead<2>(row + c, next_strip);
            store_codes<S>(a.q, out, c, scaled<S>(S::load(row + c), block_inv), 16);
          }
        }
        if (c < c_end) {
          const int n = static_cast<int>(c_end - c);
          store_codes<S>(a.q, out, c, scaled<S>(S::load_n(row + c, n), block_inv), n);
          c = c_end;
        }
      }
    }
  }
}

}  // namespace quant_detail

// Rows [br0 * block_rows, ...) of whole row blocks br in [br0, br1).
template <tile::Isa I, class T>
void block_cast_rows(const BlockCastArgs& a, int64_t br0, int64_t br1) {
  using S = SimdOf<I>;
  using quant_detail::load_part;
  const float fmt_max = format_max(a.q.fmt);
  const bool strips = a.block_cols % 16 == 0 && a.block_cols <= quant_detail::kStripCols;
  for (int64_t br = br0; br < br1; ++br) {
    const int64_t r_begin = br * a.block_rows;
    const int64_t r_end = r_begin + a.block_rows < a.rows ? r_begin + a.block_rows : a.rows;
    if (strips) {
      quant_detail::block_cast_strips<S, T>(a, br, r_begin, r_end);
      continue;
    }
    for (int64_t start = 0, kb = 0; start < a.cols; start += a.block_cols, ++kb) {
      const int64_t end = start + a.block_cols < a.cols ? start + a.block_cols : a.cols;
      quant_detail::Amax<S> amax;
      for (int64_t r = r_begin; r < r_end; ++r) {
        const T* row = static_cast<const T*>(a.x) + r * a.x_stride;
        for (int64_t c = start; c < end; c += 16) {
          const int n = static_cast<int>(end - c < 16 ? end - c : 16);
          amax.add(load_part<S>(row + c, n));
        }
      }
      const float sf = quant_detail::scale_of(amax.value(), fmt_max, a.q.round_sf);
      store_scale(a.q.sf, br, kb, sf);
      const auto inv = S::set1(quant::inverse_scale(sf));
      for (int64_t r = r_begin; r < r_end; ++r) {
        const T* row = static_cast<const T*>(a.x) + r * a.x_stride;
        uint8_t* out = static_cast<uint8_t*>(a.q.out) + r * a.q.out_stride;
        for (int64_t c = start; c < end; c += 16) {
          const int n = static_cast<int>(end - c < 16 ? end - c : 16);
          quant_detail::store_codes<S>(a.q, out, c,
                                       quant_detail::scaled<S>(load_part<S>(row + c, n), inv), n);
        }
      }
    }
  }
  if (a.q.stream) S::stream_fence();
}

// per_channel_cast: blocks of block_rows rows x 1 column; row blocks [br0, br1). Uses
// BlockCastArgs with block_cols ignored.
template <tile::Isa I, class T>
void channel_cast_rows(const BlockCastArgs& a, int64_t br0, int64_t br1) {
  using S = SimdOf<I>;
  using quant_detail::load_part;
  alignas(64) float inv[16];
  for (int64_t br = br0; br < br1; ++br) {
    const int64_t r_begin = br * a.block_rows;
    const int64_t r_end = r_begin + a.block_rows < a.rows ? r_begin + a.block_rows : a.rows;
    for (int64_t c = 0; c < a.cols; c += 16) {
      const int n = static_cast<int>(a.cols - c < 16 ? a.cols - c : 16);
      auto amax = S::zero();
      Mask16 nan = 0;  // per column here: lanes are columns
      for (int64_t r = r_begin; r < r_end; ++r) {
        const auto x = load_part<S>(static_cast<const T*>(a.x) + r * a.x_stride + c, n);
        nan |= S::isnan(x);
        amax = S::max(S::abs(x), amax);
      }
      for (int j = 0; j < n; ++j) {
        const float lane_amax = (nan >> j) & 1u ? numeric::float_of(0x7FC00000u) : S::lane(amax, j);
        const float sf = quant_detail::scale_of(lane_amax, format_max(a.q.fmt), a.q.round_sf);
        store_scale(a.q.sf, br, c + j, sf);
        inv[j] = quant::inverse_scale(sf);
      }
      const auto inv_v = S::load_n(inv, n);
      for (int64_t r = r_begin; r < r_end; ++r) {
        const auto x = load_part<S>(static_cast<const T*>(a.x) + r * a.x_stride + c, n);
        uint8_t* out = static_cast<uint8_t*>(a.q.out) + r * a.q.out_stride;
        quant_detail::store_codes<S>(a.q, out, c, quant_detail::scaled<S>(x, inv_v), n);
      }
    }
  }
}

namespace quant_detail {

// One row of cast_back for a format fixed at compile time; whole vectors use unmasked stores.
template <class S, QuantFormat kFmt, class O>
DSK_TK_INLINE void cast_back_row(const CastBackArgs& a, const uint8_t* codes, O* out, int64_t r) {
  const auto decode = [&](int64_t c, int n) {
    if constexpr (kFmt == QuantFormat::e4m3)
      return S::load_e4m3_n(reinterpret_cast<const e4m3*>(codes) + c, n);
    else
      return S::load_e2m1_n(reinterpret_cast<const fp4x2*>(codes) + c / 2, n);
  };
  for (int64_t start = 0, kb = 0; start < a.cols; start += a.block_cols, ++kb) {
    const int64_t end = start + a.block_cols < a.cols ? start + a.block_cols : a.cols;
    const auto sf = S::set1(load_scale(a.sf, r / a.block_rows, kb));
    int64_t c = start;
    for (; c + 16 <= end; c += 16) S::store(out + c, S::mul(decode(c, 16), sf));
    if (c < end) {
      const int n = static_cast<int>(end - c);
      S::store_n(out + c, S::mul(decode(c, n), sf), n);
    }
  }
}

}  // namespace quant_detail

template <tile::Isa I, class O>
void cast_back_rows(const CastBackArgs& a, int64_t r0, int64_t r1) {
  using S = SimdOf<I>;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = static_cast<const uint8_t*>(a.x) + r * a.x_stride;
    O* out = static_cast<O*>(a.out) + r * a.out_stride;
    if (a.fmt == QuantFormat::e4m3)
      quant_detail::cast_back_row<S, QuantFormat::e4m3>(a, codes, out, r);
    else
      quant_detail::cast_back_row<S, QuantFormat::e2m1>(a, codes, out, r);
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels
