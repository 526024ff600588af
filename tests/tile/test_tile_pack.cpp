// Packing and epilogue helpers of the tile layer on every backend this CPU runs: VNNI packing of B
// from both layouts with K and N tails (bf16, s8, u8), zero-padded copies, and the f32 epilogues,
// all compared bit for bit against references written here.
#include <cstring>

#include <dsk/kernels/tile/pack.hpp>

#include "common/test_util.hpp"
#include "tile/tile_test.hpp"

namespace dsk::tile_test {
namespace {

struct PackCase {
  int k, n, k_pad, n_pad;
  int extra_ld;  // packed row stride beyond n_pad * V, left untouched
};

const PackCase kBf16PackCases[] = {{37, 23, 38, 32, 6}, {32, 16, 32, 16, 0},
                                   {5, 3, 32, 16, 2},   {100, 40, 128, 48, 0},
                                   {1, 1, 2, 1, 0},     {64, 33, 64, 48, 10}};
const PackCase kBytePackCases[] = {{70, 19, 72, 32, 4},
                                   {64, 16, 64, 16, 0},
                                   {3, 5, 64, 16, 0},
                                   {1, 1, 4, 1, 3},
                                   {130, 47, 132, 48, 0}};

template <class T>
uint32_t raw(T x) {
  uint32_t r = 0;
  std::memcpy(&r, &x, sizeof x);
  return r;
}

template <class T>
std::vector<T> random_elements(size_t n, uint32_t seed) {
  std::vector<T> out(n);
  if constexpr (sizeof(T) == 2) {
    const std::vector<bf16> v = random_bf16(n, seed, false);
    std::memcpy(out.data(), v.data(), 2 * n);
  } else {
    const std::vector<uint8_t> v = random_bytes(n, seed);
    std::memcpy(out.data(), v.data(), n);
  }
  return out;
}

// Packs with the backend and checks every element of the destination, including the untouched
// part of each row past n_pad * V.
template <class T, class Pack>
void check_pack(Pack pack, const PackCase& pc, bool nt, uint32_t seed) {
  constexpr int V = 4 / sizeof(T);
  SCOPED_TRACE(::testing::Message() << (nt ? "nt" : "nn") << " k=" << pc.k << " n=" << pc.n
                                    << " k_pad=" << pc.k_pad << " n_pad=" << pc.n_pad);
  const int64_t ldb = nt ? pc.k + 5 : pc.n + 3;
  const int b_rows = nt ? pc.n : pc.k;
  const std::vector<T> b = random_elements<T>(b_rows * ldb, seed);
  const auto b_at = [&](int kk, int nn) { return nt ? b[nn * ldb + kk] : b[kk * ldb + nn]; };

  const int64_t ld_dst = int64_t{pc.n_pad} * V + pc.extra_ld;
  const int groups = pc.k_pad / V;
  T poison;
  std::memset(&poison, 0xFF, sizeof poison);
  std::vector<T> dst(groups * ld_dst, poison);
  pack(nt, b.data(), ldb, pc.k, pc.n, dst.data(), ld_dst, pc.k_pad, pc.n_pad);

  for (int g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < ld_dst; ++i) {
      const int nn = static_cast<int>(i / V), kk = g * V + static_cast<int>(i % V);
      T want = poison;
      if (i < int64_t{pc.n_pad} * V) want = (kk < pc.k && nn < pc.n) ? b_at(kk, nn) : T{};
      ASSERT_EQ(raw(dst[g * ld_dst + i]), raw(want)) << "packed row " << g << " element " << i;
    }
  }
}

class TilePack : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { DSK_SKIP_UNLESS_BACKEND(GetParam()); }
  const Runners& backend() const { return runners_for(GetParam()); }
};

TEST_P(TilePack, Bf16IntoVnniFromBothLayoutsWithTails) {
  uint32_t seed = 1;
  for (const PackCase& pc : kBf16PackCases)
    for (bool nt : {false, true}) check_pack<bf16>(backend().pack_bf16, pc, nt, seed++);
}

TEST_P(TilePack, BytesIntoVnniFromBothLayoutsWithTails) {
  uint32_t seed = 100;
  for (const PackCase& pc : kBytePackCases) {
    for (bool nt : {false, true}) {
      check_pack<int8_t>(backend().pack_s8, pc, nt, seed++);
      check_pack<uint8_t>(backend().pack_u8, pc, nt, seed++);
    }
  }
}

