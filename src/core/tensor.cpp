#include <dsk/core/tensor.hpp>

#include <dlpack/dlpack.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include <dsk/core/env.hpp>
#include <dsk/core/threads.hpp>

#include "copy.hpp"

namespace dsk {
namespace {

// NOTES: buffers of 2 MiB or more are 2 MiB aligned and advised as huge pages: on the development
// machines THP is in `madvise` mode and streaming reads gain 10-15% (spec/cpu.md §8).
// Those large buffers are also kept for reuse when freed (a caching allocator, as PyTorch's):
// glibc returns them to the OS, so every new output would be faulted in and zeroed page by page
// again, which cost memory-bound ops more than the op itself (a 29 MB output: 4.5 ms fresh vs
// 1.0 ms reused). Buffers of 64 KiB or more are kept too (rounded to 64 KiB): glibc serves them
// from its heap or by mmap and, once they are freed, trims the heap or unmaps them, so every
// operation that returns such outputs (an EP dispatch returns six of 8 KB to 512 KB) faulted its
// pages in again, and each trim is a TLB shootdown that interrupts the other CPUs as well (a
// T=4096 shared-memory dispatch, 2 ranks: 9.7-10.8 ms until the heap began to trim, then 12.7-13.5
// ms with 240 faults per call). The cache holds at most DSK_TENSOR_CACHE_MB and is off under
// AddressSanitizer, so use-after-free stays detectable there.
constexpr size_t kAlignment = 64;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kCachedGranule = size_t{64} << 10;  // the smallest buffer the cache keeps

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheEnabled = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kCacheEnabled = false;
#else
constexpr bool kCacheEnabled = true;
#endif
#else
constexpr bool kCacheEnabled = true;
#endif

// Freed blocks by exact (rounded) size. Never destroyed: tensors may outlive statics.
class BlockCache {
 public:
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;
    return *cache;
  }

  void* take(size_t bytes) {
    std::lock_guard lock(mutex_);
    const auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    cached_ -= bytes;
    return p;
  }

