// The scale-factor layout tools against straightforward loops: exact equality of every value, the
// strides upstream's kernels expect, zeroed padding, and the settings of the contiguous layout.
#include <cstring>

#include "gemm/gemm_test_util.hpp"

namespace dsk::gemm_test {
namespace {

int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

// Element (g, r, c) of a 2-D or 3-D tensor (any strides) as raw 4 or 2 bytes.
uint32_t raw(const Tensor& t, int64_t g, int64_t r, int64_t c) {
  const int64_t offset = (t.dim() == 3 ? g * t.stride(0) : 0) + r * t.stride(-2) + c * t.stride(-1);
  uint32_t v = 0;
  std::memcpy(&v, static_cast<const char*>(t.data_ptr()) + offset * t.element_size(),
              t.element_size());
  return v;
}

// Powers of two from 2^-20 to 2^20 (UE8M0 values).
Tensor random_ue8m0(const Shape& shape) {
  Tensor t = ref::randint(shape, DType::i32, fresh_seed(), 107, 148);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(static_cast<uint32_t>(t.data<int32_t>()[i]) << 23);
  return t.reinterpret(DType::f32);
}

void expect_mn_major_tma(const Tensor& t, int64_t mn, int64_t cols) {
  const int64_t ld = gemm::get_tma_aligned_size(mn, 4);
  EXPECT_EQ(t.stride(-2), 1);
  EXPECT_EQ(t.stride(-1), ld);
  if (t.dim() == 3) {
    EXPECT_EQ(t.stride(0), ld * cols);
  }
}

TEST(Layout, TmaAlignedSize) {
  for (int64_t es : {1, 2, 4, 8, 16})
    for (int64_t x = 0; x < 70; ++x)
      EXPECT_EQ(gemm::get_tma_aligned_size(x, es), align_up(x, 16 / es)) << x << " " << es;
  EXPECT_THROW(gemm::get_tma_aligned_size(5, 3), Error);
  EXPECT_THROW(gemm::get_tma_aligned_size(-1, 4), Error);
}

TEST(Layout, MnMajorTmaAlignedTensorKeepsEveryValue) {
  SCOPED_TRACE(seed_note());
  for (int64_t groups : {0, 1, 3})  // 0: a 2-D tensor
    for (int64_t mn : {1, 5, 8, 13})
      for (int64_t cols : {1, 3, 56}) {
        Shape shape = {mn, cols};
        if (groups > 0) shape.insert(shape.begin(), groups);
        const Tensor sf = randn_f32(shape);
        const Tensor out = gemm::get_mn_major_tma_aligned_tensor(sf);
        SCOPED_TRACE(fmt::format("groups {} mn {} cols {}", groups, mn, cols));
        ASSERT_EQ(out.sizes(), sf.sizes());
        expect_mn_major_tma(out, mn, cols);
        for (int64_t g = 0; g < std::max<int64_t>(groups, 1); ++g)
          for (int64_t r = 0; r < mn; ++r)
            for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(raw(out, g, r, c), raw(sf, g, r, c));
        // Already in the layout: returned as is.
        const Tensor again = gemm::get_mn_major_tma_aligned_tensor(out);
        EXPECT_EQ(again.data_ptr(), out.data_ptr());
      }
  // int32 words move the same way.
  const Tensor words = ref::randint({6, 3}, DType::i32, fresh_seed(), -1000, 1000);
  const Tensor moved = gemm::get_mn_major_tma_aligned_tensor(words);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(raw(moved, 0, r, c), raw(words, 0, r, c));
}

TEST(Layout, PackedUe8m0TensorMatchesALoop) {
  SCOPED_TRACE(seed_note());
  for (int64_t groups : {0, 2})
    for (int64_t mn : {1, 6, 9})
      for (int64_t sf_k : {1, 4, 7, 57}) {
        Shape shape = {mn, sf_k};
        if (groups > 0) shape.insert(shape.begin(), groups);
        // Any input strides: use an MN-major view half the time.
        Tensor sf = random_ue8m0(shape);
        if (sf_k % 2) sf = gemm::get_mn_major_tma_aligned_tensor(sf);
        const Tensor out = gemm::get_mn_major_tma_aligned_packed_ue8m0_tensor(sf);
        const int64_t words = (sf_k + 3) / 4;
        SCOPED_TRACE(fmt::format("groups {} mn {} sf_k {}", groups, mn, sf_k));
        Shape want_shape = {mn, words};
        if (groups > 0) want_shape.insert(want_shape.begin(), groups);
        ASSERT_EQ(out.sizes(), want_shape);
        ASSERT_EQ(out.dtype(), DType::i32);
        expect_mn_major_tma(out, mn, words);
        for (int64_t g = 0; g < std::max<int64_t>(groups, 1); ++g)
          for (int64_t r = 0; r < mn; ++r)
            for (int64_t q = 0; q < words; ++q) {
              uint32_t want = 0;
              for (int64_t j = 0; j < 4 && 4 * q + j < sf_k; ++j)
                want |= (raw(sf, g, r, 4 * q + j) >> 23) << (8 * j);  // padding bytes stay 0
              ASSERT_EQ(raw(out, g, r, q), want) << g << " " << r << " " << q;
            }
      }
  Tensor bad = random_ue8m0({2, 4});
  bad.data<float>()[3] = 0.7f;
  EXPECT_THROW(gemm::get_mn_major_tma_aligned_packed_ue8m0_tensor(bad), Error);
}

TEST(Layout, TransformFp32Scales) {
  SCOPED_TRACE(seed_note());
  const int64_t m = 9, n = 300, k = 700;
  // Per-token A scales (1, 128): the MN-major, TMA-aligned copy.
  const Tensor sfa = randn_f32({m, 6});
  const Tensor a_out = gemm::transform_sf_into_required_layout(sfa, m, k, Recipe{1, 128, 128},
                                                               std::nullopt, std::nullopt, true);
  expect_mn_major_tma(a_out, m, 6);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(raw(a_out, 0, r, c), raw(sfa, 0, r, c));
  // Per-block B scales (128, 128): kept as given.
  const Tensor sfb = randn_f32({3, 6});
  const Tensor b_out = gemm::transform_sf_into_required_layout(sfb, n, k, Recipe{1, 128, 128},
                                                               std::nullopt, std::nullopt, false);
  EXPECT_EQ(b_out.data_ptr(), sfb.data_ptr());
  // The (gran_mn, gran_k) form with groups.
  const Tensor grouped = randn_f32({2, m, 22});
  const Tensor g_out =
      gemm::transform_sf_into_required_layout(grouped, m, k, std::nullopt, OperandRecipe{1, 32}, 2);
  expect_mn_major_tma(g_out, m, 22);
  EXPECT_EQ(raw(g_out, 1, 4, 21), raw(grouped, 1, 4, 21));
}

TEST(Layout, TransformPackedInt32Scales) {
  SCOPED_TRACE(seed_note());
  const int64_t mn = 10, k = 1000;  // 8 blocks of 128: 2 words per row
  const Tensor packed = gemm::pack_ue8m0_to_int(random_ue8m0({mn, 8}));
  const Tensor out =
      gemm::transform_sf_into_required_layout(packed, mn, k, std::nullopt, OperandRecipe{1, 128});
  expect_mn_major_tma(out, mn, 2);
  for (int64_t r = 0; r < mn; ++r)
    for (int64_t q = 0; q < 2; ++q) EXPECT_EQ(raw(out, 0, r, q), raw(packed, 0, r, q));
  EXPECT_THROW(
      gemm::transform_sf_into_required_layout(packed, mn, k, std::nullopt, OperandRecipe{128, 128}),
      Error);  // packed int32 scales are per row (gran_mn 1), as upstream
}

TEST(Layout, TransformAscendInt16ScalesRepeatsRows) {
  SCOPED_TRACE(seed_note());
  const int64_t mn = 300, k = 200;  // ceil(200 / 32) = 7 scales: 4 int16 words per row
  for (int gran_mn : {1, 128}) {
    const int64_t rows = (mn + gran_mn - 1) / gran_mn;
    const Tensor sf = ref::randint({2, rows, 4}, DType::i16, fresh_seed(), -32768, 32768);
    const Tensor out = gemm::transform_sf_into_required_layout(sf, mn, k, std::nullopt,
                                                               OperandRecipe{gran_mn, 32}, 2);
    ASSERT_EQ(out.sizes(), (Shape{2, mn, 4}));
    EXPECT_EQ(out.stride(1), 1);
    EXPECT_EQ(out.stride(2), mn);
    EXPECT_EQ(out.stride(0), mn * 4);
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t r = 0; r < mn; ++r)
        for (int64_t c = 0; c < 4; ++c)
          ASSERT_EQ(raw(out, g, r, c), raw(sf, g, r / gran_mn, c)) << gran_mn;
    // The required layout is accepted again and kept.
    const Tensor again = gemm::transform_sf_into_required_layout(out, mn, k, std::nullopt,
                                                                 OperandRecipe{gran_mn, 32}, 2);
    for (int64_t r = 0; r < mn; ++r) EXPECT_EQ(raw(again, 1, r, 3), raw(out, 1, r, 3));
  }
}

TEST(Layout, TransformRejectsBadRecipesAndShapes) {
  const Tensor sf = randn_f32({4, 2});
  auto arg_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.function(), "transform_sf_into_required_layout") << e.what();
      return e.argument();
    }
    return "(no error)";
  };
  EXPECT_EQ(arg_of([&] { gemm::transform_sf_into_required_layout(sf, 4, 256); }), "recipe");
  EXPECT_EQ(arg_of([&] {
              gemm::transform_sf_into_required_layout(sf, 4, 256, Recipe{1, 128, 128});
            }),
            "is_sfa");
  EXPECT_EQ(
      arg_of([&] {
        gemm::transform_sf_into_required_layout(sf, 4, 256, std::nullopt, OperandRecipe{1, 64});
      }),
      "recipe_ab");
  EXPECT_EQ(
      arg_of([&] {
        gemm::transform_sf_into_required_layout(sf, 5, 256, std::nullopt, OperandRecipe{1, 128});
      }),
      "sf");
  EXPECT_EQ(
      arg_of([&] {
        gemm::transform_sf_into_required_layout(sf, 4, 256, std::nullopt, OperandRecipe{1, 128}, 2);
      }),
      "sf");
}

