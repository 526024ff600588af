// LogFMT-10, upstream DeepEP's compressed low-latency combine record (use_logfmt): the expert
// rank encodes each BF16 row, the owner decodes it before the weighted sum. docs/ep.md describes
// the format; this is the CPU encoder and decoder, bit for bit the layout upstream sends.
//
// Message of one H-channel row (H a multiple of 512):
//   [meta: per 128 channels, bf16 amax of |x| then bf16 amin of |x|, 4 bytes]
//   [chunks of 1024 channels (512 when H is not a multiple of 1024), in channel order]
// A chunk is encoded when every 128-channel group in it has log2(amax) < 0 and a log range
// (log2 amax - max(log2 amin, log2 amax - 32)) above zero; otherwise it is the raw BF16 bytes.
// An encoded chunk packs each 16 channels in 20 bytes: 9-bit magnitude codes at bits 9j, sign
// bits at 144 + j (little-endian). Code 0 is zero; code c > 0 is 2^(log_amin + (c-1) * step),
// step = (log_amax - log_amin) / 510, so code 1 is amin and code 511 is amax; a magnitude is
// rounded to the nearest level in the linear domain. The decoder reads which chunks are encoded
// from the meta alone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsk::ep::detail::logfmt {

inline constexpr int64_t kGroupChannels = 128;  // channels per (amax, amin) pair
inline constexpr int64_t kBlockChannels = 16;   // channels per packed block
inline constexpr size_t kBlockBytes = 20;       // 16 codes of 9 bits + 16 sign bits
inline constexpr size_t kMetaBytesPerGroup = 4;
inline constexpr int kCodeBits = 9;
inline constexpr uint32_t kMaxCode = (1u << kCodeBits) - 1;  // 511
inline constexpr float kMinClip = 32;                        // levels span at most 2^32 below amax

// Whether rows of H channels can be encoded (upstream requires a multiple of 512).
constexpr bool supports_hidden(int64_t hidden) {
  return hidden > 0 && hidden % 512 == 0;
}
// Channels per encode-or-not decision (upstream: one warp's 32 lanes x 2 or 4 int4 loads).
constexpr int64_t chunk_channels(int64_t hidden) {
  return hidden % 1024 == 0 ? 1024 : 512;
}
// Bytes a message may take: the meta plus every chunk raw (upstream's slot size).
constexpr size_t max_message_bytes(int64_t hidden) {
  return static_cast<size_t>(hidden / kGroupChannels) * kMetaBytesPerGroup +
         2 * static_cast<size_t>(hidden);
}

// Writes the message of `row` (H bf16 bit patterns) to `msg` (max_message_bytes(H) bytes of room)
// and returns the bytes it used.
size_t encode(const uint16_t* row, int64_t hidden, std::byte* msg);
// The bytes a message uses, read from its meta.
size_t message_bytes(const std::byte* msg, int64_t hidden);
// out[h] = the decoded value of channel h.
void decode(const std::byte* msg, int64_t hidden, float* out);
// acc[h] += weight * decoded value of channel h, in f32 (the owner's weighted sum).
void decode_accumulate(const std::byte* msg, int64_t hidden, float weight, float* acc);

}  // namespace dsk::ep::detail::logfmt
