// Tensor argument checks for API entry points. Each raises dsk::Error naming the function, the
// argument, what was expected and what was given ("fp8_gemm_nt: a: expected 2 dimensions, got 3").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <dsk/core/tensor.hpp>

namespace dsk::check {

void defined(const char* fn, const char* arg, const Tensor& t);
void dtype(const char* fn, const char* arg, const Tensor& t, DType expected);
void dtype_in(const char* fn, const char* arg, const Tensor& t,
              std::initializer_list<DType> allowed);
void dim(const char* fn, const char* arg, const Tensor& t, int expected);
// Sizes equal `expected`; an entry of -1 matches any size.
void shape(const char* fn, const char* arg, const Tensor& t, const Shape& expected);
void size(const char* fn, const char* arg, const Tensor& t, int d, int64_t expected);
void contiguous(const char* fn, const char* arg, const Tensor& t);
// The last dimension has stride 1 (rows may be strided).
void last_dim_contiguous(const char* fn, const char* arg, const Tensor& t);
// data_ptr() is a multiple of `bytes`.
void aligned(const char* fn, const char* arg, const Tensor& t, size_t bytes);
// A scalar argument within [lo, hi].
void in_range(const char* fn, const char* arg, int64_t value, int64_t lo, int64_t hi);

}  // namespace dsk::check
