// The engine's view of the GEMM kernels compiled into libdsk, one set per ISA translation unit
// (engine_kernels_generic.cpp, engine_kernels_avx512.cpp, engine_kernels_amx.cpp): the
// runtime-shape variant of each kernel path (the JIT's fallback) and the weight packer. Private to
// src/gemm.
#pragma once

#include <cstddef>
#include <cstdint>

#include <string>

#include <dsk/core/cpu.hpp>
#include <dsk/core/tensor.hpp>
#include <dsk/jit.hpp>
#include <dsk/kernels/gemm/args.hpp>
#include <dsk/kernels/gemm/layout.hpp>

namespace dsk::gemm::engine {

namespace kg = dsk::kernels::gemm;

// A packed weight: its layout and the bytes it describes (a Tensor's storage: 64-byte aligned, on
// huge pages when large).
class PackedB {
 public:
  kg::PackedLayout layout;
  DType dtype = DType::bf16;
  Tensor storage;

  const std::byte* data() const { return static_cast<const std::byte*>(storage.data_ptr()); }
};

using KernelFn = void (*)(const kg::GemmArgs&);

struct IsaKernels {
  KernelFn large_m = nullptr;  // gemm<isa, {.path = large_m}> with every other knob at run time
  KernelFn small_m = nullptr;
  jit::Entry large_m_entry = nullptr;  // the same two as AOT entries (jit::aot_entry)
  jit::Entry small_m_entry = nullptr;
  // Writes panels [p0, p1) of the packed form of `source` at dst + p * layout.panel_bytes.
  void (*pack_panels)(const kg::PackedLayout& layout, const kg::PackSource& source, int64_t p0,
                      int64_t p1, std::byte* dst) = nullptr;
};

// Defined by the ISA translation units; the avx512 and amx ones are empty when the compiler
// cannot build them.
const IsaKernels& generic_kernels();
const IsaKernels& avx512_kernels();
const IsaKernels& amx_kernels();
const IsaKernels& kernels_for(Backend isa);

// ---- the JIT (engine_jit.cpp) ----

// gemm<isa, config> as dsk::jit compiles it: name gemm_<a>_<b>_<d>_<path>_n<N>_k<K>_bk<BK>_<isa>.
jit::KernelSource kernel_source(Backend isa, const kg::GemmConfig& config);
// The kernel for (isa, config): JIT-compiled (DSK_GEMM_JIT_* / DSK_JIT_* settings), else the
// runtime-shape variant compiled into libdsk. Looked up once per process and config.
jit::Kernel<kg::GemmArgs> kernel(Backend isa, const kg::GemmConfig& config);

}  // namespace dsk::gemm::engine
