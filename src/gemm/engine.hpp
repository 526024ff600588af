// The contract between dsk::gemm's API layer (src/gemm/api_*.cpp: argument checks, recipes, scale
// layouts, grouped layouts, early returns) and its engine (src/gemm/engine_*.cpp: weight packing,
// kernel selection, threading, the JIT). Private to src/gemm.
//
// The API layer hands the engine canonical problems only: operands as strided views with their
// scales already converted to f32 [rows / gran_mn, k / gran_k] (row-major, any leading dimension),
// D as a strided row-major view already holding C when accumulating. The engine never re-checks
// arguments (DESIGN §2: kernels assume valid input).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <dsk/core/dtype.hpp>
#include <dsk/gemm.hpp>

namespace dsk::gemm::engine {

// Scale factors of one operand: f32 values, one per gran_mn x gran_k block, block (r, kb) at
// data[r * ld + kb]. power_of_two: every value is an exact power of two (UE8M0 recipes), which
// lets kernels fold them into the widening of FP8/FP4 values to bf16 exactly.
struct Scales {
  const float* data = nullptr;  // nullptr: no scales (bf16 operands)
  int64_t ld = 0;
  int gran_mn = 1;
  int gran_k = 128;
  bool power_of_two = false;
};

// A logical matrix [rows, k]: element (r, kk) at data + r * stride_r + kk * stride_k (in
// elements). dtype bf16, e4m3 or fp4x2; fp4x2 operands are K-major (stride_k == 1 counts bytes,
// i.e. element pairs: value kk of row r is nibble kk % 2 of byte data + r * stride_r + kk / 2).
struct Operand {
  const void* data = nullptr;
  DType dtype = DType::bf16;
  int64_t rows = 0, k = 0;
  int64_t stride_r = 0, stride_k = 1;
  Scales sf;
};

// D [m, n], row-major with leading dimension ld (elements), f32 or bf16.
struct Output {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t m = 0, n = 0, ld = 0;
};

// A weight in the kernels' layout (PackedWeight::Impl holds one per group).
class PackedB;

// Packs B [n, k] (one group) for the kernels; b.sf holds B's scales when b is FP8/FP4.
std::shared_ptr<const PackedB> pack_b(const Operand& b);
int64_t packed_n(const PackedB& b);
int64_t packed_k(const PackedB& b);
DType packed_dtype(const PackedB& b);
size_t packed_bytes(const PackedB& b);

// One product of a batch: D = (accumulate ? D : 0) + A · Bᵀ.
struct Segment {
  Operand a;  // [m, k]
  const PackedB* b = nullptr;
  Output d;  // [m, n]
};

// Runs every segment (dense GEMM = one segment; grouped GEMMs = one per non-empty group segment)
// as one parallel job. Deterministic: each D element is computed by one thread in a fixed order,
// whatever the thread count.
void run(std::span<const Segment> segments, bool accumulate);

}  // namespace dsk::gemm::engine

// The public PackedWeight is a list of per-group packed weights.
struct dsk::gemm::PackedWeight::Impl {
  std::vector<std::shared_ptr<const engine::PackedB>> groups;
  int64_t n = 0, k = 0;
  DType dtype = DType::bf16;
};
