// Tile-layer operations on every backend this CPU runs: zero/load/store round trips with odd and
// negative strides, bf16 mma bitwise equal across backends (and to the SDM pseudocode run on
// hardware FMA), hand-made DAZ/FTZ/ordering cases, exact int8 mma for all four sign pairs.
#include <cmath>
#include <cstring>

#include <dsk/kernels/tile/types.hpp>
#include <dsk/kernels/tile/unit.hpp>

#include "common/test_util.hpp"
#include "tile/tile_test.hpp"

namespace dsk::tile_test {
namespace {

namespace tl = dsk::tile;

// ---- compile-time checks of the register types ----
using C16 = tl::TileC<0, bf16, 16, 16>;
using A16 = tl::TileA<1, bf16, 16, 32>;
using B16 = tl::TileB<2, bf16, 32, 16>;
static_assert(B16::rows == 16 && B16::cols == 32 && B16::colsb == 64);
static_assert(tl::MmaOperands<C16, A16, B16>);
static_assert(!tl::MmaOperands<C16, A16, tl::TileB<2, bf16, 30, 16>>);    // K differs
static_assert(!tl::MmaOperands<C16, tl::TileA<1, bf16, 8, 32>, B16>);     // M differs
static_assert(!tl::MmaOperands<C16, A16, tl::TileB<2, bf16, 32, 8>>);     // N differs
static_assert(!tl::MmaOperands<C16, A16, tl::TileB<1, bf16, 32, 16>>);    // A and B share tmm1
static_assert(!tl::MmaOperands<tl::TReg<0, int32_t, 16, 16>, A16, B16>);  // bf16 needs f32 C
static_assert(!tl::MmaOperands<C16, tl::TileA<1, int8_t, 16, 64>, B16>);  // mixed families
static_assert(tl::MmaOperands<tl::TileC<0, int8_t, 16, 16>, tl::TileA<1, uint8_t, 16, 64>,
                              tl::TileB<2, int8_t, 64, 16>>);
static_assert(!tl::MmaOperands<tl::TileC<0, int8_t, 16, 16>, tl::TileA<1, uint8_t, 16, 60>,
                               tl::TReg<2, int8_t, 16, 64>>);  // K differs
// (A register whose row is not whole dwords, such as 62 int8 values, cannot even be declared:
// AMX faults on it, so TReg rejects it.)

// A unit accepts only its own registers, and only well-formed products.
template <class Unit, class R>
concept CanZero = requires(Unit& unit) {
  unit.zero(R{});
};
template <class Unit, class C, class A, class B>
concept CanMma = requires(Unit& unit) {
  unit.mma(C{}, A{}, B{});
};
using B30 = tl::TileB<2, bf16, 30, 16>;
static_assert(CanZero<tl::TileUnit<tl::generic_t, C16, A16>, A16>);
static_assert(!CanZero<tl::TileUnit<tl::generic_t, C16, A16>, B16>);
static_assert(CanMma<tl::TileUnit<tl::generic_t, C16, A16, B16>, C16, A16, B16>);
static_assert(!CanMma<tl::TileUnit<tl::generic_t, C16, A16, B30>, C16, A16, B30>);

// ---- buffers ----
uint32_t bits(float x) {
  return numeric::bits_of(x);
}

// rows x row_bytes of `data` laid out with `stride` bytes per row, 0xFF between rows.
std::vector<uint8_t> strided(const void* data, int rows, int row_bytes, int64_t stride) {
  std::vector<uint8_t> out(rows * stride, 0xFF);
  for (int r = 0; r < rows; ++r)
    std::memcpy(out.data() + r * stride, static_cast<const uint8_t*>(data) + r * row_bytes,
                row_bytes);
  return out;
}

class TileOps : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { DSK_SKIP_UNLESS_BACKEND(GetParam()); }
  const Runners& backend() const { return runners_for(GetParam()); }
};

// ---- zero / load / store ----
TEST_P(TileOps, LoadStoreRoundTripsWithOddStrides) {
  for (int s = 0; s < kNumTileShapes; ++s) {
    const TileShape shape = kTileShapes[s];
    const int colsb = shape.element_bytes * shape.cols;
    const int64_t src_stride = colsb + 3, dst_stride = colsb + 5;
    const std::vector<uint8_t> src = random_bytes(shape.rows * src_stride, 10 + s);
    std::vector<uint8_t> dst(shape.rows * dst_stride + 64, 0xFF);  // poison and a guard zone
    backend().load_store(s, src.data(), src_stride, dst.data(), dst_stride);
    for (int r = 0; r < shape.rows; ++r) {
      const uint8_t* row = dst.data() + r * dst_stride;
      EXPECT_EQ(std::memcmp(row, src.data() + r * src_stride, colsb), 0) << "shape " << s;
      for (int64_t i = colsb; i < dst_stride; ++i) ASSERT_EQ(row[i], 0xFF) << "shape " << s;
    }
    for (size_t i = shape.rows * dst_stride; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xFF);
  }
}

TEST_P(TileOps, LoadStoreWithNegativeStrides) {
  for (int s = 0; s < kNumTileShapes; ++s) {
    const TileShape shape = kTileShapes[s];
    const int colsb = shape.element_bytes * shape.cols;
    const int64_t stride = colsb + 7;
    const std::vector<uint8_t> src = random_bytes(shape.rows * stride, 20 + s);
    std::vector<uint8_t> dst(shape.rows * stride, 0xFF);
    const int64_t last = (shape.rows - 1) * stride;
    backend().load_store(s, src.data() + last, -stride, dst.data() + last, -stride);
    for (int r = 0; r < shape.rows; ++r)
      EXPECT_EQ(std::memcmp(dst.data() + r * stride, src.data() + r * stride, colsb), 0);
  }
}

TEST_P(TileOps, ZeroClearsExactlyTheTile) {
  for (int s = 0; s < kNumTileShapes; ++s) {
    const TileShape shape = kTileShapes[s];
    const int colsb = shape.element_bytes * shape.cols;
    const int64_t stride = colsb + 9;
    const std::vector<uint8_t> src = random_bytes(shape.rows * stride, 30 + s);
    std::vector<uint8_t> dst(shape.rows * stride, 0xFF);
    backend().zero_store(s, src.data(), stride, dst.data(), stride);
    for (int r = 0; r < shape.rows; ++r)
      for (int64_t i = 0; i < stride; ++i)
        ASSERT_EQ(dst[r * stride + i], i < colsb ? 0x00 : 0xFF) << "shape " << s;
  }
}

// ---- bf16 mma ----
struct Bf16Problem {
  MmaShape shape;
  int64_t a_stride, b_stride, c_stride;  // bytes, none of them the packed width
  std::vector<uint8_t> a, b, c;
};

Bf16Problem random_bf16_problem(const MmaShape& shape, uint32_t seed) {
  Bf16Problem p{shape, 2 * shape.k + 6, 4 * shape.n + 10, 4 * shape.n + 12, {}, {}, {}};
  const std::vector<bf16> a = random_bf16(shape.m * shape.k, seed, true);
  const std::vector<bf16> b = random_bf16(shape.k * shape.n, seed + 1000, true);  // VNNI rows
  const std::vector<float> c = random_accumulators(shape.m * shape.n, seed + 2000);
  p.a = strided(a.data(), shape.m, 2 * shape.k, p.a_stride);
  p.b = strided(b.data(), shape.k / 2, 4 * shape.n, p.b_stride);
  p.c = strided(c.data(), shape.m, 4 * shape.n, p.c_stride);
  return p;
}

std::vector<uint8_t> run_mma_bf16(const Runners& runners, int shape, const Bf16Problem& p) {
  std::vector<uint8_t> c = p.c;
  runners.mma_bf16(shape, p.a.data(), p.a_stride, p.b.data(), p.b_stride, c.data(), p.c_stride);
  return c;
}

template <class T>
T at(const std::vector<uint8_t>& buf, int64_t offset) {
  T v;
  std::memcpy(&v, buf.data() + offset, sizeof v);
  return v;
}

float bf16_at(const std::vector<uint8_t>& buf, int64_t offset) {
  return numeric::bf16_to_f32(at<bf16>(buf, offset));
}

// |C - (C0 + sum_k A B)| against an fp64 sum: at most one f32 rounding per step (K + 1 of them)
// plus what DAZ/FTZ drop (each below 2^-120 here).
void expect_close_to_fp64(const Bf16Problem& p, const std::vector<uint8_t>& c) {
  const MmaShape s = p.shape;
  for (int m = 0; m < s.m; ++m) {
    for (int n = 0; n < s.n; ++n) {
      double exact = at<float>(p.c, m * p.c_stride + 4 * n);
      double magnitude = std::fabs(exact);
      for (int k = 0; k < s.k; ++k) {
        const double term = double{bf16_at(p.a, m * p.a_stride + 2 * k)} *
                            bf16_at(p.b, (k / 2) * p.b_stride + 4 * n + 2 * (k % 2));
        exact += term;
        magnitude += std::fabs(term);
      }
      const double got = at<float>(c, m * p.c_stride + 4 * n);
      EXPECT_LE(std::fabs(got - exact), (s.k + 1) * 0x1p-24 * magnitude + s.k * 0x1p-110)
          << "m=" << m << " n=" << n;
    }
  }
}

void expect_same_c_bits(const Bf16Problem& p, const std::vector<uint8_t>& got,
                        const std::vector<uint8_t>& want, const char* what) {
  for (int m = 0; m < p.shape.m; ++m)
    for (int n = 0; n < p.shape.n; ++n)
      ASSERT_EQ(bits(at<float>(got, m * p.c_stride + 4 * n)),
                bits(at<float>(want, m * p.c_stride + 4 * n)))
          << what << ": m=" << m << " n=" << n;
}

TEST_P(TileOps, MmaBf16IsBitwiseEqualAcrossBackendsAndCloseToFp64) {
  for (int s = 0; s < kNumBf16Shapes; ++s) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(::testing::Message() << "shape " << s << " seed " << seed);
      const Bf16Problem p = random_bf16_problem(kBf16Shapes[s], 100 * s + seed);
      const std::vector<uint8_t> got = run_mma_bf16(backend(), s, p);
      expect_same_c_bits(p, got, run_mma_bf16(generic_runners(), s, p), "vs generic");
      if (backend_supported(Backend::avx512)) {
        std::vector<uint8_t> model = p.c;
        fma_model_mma_bf16(p.shape, p.a.data(), p.a_stride, p.b.data(), p.b_stride, model.data(),
                           p.c_stride);
        expect_same_c_bits(p, got, model, "vs the contract on hardware FMA");
      }
      expect_close_to_fp64(p, got);
      for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {  // padding untouched
        if (i % p.c_stride >= 4 * p.shape.n) {
          ASSERT_EQ(got[i], 0xFF);
        }
      }
    }
  }
}

