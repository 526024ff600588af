// LogFMT-10 encoder and decoder (logfmt.hpp): upstream DeepEP's combine compression with its
// arithmetic order, the C library's log2f / exp2f standing in for the GPU's approximate ones.
#include "ep/logfmt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dsk::ep::detail::logfmt {
namespace {

constexpr int64_t kBlocksPerGroup = kGroupChannels / kBlockChannels;
constexpr uint16_t kMagnitudeMask = 0x7FFF;

float widen(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- Meta: per 128 channels, bf16 amax then bf16 amin of the magnitudes ----
void write_meta(std::byte* msg, int64_t group, uint16_t amax, uint16_t amin) {
  std::memcpy(msg + group * kMetaBytesPerGroup, &amax, 2);
  std::memcpy(msg + group * kMetaBytesPerGroup + 2, &amin, 2);
}

// Magnitudes compare as their bit patterns (non-negative floats order like integers), and a NaN
// pattern is above every number, so a NaN makes amax NaN and its chunk travels raw.
void group_range(const uint16_t* x, uint16_t& amax, uint16_t& amin) {
  amax = 0;
  amin = kMagnitudeMask;
  for (int64_t i = 0; i < kGroupChannels; ++i) {
    const uint16_t m = x[i] & kMagnitudeMask;
    amax = std::max(amax, m);
    amin = std::min(amin, m);
  }
}

// The levels of one group, computed from its meta alone so that encoder and decoder agree bit
// for bit.
struct Levels {
  float log_amin = 0;
  float step = 0;
  bool encodable = false;
};

Levels group_levels(const std::byte* msg, int64_t group) {
  uint16_t amax, amin;
  std::memcpy(&amax, msg + group * kMetaBytesPerGroup, 2);
  std::memcpy(&amin, msg + group * kMetaBytesPerGroup + 2, 2);
  const float log_amax = std::log2(widen(amax));
  // log2(0) = -inf: a zero in the group (or anything 2^32 below amax) clips to amax / 2^32.
  const float log_amin = std::fmax(std::log2(widen(amin)), log_amax - kMinClip);
  Levels l;
  // Upstream's condition: magnitudes below 1 and a non-empty log range (false for NaN, inf,
  // all-zero and all-equal groups).
  l.encodable = log_amax < 0 && log_amin < log_amax;
  l.log_amin = log_amin;
  l.step = l.encodable ? (log_amax - log_amin) / static_cast<float>(kMaxCode - 1) : 0.0f;
  return l;
}

bool chunk_encodable(const std::byte* msg, int64_t first_channel, int64_t channels) {
  for (int64_t g = first_channel / kGroupChannels; g < (first_channel + channels) / kGroupChannels;
       ++g)
    if (!group_levels(msg, g).encodable) return false;
  return true;
}

// ---- Blocks: 16 codes of 9 bits at bits 9j, then 16 sign bits at 144 + j ----
void pack_block(const uint32_t (&codes)[kBlockChannels], uint32_t signs, std::byte* out) {
  uint32_t words[kBlockBytes / 4] = {};
  for (int j = 0; j < kBlockChannels; ++j) {
    const int bit = kCodeBits * j, word = bit / 32, shift = bit % 32;
    words[word] |= codes[j] << shift;
    if (shift + kCodeBits > 32) words[word + 1] |= codes[j] >> (32 - shift);
  }
  words[4] |= signs << 16;
  std::memcpy(out, words, kBlockBytes);  // little-endian words, as upstream stores them
}

void unpack_block(const std::byte* in, uint32_t (&codes)[kBlockChannels], uint32_t& signs) {
  uint32_t words[kBlockBytes / 4];
  std::memcpy(words, in, kBlockBytes);
  for (int j = 0; j < kBlockChannels; ++j) {
    const int bit = kCodeBits * j, word = bit / 32, shift = bit % 32;
    const uint64_t pair =
        words[word] | (word + 1 < 5 ? static_cast<uint64_t>(words[word + 1]) << 32 : 0);
    codes[j] = static_cast<uint32_t>(pair >> shift) & kMaxCode;
  }
  signs = words[4] >> 16;
}

// ---- Encoding one group ----
// code = floor(max(log2|x| * step_inv + offset, 0)). The offset shifts the threshold between
// level L and the next, L * 2^step, from the log-domain midpoint to the linear one: it lies
// log2((1 + 2^step) / 2) above log2 L.
struct Encoder {
  float step_inv = 0;
  float offset = 0;
};

Encoder make_encoder(const Levels& l) {
  Encoder e;
  e.step_inv = 1.0f / l.step;
  const float rounding = 2.0f - std::log2((1.0f + std::exp2(l.step)) * 0.5f) * e.step_inv;
  e.offset = rounding - l.log_amin * e.step_inv;
  return e;
}

uint32_t encode_magnitude(uint16_t magnitude, const Encoder& e) {
  const float position = std::log2(widen(magnitude)) * e.step_inv + e.offset;
  // Like upstream's fmaxf(position, 0): -inf (a zero magnitude, or one below the clipped range)
  // gives code 0. The upper clamp only guards the field width (|x| <= amax lands on 511 at most).
  const float floor0 = position > 0.0f ? position : 0.0f;
  const float clamped =
      floor0 < static_cast<float>(kMaxCode) ? floor0 : static_cast<float>(kMaxCode);
  return static_cast<uint32_t>(clamped);  // truncation: rounds down, as upstream's _rd
}

std::byte* encode_group(const uint16_t* x, const Levels& l, std::byte* out) {
  const Encoder e = make_encoder(l);
  for (int64_t b = 0; b < kBlocksPerGroup; ++b, out += kBlockBytes) {
    uint32_t codes[kBlockChannels];
    uint32_t signs = 0;
    for (int j = 0; j < kBlockChannels; ++j) {
      const uint16_t bits = x[b * kBlockChannels + j];
      codes[j] = encode_magnitude(bits & kMagnitudeMask, e);
      signs |= static_cast<uint32_t>(bits >> 15) << j;
    }
    pack_block(codes, signs, out);
  }
  return out;
}

// ---- Decoding: calls sink(channel, value) for every channel in order ----
template <class Sink>
const std::byte* decode_group(const std::byte* in, const Levels& l, int64_t first, Sink& sink) {
  for (int64_t b = 0; b < kBlocksPerGroup; ++b, in += kBlockBytes) {
    uint32_t codes[kBlockChannels];
    uint32_t signs;
    unpack_block(in, codes, signs);
    for (int j = 0; j < kBlockChannels; ++j) {
      const float magnitude =
          codes[j] == 0 ? 0.0f : std::exp2(static_cast<float>(codes[j] - 1) * l.step + l.log_amin);
      sink(first + b * kBlockChannels + j, (signs >> j) & 1 ? -magnitude : magnitude);
    }
  }
  return in;
}

template <class Sink>
void visit(const std::byte* msg, int64_t hidden, Sink&& sink) {
  const int64_t chunk = chunk_channels(hidden);
  const std::byte* in = msg + static_cast<size_t>(hidden / kGroupChannels) * kMetaBytesPerGroup;
  for (int64_t c0 = 0; c0 < hidden; c0 += chunk) {
    if (!chunk_encodable(msg, c0, chunk)) {
      for (int64_t h = 0; h < chunk; ++h) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * h, 2);
        sink(c0 + h, widen(bits));
      }
      in += 2 * chunk;
      continue;
    }
    for (int64_t g = c0; g < c0 + chunk; g += kGroupChannels)
      in = decode_group(in, group_levels(msg, g / kGroupChannels), g, sink);
  }
}

}  // namespace

