// The generated kernel.cpp and the cache key: XXH3-128 over length-prefixed components (name,
// generated source, every <dsk/kernels/...> header it reaches, compiler identity, flags, target
// CPU, dependency signature).
#include <xxhash.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/core.h>

#include "internal.hpp"

namespace dsk::jit::internal {
namespace {

// Bumped when the key's layout or the generated code's shape changes, so old entries miss.
constexpr std::string_view kKeyVersion = "dsk-jit-key-1";

class Hasher {
 public:
  Hasher() : state_(XXH3_createState(), &XXH3_freeState) { XXH3_128bits_reset(state_.get()); }

  // Each component is prefixed by its length, so ("ab", "c") and ("a", "bc") differ.
  void add(std::string_view component) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(component.size() >> (8 * i));
    XXH3_128bits_update(state_.get(), length, sizeof(length));
    XXH3_128bits_update(state_.get(), component.data(), component.size());
  }

  std::string hex() const { return to_hex(XXH3_128bits_digest(state_.get())); }

  static std::string to_hex(XXH128_hash_t hash) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, hash);
    std::string out;
    for (unsigned char byte : canonical.digest) out += fmt::format("{:02x}", byte);
    return out;
  }

 private:
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

bool all_of_chars(std::string_view text, std::string_view allowed_punctuation) {
  for (char c : text) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && allowed_punctuation.find(c) == std::string_view::npos) return false;
  }
  return true;
}

bool is_kernel_header_path(std::string_view path) {
  if (path.substr(0, 12) != "dsk/kernels/" || path.size() == 12) return false;
  if (!all_of_chars(path, "_./-")) return false;
  for (const fs::path& part : fs::path(path))
    if (part == ".." || part == ".") return false;
  return true;
}

struct Include {
  char delimiter;  // '<', '"', or '?' for a computed include (#include MACRO)
  std::string path;
};

// The target of an #include line, or nullopt for any other line.
std::optional<Include> parse_include(std::string_view line) {
  size_t i = line.find_first_not_of(" \t");
  if (i == std::string_view::npos || line[i] != '#') return std::nullopt;
  i = line.find_first_not_of(" \t", i + 1);
  if (i == std::string_view::npos || line.substr(i, 7) != "include") return std::nullopt;
  i += 7;
  if (i < line.size() && line[i] == '_') return std::nullopt;  // #include_next: system headers
  i = line.find_first_not_of(" \t", i);
  if (i == std::string_view::npos) return Include{'?', ""};
  const char open = line[i];
  const char close = open == '<' ? '>' : '"';
  if (open != '<' && open != '"') return Include{'?', std::string(line.substr(i))};
  const size_t end = line.find(close, i + 1);
  if (end == std::string_view::npos) return Include{'?', std::string(line.substr(i))};
  return Include{open, std::string(line.substr(i + 1, end - i - 1))};
}

// Every <dsk/kernels/...> header reached from a text, by path under the include root, with its
// content (nullopt when the file does not exist: a header behind an #if the compiler may skip).
class HeaderTracker {
 public:
  explicit HeaderTracker(fs::path root) : root_(std::move(root)) {}

  void scan(const std::string& text, const std::string& from) {
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      const std::optional<Include> inc = parse_include(line);
      if (!inc) continue;
      check_allowed(*inc, from);
      if (inc->delimiter == '<' && inc->path.substr(0, 4) == "dsk/") visit(inc->path);
    }
  }

  const std::map<std::string, std::optional<std::string>>& headers() const { return headers_; }

 private:
  static void check_allowed(const Include& inc, const std::string& from) {
    DSK_CHECK(inc.delimiter != '?', "dsk::jit::cache_key",
              fmt::format("{}: '#include {}': the JIT tracks only literal <...> includes", from,
                          inc.path));
    DSK_CHECK(inc.delimiter != '"', "dsk::jit::cache_key",
              fmt::format("{}: '#include \"{}\"': kernel headers include each other as "
                          "<dsk/kernels/...> so that the JIT can track them",
                          from, inc.path));
    if (inc.path.substr(0, 4) != "dsk/") return;  // a standard or intrinsics header
    DSK_CHECK(is_kernel_header_path(inc.path), "dsk::jit::cache_key",
              fmt::format("{}: '#include <{}>': kernel code may include only <dsk/kernels/...> "
                          "and standard headers",
                          from, inc.path));
  }

  void visit(const std::string& path) {
    if (headers_.count(path)) return;
    std::ifstream in(root_ / path, std::ios::binary);
    if (!in) {
      headers_[path] = std::nullopt;
      return;
    }
    std::ostringstream content;
    content << in.rdbuf();
    headers_[path] = content.str();
    scan(content.str(), path);
  }

  fs::path root_;
  std::map<std::string, std::optional<std::string>> headers_;
};

}  // namespace

