// Tensor: a typed, strided view of shared storage (DESIGN §3).
//
// - Shapes and strides are in elements (int64); fp4x2 counts bytes, like upstream's int8 view.
// - Tensor::empty allocates 64-byte aligned storage (2 MiB aligned with transparent huge pages for
//   buffers of 2 MiB or more; buffers of 64 KiB or more are cached for reuse when freed, up to
//   DSK_TENSOR_CACHE_MB); copies of a Tensor share the storage; views
//   (view/slice/select/transpose) share it too.
// - Tensor::from_blob wraps memory the caller owns (optionally kept alive by `owner`).
// - DLPack import/export shares memory with other frameworks without copies.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <dsk/core/dtype.hpp>
#include <dsk/core/error.hpp>

struct DLManagedTensor;

namespace dsk {

using Shape = std::vector<int64_t>;

class Tensor {
 public:
  // An undefined tensor (defined() is false), like an empty std::optional.
  Tensor() = default;

  // Uninitialised, contiguous, 64-byte aligned.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  // A non-owning view of caller memory; empty `strides` means contiguous. `owner`, if given, is
  // kept alive as long as any view of the tensor exists.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, const Shape& strides = {},
                          std::shared_ptr<void> owner = {});
  // Takes ownership of `managed` (its deleter runs when the last view is gone). fp8/fp4/ue8m0
  // travel as uint8 in DLPack 0.6; pass `as` to reinterpret a byte tensor as one of them.
  static Tensor from_dlpack(DLManagedTensor* managed, std::optional<DType> as = std::nullopt);
  // A new DLPack reference to this tensor's memory; the consumer calls its deleter.
  DLManagedTensor* to_dlpack() const;

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  int dim() const { return static_cast<int>(sizes_.size()); }
  const Shape& sizes() const { return sizes_; }
  const Shape& strides() const { return strides_; }
  // Negative d counts from the last dimension; out-of-range d raises dsk::Error.
  int64_t size(int d) const { return sizes_[wrap_dim(d)]; }
  int64_t stride(int d) const { return strides_[wrap_dim(d)]; }
  int64_t numel() const;
  size_t element_size() const { return dsk::element_size(dtype_); }
  // numel() * element_size(): the bytes a contiguous copy occupies.
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  // Whether the byte ranges the two tensors' elements span intersect (a conservative test:
  // interleaved views of one buffer count as overlapping; empty tensors overlap nothing).
  bool may_overlap(const Tensor& other) const;

  void* data_ptr() const { return data_; }
  // Typed pointer; raises dsk::Error when T does not match dtype().
  template <class T>
  T* data() const {
    DSK_CHECK_ARG(dtype_of_v<T> == dtype_, "Tensor::data", "T", dtype_of_v<T>, dtype_);
    return static_cast<T*>(data_);
  }
  // Reads/writes element `index` of a tensor as T (no dtype check); for tests and small host code.
  template <class T>
  T& at(std::initializer_list<int64_t> index) const {
    return *reinterpret_cast<T*>(static_cast<char*>(data_) + offset_bytes(index));
  }

  // Views sharing the storage.
  Tensor view(const Shape& shape) const;  // needs a contiguous tensor; one -1 entry is inferred
  Tensor slice(int d, int64_t begin, int64_t end) const;
  Tensor select(int d, int64_t index) const;  // removes dimension d
  Tensor transpose(int d0, int d1) const;
  Tensor unsqueeze(int d) const;
  // Same bytes, another element type of the same size (e4m3 <-> u8 <-> i8, i32 <-> f32, ...).
  Tensor reinterpret(DType dtype) const;

  // Copies.
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;       // always a new contiguous buffer
  // Element-wise copy from a tensor of the same shape and dtype, any strides.
  void copy_(const Tensor& src);
  // Sets every byte of every element to `byte` (0xFF poisons f32/bf16 with NaN).
  void fill_bytes_(uint8_t byte);

  // True when both tensors view the same storage (not necessarily the same elements).
  bool shares_storage_with(const Tensor& other) const {
    return storage_ && storage_ == other.storage_;
  }
  // "bfloat16[4, 128]" (plus strides when not contiguous): for error messages.
  std::string describe() const;

 private:
  int wrap_dim(int d) const;
  size_t offset_bytes(std::initializer_list<int64_t> index) const;

  std::shared_ptr<void> storage_;  // keeps the memory alive; empty for unowned blobs
  void* data_ = nullptr;           // the first element
  Shape sizes_;
  Shape strides_;
  DType dtype_ = DType::f32;
  bool defined_ = false;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::ostream& operator<<(std::ostream& os, const Shape& shape);

// Contiguous strides of a shape (row-major).
Shape contiguous_strides(const Shape& shape);

// Frees the blocks the tensor allocator keeps for reuse (see Tensor::empty); returns the
// bytes given back. Storage still in use by a tensor is not affected.
size_t release_cached_tensor_memory();

}  // namespace dsk
