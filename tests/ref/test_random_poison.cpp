// Seeded random tensors (repeatable across runs and thread counts, right moments, bf16-exact) and
// output poisoning (every dtype, strided views).
#include <cmath>
#include <cstring>

#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::ref {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Restores the thread count at scope exit.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(get_num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(Random, SameSeedSameTensorForAnyThreadCount) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::fp4x2}) {
    Tensor one, two;
    {
      ScopedThreads threads(1);
      one = randn({257, 129}, dtype, 42);
    }
    {
      ScopedThreads threads(2);
      two = randn({257, 129}, dtype, 42);
    }
    EXPECT_TRUE(same_bytes(one, two)) << dtype;
    EXPECT_FALSE(same_bytes(one, randn({257, 129}, dtype, 43))) << dtype;
  }
  EXPECT_TRUE(
      same_bytes(randint({1000}, DType::i32, 5, -7, 9), randint({1000}, DType::i32, 5, -7, 9)));
  // Element i does not depend on the shape it is drawn in.
  Tensor flat = randn({64}, DType::f32, 9);
  Tensor square = randn({8, 8}, DType::f32, 9);
  EXPECT_EQ(std::memcmp(flat.data_ptr(), square.data_ptr(), 64 * sizeof(float)), 0);
  EXPECT_NE(random_u64(1, 0), random_u64(2, 0));
  EXPECT_NE(random_u64(1, 0), random_u64(1, 1));
}

TEST(Random, RandnHasTheRequestedMomentsAndIsBf16Exact) {
  const int64_t n = 1 << 18;
  Tensor t = randn({n}, DType::f32, 7, 0.5f, 2.0f);
  double sum = 0, sq = 0;
  int zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = t.data<float>()[i];
    ASSERT_EQ(v, numeric::round_to_bf16(v)) << i;
    sum += v;
    sq += static_cast<double>(v) * v;
    zeros += v == 0.0f;
  }
  const double mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(stddev, 2.0, 0.02);
  EXPECT_LT(zeros, 10);
}

TEST(Random, UniformAndIntegerRanges) {
  Tensor u = rand_uniform({1 << 16}, DType::f32, 3, -1.0f, 3.0f);
  double sum = 0;
  for (int64_t i = 0; i < u.numel(); ++i) {
    const float v = u.data<float>()[i];
    ASSERT_GE(v, -1.0f);
    ASSERT_LE(v, 3.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / u.numel(), 1.0, 0.02);

  Tensor r = randint({1 << 16}, DType::i8, 4, -3, 4);
  int counts[7] = {};
  for (int64_t i = 0; i < r.numel(); ++i) {
    const int v = r.data<int8_t>()[i];
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 4);
    ++counts[v + 3];
  }
  for (int c : counts) EXPECT_NEAR(c, (1 << 16) / 7.0, 500);
  Tensor b = randint({100}, DType::boolean, 4, 0, 2);
  for (int64_t i = 0; i < 100; ++i) ASSERT_LE(b.data<bool>()[i], 1);
}

// Every exponent of the range appears, with both signs, and nothing outside it (bf16 rounds a
// mantissa near 2 up to the next power).
TEST(Random, WideValuesSpanTheirExponents) {
  Tensor w = rand_wide({1 << 16}, DType::bf16, 5, 20);
  int per_exponent[42] = {}, negative = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float v = bf16_to_f32(w.data<bf16>()[i]);
    int e = 0;
    std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
    ASSERT_GE(e - 1, -20) << v;
    ASSERT_LE(e - 1, 21) << v;
    ++per_exponent[e - 1 + 20];
    negative += v < 0;
  }
  for (int e = 0; e <= 40; ++e) EXPECT_GT(per_exponent[e], 1000) << e - 20;
  EXPECT_NEAR(negative, (1 << 16) / 2, 800);
  EXPECT_TRUE(same_bytes(w, rand_wide({1 << 16}, DType::bf16, 5, 20)));
}

TEST(Random, BadArgumentsRaise) {
  EXPECT_THROW(randn({4}, DType::i32, 1), Error);
  EXPECT_THROW(randn({4}, DType::f32, 1, 0.0f, -1.0f), Error);
  EXPECT_THROW(rand_uniform({4}, DType::f32, 1, 2.0f, 1.0f), Error);
  EXPECT_THROW(randint({4}, DType::i8, 1, 0, 300), Error);
  EXPECT_THROW(randint({4}, DType::i32, 1, 5, 5), Error);
  EXPECT_THROW(randint({4}, DType::bf16, 1, 0, 5), Error);
  EXPECT_THROW(rand_wide({4}, DType::f32, 1, -1), Error);
  EXPECT_THROW(rand_wide({4}, DType::i32, 1), Error);
}

TEST(Poison, EveryDtypeIsDetected) {
  for (DType dtype :
       {DType::f64, DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::fp4x2,
        DType::ue8m0, DType::i8, DType::u8, DType::i16, DType::i32, DType::i64, DType::boolean}) {
    Tensor t = Tensor::zeros({3, 5}, dtype);
    EXPECT_TRUE(all_written(t)) << dtype;
    poison(t);
    EXPECT_EQ(count_poisoned(t), 15) << dtype;
    EXPECT_FALSE(all_written(t)) << dtype;
  }
  Tensor f = Tensor::empty({4}, DType::f32);
  poison(f);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(f.data<float>()[i]));
  Tensor idx = Tensor::empty({2}, DType::i32);
  poison(idx);
  EXPECT_EQ(idx.data<int32_t>()[0], 0x7F7F7F7F);
}

TEST(Poison, StridedViewsCountOnlyTheirElements) {
  Tensor t = randn({6, 10}, DType::bf16, 8);
  Tensor view = t.slice(1, 2, 7).transpose(0, 1);  // [5, 6], strided
  poison(view);
  EXPECT_EQ(count_poisoned(t), 30);
  EXPECT_EQ(count_poisoned(view), 30);
  EXPECT_EQ(count_poisoned(t.slice(1, 0, 2)), 0);
  // A "kernel" that writes all but one element of the view.
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 6; ++j)
      if (i != 3 || j != 4) view.at<bf16>({i, j}) = numeric::f32_to_bf16(1.0f);
  EXPECT_EQ(count_poisoned(view), 1);
  EXPECT_FALSE(all_written(view));
  view.at<bf16>({3, 4}) = numeric::f32_to_bf16(-2.0f);
  EXPECT_TRUE(all_written(view));
}

}  // namespace
}  // namespace dsk::ref