void validate(const char* function, const KernelSource& s) {
  DSK_CHECK_ARG(!s.name.empty() && s.name.size() <= 200 && all_of_chars(s.name, "_"), function,
                "source.name", "1 to 200 characters of [A-Za-z0-9_]", "'" + s.name + "'");
  DSK_CHECK_ARG(all_of_chars(s.module, "_"), function, "source.module",
                "characters of [A-Za-z0-9_] (an env prefix such as GEMM)", "'" + s.module + "'");
  DSK_CHECK_ARG(is_kernel_header_path(s.header), function, "source.header",
                "a path 'dsk/kernels/...' without '.' or '..' parts", "'" + s.header + "'");
  DSK_CHECK_ARG(!s.instantiation.empty() && s.instantiation.find('\n') == std::string::npos,
                function, "source.instantiation", "a one-line template instantiation",
                "'" + s.instantiation + "'");
  DSK_CHECK_ARG(!s.args_type.empty() && all_of_chars(s.args_type, "_:<>, "), function,
                "source.args_type", "a qualified type name", "'" + s.args_type + "'");
}

void check_include_root(const Settings& settings) {
  std::error_code ec;
  if (settings.include_root.empty())
    throw Unavailable{
        "the kernel headers (<dsk/kernels/...>) were not found; set "
        "DSK_JIT_INCLUDE_DIR to the include directory that holds them"};
  if (!fs::is_directory(settings.include_root / "dsk" / "kernels", ec))
    throw Unavailable{fmt::format("the include directory '{}' has no dsk/kernels",
                                  settings.include_root.string())};
}

CacheKey compute_key(const KernelSource& source, const Settings& settings) {
  check_include_root(settings);
  std::error_code ec;
  DSK_CHECK(fs::exists(settings.include_root / source.header, ec), "dsk::jit::cache_key",
            fmt::format("source.header: '{}' does not exist under '{}'", source.header,
                        settings.include_root.string()));
  CacheKey key;
  key.compiler = settings.compiler;
  const std::string identity = compiler_identity(settings.compiler);
  key.compiler_identity = identity.substr(0, identity.find('\n'));
  key.flags = effective_flags(settings, source.isa);
  key.include_root = settings.include_root;

  const std::string code = generate_source(source);
  HeaderTracker tracker(settings.include_root);
  tracker.scan(code, "kernel.cpp");

  Hasher h;
  h.add(kKeyVersion);
  h.add(source.name);
  h.add(code);
  for (const auto& [path, content] : tracker.headers()) {
    key.headers.push_back(path);
    h.add(path);
    h.add(content ? "present" : "missing");
    h.add(content.value_or(""));
  }
  h.add(identity);
  h.add(std::to_string(key.flags.size()));
  for (const std::string& flag : key.flags) h.add(flag);
  h.add(target_identity());
  h.add(source.dependency_signature);
  key.digest = h.hex();
  return key;
}

std::optional<std::string> file_digest(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string data = bytes.str();
  return Hasher::to_hex(XXH3_128bits(data.data(), data.size()));
}

}  // namespace dsk::jit::internal

namespace dsk::jit {

std::string generate_source(const KernelSource& source) {
  internal::validate("dsk::jit::generate_source", source);
  return fmt::format(
      "// Generated by dsk::jit for kernel {}; do not edit.\n"
      "#include <{}>\n"
      "\n"
      "extern \"C\" __attribute__((visibility(\"default\"))) void dsk_jit_entry(const void* args) "
      "{{\n"
      "  {}(*static_cast<const {}*>(args));\n"
      "}}\n",
      source.name, source.header, source.instantiation, source.args_type);
}

CacheKey cache_key(const KernelSource& source) {
  internal::validate("dsk::jit::cache_key", source);
  try {
    return internal::compute_key(source, internal::read_settings(source.module));
  } catch (const internal::Unavailable& u) {
    DSK_FAIL("dsk::jit::cache_key", u.reason);
  }
}

}  // namespace dsk::jit
