// Helpers of the tk API layer (common.hpp).
#include "common.hpp"

#include <cmath>
#include <cstring>

#include <dsk/core/cpu.hpp>
#include <dsk/core/threads.hpp>

namespace dsk::tk::detail {

const KernelTable& kernel_table() {
  return backend() == Backend::generic ? kernel_table_generic() : kernel_table_avx512();
}

// NOTES: below ~64 Ki elements of work a call is over before the pool's threads wake up, so small
// problems (decode steps, T = 1..7) run on the caller.
void parallel_rows(int64_t rows, int64_t cost_per_row,
                   const std::function<void(int64_t, int64_t)>& fn) {
  if (rows <= 0) return;
  constexpr int64_t kMinParallelWork = int64_t{1} << 16;
  if (rows == 1 || rows * cost_per_row < kMinParallelWork) return fn(0, rows);
  parallel_for(rows, [&](int64_t begin, int64_t end, int) { fn(begin, end); });
}

Elt elt_of(const char* fn, const char* arg, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return kF32;
    case DType::bf16:
      return kBf16;
    case DType::f16:
      return kF16;
    case DType::e4m3:
      return kE4m3;
    default:
      DSK_CHECK_ARG(false, fn, arg, "a float32, bfloat16, float16 or float8_e4m3fn tensor", dtype);
      return kF32;
  }
}

kernels::QuantFormat parse_quant_format(const char* fn, std::string_view fmt) {
  if (fmt == "e4m3") return kernels::QuantFormat::e4m3;
  if (fmt == "e2m1") return kernels::QuantFormat::e2m1;
  DSK_CHECK_ARG(false, fn, "fmt", "\"e4m3\" or \"e2m1\"", fmt);
  return kernels::QuantFormat::e4m3;
}

Scales alloc_scales(int64_t rows, int64_t blocks, bool col_major, bool packed) {
  const int64_t cols = packed ? ceil_div(blocks, 4) : blocks;
  const DType dtype = packed ? DType::i32 : DType::f32;
  Scales s;
  s.layout.packed = packed;
  if (!col_major) {
    s.tensor = Tensor::empty({rows, cols}, dtype);
    s.layout.row_stride = cols;
    s.layout.col_stride = 1;
  } else {
    // MN-major with the MN extent padded to 16 bytes (4 words), as TMA-aligned layouts are.
    const int64_t padded_rows = align_up(rows, 4);
    Tensor storage = Tensor::empty({cols, padded_rows}, dtype);
    if (packed) storage.fill_bytes_(0x7F);
    s.tensor = storage.slice(1, 0, rows).transpose(0, 1);
    s.layout.row_stride = 1;
    s.layout.col_stride = padded_rows;
  }
  if (packed && !col_major) s.tensor.fill_bytes_(0x7F);
  s.layout.data = s.tensor.data_ptr();
  return s;
}

kernels::ScaleLayout read_scales(const char* fn, const char* arg, const Tensor& sf, int64_t rows,
                                 int64_t blocks) {
  check::defined(fn, arg, sf);
  check::dtype_in(fn, arg, sf, {DType::f32, DType::i32});
  check::dim(fn, arg, sf, 2);
  const bool packed = sf.dtype() == DType::i32;
  check::shape(fn, arg, sf, {rows, packed ? ceil_div(blocks, 4) : blocks});
  kernels::ScaleLayout l;
  l.data = sf.data_ptr();
  l.packed = packed;
  l.row_stride = sf.stride(0);
  l.col_stride = sf.stride(1);
  return l;
}

void check_cast_options(const char* fn, kernels::QuantFormat, bool, bool round_sf, bool packed) {
  DSK_CHECK_ARG(!packed || round_sf, fn, "use_packed_ue8m0",
                "round_sf = true (packed scales are UE8M0 powers of two)", "round_sf = false");
}

void check_ids_tensor(const char* fn, const char* arg, const Tensor& ids) {
  check::defined(fn, arg, ids);
  check::dtype_in(fn, arg, ids, {DType::i64, DType::i32});
  check::dim(fn, arg, ids, 2);
  check::contiguous(fn, arg, ids);
}

void check_id_range(const char* fn, const char* arg, const Tensor& ids, int64_t lo, int64_t hi) {
  const int64_t n = ids.numel();
  with_ids(ids, [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < lo || p[i] >= hi) [[unlikely]]
        DSK_CHECK_ARG(false, fn, arg,
                      "ids in [" + std::to_string(lo) + ", " + std::to_string(hi) + ")",
                      std::to_string(p[i]) + " at flat index " + std::to_string(i));
  });
}

void check_rows(const char* fn, const char* arg, const Tensor& x,
                std::initializer_list<DType> dtypes) {
  check::defined(fn, arg, x);
  check::dtype_in(fn, arg, x, dtypes);
  check::dim(fn, arg, x, 2);
  check::last_dim_contiguous(fn, arg, x);
}

void check_finite(const char* fn, const char* arg, const Tensor& x) {
  const int64_t rows = x.dim() == 1 ? 1 : x.numel() / x.size(-1);
  const int64_t cols = x.size(-1);
  const Tensor flat = x.dim() == 2 || x.dim() == 1 ? x : x.contiguous().view({rows, cols});
  const int64_t row_stride = flat.dim() == 2 ? flat.stride(0) : 0;
  const auto* base = static_cast<const float*>(flat.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = base + r * row_stride;
    bool bad = false;
    for (int64_t c = 0; c < cols; ++c) bad |= !std::isfinite(row[c]);
    if (!bad) continue;
    for (int64_t c = 0; c < cols; ++c)
      DSK_CHECK_ARG(
          std::isfinite(row[c]), fn, arg, "finite values",
          std::to_string(row[c]) + " at [" + std::to_string(r) + ", " + std::to_string(c) + "]");
  }
}

DType parse_float_format(const char* fn, const char* arg, std::string_view fmt) {
  if (fmt == "fp32") return DType::f32;
  if (fmt == "bf16") return DType::bf16;
  DSK_CHECK_ARG(false, fn, arg, "\"fp32\" or \"bf16\"", fmt);
  return DType::f32;
}

}  // namespace dsk::tk::detail
