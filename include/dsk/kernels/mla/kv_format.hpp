// The byte formats of the DeepSeek-V3.2 caches, written once for FlashMLA's kernels (dsk::mla),
// the indexer (dsk::gemm's paged MQA logits) and the model's paged cache (spec/attention.md §2,
// §5.3):
//
//   MLA token, 656 bytes ("V32_FP8Sparse"):
//     [0, 512)    512 e4m3: the latent c[0:512], tile t = dims [128t, 128t + 128) divided by
//                 scale[t] (round to nearest even, saturating)
//     [512, 528)  4 f32: scale[t] = 2^ceil(log2(max(amax_t / 448, 1e-4)))
//     [528, 656)  64 bf16: the RoPE part k_pe[0:64], never quantized
//   Tokens lie back to back in a page block of page_block_size tokens; the sparse-decode index
//   of token `offset` of physical block `block` is the global slot block * page_block_size +
//   offset, and -1 marks an invalid entry.
//
//   Indexer token, 132 bytes: 128 e4m3 codes and one f32 scale, stored per block of block_kv
//   tokens as all the codes first (token t at t * 128), then all the scales (token t at
//   block_kv * 128 + 4 t): DeepGEMM's paged layout.
//
// Header-only and dependency-free: JIT-compiled kernels include it.
#pragma once

#include <cstdint>
#include <cstring>

#include <dsk/kernels/numeric.hpp>

namespace dsk::kernels::mla {
inline namespace DSK_TILE_ABI {

// ---- the MLA token ----
inline constexpr int64_t kLatentDim = 512;                // c: the quantized part, also V (d_v)
inline constexpr int64_t kRopeDim = 64;                   // k_pe: bf16
inline constexpr int64_t kQkDim = kLatentDim + kRopeDim;  // 576: the key d_qk
inline constexpr int64_t kScaleTile = 128;                // latent dims per scale
inline constexpr int64_t kNumScales = kLatentDim / kScaleTile;
inline constexpr int64_t kScaleOffset = kLatentDim;                    // bytes
inline constexpr int64_t kRopeOffset = kScaleOffset + 4 * kNumScales;  // 528
inline constexpr int64_t kTokenBytes = kRopeOffset + 2 * kRopeDim;     // 656
static_assert(kTokenBytes == 656, "the V3.2 FP8 sparse token is 656 bytes");

// The smallest scale a tile may have: the floor of amax / 448 (HEAD tests/quant.py).
inline constexpr float kMinScaleBeforeRounding = 1e-4f;

// The scale of a latent tile whose largest |x| is amax: 2^ceil(log2(max(amax / 448, 1e-4))).
constexpr float tile_scale(float amax) {
  const float s = amax / numeric::kE4m3Max;
  return numeric::ceil_to_ue8m0(s > kMinScaleBeforeRounding ? s : kMinScaleBeforeRounding);
}

// The global slot of token `offset` in physical block `block`.
constexpr int64_t global_slot(int64_t block, int64_t offset, int64_t page_block_size) {
  return block * page_block_size + offset;
}

// Writes one token: latent f32 [512], rope bf16 [64], to 656 bytes at dst. A tile holding a NaN
// gets the floor scale (a NaN amax fails the `> 1e-4` test), so the NaN keeps its NaN code and the
// tile's other values saturate; an inf amax gives the largest scale (ceil_to_ue8m0 clamps to
// 2^127). Upstream's torch.clamp would give a NaN scale instead (open: see docs/mla.md).
inline void quantize_token(const float* latent, const bf16* rope, uint8_t* dst) {
  for (int64_t t = 0; t < kNumScales; ++t) {
    float amax = 0.0f;
    for (int64_t d = 0; d < kScaleTile; ++d) {
      const float a =
          latent[t * kScaleTile + d] < 0 ? -latent[t * kScaleTile + d] : latent[t * kScaleTile + d];
      amax = a > amax || a != a ? a : amax;
    }
    const float scale = tile_scale(amax);
    for (int64_t d = 0; d < kScaleTile; ++d)
      dst[t * kScaleTile + d] = numeric::f32_to_e4m3(latent[t * kScaleTile + d] / scale).bits;
    std::memcpy(dst + kScaleOffset + 4 * t, &scale, 4);
  }
  std::memcpy(dst + kRopeOffset, rope, 2 * kRopeDim);
}

// The scale of latent tile t of a token.
inline float token_scale(const uint8_t* token, int64_t t) {
  float s;
  std::memcpy(&s, token + kScaleOffset + 4 * t, 4);
  return s;
}

// One token as the 576 bf16 the attention kernels multiply: latent e4m3 value times its scale
// rounded to bf16 first, the product rounded to bf16 once (FlashMLA's SM90 dequantization; exact
// for the power-of-two scales quantize_token writes), then the RoPE part as stored.
inline void dequantize_token_bf16(const uint8_t* token, bf16* dst) {
  for (int64_t t = 0; t < kNumScales; ++t) {
    const float scale = numeric::round_to_bf16(token_scale(token, t));
    for (int64_t d = t * kScaleTile; d < (t + 1) * kScaleTile; ++d)
      dst[d] = numeric::f32_to_bf16(numeric::e4m3_to_f32(e4m3{token[d]}) * scale);
  }
  std::memcpy(dst + kLatentDim, token + kRopeOffset, 2 * kRopeDim);
}

// ---- the indexer token ----
inline constexpr int64_t kIndexerDim = 128;
inline constexpr int64_t kIndexerTokenBytes = kIndexerDim + 4;  // 132

// Byte offsets of token t's codes and scale inside a block of block_kv indexer tokens of d codes
// each (V3.2: d = 128; dsk::gemm's paged MQA logits also takes 32 and 64).
constexpr int64_t indexer_codes_offset(int64_t t, int64_t d = kIndexerDim) {
  return t * d;
}
constexpr int64_t indexer_scale_offset(int64_t t, int64_t block_kv, int64_t d = kIndexerDim) {
  return block_kv * d + 4 * t;
}
constexpr int64_t indexer_block_bytes(int64_t block_kv, int64_t d = kIndexerDim) {
  return block_kv * (d + 4);
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::kernels::mla
