// The reference quantizers against an independent scalar transcription of
// deep_gemm/utils/math.py (written here from the Python, not from dsk/kernels/quant.hpp), bit for
// bit: codes, scales, UE8M0 packing with its padding, and the FP4 inverse.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

// ---- the transcription ----

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// ceil_to_ue8m0: exp = ((bits >> 23) & 0xFF) + (mantissa != 0), clamped to [1, 254].
float py_ceil_to_ue8m0(float x) {
  const uint32_t b = bits(std::fabs(x));
  int exp = static_cast<int>((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0 ? 1 : 0);
  exp = std::min(254, std::max(1, exp));
  return from_bits(static_cast<uint32_t>(exp) << 23);
}

// x_amax.clamp(1e-4) (NaN stays NaN), / 448 or / 6, optional ceil_to_ue8m0.
float py_scale(float amax, float fmt_max, bool use_ue8m0) {
  const float clamped = std::isnan(amax) ? amax : std::max(amax, 1e-4f);
  const float sf = clamped / fmt_max;
  return use_ue8m0 ? py_ceil_to_ue8m0(sf) : sf;
}

// torch's amax: NaN propagates.
float py_amax(float amax, float x) {
  if (std::isnan(amax) || std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(amax, std::fabs(x));
}

// _quantize_to_fp4_e2m1: bucketize(|x| clamped to 6) over the midpoints (right=False), sign bit
// only for a non-zero index.
uint8_t py_fp4_code(float x) {
  const float ax = std::min(std::fabs(x), 6.0f);
  const float boundaries[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t idx = 0;
  while (idx < 7 && boundaries[idx] < ax) ++idx;
  return static_cast<uint8_t>(idx | ((x < 0 && idx != 0) ? 8 : 0));
}

float py_fp4_value(uint8_t code) {
  const float values[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = values[code & 7];
  return (code & 8) && (code & 7) ? -v : v;
}

// pack_ue8m0_to_int for one value: (bits >> 23) as uint8.
uint8_t py_ue8m0_byte(float sf) {
  return static_cast<uint8_t>(bits(sf) >> 23);
}

// ---- inputs ----

// Rows of bf16 values at very different magnitudes: ordinary rows, rows below the 1e-4 floor,
// an all-zero row and rows with huge values.
Tensor varied_rows(int64_t m, int64_t n, DType dtype) {
  Tensor x = ref::randn({m, n}, DType::f32, fresh_seed());
  float* v = x.data<float>();
  for (int64_t r = 0; r < m; ++r) {
    const float scale = r % 7 == 3   ? 1e-6f
                        : r % 7 == 5 ? 3e4f
                                     : std::ldexp(1.0f, static_cast<int>(r % 9) - 4);
    for (int64_t c = 0; c < n; ++c) v[r * n + c] = r == 1 ? 0.0f : v[r * n + c] * scale;
  }
  if (dtype == DType::f32) return x;
  Tensor out = Tensor::empty({m, n}, dtype);
  convert_f32_to_bf16(x.data<float>(), out.data<bf16>(), static_cast<size_t>(m * n));
  return out;
}

std::vector<float> as_f32(const Tensor& x) {
  Tensor c = x.contiguous();
  std::vector<float> out(static_cast<size_t>(c.numel()));
  if (c.dtype() == DType::bf16)
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(c.data<bf16>()[i]);
  else
    std::memcpy(out.data(), c.data_ptr(), out.size() * 4);
  return out;
}

void expect_same_floats(const Tensor& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  const Tensor g = got.contiguous();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(bits(g.data<float>()[i]), bits(want[i])) << what << " at flat index " << i;
}

void expect_same_bytes(const Tensor& got, const std::vector<uint8_t>& want, const char* what) {
  ASSERT_EQ(got.nbytes(), want.size()) << what;
  const Tensor g = got.contiguous();
  const auto* b = static_cast<const uint8_t*>(g.data_ptr());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(b[i], want[i]) << what << " at byte " << i;
}

// The packed UE8M0 words of [rows, blocks] scales: padded with 1.0 (byte 127) to whole words.
std::vector<uint8_t> packed_bytes(const std::vector<float>& sf, int64_t rows, int64_t blocks) {
  const int64_t words = (blocks + 3) / 4;
  std::vector<uint8_t> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < words * 4; ++j)
      out.push_back(j < blocks ? py_ue8m0_byte(sf[r * blocks + j]) : uint8_t{127});
  return out;
}

// per_token_cast_to_fp8 / _fp4 transcribed: scales [m, ceil(n / g)] and codes [m, n].
void py_per_token(const std::vector<float>& x, int64_t m, int64_t n, int g, float fmt_max,
                  bool use_ue8m0, std::vector<float>& sf, std::vector<float>& scaled) {
  const int64_t blocks = (n + g - 1) / g;
  sf.assign(static_cast<size_t>(m * blocks), 0.0f);
  scaled.assign(static_cast<size_t>(m * n), 0.0f);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;  // the zero padding
      for (int64_t c = b * g; c < std::min(n, (b + 1) * g); ++c) amax = py_amax(amax, x[r * n + c]);
      const float s = py_scale(amax, fmt_max, use_ue8m0);
      sf[r * blocks + b] = s;
      const float inv = 1.0f / s;
      for (int64_t c = b * g; c < std::min(n, (b + 1) * g); ++c)
        scaled[r * n + c] = x[r * n + c] * inv;
    }
}

// ---- the tests ----

TEST(Quant, CeilToUe8m0MatchesThePythonOnSpecialAndRandomValues) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          0.75f,
                          1.5f,
                          448.0f,
                          1e-4f,
                          1e-40f,
                          1e-45f,
                          3.4e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          0x1p-126f,
                          0x1p127f};
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
  for (int i = 0; i < 4000; ++i) v.push_back(from_bits(static_cast<uint32_t>(rng())));
  Tensor x = Tensor::from_blob(v.data(), {static_cast<int64_t>(v.size())}, DType::f32);
  std::vector<float> want;
  for (float f : v) want.push_back(py_ceil_to_ue8m0(f));
  expect_same_floats(gemm::ceil_to_ue8m0(x), want, "ceil_to_ue8m0");
  // bf16 input reads its values exactly.
  Tensor xb = randn_bf16({3, 50});
  std::vector<float> want_b;
  for (float f : as_f32(xb)) want_b.push_back(py_ceil_to_ue8m0(f));
  expect_same_floats(gemm::ceil_to_ue8m0(xb), want_b, "ceil_to_ue8m0 bf16");
  EXPECT_EQ(gemm::ceil_to_ue8m0(xb).sizes(), xb.sizes());
}