// One output element, K = 4: c + a0 b0 + a1 b1 (pair 0) + a2 b2 + a3 b3 (pair 1).
struct EdgeCase {
  const char* name;
  float c;
  float a[4];
  float b[4];
  uint32_t expected;
};

// Each case tells the contract of tile/unit.hpp apart from a rule the hardware does not follow
// (the SDM's one chain through C, one exact sum, or rounding each pair); where AMX runs, the amx
// instance checks the real instruction against them.
const EdgeCase kEdgeCases[] = {
    // One chain from C would round 1 + 2^-24 to 1 twice.
    {"C is added after the chains",
     1.0f,
     {0x1p-24f, 0, 0x1p-24f, 0},
     {1, 0, 1, 0},
     bits(1.0f + 0x1p-23f)},
    // One chain, even first: 1, 1, 0, 2^-24.
    {"even and odd products run in separate chains",
     0.0f,
     {1.0f, 0x1p-24f, -1.0f, 0x1p-24f},
     {1, 1, 1, 1},
     bits(0x1p-23f)},
    // An exact sum would give 2^-23: the even chain rounds 1 + 2^-24 to 1.
    {"each chain step is rounded",
     0.0f,
     {1.0f, -1.0f, 0x1p-24f, 0x1p-24f},
     {1, 1, 1, 1},
     bits(0x1p-24f)},
    // even + odd = 1 + 2^-24 rounds to 1 before C = 2^-24 is added (exact: 1 + 2^-23).
    {"even + odd is rounded before C", 0x1p-24f, {1.0f, 0x1p-24f, 0, 0}, {1, 1, 0, 0}, bits(1.0f)},
    {"DAZ on A", 0.0f, {0x1p-133f, 0, 0, 0}, {0x1p100f, 0, 0, 0}, 0x00000000u},
    {"DAZ on B", 0.0f, {0x1p100f, 0, 0, 0}, {0x1p-133f, 0, 0, 0}, 0x00000000u},
    {"DAZ on C", 0x1p-127f, {0x1p-126f, 0, 0, 0}, {1, 0, 0, 0}, bits(0x1p-126f)},
    {"FTZ", 0x1p-125f, {-0x1.8p-126f, 0, 0, 0}, {1, 0, 0, 0}, 0x00000000u},
    {"FTZ keeps the sign", -0x1p-125f, {0, 0, 0, 0x1.8p-126f}, {0, 0, 0, 1}, 0x80000000u},
    {"a product below 2^-126 is flushed in its chain",
     0x1p-125f,
     {0x1p-63f, 0, 0, 0},
     {0x1p-64f, 0, 0, 0},
     bits(0x1p-125f)},
    // 2^-126 - 2^-152 rounds (24 bits, unbounded exponent) to 2^-126: tininess after rounding.
    {"a chain step that rounds up to 2^-126 is not tiny",
     0.0f,
     {0x1p-63f, 0, -0x1p-76f, 0},
     {0x1p-63f, 0, 0x1p-76f, 0},
     bits(0x1p-126f)},
};

