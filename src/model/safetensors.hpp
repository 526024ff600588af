// Private to src/model: the safetensors file format (reader and streaming writer).
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<text>", ...}}
// then the tensor data, row-major, at offsets relative to the end of the header. Like the
// upstream library, the reader accepts only files whose tensors tile the data exactly (no gaps,
// no overlaps, nothing after the last tensor), and the writer pads the header with spaces to a
// multiple of 8 bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <dsk/model.hpp>

namespace dsk::model::safetensors {

// "F8_E4M3", "BF16", "F32", ...; nullopt for dtypes the format has no name for (fp4x2).
std::optional<std::string_view> format_dtype_name(DType dtype);
std::optional<DType> dtype_from_format_name(std::string_view name);

struct File {
  std::map<std::string, Tensor> tensors;  // read-only views into the mapping, which they keep alive
  std::map<std::string, std::string> metadata;
};

// Maps `path` read-only and checks it completely; any defect raises dsk::Error naming the file
// (and the tensor). Writing through a returned tensor faults: the mapping is read-only.
File read(const std::filesystem::path& path);

// Bytes the data of a tensor of this dtype and shape takes.
int64_t data_bytes(DType dtype, const Shape& shape);

// Writes one file tensor by tensor: the header (from the specs, in their order) first, then each
// tensor's data as write() is called, in the same order. The file appears under its name only
// when finish() succeeds (it is written as "<path>.partial" and renamed), so an interrupted write
// never leaves a file that looks complete.
class Writer {
 public:
  Writer(std::filesystem::path path, std::vector<TensorSpec> specs,
         const std::map<std::string, std::string>& metadata = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // The next tensor: its name, dtype and shape must be those of the next spec.
  void write(const std::string& name, const Tensor& tensor);
  bool done() const { return next_ == specs_.size(); }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  void finish();

 private:
  std::filesystem::path path_;
  std::filesystem::path partial_;
  std::vector<TensorSpec> specs_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
};

// The whole file at once, tensors in the given order.
void write(const std::filesystem::path& path,
           const std::vector<std::pair<std::string, Tensor>>& tensors,
           const std::map<std::string, std::string>& metadata = {});

}  // namespace dsk::model::safetensors
