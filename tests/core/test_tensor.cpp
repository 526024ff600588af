#include <dlpack/dlpack.h>

#include <cmath>

#include <cstring>

#include "common/test_util.hpp"

namespace dsk {
namespace {

TEST(Tensor, EmptyIsAlignedContiguousAndSized) {
  Tensor t = Tensor::empty({3, 5, 7}, DType::bf16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.nbytes(), 210u);
  EXPECT_EQ(t.strides(), (Shape{35, 7, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  Tensor big = Tensor::empty({4 << 20}, DType::u8);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data_ptr()) % (2 << 20), 0u);
}

// Large buffers are reused after they are freed (unless AddressSanitizer turns the cache off), stay
// 2 MiB aligned, and a live tensor's storage is never handed out twice.
TEST(Tensor, LargeBuffersAreReusedAndNeverShared) {
  const Shape shape = {3, 1 << 20};  // 12 MiB of f32
  release_cached_tensor_memory();
  void* first = nullptr;
  {
    Tensor a = Tensor::empty(shape, DType::f32);
    first = a.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 << 20), 0u);
    Tensor live = Tensor::empty(shape, DType::f32);
    EXPECT_NE(live.data_ptr(), first);
  }
  Tensor b = Tensor::empty(shape, DType::f32);
  Tensor c = Tensor::empty(shape, DType::f32);
  EXPECT_NE(b.data_ptr(), c.data_ptr());
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_TRUE(b.data_ptr() == first || c.data_ptr() == first);
#endif
  b = Tensor();
  c = Tensor();
  EXPECT_GE(release_cached_tensor_memory(), 0u);
  EXPECT_EQ(release_cached_tensor_memory(), 0u);
}

// Medium buffers (64 KiB to 2 MiB) are reused too, by their 64 KiB-rounded size; small ones are
// not cached (the heap serves them).
TEST(Tensor, MediumBuffersAreReusedBySizeAndNeverShared) {
  release_cached_tensor_memory();
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({100 << 10}, DType::u8);  // 100 KiB: a 128 KiB block
    first = a.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    Tensor live = Tensor::empty({100 << 10}, DType::u8);
    EXPECT_NE(live.data_ptr(), first);
  }
  Tensor other_size = Tensor::empty({200 << 10}, DType::u8);  // a 256 KiB block: not that one
  EXPECT_NE(other_size.data_ptr(), first);
  Tensor b = Tensor::empty({120 << 10}, DType::u8);  // also 128 KiB
  Tensor c = Tensor::empty({128 << 10}, DType::u8);
  EXPECT_NE(b.data_ptr(), c.data_ptr());
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_TRUE(b.data_ptr() == first || c.data_ptr() == first);
  b = Tensor();
  c = Tensor();
  other_size = Tensor();
  EXPECT_EQ(release_cached_tensor_memory(), size_t{2 * (128 << 10) + (256 << 10)});
#endif
  EXPECT_EQ(release_cached_tensor_memory(), 0u);
}

TEST(Tensor, UndefinedByDefault) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_TRUE(Tensor::empty({}, DType::f32).defined());
  EXPECT_EQ(Tensor::empty({}, DType::f32).numel(), 1);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::empty({4, 6}, DType::f32);
  float* p = t.data<float>();
  for (int i = 0; i < 24; ++i) p[i] = static_cast<float>(i);

  Tensor row = t.select(0, 2);
  EXPECT_EQ(row.sizes(), (Shape{6}));
  EXPECT_EQ(row.at<float>({3}), 15.0f);

  Tensor cols = t.slice(1, 1, 4);
  EXPECT_EQ(cols.sizes(), (Shape{4, 3}));
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.at<float>({3, 2}), 21.0f);

  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.sizes(), (Shape{6, 4}));
  EXPECT_EQ(tt.at<float>({5, 1}), 11.0f);
  EXPECT_TRUE(tt.shares_storage_with(t));

  Tensor v = t.view({2, -1, 3});
  EXPECT_EQ(v.sizes(), (Shape{2, 4, 3}));
  v.at<float>({1, 0, 0}) = -1.0f;
  EXPECT_EQ(p[12], -1.0f);

  Tensor u = t.unsqueeze(0);
  EXPECT_EQ(u.sizes(), (Shape{1, 4, 6}));
  EXPECT_TRUE(u.is_contiguous());
}

TEST(Tensor, ContiguousCopiesStridedViews) {
  Tensor t = Tensor::empty({5, 3}, DType::i32);
  for (int i = 0; i < 15; ++i) t.data<int32_t>()[i] = i;
  Tensor c = t.transpose(0, 1).contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(t));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) EXPECT_EQ(c.at<int32_t>({i, j}), j * 3 + i);
  Tensor same = t.contiguous();
  EXPECT_TRUE(same.shares_storage_with(t));
}