TEST_P(TileOps, MmaBf16HandMadeCases) {
  const MmaShape shape = kBf16Shapes[kBf16EdgeShape];
  ASSERT_EQ(shape.m, 1);
  ASSERT_EQ(shape.n, 1);
  ASSERT_EQ(shape.k, 4);
  for (const EdgeCase& e : kEdgeCases) {
    bf16 a[4], b[4];
    for (int i = 0; i < 4; ++i) {
      a[i] = numeric::f32_to_bf16(e.a[i]);
      b[i] = numeric::f32_to_bf16(e.b[i]);
      ASSERT_EQ(numeric::bf16_to_f32(a[i]), e.a[i]) << e.name << ": not a bf16 value";
      ASSERT_EQ(numeric::bf16_to_f32(b[i]), e.b[i]) << e.name << ": not a bf16 value";
    }
    float c = e.c;
    backend().mma_bf16(kBf16EdgeShape, a, 8, b, 4, &c, 4);  // B row k2 = (b[2k2], b[2k2+1])
    EXPECT_EQ(bits(c), e.expected) << e.name << ": got " << c;
    if (backend_supported(Backend::avx512)) {
      float model = e.c;
      fma_model_mma_bf16(shape, a, 8, b, 4, &model, 4);
      EXPECT_EQ(bits(model), e.expected)
          << e.name << ": the contract on hardware FMA gives " << model;
    }
  }
}