// e4m3 codes widened while packed: every code (the NaNs, zeros and subnormals among them) and
// the tails must give the bytes of the exact bf16 values packed by the rule at the top of pack.hpp.
TEST_P(TilePack, E4m3WidenedIntoBf16VnniWithTails) {
  const PackCase cases[] = {{128, 64, 128, 64, 0}, {128, 37, 128, 48, 6}, {64, 16, 64, 16, 0},
                            {32, 64, 32, 64, 0},   {100, 40, 128, 48, 2}, {7, 3, 32, 16, 0},
                            {256, 17, 256, 32, 0}};
  uint32_t seed = 200;
  for (const PackCase& pc : cases) {
    SCOPED_TRACE(::testing::Message() << "k=" << pc.k << " n=" << pc.n << " k_pad=" << pc.k_pad
                                      << " n_pad=" << pc.n_pad);
    const int64_t ldb = pc.k + 3;
    std::vector<uint8_t> bytes = random_bytes(pc.n * ldb, seed++);
    for (int c = 0; c < 256 && c < static_cast<int>(bytes.size()); ++c)
      bytes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);  // every code at least once
    std::vector<e4m3> b(bytes.size());
    std::memcpy(b.data(), bytes.data(), bytes.size());
    const int64_t ld_dst = int64_t{pc.n_pad} * 2 + pc.extra_ld;
    const int groups = pc.k_pad / 2;
    std::vector<bf16> dst(groups * ld_dst, bf16{0xFFFF});
    backend().pack_e4m3_widen(b.data(), ldb, pc.k, pc.n, dst.data(), ld_dst, pc.k_pad, pc.n_pad);
    for (int g = 0; g < groups; ++g) {
      for (int64_t i = 0; i < ld_dst; ++i) {
        const int nn = static_cast<int>(i / 2), kk = g * 2 + static_cast<int>(i % 2);
        uint16_t want = 0xFFFF;
        if (i < int64_t{pc.n_pad} * 2)
          want = (kk < pc.k && nn < pc.n)
                     ? tile::convert_scalar<bf16>(b[static_cast<size_t>(nn * ldb + kk)]).bits
                     : 0;
        ASSERT_EQ(dst[static_cast<size_t>(g * ld_dst + i)].bits, want)
            << "packed row " << g << " element " << i;
      }
    }
  }
}

// ---- epilogues: a 5 x 37 block (two full 16-column chunks and a tail) in rows of 40 ----
constexpr int kRows = 5, kCols = 37, kLd = 40;

std::vector<float> block(uint32_t seed) {
  std::vector<float> v = random_floats(kRows * kLd, seed, true);
  for (int r = 0; r < kRows; ++r)  // the columns past the block are poisoned
    for (int c = kCols; c < kLd; ++c) v[r * kLd + c] = numeric::float_of(0x7FC00001u + r);
  return v;
}

// The product rounded on its own, whatever the compiler's -ffp-contract (an empty asm hides it).
float rounded(float x) {
  asm("" : "+x"(x));
  return x;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(numeric::bits_of(got[i]), numeric::bits_of(want[i])) << "element " << i;
}

TEST_P(TilePack, EpilogueScalesAndAccumulatesLikeTheWrittenFormula) {
  const std::vector<float> src = block(1), base = block(2);
  const std::vector<float> row_scale = random_floats(kRows, 3, true);
  const std::vector<float> col_scale = random_floats(kCols, 4, true);

  std::vector<float> got = base, want = base;
  backend().scale_rows(got.data(), kLd, kRows, kCols, row_scale.data());
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) want[r * kLd + c] = want[r * kLd + c] * row_scale[r];
  expect_same_bits(got, want);

  got = want = base;
  backend().scale_cols(got.data(), kLd, kRows, kCols, col_scale.data());
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) want[r * kLd + c] = want[r * kLd + c] * col_scale[c];
  expect_same_bits(got, want);

  got = want = base;
  backend().accumulate(got.data(), kLd, src.data(), kLd, kRows, kCols);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) want[r * kLd + c] = want[r * kLd + c] + src[r * kLd + c];
  expect_same_bits(got, want);

  got = want = base;
  backend().accumulate_scaled(got.data(), kLd, src.data(), kLd, kRows, kCols, row_scale.data(),
                              col_scale.data());
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const float scale = row_scale[r] * col_scale[c];
      const float product = rounded(src[r * kLd + c] * scale);
      want[r * kLd + c] = want[r * kLd + c] + product;
    }
  }
  expect_same_bits(got, want);
}

TEST_P(TilePack, EpilogueStoresBf16Rows) {
  std::vector<float> src = block(5);
  src[3] = numeric::float_of(0x7F800001u);  // a signalling NaN becomes a quiet one
  src[4] = 0x1.008p0f;                      // halfway above an even bf16: rounds down
  src[5] = 0x1.018p0f;                      // halfway above an odd bf16: rounds up
  constexpr int kLdOut = 41;
  std::vector<bf16> got(kRows * kLdOut, bf16{0xFFFF});
  backend().store_rows_bf16(src.data(), kLd, kRows, kCols, got.data(), kLdOut);
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kLdOut; ++c) {
      const uint16_t want = c < kCols ? numeric::f32_to_bf16(src[r * kLd + c]).bits : 0xFFFF;
      ASSERT_EQ(got[r * kLdOut + c].bits, want) << "r=" << r << " c=" << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TilePack,
                         ::testing::Values(Backend::generic, Backend::avx512, Backend::amx),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

TEST(TileCopyPadded, CopiesTheBlockAndZeroFillsThePadding) {
  constexpr int kSrcRows = 5, kSrcCols = 7, kLdSrc = 9, kPadRows = 8, kPadCols = 16, kLdDst = 20;
  const std::vector<bf16> src = random_bf16(kSrcRows * kLdSrc, 7, false);
  std::vector<bf16> dst(kPadRows * kLdDst, bf16{0xFFFF});
  tile::copy_padded(src.data(), kLdSrc, kSrcRows, kSrcCols, dst.data(), kLdDst, kPadRows, kPadCols);
  for (int r = 0; r < kPadRows; ++r) {
    for (int c = 0; c < kLdDst; ++c) {
      uint16_t want = 0xFFFF;
      if (c < kPadCols) want = (r < kSrcRows && c < kSrcCols) ? src[r * kLdSrc + c].bits : 0;
      ASSERT_EQ(dst[r * kLdDst + c].bits, want) << "r=" << r << " c=" << c;
    }
  }
}

}  // namespace
}  // namespace dsk::tile_test