TEST(Settings, MkAlignmentIsStoredAndChecked) {
  const int before = gemm::get_mk_alignment_for_contiguous_layout();
  EXPECT_GT(before, 0);
  EXPECT_EQ(before % 16, 0);
  {
    ScopedAlignment scoped(64);
    EXPECT_EQ(gemm::get_mk_alignment_for_contiguous_layout(), 64);
    EXPECT_EQ(gemm::get_m_alignment_for_contiguous_layout(), 64);
    EXPECT_EQ(gemm::get_k_alignment_for_contiguous_layout(), 64);
  }
  EXPECT_EQ(gemm::get_mk_alignment_for_contiguous_layout(), before);
  for (int bad : {0, -16, 24}) {
    try {
      gemm::set_mk_alignment_for_contiguous_layout(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "alignment");
    }
  }
  EXPECT_EQ(gemm::get_mk_alignment_for_contiguous_layout(), before);
  EXPECT_GT(gemm::get_theoretical_mk_alignment_for_contiguous_layout(), 0);
  EXPECT_EQ(gemm::get_theoretical_mk_alignment_for_contiguous_layout(100) % 16, 0);
  EXPECT_THROW(gemm::get_theoretical_mk_alignment_for_contiguous_layout(0), Error);
}

}  // namespace
}  // namespace dsk::gemm_test