// ---- int8 mma ----
int32_t byte_value(uint8_t byte, bool is_signed) {
  return is_signed ? static_cast<int8_t>(byte) : byte;
}

bool signed_a(Int8Kind kind) {
  return kind == Int8Kind::s8s8 || kind == Int8Kind::s8u8;
}
bool signed_b(Int8Kind kind) {
  return kind == Int8Kind::s8s8 || kind == Int8Kind::u8s8;
}

void check_int8_mma(const Runners& runners, Int8Kind kind, int s, const std::vector<uint8_t>& a,
                    const std::vector<uint8_t>& b, const std::vector<int32_t>& c0) {
  const MmaShape shape = kInt8Shapes[s];
  const int64_t a_stride = shape.k + 5, b_stride = 4 * shape.n + 7, c_stride = 4 * shape.n + 4;
  const std::vector<uint8_t> a_buf = strided(a.data(), shape.m, shape.k, a_stride);
  const std::vector<uint8_t> b_buf = strided(b.data(), shape.k / 4, 4 * shape.n, b_stride);
  std::vector<uint8_t> c_buf = strided(c0.data(), shape.m, 4 * shape.n, c_stride);
  runners.mma_int8(s, kind, a_buf.data(), a_stride, b_buf.data(), b_stride, c_buf.data(), c_stride);
  for (int m = 0; m < shape.m; ++m) {
    for (int n = 0; n < shape.n; ++n) {
      uint32_t want = static_cast<uint32_t>(c0[m * shape.n + n]);  // int32 wrap-around
      for (int k = 0; k < shape.k; ++k)
        want += static_cast<uint32_t>(
            byte_value(a[m * shape.k + k], signed_a(kind)) *
            byte_value(b[(k / 4) * 4 * shape.n + 4 * n + k % 4], signed_b(kind)));
      ASSERT_EQ(static_cast<uint32_t>(at<int32_t>(c_buf, m * c_stride + 4 * n)), want)
          << int8_kind_name(kind) << " shape " << s << " m=" << m << " n=" << n;
    }
  }
}

