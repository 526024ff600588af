// The safetensors format: a checked, memory-mapped reader and a streaming writer (safetensors.hpp).
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dsk::model::safetensors {
namespace {

using nlohmann::json;

constexpr const char* kRead = "dsk::model::load_checkpoint";
constexpr const char* kWrite = "dsk::model::save_checkpoint";
// The upstream library's limit on the header; also keeps a corrupt length from allocating much.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr std::array<std::pair<DType, std::string_view>, 13> kDTypeNames = {{
    {DType::f64, "F64"},
    {DType::f32, "F32"},
    {DType::f16, "F16"},
    {DType::bf16, "BF16"},
    {DType::e4m3, "F8_E4M3"},
    {DType::e5m2, "F8_E5M2"},
    {DType::ue8m0, "F8_E8M0"},
    {DType::i8, "I8"},
    {DType::u8, "U8"},
    {DType::i16, "I16"},
    {DType::i32, "I32"},
    {DType::i64, "I64"},
    {DType::boolean, "BOOL"},
}};

// A read-only mapping of a whole file, unmapped when the last tensor viewing it is gone.
std::shared_ptr<void> map_file(const std::filesystem::path& path, uint64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DSK_CHECK(fd >= 0, kRead,
            fmt::format("{}: cannot open ({})", path.string(), std::strerror(errno)));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  size = stat_ok ? static_cast<uint64_t>(st.st_size) : 0;
  if (!stat_ok || size < 8) {
    ::close(fd);
    DSK_FAIL(kRead, fmt::format("{}: {} bytes, shorter than the 8-byte header length",
                                path.string(), size));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  DSK_CHECK(p != MAP_FAILED, kRead,
            fmt::format("{}: cannot map ({})", path.string(), std::strerror(map_errno)));
  return std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// Reads and checks one header entry; every error names the file and the tensor.
class EntryParser {
 public:
  EntryParser(const std::filesystem::path& path, std::string name, const json& v)
      : path_(path), name_(std::move(name)), v_(v) {}

  Entry parse() const {
    check(v_.is_object(), "an object {dtype, shape, data_offsets}", v_.dump());
    Entry e{name_, dtype(), shape(), 0, 0};
    const json& offsets = field("data_offsets");
    check(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
              offsets[1].is_number_unsigned(),
          "data_offsets as two non-negative integers [begin, end]", offsets.dump());
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    check(e.begin <= e.end, "data_offsets with begin <= end", offsets.dump());
    const int64_t bytes = data_bytes(e.dtype, e.shape);
    check(bytes >= 0 && e.end - e.begin == static_cast<uint64_t>(bytes),
          fmt::format("data_offsets spanning {} bytes ({}{})", bytes,
                      format_dtype_name(e.dtype).value(), detail::to_text(e.shape)),
          fmt::format("{} bytes", e.end - e.begin));
    return e;
  }

 private:
  const json& field(const char* key) const {
    check(v_.contains(key), fmt::format("a \"{}\" field", key), v_.dump());
    return v_.at(key);
  }
  DType dtype() const {
    const json& d = field("dtype");
    const auto t = d.is_string() ? dtype_from_format_name(d.get<std::string>()) : std::nullopt;
    check(t.has_value(), "a known dtype (F64, F32, F16, BF16, F8_E4M3, F8_E5M2, ...)", d.dump());
    return *t;
  }
  Shape shape() const {
    const json& s = field("shape");
    check(s.is_array() && s.size() <= 8, "shape as a list of at most 8 sizes", s.dump());
    Shape shape;
    for (const json& d : s) {
      check(d.is_number_unsigned() && d.get<uint64_t>() <= (uint64_t{1} << 40),
            "sizes that are integers in [0, 2^40]", s.dump());
      shape.push_back(d.get<int64_t>());
    }
    return shape;
  }
  void check(bool ok, const std::string& expected, const std::string& got) const {
    DSK_CHECK(
        ok, kRead,
        fmt::format("{}: tensor '{}': expected {}, got {}", path_.string(), name_, expected, got));
  }

  const std::filesystem::path& path_;
  std::string name_;
  const json& v_;
};

std::map<std::string, std::string> parse_metadata(const std::filesystem::path& path,
                                                  const json& m) {
  std::map<std::string, std::string> out;
  DSK_CHECK(m.is_object(), kRead,
            fmt::format("{}: __metadata__: expected an object, got {}", path.string(), m.dump()));
  for (const auto& [key, value] : m.items())
    out[key] = value.is_string() ? value.get<std::string>() : value.dump();
  return out;
}

// The entries must tile [0, data_bytes) exactly, in offset order.
void check_layout(const std::filesystem::path& path, std::vector<Entry>& entries,
                  uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  for (const Entry& e : entries) {
    DSK_CHECK(e.end <= data_bytes, kRead,
              fmt::format("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data "
                          "({} bytes; the file is truncated or the header is wrong)",
                          path.string(), e.name, e.begin, e.end, data_bytes));
    DSK_CHECK(
        e.begin == expected_begin, kRead,
        fmt::format("{}: tensor '{}': data_offsets [{}, {}] {} the previous tensor's data "
                    "(which ends at {})",
                    path.string(), e.name, e.begin, e.end,
                    e.begin < expected_begin ? "overlap" : "leave a gap after", expected_begin));
    expected_begin = e.end;
  }
  DSK_CHECK(expected_begin == data_bytes, kRead,
            fmt::format("{}: the tensors' data ends at byte {} of {} data bytes (extra bytes at "
                        "the end of the file)",
                        path.string(), expected_begin, data_bytes));
}

void write_all(std::FILE* f, const void* data, size_t bytes, const std::filesystem::path& path) {
  DSK_CHECK(bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes, kWrite,
            fmt::format("{}: write failed ({})", path.string(), std::strerror(errno)));
}

std::string header_text(const std::vector<TensorSpec>& specs,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& s : specs) {
    const auto name = format_dtype_name(s.dtype);
    DSK_CHECK(name.has_value(), kWrite,
              fmt::format("tensor '{}': {} has no safetensors dtype", s.name, dtype_name(s.dtype)));
    DSK_CHECK(!header.contains(s.name), kWrite,
              fmt::format("tensor '{}' appears twice in one file", s.name));
    const auto bytes = static_cast<uint64_t>(data_bytes(s.dtype, s.shape));
    header[s.name] = {{"dtype", *name},
                      {"shape", s.shape},
                      {"data_offsets", json::array({offset, offset + bytes})}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  return text;
}

}  // namespace

std::optional<std::string_view> format_dtype_name(DType dtype) {
  for (const auto& [t, name] : kDTypeNames)
    if (t == dtype) return name;
  return std::nullopt;
}

std::optional<DType> dtype_from_format_name(std::string_view name) {
  for (const auto& [t, n] : kDTypeNames)
    if (n == name) return t;
  return std::nullopt;
}

int64_t data_bytes(DType dtype, const Shape& shape) {
  int64_t bytes = static_cast<int64_t>(element_size(dtype));
  for (int64_t d : shape) {
    if (d < 0 || (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d)) return -1;
    bytes *= d;
  }
  return bytes;
}

File read(const std::filesystem::path& path) {
  uint64_t size = 0;
  std::shared_ptr<void> mapping = map_file(path, size);
  const auto* bytes = static_cast<const unsigned char*>(mapping.get());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];  // little-endian
  DSK_CHECK(header_len <= size - 8 && header_len <= kMaxHeaderBytes, kRead,
            fmt::format("{}: header length {} runs past the end of the file ({} bytes)",
                        path.string(), header_len, size));
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  const json header = json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  DSK_CHECK(!header.is_discarded() && header.is_object(), kRead,
            fmt::format("{}: the {}-byte header is not a JSON object", path.string(), header_len));

  File file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__")
      file.metadata = parse_metadata(path, value);
    else
      entries.push_back(EntryParser(path, name, value).parse());
  }
  const uint64_t data_start = 8 + header_len;
  check_layout(path, entries, size - data_start);
  for (const Entry& e : entries) {
    void* data = const_cast<unsigned char*>(bytes + data_start + e.begin);
    file.tensors[e.name] = Tensor::from_blob(data, e.shape, e.dtype, {}, mapping);
  }
  return file;
}