TEST(Quant, PerTokenFp8MatchesThePythonBitForBit) {
  SCOPED_TRACE(seed_note());
  for (DType dtype : {DType::bf16, DType::f32})
    for (int g : {128, 32})
      for (bool ue8m0 : {false, true})
        for (bool packed : {false, true}) {
          if (packed && !ue8m0) continue;
          const int64_t m = 19, n = 300;  // n is no multiple of g: the last block is padded
          const Tensor x = varied_rows(m, n, dtype);
          const Fp8Tensor q = gemm::per_token_cast_to_fp8(x, ue8m0, g, packed);
          std::vector<float> sf, scaled;
          py_per_token(as_f32(x), m, n, g, 448.0f, ue8m0, sf, scaled);
          std::vector<uint8_t> codes;
          for (float s : scaled) codes.push_back(f32_to_e4m3(s).bits);
          SCOPED_TRACE(
              fmt::format("dtype {} g {} ue8m0 {} packed {}", dtype_name(dtype), g, ue8m0, packed));
          EXPECT_EQ(q.data.dtype(), DType::e4m3);
          EXPECT_EQ(q.data.sizes(), (Shape{m, n}));
          expect_same_bytes(q.data, codes, "codes");
          const int64_t blocks = (n + g - 1) / g;
          if (packed) {
            EXPECT_EQ(q.sf.sizes(), (Shape{m, (blocks + 3) / 4}));
            expect_same_bytes(q.sf, packed_bytes(sf, m, blocks), "packed scales");
          } else {
            EXPECT_EQ(q.sf.sizes(), (Shape{m, blocks}));
            expect_same_floats(q.sf, sf, "scales");
          }
        }
}