TEST_P(TileOps, MmaInt8IsExactForEverySignPair) {
  for (Int8Kind kind : kInt8Kinds) {
    for (int s = 0; s < kNumInt8Shapes; ++s) {
      const MmaShape shape = kInt8Shapes[s];
      const uint32_t seed = 1000 * static_cast<uint32_t>(kind) + s;
      const std::vector<uint8_t> a = random_bytes(shape.m * shape.k, seed);
      const std::vector<uint8_t> b = random_bytes(shape.k * shape.n, seed + 1);
      const std::vector<uint8_t> c_bytes = random_bytes(4 * shape.m * shape.n, seed + 2);
      std::vector<int32_t> c0(shape.m * shape.n);
      std::memcpy(c0.data(), c_bytes.data(), c_bytes.size());
      c0[0] = INT32_MAX - 3;  // force wrap-around both ways
      c0.back() = INT32_MIN + 3;
      check_int8_mma(backend(), kind, s, a, b, c0);
    }
  }
}

TEST_P(TileOps, MmaInt8AtTheExtremes) {
  const int s = 0;  // 16 x 16 x 64
  const MmaShape shape = kInt8Shapes[s];
  for (Int8Kind kind : kInt8Kinds) {
    for (uint8_t a_fill : {uint8_t{0x80}, uint8_t{0x7F}, uint8_t{0xFF}}) {
      for (uint8_t b_fill : {uint8_t{0x80}, uint8_t{0x7F}, uint8_t{0xFF}}) {
        const std::vector<uint8_t> a(shape.m * shape.k, a_fill);
        const std::vector<uint8_t> b(shape.k * shape.n, b_fill);
        const std::vector<int32_t> c0(shape.m * shape.n, INT32_MAX - 1000);
        check_int8_mma(backend(), kind, s, a, b, c0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TileOps,
                         ::testing::Values(Backend::generic, Backend::avx512, Backend::amx),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace dsk::tile_test