// Large strided copies split their rows over the threads (and stream them past 8 MiB): every
// element lands where the element-wise rule puts it, for rows of whole and partial cache lines,
// at 1 and 2 threads; a copy between overlapping views stays correct (it runs serially).
TEST(Tensor, LargeStridedCopiesMatchTheElementRule) {
  const int threads = get_num_threads();
  for (const Shape& shape : {Shape{96, 40, 128}, Shape{600, 30, 128}, Shape{1100, 30, 130}}) {
    Tensor t = Tensor::empty(shape, DType::i32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i * 7 + 1);
    for (int n : {1, std::max(2, threads)}) {
      set_num_threads(n);
      const Tensor c = t.transpose(0, 1).contiguous();
      ASSERT_EQ(c.sizes(), (Shape{shape[1], shape[0], shape[2]}));
      bool same = true;
      for (int64_t i = 0; i < shape[1] && same; ++i)
        for (int64_t j = 0; j < shape[0] && same; ++j)
          for (int64_t k = 0; k < shape[2]; k += 13)
            same = same && c.at<int32_t>({i, j, k}) == t.at<int32_t>({j, i, k});
      EXPECT_TRUE(same) << t.describe() << ", threads " << n;
    }
  }
  set_num_threads(threads);
  // Overlapping views of one buffer (rows 1.. take rows 0..) keep the serial row order: each
  // row is copied after the one before it was written, so row 0 runs down the whole view.
  Tensor buffer = Tensor::empty({4097, 128}, DType::i32);
  for (int64_t i = 0; i < buffer.numel(); ++i) buffer.data<int32_t>()[i] = static_cast<int32_t>(i);
  buffer.slice(0, 1, 4097).slice(1, 0, 120).copy_(buffer.slice(0, 0, 4096).slice(1, 0, 120));
  for (int64_t row : {1, 2048, 4096}) {
    EXPECT_EQ(buffer.at<int32_t>({row, 5}), 5) << row;
    EXPECT_EQ(buffer.at<int32_t>({row, 125}), row * 128 + 125) << row;  // outside the view
  }
}

TEST(Tensor, LargeContiguousCopiesKeepEveryByte) {
  const int threads = get_num_threads();
  // Below the parallel size, above it, and above the streaming size with a tail that is not a
  // whole chunk or line; dst at an offset of 4 bytes as well, so no store may assume alignment.
  for (const int64_t bytes : {int64_t{600} << 10, int64_t{3} << 20, (int64_t{9} << 20) + 36}) {
    Tensor src = Tensor::empty({bytes}, DType::u8);
    for (int64_t i = 0; i < bytes; ++i) src.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + 1);
    for (int n : {1, std::max(2, threads)}) {
      set_num_threads(n);
      for (const int64_t offset : {int64_t{0}, int64_t{4}}) {
        Tensor buffer = Tensor::empty({bytes + offset}, DType::u8);
        buffer.fill_bytes_(0xAB);
        buffer.slice(0, offset, offset + bytes).copy_(src);
        EXPECT_EQ(std::memcmp(buffer.data<uint8_t>() + offset, src.data<uint8_t>(),
                              static_cast<size_t>(bytes)),
                  0)
            << bytes << " bytes, threads " << n << ", offset " << offset;
        if (offset > 0) {
          EXPECT_EQ(buffer.data<uint8_t>()[offset - 1], 0xAB);
        }
      }
    }
  }
  set_num_threads(threads);
  // Overlapping contiguous views of one buffer copy as memmove does.
  const int64_t n = int64_t{2} << 20;
  Tensor buffer = Tensor::empty({n + 1000}, DType::i32);
  for (int64_t i = 0; i < buffer.numel(); ++i) buffer.data<int32_t>()[i] = static_cast<int32_t>(i);
  buffer.slice(0, 1000, n + 1000).copy_(buffer.slice(0, 0, n));
  for (int64_t i : {int64_t{0}, int64_t{999}, int64_t{1000}, n / 2, n + 999})
    EXPECT_EQ(buffer.data<int32_t>()[i], i < 1000 ? i : i - 1000) << i;
}