TEST(Quant, AmaxFloorAndNanFollowTorch) {
  // A row of tiny values takes the 1e-4 floor; a NaN makes the block's scale NaN (2^127 after
  // ceil_to_ue8m0), as clamp and amax do in torch.
  Tensor x = Tensor::zeros({2, 4}, DType::f32);
  x.data<float>()[0] = 1e-7f;
  x.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  const Fp8Tensor plain = gemm::per_token_cast_to_fp8(x, false, 4);
  EXPECT_EQ(plain.sf.data<float>()[0], 1e-4f / 448.0f);
  EXPECT_TRUE(std::isnan(plain.sf.data<float>()[1]));
  const Fp8Tensor ue8m0 = gemm::per_token_cast_to_fp8(x, true, 4);
  EXPECT_EQ(ue8m0.sf.data<float>()[0], py_ceil_to_ue8m0(1e-4f / 448.0f));
  EXPECT_EQ(ue8m0.sf.data<float>()[1], 0x1p127f);
}

TEST(Quant, PerBlockFp8MatchesThePythonBitForBit) {
  SCOPED_TRACE(seed_note());
  for (int g : {128, 32})
    for (bool ue8m0 : {false, true}) {
      const int64_t m = 150, n = 200;  // both dimensions padded
      const Tensor x = varied_rows(m, n, DType::bf16);
      const std::vector<float> v = as_f32(x);
      const Fp8Tensor q = gemm::per_block_cast_to_fp8(x, ue8m0, g);
      const int64_t rb = (m + g - 1) / g, cb = (n + g - 1) / g;
      std::vector<float> sf(static_cast<size_t>(rb * cb));
      std::vector<uint8_t> codes(static_cast<size_t>(m * n));
      for (int64_t i = 0; i < rb; ++i)
        for (int64_t j = 0; j < cb; ++j) {
          float amax = 0.0f;
          for (int64_t r = i * g; r < std::min(m, (i + 1) * g); ++r)
            for (int64_t c = j * g; c < std::min(n, (j + 1) * g); ++c)
              amax = py_amax(amax, v[r * n + c]);
          const float s = py_scale(amax, 448.0f, ue8m0);
          sf[i * cb + j] = s;
          for (int64_t r = i * g; r < std::min(m, (i + 1) * g); ++r)
            for (int64_t c = j * g; c < std::min(n, (j + 1) * g); ++c)
              codes[r * n + c] = f32_to_e4m3(v[r * n + c] * (1.0f / s)).bits;
        }
      SCOPED_TRACE(fmt::format("g {} ue8m0 {}", g, ue8m0));
      EXPECT_EQ(q.sf.sizes(), (Shape{rb, cb}));
      expect_same_bytes(q.data, codes, "codes");
      expect_same_floats(q.sf, sf, "scales");
    }
}

TEST(Quant, PerChannelFp8MatchesThePythonBitForBit) {
  SCOPED_TRACE(seed_note());
  for (bool ue8m0 : {false, true}) {
    const int64_t m = 256, n = 70, g = 128;
    const Tensor x = varied_rows(m, n, DType::bf16);
    const std::vector<float> v = as_f32(x);
    const Fp8Tensor q = gemm::per_channel_cast_to_fp8(x, ue8m0);
    std::vector<float> sf(static_cast<size_t>(m / g * n));
    std::vector<uint8_t> codes(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m / g; ++i)
      for (int64_t c = 0; c < n; ++c) {
        float amax = 0.0f;
        for (int64_t r = i * g; r < (i + 1) * g; ++r) amax = py_amax(amax, v[r * n + c]);
        const float s = py_scale(amax, 448.0f, ue8m0);
        sf[i * n + c] = s;
        for (int64_t r = i * g; r < (i + 1) * g; ++r)
          codes[r * n + c] = f32_to_e4m3(v[r * n + c] * (1.0f / s)).bits;
      }
    EXPECT_EQ(q.sf.sizes(), (Shape{m / g, n}));
    expect_same_bytes(q.data, codes, "codes");
    expect_same_floats(q.sf, sf, "scales");
  }
}

