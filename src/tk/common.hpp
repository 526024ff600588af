// Helpers of the tk API layer: the kernel table of the current backend, row-parallel launches,
// scale-factor tensors in their layouts, id tensors, and the argument checks the entry points
// share. Private to src/tk.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include <dsk/core/check.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/tensor.hpp>

#include "kernels.hpp"

namespace dsk::tk::detail {

// The table of dsk::backend(): AVX-512 for avx512 and amx, portable C++ for generic.
const KernelTable& kernel_table();

// Runs fn(begin, end) over [0, rows) on the compute threads when the work (rows x cost_per_row
// elements) is worth it, else on the caller. Chunks are static, so results never depend on the
// split (each row is computed by one call).
void parallel_rows(int64_t rows, int64_t cost_per_row,
                   const std::function<void(int64_t, int64_t)>& fn);

// The table index of a row element type (f32, bf16, f16, e4m3); raises for others.
Elt elt_of(const char* fn, const char* arg, DType dtype);

// "e4m3" or "e2m1".
kernels::QuantFormat parse_quant_format(const char* fn, std::string_view fmt);

// A scale-factor tensor [rows, blocks] in one of the public layouts (docs in dsk/tk.hpp) and how
// the kernels address it. Packed tensors come filled with UE8M0 1.0 (byte 127).
struct Scales {
  Tensor tensor;
  kernels::ScaleLayout layout;
};
Scales alloc_scales(int64_t rows, int64_t blocks, bool col_major, bool packed);

// How kernels read an existing scale tensor: f32 [rows, blocks] or packed int32 [rows,
// ceil(blocks / 4)], any strides. Raises unless its shape fits.
kernels::ScaleLayout read_scales(const char* fn, const char* arg, const Tensor& sf, int64_t rows,
                                 int64_t blocks);

// Checks of the quantisation options shared by the casts.
void check_cast_options(const char* fn, kernels::QuantFormat fmt, bool col_major, bool round_sf,
                        bool packed);

// Expert-id tensors: int64 or int32, 2-D and contiguous (read through with_ids).
void check_ids_tensor(const char* fn, const char* arg, const Tensor& ids);
// fn(p) with p the ids' data as const int64_t* or const int32_t*, so that a loop over the ids is
// compiled once per type instead of testing the dtype at every id.
template <class Fn>
decltype(auto) with_ids(const Tensor& ids, Fn&& fn) {
  if (ids.dtype() == DType::i64) return fn(static_cast<const int64_t*>(ids.data_ptr()));
  return fn(static_cast<const int32_t*>(ids.data_ptr()));
}

// Every id lies in [lo, hi); raises naming the first that does not.
void check_id_range(const char* fn, const char* arg, const Tensor& ids, int64_t lo, int64_t hi);

// A row-major 2-D float tensor whose last dimension is contiguous.
void check_rows(const char* fn, const char* arg, const Tensor& x,
                std::initializer_list<DType> dtypes);

// Values of f32 tensors must be finite (NaN / inf rejected with their position).
void check_finite(const char* fn, const char* arg, const Tensor& x);

// "fp32" or "bf16" for cast_back and friends.
DType parse_float_format(const char* fn, const char* arg, std::string_view fmt);

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
constexpr int64_t align_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

}  // namespace dsk::tk::detail