  // Keeps `p` if it fits under the limit; otherwise frees it.
  void give(void* p, size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      if (cached_ + bytes <= limit_) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  size_t release() {
    std::multimap<size_t, void*> blocks;
    {
      std::lock_guard lock(mutex_);
      blocks.swap(free_);
      cached_ = 0;
    }
    size_t bytes = 0;
    for (const auto& [size, p] : blocks) {
      bytes += size;
      std::free(p);
    }
    return bytes;
  }

 private:
  BlockCache()
      : limit_(kCacheEnabled ? static_cast<size_t>(
                                   std::max<int64_t>(0, env::get_int("", "TENSOR_CACHE_MB", 2048)))
                                   << 20
                             : 0) {}

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
  const size_t limit_;
};

std::shared_ptr<void> allocate(size_t nbytes) {
  const bool large = nbytes >= kHugePage;
  const bool cached = nbytes >= kCachedGranule;
  const size_t alignment = large ? kHugePage : kAlignment;
  const size_t granule = large ? kHugePage : cached ? kCachedGranule : kAlignment;
  const size_t rounded = std::max<size_t>(granule, (nbytes + granule - 1) / granule * granule);
  void* p = cached ? BlockCache::instance().take(rounded) : nullptr;
  if (p == nullptr) {
    p = std::aligned_alloc(alignment, rounded);
    if (p == nullptr)
      DSK_FAIL("Tensor::empty", fmt::format("out of memory allocating {} bytes", nbytes));
    if (large) madvise(p, rounded, MADV_HUGEPAGE);
  }
  if (!cached) return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return std::shared_ptr<void>(p, [rounded](void* q) { BlockCache::instance().give(q, rounded); });
}

// DSK_POISON_NEW_TENSORS: tests see an element a kernel forgot to write as poison (NaN, 0x7F7F...),
// never as the zeros of fresh pages or a recycled buffer's old (often correct) values: a second
// call of the same shape often gets the first call's freed output back.
bool poison_new_tensors() {
  static const bool on = env::get_bool("", "POISON_NEW_TENSORS", false);
  return on;
}

void check_shape(const char* fn, const Shape& shape) {
  // The shape is formatted only on failure: this runs for every tensor made.
  for (int64_t s : shape) DSK_CHECK_ARG(s >= 0, fn, "shape", "non-negative sizes", shape);
}

}  // namespace

size_t release_cached_tensor_memory() {
  return BlockCache::instance().release();
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  check_shape("Tensor::empty", shape);
  Tensor t;
  t.defined_ = true;
  t.sizes_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = allocate(t.nbytes());
  t.data_ = t.storage_.get();
  if (poison_new_tensors()) std::memset(t.data_, poison_byte(dtype), t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, const Shape& strides,
                         std::shared_ptr<void> owner) {
  check_shape("Tensor::from_blob", shape);
  DSK_CHECK_ARG(strides.empty() || strides.size() == shape.size(), "Tensor::from_blob", "strides",
                fmt::format("{} strides", shape.size()), strides.size());
  DSK_CHECK_ARG(
      data != nullptr || shape.empty() || std::find(shape.begin(), shape.end(), 0) != shape.end(),
      "Tensor::from_blob", "data", "a non-null pointer", "nullptr");
  Tensor t;
  t.defined_ = true;
  t.sizes_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : strides;
  t.dtype_ = dtype;
  t.storage_ = std::move(owner);
  t.data_ = data;
  return t;
}

int Tensor::wrap_dim(int d) const {
  const int n = dim();
  DSK_CHECK_ARG(d >= -n && d < n, "Tensor", "dim", fmt::format("a dimension in [{}, {})", -n, n),
                d);
  return d < 0 ? d + n : d;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

size_t Tensor::offset_bytes(std::initializer_list<int64_t> index) const {
  DSK_CHECK_ARG(static_cast<int>(index.size()) == dim(), "Tensor::at", "index",
                fmt::format("{} coordinates", dim()), index.size());
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index) {
    DSK_CHECK_ARG(i >= 0 && i < sizes_[d], "Tensor::at", "index",
                  fmt::format("a coordinate below {} in dimension {}", sizes_[d], d), i);
    offset += i * strides_[d++];
  }
  return static_cast<size_t>(offset) * element_size();
}

Tensor Tensor::view(const Shape& shape) const {
  DSK_CHECK_ARG(is_contiguous(), "Tensor::view", "self", "a contiguous tensor", describe());
  Shape resolved = shape;
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      DSK_CHECK_ARG(inferred < 0, "Tensor::view", "shape", "at most one -1", shape);
      inferred = static_cast<int>(i);
    } else {
      DSK_CHECK_ARG(resolved[i] >= 0, "Tensor::view", "shape", "non-negative sizes", shape);
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    DSK_CHECK_ARG(known != 0 && numel() % known == 0, "Tensor::view", "shape",
                  fmt::format("sizes whose product divides {}", numel()), shape);
    resolved[inferred] = numel() / known;
    known *= resolved[inferred];
  }
  DSK_CHECK_ARG(known == numel(), "Tensor::view", "shape",
                fmt::format("{} elements in all", numel()), shape);
  Tensor t = *this;
  t.sizes_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  d = wrap_dim(d);
  DSK_CHECK_ARG(begin >= 0 && begin <= end && end <= sizes_[d], "Tensor::slice", "range",
                fmt::format("0 <= begin <= end <= {}", sizes_[d]),
                fmt::format("[{}, {})", begin, end));
  Tensor t = *this;
  t.sizes_[d] = end - begin;
  t.data_ = static_cast<char*>(data_) + begin * strides_[d] * static_cast<int64_t>(element_size());
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  d = wrap_dim(d);
  DSK_CHECK_ARG(index >= 0 && index < sizes_[d], "Tensor::select", "index",
                fmt::format("an index below {}", sizes_[d]), index);
  Tensor t = slice(d, index, index + 1);
  t.sizes_.erase(t.sizes_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  d0 = wrap_dim(d0);
  d1 = wrap_dim(d1);
  Tensor t = *this;
  std::swap(t.sizes_[d0], t.sizes_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  const int n = dim();
  DSK_CHECK_ARG(d >= -n - 1 && d <= n, "Tensor::unsqueeze", "dim",
                fmt::format("a position in [{}, {}]", -n - 1, n), d);
  if (d < 0) d += n + 1;
  Tensor t = *this;
  const int64_t stride = d < n ? strides_[d] * sizes_[d] : 1;
  t.sizes_.insert(t.sizes_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, stride);
  return t;
}

Tensor Tensor::reinterpret(DType dtype) const {
  DSK_CHECK_ARG(dsk::element_size(dtype) == element_size(), "Tensor::reinterpret", "dtype",
                fmt::format("a dtype of {} bytes", element_size()), dtype);
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

namespace {

// Calls fn(dst_byte_ptr, src_byte_ptr) for every element, walking both tensors' strides.
template <class Fn>
void for_each_element_pair(const Tensor& dst, const Tensor& src, Fn fn) {
  const int n = dst.dim();
  const int64_t es = static_cast<int64_t>(dst.element_size());
  if (dst.numel() == 0) return;
  std::vector<int64_t> index(n, 0);
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  while (true) {
    int64_t od = 0, os = 0;
    for (int i = 0; i < n; ++i) {
      od += index[i] * dst.stride(i);
      os += index[i] * src.stride(i);
    }
    fn(d + od * es, s + os * es);
    int i = n - 1;
    for (; i >= 0; --i) {
      if (++index[i] < dst.size(i)) break;
      index[i] = 0;
    }
    if (i < 0) break;
  }
}

// Calls fn(dst_row, src_row, row_bytes) for every row (all indices but the last) of two tensors
// whose last dimension is contiguous: one memcpy-sized call per row instead of one per element.
template <class Fn>
void for_each_row_pair(const Tensor& dst, const Tensor& src, Fn fn) {
  const int n = dst.dim();
  const int64_t es = static_cast<int64_t>(dst.element_size());
  const size_t row_bytes = static_cast<size_t>(dst.size(n - 1) * es);
  std::vector<int64_t> index(static_cast<size_t>(n - 1), 0);
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  while (true) {
    int64_t od = 0, os = 0;
    for (int i = 0; i < n - 1; ++i) {
      od += index[i] * dst.stride(i);
      os += index[i] * src.stride(i);
    }
    fn(d + od * es, s + os * es, row_bytes);
    int i = n - 2;
    for (; i >= 0; --i) {
      if (++index[i] < dst.size(i)) break;
      index[i] = 0;
    }
    if (i < 0) break;
  }
}

// The bytes [first, last) that a tensor's elements span (numel() > 0).
std::pair<const char*, const char*> byte_span(const Tensor& t) {
  const auto* base = static_cast<const char*>(t.data_ptr());
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < t.dim(); ++i) {
    const int64_t reach = (t.size(i) - 1) * t.stride(i);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto es = static_cast<int64_t>(t.element_size());
  return {base + lo * es, base + (hi + 1) * es};
}

// From how many bytes a copy is split over the threads: 1 MiB takes about 100 us on one core, far
// more than a parallel_for costs. On the AMX VM (two cores): a transposed 256 MiB bf16 tensor
// made contiguous 62 ms on one core, 25 ms split over two; a contiguous copy (one memmove before)
// of 4 / 64 / 256 MiB 0.33 / 6.7 / 26 ms, split and streamed 0.17 / 2.1 / 12.8 ms.
constexpr size_t kParallelCopyBytes = size_t{1} << 20;

// copy_ of two tensors whose last dimension is contiguous and whose bytes do not overlap: their
// rows split over the threads, written around the caches when the copy is larger than they keep.
void copy_rows_parallel(const Tensor& dst, const Tensor& src) {
  const int n = dst.dim();
  const int64_t es = static_cast<int64_t>(dst.element_size());
  const auto row_bytes = static_cast<size_t>(dst.size(n - 1) * es);
  const int64_t rows = dst.numel() / dst.size(n - 1);
  const bool stream = dst.nbytes() >= detail::kStreamCopyBytes;
  auto* d = static_cast<std::byte*>(dst.data_ptr());
  const auto* s = static_cast<const std::byte*>(src.data_ptr());
  parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    // The index of row r0 (all dimensions but the last), then stepped along row by row.
    std::vector<int64_t> index(static_cast<size_t>(n - 1));
    int64_t od = 0, os = 0;
    for (int64_t i = n - 2, rest = r0; i >= 0; --i) {
      index[static_cast<size_t>(i)] = rest % dst.size(i);
      rest /= dst.size(i);
      od += index[static_cast<size_t>(i)] * dst.stride(i);
      os += index[static_cast<size_t>(i)] * src.stride(i);
    }
    for (int64_t r = r0; r < r1; ++r) {
      detail::copy_row(d + od * es, s + os * es, row_bytes, stream);
      for (int i = n - 2; i >= 0; --i) {
        od += dst.stride(i);
        os += src.stride(i);
        if (++index[static_cast<size_t>(i)] < dst.size(i)) break;
        od -= dst.size(i) * dst.stride(i);
        os -= dst.size(i) * src.stride(i);
        index[static_cast<size_t>(i)] = 0;
      }
    }
    if (stream) detail::stream_fence();  // each thread's non-temporal stores, before the join
  });
}

// copy_ of two contiguous tensors whose bytes do not overlap: one contiguous range of whole
// chunks per thread (chunks keep a 64-byte aligned dst aligned for the streaming stores), written
// around the caches when the copy is larger than they keep.
void copy_bytes_parallel(std::byte* d, const std::byte* s, size_t bytes) {
  constexpr size_t kChunk = size_t{64} << 10;
  const bool stream = bytes >= detail::kStreamCopyBytes;
  const auto chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  parallel_for(chunks, [&](int64_t c0, int64_t c1, int) {
    const size_t b0 = static_cast<size_t>(c0) * kChunk;
    const size_t b1 = std::min(bytes, static_cast<size_t>(c1) * kChunk);
    detail::copy_row(d + b0, s + b0, b1 - b0, stream);
    if (stream) detail::stream_fence();  // each thread's non-temporal stores, before the join
  });
}

}  // namespace

bool Tensor::may_overlap(const Tensor& other) const {
  if (numel() == 0 || other.numel() == 0) return false;
  const auto [a0, a1] = byte_span(*this);
  const auto [b0, b1] = byte_span(other);
  return a0 < b1 && b0 < a1;
}

void Tensor::copy_(const Tensor& src) {
  DSK_CHECK_ARG(src.dtype() == dtype_, "Tensor::copy_", "src",
                "dtype " + std::string(dtype_name(dtype_)), src.dtype());
  DSK_CHECK_ARG(src.sizes() == sizes_, "Tensor::copy_", "src", describe(), src.describe());
  if (numel() == 0) return;
  const bool parallel = nbytes() >= kParallelCopyBytes && !may_overlap(src);
  if (is_contiguous() && src.is_contiguous()) {
    if (parallel)
      copy_bytes_parallel(static_cast<std::byte*>(data_), static_cast<const std::byte*>(src.data_),
                          nbytes());
    else
      std::memmove(data_, src.data_, nbytes());
    return;
  }
  if (dim() >= 2 && stride(-1) == 1 && src.stride(-1) == 1) {
    if (parallel) {
      copy_rows_parallel(*this, src);
      return;
    }
    for_each_row_pair(*this, src,
                      [](char* d, const char* s, size_t bytes) { std::memmove(d, s, bytes); });
    return;
  }
  const size_t es = element_size();
  for_each_element_pair(*this, src, [es](char* d, const char* s) { std::memcpy(d, s, es); });
}

void Tensor::fill_bytes_(uint8_t byte) {
  if (is_contiguous()) {
    std::memset(data_, byte, nbytes());
    return;
  }
  const size_t es = element_size();
  for_each_element_pair(*this, *this,
                        [es, byte](char* d, const char*) { std::memset(d, byte, es); });
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(sizes_, dtype_);
  t.copy_(*this);
  return t;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) {
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  return os << "]";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "undefined";
  os << t.dtype() << t.sizes();
  if (!t.is_contiguous()) os << " strides " << t.strides();
  return os;
}

// ---- DLPack ----

namespace {

struct DlpackDType {
  DType dtype;
  DLDataType dl;
};

// fp8 / fp4 / ue8m0 have no DLPack 0.6 code: they travel as uint8 (see Tensor::from_dlpack).
constexpr DlpackDType kDlpackTypes[] = {
    {DType::f64, {kDLFloat, 64, 1}}, {DType::f32, {kDLFloat, 32, 1}},
    {DType::f16, {kDLFloat, 16, 1}}, {DType::bf16, {kDLBfloat, 16, 1}},
    {DType::i8, {kDLInt, 8, 1}},     {DType::u8, {kDLUInt, 8, 1}},
    {DType::i16, {kDLInt, 16, 1}},   {DType::i32, {kDLInt, 32, 1}},
    {DType::i64, {kDLInt, 64, 1}},   {DType::e4m3, {kDLUInt, 8, 1}},
    {DType::e5m2, {kDLUInt, 8, 1}},  {DType::fp4x2, {kDLUInt, 8, 1}},
    {DType::ue8m0, {kDLUInt, 8, 1}}, {DType::boolean, {kDLUInt, 8, 1}},
};

DLDataType to_dl(DType t) {
  for (const auto& e : kDlpackTypes)
    if (e.dtype == t) return e.dl;
  return {kDLUInt, 8, 1};
}

DType from_dl(DLDataType dl) {
  for (const auto& e : kDlpackTypes)
    if (e.dl.code == dl.code && e.dl.bits == dl.bits && e.dl.lanes == dl.lanes) return e.dtype;
  DSK_FAIL("Tensor::from_dlpack",
           fmt::format("unsupported DLPack dtype (code {}, bits {}, lanes {})", dl.code, dl.bits,
                       dl.lanes));
}

// Owns the exported view and the shape/stride arrays DLPack points at.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  DSK_CHECK_ARG(defined(), "Tensor::to_dlpack", "self", "a defined tensor", "undefined");
  auto* ctx = new ExportContext{*this, sizes_, strides_, {}};
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = data_;
  dl.device = {kDLCPU, 0};
  dl.ndim = dim();
  dl.dtype = to_dl(dtype_);
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &ctx->managed;
}

Tensor Tensor::from_dlpack(DLManagedTensor* managed, std::optional<DType> as) {
  DSK_CHECK_ARG(managed != nullptr, "Tensor::from_dlpack", "managed", "a non-null DLManagedTensor",
                "nullptr");
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  DSK_CHECK_ARG(dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDAHost,
                "Tensor::from_dlpack", "managed", "a CPU tensor",
                fmt::format("device type {}", static_cast<int>(dl.device.device_type)));
  DSK_CHECK_ARG(dl.ndim >= 0, "Tensor::from_dlpack", "managed", "ndim >= 0", dl.ndim);
  DType dtype = from_dl(dl.dtype);
  if (as) {
    DSK_CHECK_ARG(dsk::element_size(*as) == dsk::element_size(dtype), "Tensor::from_dlpack", "as",
                  fmt::format("a dtype of {} bytes", dsk::element_size(dtype)), *as);
    dtype = *as;
  }
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : contiguous_strides(shape);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  return from_blob(data, shape, dtype, strides, std::move(owner));
}

}  // namespace dsk