TEST(Quant, PerTokenFp4AndCastBackMatchThePythonBitForBit) {
  SCOPED_TRACE(seed_note());
  for (int g : {32, 128})
    for (bool ue8m0 : {false, true})
      for (bool packed : {false, true}) {
        if (packed && !ue8m0) continue;
        const int64_t m = 13, n = 2 * 37;  // padded last block; 3 scales do not fill a word
        const Tensor x = varied_rows(m, n, DType::bf16);
        const Fp8Tensor q = gemm::per_token_cast_to_fp4(x, ue8m0, g, packed);
        std::vector<float> sf, scaled;
        py_per_token(as_f32(x), m, n, g, 6.0f, ue8m0, sf, scaled);
        std::vector<uint8_t> bytes;
        for (int64_t i = 0; i < m * n; i += 2)
          bytes.push_back(static_cast<uint8_t>((py_fp4_code(scaled[i]) & 0xF) |
                                               ((py_fp4_code(scaled[i + 1]) & 0xF) << 4)));
        SCOPED_TRACE(fmt::format("g {} ue8m0 {} packed {}", g, ue8m0, packed));
        EXPECT_EQ(q.data.dtype(), DType::fp4x2);
        EXPECT_EQ(q.data.sizes(), (Shape{m, n / 2}));
        expect_same_bytes(q.data, bytes, "codes");
        const int64_t blocks = (n + g - 1) / g;
        if (packed)
          expect_same_bytes(q.sf, packed_bytes(sf, m, blocks), "packed scales");
        else
          expect_same_floats(q.sf, sf, "scales");

        // cast_back_from_fp4: value * sf[:, c / g], unpacking scales as byte << 23.
        std::vector<float> back;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c) {
            const uint8_t byte = bytes[(r * n + c) / 2];
            const uint8_t code = c % 2 == 0 ? byte & 0xF : byte >> 4;
            const float s = packed
                                ? from_bits(uint32_t{py_ue8m0_byte(sf[r * blocks + c / g])} << 23)
                                : sf[r * blocks + c / g];
            back.push_back(py_fp4_value(code) * s);
          }
        expect_same_floats(gemm::cast_back_from_fp4(q.data, q.sf, g, packed), back, "cast back");
      }
}

TEST(Quant, Fp4CodesCoverEveryThresholdTie) {
  // Values exactly on a midpoint round toward zero; -0 is never produced.
  const float probes[] = {0.0f, -0.0f, 0.25f, 0.2500001f, 0.75f, 1.25f, 1.75f, 2.5f,
                          3.5f, 5.0f,  5.01f, 6.0f,       -0.1f, -0.3f, -5.0f, -6.0f};
  const int64_t n = 2 * ((static_cast<int64_t>(std::size(probes)) + 1) / 2);
  Tensor x = Tensor::zeros({1, n}, DType::f32);
  for (size_t i = 0; i < std::size(probes); ++i) x.data<float>()[i] = probes[i];
  x.data<float>()[0] = 6.0f;  // make the block maximum 6, so the scale is exactly 1
  const Fp8Tensor q = gemm::per_token_cast_to_fp4(x, false, static_cast<int>(n));
  ASSERT_EQ(q.sf.data<float>()[0], 1.0f);
  const auto* b = static_cast<const uint8_t*>(q.data.data_ptr());
  for (int64_t i = 1; i < static_cast<int64_t>(std::size(probes)); ++i) {
    const uint8_t code = i % 2 == 0 ? b[i / 2] & 0xF : b[i / 2] >> 4;
    EXPECT_EQ(code, py_fp4_code(probes[i])) << probes[i];
  }
}