TEST(Tensor, MayOverlapComparesTheSpannedBytes) {
  const Tensor t = Tensor::empty({8, 6}, DType::f32);
  EXPECT_TRUE(t.may_overlap(t));
  EXPECT_FALSE(t.slice(0, 0, 4).may_overlap(t.slice(0, 4, 8)));
  EXPECT_TRUE(t.slice(0, 0, 5).may_overlap(t.slice(0, 4, 8)));
  // Interleaved columns span the same bytes: counted as overlapping (the test is conservative).
  EXPECT_TRUE(t.slice(1, 0, 3).may_overlap(t.slice(1, 3, 6)));
  EXPECT_TRUE(t.transpose(0, 1).may_overlap(t.select(0, 7)));
  EXPECT_FALSE(t.slice(0, 2, 2).may_overlap(t));  // empty
  EXPECT_FALSE(t.may_overlap(Tensor::empty({8, 6}, DType::f32)));
}

TEST(Tensor, FillBytesPoisonsOnlyTheView) {
  Tensor t = Tensor::zeros({4, 4}, DType::f32);
  t.slice(1, 1, 3).fill_bytes_(0xFF);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.at<float>({i, 0}), 0.0f);
    EXPECT_TRUE(std::isnan(t.at<float>({i, 1})));
    EXPECT_TRUE(std::isnan(t.at<float>({i, 2})));
    EXPECT_EQ(t.at<float>({i, 3}), 0.0f);
  }
}

TEST(Tensor, FromBlobKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<int16_t>>(12, 7);
  std::weak_ptr<std::vector<int16_t>> weak = owner;
  Tensor t = Tensor::from_blob(owner->data(), {3, 4}, DType::i16, {}, owner);
  owner.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(t.at<int16_t>({2, 3}), 7);
  t = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(Tensor, BadArgumentsRaiseNamedErrors) {
  Tensor t = Tensor::empty({2, 3}, DType::f32);
  EXPECT_THROW(t.data<bf16>(), Error);
  EXPECT_THROW(t.size(2), Error);
  EXPECT_THROW(t.slice(0, 1, 3), Error);
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.transpose(0, 1).view({6}), Error);
  EXPECT_THROW(Tensor::empty({-1}, DType::f32), Error);
  EXPECT_THROW(t.reinterpret(DType::bf16), Error);
  try {
    t.slice(1, 2, 9);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.function(), "Tensor::slice");
    EXPECT_NE(std::string(e.what()).find("expected 0 <= begin <= end <= 3"), std::string::npos)
        << e.what();
  }
  // The shape checks format their text only when they fail; the text is still the whole shape.
  try {
    Tensor::empty({2, -3, 4}, DType::f32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Tensor::empty: shape: expected non-negative sizes, got [2, -3, 4]");
  }
  try {
    check::shape("f", "x", t, {2, -1, 5});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "f: x: expected shape [2, -1, 5], got [2, 3]");
  }
}

TEST(Tensor, DlpackRoundTripSharesMemory) {
  Tensor t = Tensor::empty({3, 4}, DType::bf16);
  DLManagedTensor* m = t.to_dlpack();
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
  EXPECT_EQ(m->dl_tensor.shape[1], 4);
  EXPECT_EQ(m->dl_tensor.strides[0], 4);
  Tensor back = Tensor::from_dlpack(m);
  EXPECT_EQ(back.data_ptr(), t.data_ptr());
  EXPECT_EQ(back.sizes(), t.sizes());
  EXPECT_EQ(back.dtype(), DType::bf16);

  // A transposed view keeps its strides; fp8 travels as uint8 and is reinterpreted on import.
  Tensor q = Tensor::empty({2, 8}, DType::e4m3).transpose(0, 1);
  Tensor q2 = Tensor::from_dlpack(q.to_dlpack(), DType::e4m3);
  EXPECT_EQ(q2.dtype(), DType::e4m3);
  EXPECT_EQ(q2.strides(), (Shape{1, 8}));
}

TEST(Tensor, DlpackImportRunsDeleterOnce) {
  static int deleted = 0;
  static float data[6];
  static int64_t shape[2] = {2, 3};
  auto* m = new DLManagedTensor{};
  m->dl_tensor.data = data;
  m->dl_tensor.device = {kDLCPU, 0};
  m->dl_tensor.ndim = 2;
  m->dl_tensor.dtype = {kDLFloat, 32, 1};
  m->dl_tensor.shape = shape;
  m->dl_tensor.strides = nullptr;
  m->deleter = [](DLManagedTensor* self) {
    ++deleted;
    delete self;
  };
  {
    Tensor t = Tensor::from_dlpack(m);
    Tensor view = t.select(0, 1);
    EXPECT_EQ(t.strides(), (Shape{3, 1}));
    t = Tensor();
    EXPECT_EQ(deleted, 0);
  }
  EXPECT_EQ(deleted, 1);
}

}  // namespace
}  // namespace dsk