size_t encode(const uint16_t* row, int64_t hidden, std::byte* msg) {
  const int64_t groups = hidden / kGroupChannels;
  for (int64_t g = 0; g < groups; ++g) {
    uint16_t amax, amin;
    group_range(row + g * kGroupChannels, amax, amin);
    write_meta(msg, g, amax, amin);
  }
  // The chunk decisions read the meta back, exactly as the decoder will.
  const int64_t chunk = chunk_channels(hidden);
  std::byte* out = msg + static_cast<size_t>(groups) * kMetaBytesPerGroup;
  for (int64_t c0 = 0; c0 < hidden; c0 += chunk) {
    if (!chunk_encodable(msg, c0, chunk)) {
      std::memcpy(out, row + c0, 2 * static_cast<size_t>(chunk));
      out += 2 * chunk;
      continue;
    }
    for (int64_t g = c0; g < c0 + chunk; g += kGroupChannels)
      out = encode_group(row + g, group_levels(msg, g / kGroupChannels), out);
  }
  return static_cast<size_t>(out - msg);
}

size_t message_bytes(const std::byte* msg, int64_t hidden) {
  const int64_t chunk = chunk_channels(hidden);
  size_t bytes = static_cast<size_t>(hidden / kGroupChannels) * kMetaBytesPerGroup;
  for (int64_t c0 = 0; c0 < hidden; c0 += chunk)
    bytes += chunk_encodable(msg, c0, chunk)
                 ? static_cast<size_t>(chunk / kBlockChannels) * kBlockBytes
                 : 2 * static_cast<size_t>(chunk);
  return bytes;
}

void decode(const std::byte* msg, int64_t hidden, float* out) {
  visit(msg, hidden, [out](int64_t h, float v) { out[h] = v; });
}

void decode_accumulate(const std::byte* msg, int64_t hidden, float weight, float* acc) {
  visit(msg, hidden, [acc, weight](int64_t h, float v) { acc[h] += weight * v; });
}

}  // namespace dsk::ep::detail::logfmt