Writer::Writer(std::filesystem::path path, std::vector<TensorSpec> specs,
               const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), partial_(path_.string() + ".partial"), specs_(std::move(specs)) {
  const std::string header = header_text(specs_, metadata);
  file_ = std::fopen(partial_.c_str(), "wb");
  DSK_CHECK(file_ != nullptr, kWrite,
            fmt::format("{}: cannot create ({})", partial_.string(), std::strerror(errno)));
  std::array<unsigned char, 8> length{};
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  write_all(file_, length.data(), length.size(), partial_);
  write_all(file_, header.data(), header.size(), partial_);
}

Writer::~Writer() {
  if (!file_) return;
  std::fclose(file_);  // unfinished: drop the partial file
  std::error_code ignored;
  std::filesystem::remove(partial_, ignored);
}

void Writer::write(const std::string& name, const Tensor& tensor) {
  DSK_CHECK(
      file_ && next_ < specs_.size(), kWrite,
      fmt::format("{}: tensor '{}' written after the last planned tensor", path_.string(), name));
  const TensorSpec& s = specs_[next_];
  DSK_CHECK(name == s.name && tensor.dtype() == s.dtype && tensor.sizes() == s.shape, kWrite,
            fmt::format("{}: expected tensor '{}' {}{} next, got '{}' {}", path_.string(), s.name,
                        format_dtype_name(s.dtype).value_or("?"), detail::to_text(s.shape), name,
                        tensor.describe()));
  const Tensor c = tensor.contiguous();
  write_all(file_, c.data_ptr(), c.nbytes(), partial_);
  ++next_;
}

void Writer::finish() {
  DSK_CHECK(
      file_ && done(), kWrite,
      fmt::format("{}: finished after {} of {} tensors", path_.string(), next_, specs_.size()));
  const bool flushed = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  std::error_code ec;
  if (flushed && closed) std::filesystem::rename(partial_, path_, ec);
  if (!flushed || !closed || ec) {
    std::filesystem::remove(partial_, ec);
    DSK_FAIL(kWrite, fmt::format("{}: could not complete the file", path_.string()));
  }
}

void write(const std::filesystem::path& path,
           const std::vector<std::pair<std::string, Tensor>>& tensors,
           const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.dtype(), t.sizes()});
  Writer w(path, std::move(specs), metadata);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
}

}  // namespace dsk::model::safetensors
