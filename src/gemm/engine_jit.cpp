// The GEMM kernels through dsk::jit: each (ISA, path, dtypes, N, K, block_k) is one instantiation
// of dsk/kernels/gemm/gemm.hpp, compiled on first use and cached on disk; the runtime-shape
// variants in libdsk are the fallback (and are registered as AOT instantiations under their own
// text). All of them run the same template, so they give the same bits.
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <cstdio>

#include <fmt/format.h>

#include <dsk/core/env.hpp>
#include <dsk/core/error.hpp>

#include "gemm/engine_config.hpp"
#include "gemm/engine_kernels.hpp"

namespace dsk::gemm::engine {
namespace {

constexpr const char* kNamespace = "dsk::kernels::gemm";

const char* out_name(kg::OutType t) {
  return t == kg::OutType::f32 ? "f32" : t == kg::OutType::bf16 ? "bf16" : "any";
}

const char* path_name(kg::Path p) {
  return p == kg::Path::large_m ? "large_m" : "small_m";
}

std::string instantiation_of(Backend isa, const kg::GemmConfig& c) {
  return fmt::format(
      "{0}::gemm<dsk::tile::{1}_t, {0}::GemmConfig{{.path = {0}::Path::{2}, .a_type = "
      "{0}::Elem::{3}, .b_type = {0}::Elem::{4}, .d_type = {0}::OutType::{5}, .n = {6}, .k = {7}, "
      ".block_k = {8}}}>",
      kNamespace, backend_name(isa), path_name(c.path), elem_name(c.a_type), elem_name(c.b_type),
      out_name(c.d_type), c.n, c.k, c.block_k);
}

KernelFn runtime_variant(Backend isa, kg::Path path) {
  const IsaKernels& k = kernels_for(isa);
  return path == kg::Path::large_m ? k.large_m : k.small_m;
}

// The runtime variants under their own instantiation text, so find_aot knows them too.
[[maybe_unused]] const bool kRegistered = [] {
  for (Backend isa : {Backend::generic, Backend::avx512, Backend::amx}) {
    const IsaKernels& k = kernels_for(isa);
    if (k.large_m_entry)
      jit::register_aot(instantiation_of(isa, {.path = kg::Path::large_m}), k.large_m_entry);
    if (k.small_m_entry)
      jit::register_aot(instantiation_of(isa, {.path = kg::Path::small_m}), k.small_m_entry);
  }
  return true;
}();

}  // namespace

jit::KernelSource kernel_source(Backend isa, const kg::GemmConfig& c) {
  return {.name = fmt::format("gemm_{}_{}_{}_{}_n{}_k{}_bk{}_{}", elem_name(c.a_type),
                              elem_name(c.b_type), out_name(c.d_type), path_name(c.path), c.n, c.k,
                              c.block_k, backend_name(isa)),
          .module = "GEMM",
          .header = "dsk/kernels/gemm/gemm.hpp",
          .instantiation = instantiation_of(isa, c),
          .args_type = "dsk::kernels::gemm::GemmArgs",
          .isa = isa,
          .dependency_signature = ""};
}

jit::Kernel<kg::GemmArgs> kernel(Backend isa, const kg::GemmConfig& c) {
  using Key =
      std::tuple<Backend, kg::Path, kg::Elem, kg::Elem, kg::OutType, int, int, int, std::string>;
  static std::mutex mutex;
  static std::map<Key, jit::Kernel<kg::GemmArgs>> kernels;
  // Read every call: tests turn the JIT off and on (DSK_GEMM_JIT > DSK_JIT).
  const std::string jit_mode = env::get_string("GEMM", "JIT", "auto");
  const Key key{isa, c.path, c.a_type, c.b_type, c.d_type, c.n, c.k, c.block_k, jit_mode};
  std::lock_guard lock(mutex);
  if (auto it = kernels.find(key); it != kernels.end()) return it->second;
  const KernelFn fallback = runtime_variant(isa, c.path);
  DSK_CHECK(fallback != nullptr, "dsk::gemm",
            fmt::format("this build has no {} GEMM kernels", backend_name(isa)));
  jit::Kernel<kg::GemmArgs> k;
  try {
    k = jit::get<kg::GemmArgs>(kernel_source(isa, c), fallback);
  } catch (const Error& e) {
    // A kernel that does not compile here is a bug, but the built-in variant computes the same.
    fmt::print(stderr, "dsk::gemm: warning: JIT kernel unavailable, using the built-in one: {}\n",
               e.what());
    k = jit::Kernel<kg::GemmArgs>(nullptr, fallback, jit::Provider::runtime);
  }
  kernels.emplace(key, k);
  return k;
}

}  // namespace dsk::gemm::engine
