// calc_diff and allclose: known pairs, every failure kind, strided and mixed-dtype inputs.
#include <cmath>
#include <limits>

#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::ref {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor f32(std::initializer_list<float> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::f32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

TEST(CalcDiff, KnownPairs) {
  EXPECT_EQ(calc_diff(f32({1, 2, 3}), f32({1, 2, 3})), 0.0);
  EXPECT_DOUBLE_EQ(calc_diff(f32({1, 0}), f32({0, 1})), 1.0);    // orthogonal
  EXPECT_DOUBLE_EQ(calc_diff(f32({1, 2}), f32({-1, -2})), 2.0);  // opposite
  EXPECT_EQ(calc_diff(f32({0, 0}), f32({0, 0})), 0.0);           // both all zero
  EXPECT_DOUBLE_EQ(calc_diff(f32({1, 0}), f32({0, 0})), 1.0);
  // x = 1, y = 1 + e: 1 - 2(1 + e) / (1 + (1 + e)^2) = e^2 / (2 + 2e + e^2)
  const double e = 1.0 / 1024;
  EXPECT_NEAR(calc_diff(f32({1}), f32({static_cast<float>(1 + e)})), e * e / (2 + 2 * e + e * e),
              1e-15);
  EXPECT_TRUE(std::isnan(calc_diff(f32({kNaN, 1}), f32({1, 1}))));
}

TEST(CalcDiff, ReadsAnyDtypeAndStride) {
  Tensor x = randn({8, 33}, DType::f32, 11);
  Tensor xb = Tensor::empty({8, 33}, DType::bf16);
  convert_f32_to_bf16(x.data<float>(), xb.data<bf16>(), 8 * 33);
  EXPECT_EQ(calc_diff(x, xb), 0.0);                            // randn data is bf16-exact
  Tensor xt = x.transpose(0, 1).contiguous().transpose(0, 1);  // same values, column-major
  EXPECT_FALSE(xt.is_contiguous());
  EXPECT_EQ(calc_diff(xt, x), 0.0);
  Tensor y = randn({8, 33}, DType::f32, 12);
  EXPECT_GT(calc_diff(x, y), 0.5);
}

TEST(CalcDiff, ShapeMismatchRaises) {
  EXPECT_THROW(calc_diff(f32({1, 2}), f32({1, 2, 3})), Error);
  try {
    calc_diff(Tensor::empty({2, 3}, DType::f32), Tensor::empty({3, 2}, DType::f32));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.function(), "dsk::ref::calc_diff");
    EXPECT_NE(std::string(e.what()).find("float32[3, 2]"), std::string::npos) << e.what();
  }
}

TEST(Allclose, PassesOnEqualAndNearlyEqualData) {
  Tensor x = randn({4, 100}, DType::f32, 1);
  AllcloseResult r = allclose(x, x);
  EXPECT_TRUE(r) << r;
  EXPECT_EQ(r.num_elements, 400);
  EXPECT_EQ(r.max_abs_err, 0.0);
  Tensor y = x.clone();
  y.data<float>()[7] *= 1.001f;  // rel err 1e-3 < 1e-2
  r = allclose(y, x, {.abs_tol = 0, .rel_tol = 1e-2, .cos_tol = 1e-5});
  EXPECT_TRUE(r) << r;
  EXPECT_NEAR(r.max_rel_err, 1e-3, 1e-4);
  DSK_EXPECT_ALLCLOSE(y, x, {.abs_tol = 0, .rel_tol = 1e-2, .cos_tol = 1e-5});
  // Exact equality passes even with zero tolerances.
  EXPECT_TRUE(allclose(x, x, {.abs_tol = 0, .rel_tol = 0, .cos_tol = 0}));
}

TEST(Allclose, CatchesOneBadElementAndNamesIt) {
  Tensor x = randn({3, 5, 7}, DType::f32, 2);
  Tensor y = x.clone();
  y.at<float>({1, 2, 3}) += 0.5f;
  const AllcloseResult r = allclose(y, x, {.abs_tol = 1e-3, .rel_tol = 1e-3, .cos_tol = 1});
  EXPECT_FALSE(r);
  EXPECT_EQ(r.num_bad, 1);
  EXPECT_EQ(r.first_bad_index, 1 * 35 + 2 * 7 + 3);
  EXPECT_EQ(r.first_bad_coords, (Shape{1, 2, 3}));
  EXPECT_EQ(r.first_bad_actual, y.at<float>({1, 2, 3}));
  EXPECT_EQ(r.first_bad_expected, x.at<float>({1, 2, 3}));
  EXPECT_NEAR(r.max_abs_err, 0.5, 1e-6);
  EXPECT_NE(r.message.find("first at [1, 2, 3]"), std::string::npos) << r.message;
}

TEST(Allclose, NanMustMatchPositionally) {
  EXPECT_TRUE(allclose(f32({1, kNaN, 3}), f32({1, kNaN, 3})));
  const AllcloseResult r = allclose(f32({1, kNaN, 3}), f32({1, 2, 3}));
  EXPECT_FALSE(r);
  EXPECT_EQ(r.first_bad_index, 1);
  EXPECT_FALSE(allclose(f32({1, 2, 3}), f32({1, 2, kNaN})));
  EXPECT_FALSE(allclose(f32({kNaN, 2}), f32({2, kNaN})));
}

TEST(Allclose, InfinitiesMustMatchInPositionAndSign) {
  EXPECT_TRUE(allclose(f32({kInf, -kInf, 1}), f32({kInf, -kInf, 1})));
  const AllcloseResult r = allclose(f32({1, kInf}), f32({1, -kInf}));
  EXPECT_FALSE(r);
  EXPECT_EQ(r.first_bad_index, 1);
  EXPECT_NE(r.message.find("actual inf vs expected -inf"), std::string::npos) << r.message;
  EXPECT_FALSE(allclose(f32({1e30f}), f32({kInf})));
}

TEST(Allclose, CosineBoundCatchesSmallSystematicErrors) {
  // Every element within 2% relative, but the whole tensor is off by a consistent pattern.
  Tensor x = randn({4096}, DType::f32, 3);
  Tensor y = x.clone();
  for (int i = 0; i < 4096; ++i) y.data<float>()[i] *= (i % 2 ? 1.015f : 0.985f);
  const AllcloseResult loose = allclose(y, x, {.abs_tol = 0, .rel_tol = 2e-2, .cos_tol = 1e-3});
  EXPECT_TRUE(loose) << loose;
  const AllcloseResult strict = allclose(y, x, {.abs_tol = 0, .rel_tol = 2e-2, .cos_tol = 1e-6});
  EXPECT_FALSE(strict);
  EXPECT_EQ(strict.num_bad, 0);
  EXPECT_GT(strict.cos_diff, 1e-6);
  EXPECT_NE(strict.message.find("cos_diff"), std::string::npos) << strict.message;
}

TEST(Allclose, ComparesAcrossDtypesAndStrides) {
  Tensor x = randn({16, 24}, DType::bf16, 4);
  Tensor wide = Tensor::empty({16, 24}, DType::f32);
  convert_bf16_to_f32(x.data<bf16>(), wide.data<float>(), 16 * 24);
  EXPECT_TRUE(allclose(x.transpose(0, 1), wide.transpose(0, 1), {0, 0, 0}));
  EXPECT_THROW(allclose(x, wide.transpose(0, 1)), Error);
}

}  // namespace
}  // namespace dsk::ref
