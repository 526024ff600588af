// Test data generators and the backend -> runners map of the tile-layer tests.
#include <random>

#include "common/test_util.hpp"
#include "tile/tile_test.hpp"

#include <dsk/kernels/tile/prefetch.hpp>

namespace dsk::tile_test {

const char* int8_kind_name(Int8Kind kind) {
  switch (kind) {
    case Int8Kind::s8s8:
      return "s8s8";
    case Int8Kind::s8u8:
      return "s8u8";
    case Int8Kind::u8s8:
      return "u8s8";
    case Int8Kind::u8u8:
      return "u8u8";
  }
  return "?";
}

const Runners& runners_for(Backend b) {
  switch (b) {
    case Backend::generic:
      return generic_runners();
    case Backend::avx512:
      return avx512_runners();
    case Backend::amx:
      return amx_runners();
  }
  return generic_runners();
}

namespace {

uint16_t random_bf16_bits(std::mt19937& rng, bool with_denormals) {
  const uint32_t r = rng();
  const uint16_t sign = (r & 1u) ? 0x8000u : 0u;
  const uint16_t mantissa = static_cast<uint16_t>((r >> 1) & 0x7Fu);
  const uint32_t pick = (r >> 8) % 100;
  if (with_denormals && pick < 6)  // exponent 0, mantissa non-zero
    return static_cast<uint16_t>(sign | (mantissa == 0 ? 1 : mantissa));
  const uint32_t exponent = pick < 20 ? 1 + (r >> 16) % 30     // 2^-126 .. 2^-97
                                      : 120 + (r >> 16) % 11;  // 2^-7 .. 2^3
  return static_cast<uint16_t>(sign | (exponent << 7) | mantissa);
}

}  // namespace

std::vector<bf16> random_bf16(size_t n, uint32_t seed, bool with_denormals) {
  std::mt19937 rng(seed);
  std::vector<bf16> out(n);
  for (bf16& x : out) x.bits = random_bf16_bits(rng, with_denormals);
  return out;
}

std::vector<float> random_accumulators(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-4.0f, 4.0f);
  std::vector<float> out(n);
  for (float& x : out) {
    const uint32_t pick = rng() % 100;
    const uint32_t sign = (rng() & 1u) << 31;
    if (pick < 8) {  // denormal
      x = numeric::float_of(sign | (1u + rng() % 0x7FFFFFu));
    } else if (pick < 20) {  // a few ulps around 2^-126
      x = numeric::float_of(sign | (0x00800000u - 8u + rng() % 16u));
    } else {
      do x = unit(rng);
      while (x == 0.0f);
    }
  }
  return out;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& x : out) x = static_cast<uint8_t>(rng());
  const uint8_t extremes[] = {0x00, 0x7F, 0x80, 0xFF};
  if (n >= 4)
    for (size_t i = 0; i < 4; ++i) out[i * (n / 4) + rng() % (n / 4)] = extremes[i];
  return out;
}

std::vector<float> random_floats(size_t n, uint32_t seed, bool with_denormals) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& x : out) {
    if (with_denormals && rng() % 16 == 0) {
      x = numeric::float_of(((rng() & 1u) << 31) | (1u + rng() % 0x7FFFFFu));
      continue;
    }
    do x = unit(rng);
    while (x == 0.0f);
  }
  return out;
}

}  // namespace dsk::tile_test

// PrefetchFeed hands out each line of its rows once, in order, and then nothing.
TEST(TilePrefetchFeed, WalksEveryLineOfTheRowsOnce) {
  alignas(64) static std::byte rows[3 * 256];
  dsk::tile::PrefetchFeed feed{.base = rows, .row_stride = 256, .row_bytes = 100, .rows = 3};
  EXPECT_EQ(feed.lines_left(), 6);  // two lines per row of 100 bytes
  feed.feed(3);
  EXPECT_EQ(feed.lines_left(), 3);
  EXPECT_EQ(feed.row, 1);
  EXPECT_EQ(feed.offset, 64);
  feed.feed(10);
  EXPECT_EQ(feed.lines_left(), 0);
  feed.feed(1);
  EXPECT_EQ(feed.row, 3);
  EXPECT_EQ(dsk::tile::PrefetchFeed{}.lines_left(), 0);
}