TEST(Quant, PackAndUnpackUe8m0MatchThePython) {
  SCOPED_TRACE(seed_note());
  const Tensor sf = gemm::ceil_to_ue8m0(randn_f32({3, 5, 8}, 50.0f));
  const Tensor packed = gemm::pack_ue8m0_to_int(sf);
  EXPECT_EQ(packed.dtype(), DType::i32);
  EXPECT_EQ(packed.sizes(), (Shape{3, 5, 2}));
  std::vector<uint8_t> want;
  for (float f : as_f32(sf)) want.push_back(py_ue8m0_byte(f));
  expect_same_bytes(packed, want, "packed");
  expect_same_floats(gemm::unpack_ue8m0_from_int(packed), as_f32(sf), "round trip");
  // Strided input packs its values, not its memory order.
  const Tensor t = sf.transpose(0, 1);
  std::vector<uint8_t> want_t;
  for (float f : as_f32(t)) want_t.push_back(py_ue8m0_byte(f));
  expect_same_bytes(gemm::pack_ue8m0_to_int(t), want_t, "strided");
  // Upstream's unpack reads byte 0 as 0.0 and byte 255 as inf (byte << 23).
  Tensor edge = Tensor::zeros({1}, DType::i32);
  edge.data<int32_t>()[0] = static_cast<int32_t>(0xFF00u | 0x7Fu);
  const Tensor u = gemm::unpack_ue8m0_from_int(edge);
  EXPECT_EQ(u.data<float>()[0], 1.0f);
  EXPECT_EQ(u.data<float>()[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(u.data<float>()[2], 0.0f);
}

TEST(Quant, BadInputsNameTheArgument) {
  auto expect_error = [](auto&& call, const char* fn, const char* arg) {
    try {
      call();
      ADD_FAILURE() << fn << " accepted a bad " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.function(), fn) << e.what();
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
  };
  const Tensor x = randn_bf16({4, 6});
  expect_error([&] { gemm::per_token_cast_to_fp8(x.view({24}), false); }, "per_token_cast_to_fp8",
               "x");
  expect_error(
      [&] {
        gemm::per_token_cast_to_fp8(Tensor::zeros({2, 2}, DType::i32), false);
      },
      "per_token_cast_to_fp8", "x");
  expect_error([&] { gemm::per_token_cast_to_fp8(x, false, 0); }, "per_token_cast_to_fp8",
               "gran_k");
  expect_error([&] { gemm::per_token_cast_to_fp8(x, false, 128, true); }, "per_token_cast_to_fp8",
               "use_packed_ue8m0");
  expect_error([&] { gemm::per_channel_cast_to_fp8(x, false, 3); }, "per_channel_cast_to_fp8", "x");
  expect_error(
      [&] {
        gemm::per_token_cast_to_fp4(randn_bf16({2, 5}), true);
      },
      "per_token_cast_to_fp4", "x");
  const Fp8Tensor q = gemm::per_token_cast_to_fp4(x, true, 32);
  expect_error([&] { gemm::cast_back_from_fp4(q.data, q.sf, 32, true); }, "cast_back_from_fp4",
               "sf");
  expect_error([&] { gemm::pack_ue8m0_to_int(Tensor::zeros({3}, DType::f32)); },
               "pack_ue8m0_to_int", "sf");
  Tensor not_pow2 = Tensor::zeros({4}, DType::f32);
  not_pow2.data<float>()[2] = 3.0f;
  expect_error([&] { gemm::pack_ue8m0_to_int(not_pow2); }, "pack_ue8m0_to_int", "sf");
  expect_error([&] { gemm::unpack_ue8m0_from_int(Tensor::zeros({3}, DType::f32)); },
               "unpack_ue8m0_from_int", "packed");
}

}  // namespace
}  // namespace dsk::gemm_test
