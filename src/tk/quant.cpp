// Quantisation entry points: argument checks, output and scale allocation in the requested layout,
// then the quant kernels over row ranges.
#include <vector>

#include <dsk/tk.hpp>

#include "common.hpp"
#include "core/copy.hpp"

namespace dsk::tk {
namespace {

using detail::ceil_div;
using kernels::QuantFormat;

// Codes of a [rows, cols] cast and its QuantOut (scales allocated for [scale_rows, blocks]).
struct CastOutput {
  QuantTensor result;
  kernels::QuantOut q;
};

CastOutput alloc_cast_output(int64_t rows, int64_t cols, QuantFormat fmt, int64_t scale_rows,
                             int64_t blocks, bool col_major, bool round_sf, bool packed) {
  CastOutput o;
  const bool fp4 = fmt == QuantFormat::e2m1;
  o.result.data = Tensor::empty({rows, fp4 ? cols / 2 : cols}, fp4 ? DType::fp4x2 : DType::e4m3);
  detail::Scales s = detail::alloc_scales(scale_rows, blocks, col_major, packed);
  o.result.sf = s.tensor;
  o.q.fmt = fmt;
  o.q.round_sf = round_sf;
  o.q.out = o.result.data.data_ptr();
  o.q.out_stride = o.result.data.size(1);
  o.q.sf = s.layout;
  return o;
}

// Checks shared by the per-token casts; returns the format.
QuantFormat check_token_cast(const char* fn, const Tensor& x, int64_t hidden, std::string_view fmt,
                             int num_per_channels, bool round_sf, bool packed) {
  const QuantFormat f = detail::parse_quant_format(fn, fmt);
  // A row of width 0 has no whole-row block: 0 would be a division by zero.
  const bool whole_row = num_per_channels == hidden && hidden > 0;
  DSK_CHECK_ARG(num_per_channels == 16 || num_per_channels == 32 || num_per_channels == 64 ||
                    num_per_channels == 128 || whole_row,
                fn, "num_per_channels",
                hidden > 0 ? "16, 32, 64, 128 or the hidden size (" + std::to_string(hidden) + ")"
                           : std::string("16, 32, 64 or 128 (the rows are empty)"),
                num_per_channels);
  if (f == QuantFormat::e2m1)
    DSK_CHECK_ARG(hidden % 2 == 0 && num_per_channels % 2 == 0, fn, "x",
                  "an even hidden size and block for e2m1 (two codes per byte)", x.describe());
  detail::check_cast_options(fn, f, false, round_sf, packed);
  return f;
}

// The table index of a checked f32 / bf16 input.
int x_index(const Tensor& x) {
  return x.dtype() == DType::f32 ? 0 : 1;
}

// Checks pos_to_expert / pos_to_token_topk / topk_weights of the SwiGLU ops; fills the args.
void check_swiglu_extras(const char* fn, int64_t rows, const std::optional<Tensor>& pos_to_expert,
                         const std::optional<Tensor>& pos_to_token_topk,
                         const std::optional<Tensor>& topk_weights, kernels::SwigluCastArgs& a) {
  const auto check_rows_i32 = [&](const char* arg, const Tensor& t) {
    check::defined(fn, arg, t);
    check::dtype(fn, arg, t, DType::i32);
    check::shape(fn, arg, t, {rows});
    check::contiguous(fn, arg, t);
  };
  if (pos_to_expert) {
    check_rows_i32("pos_to_expert", *pos_to_expert);
    a.pos_to_expert = static_cast<const int32_t*>(pos_to_expert->data_ptr());
  }
  DSK_CHECK_ARG(pos_to_token_topk.has_value() == topk_weights.has_value(), fn, "topk_weights",
                "given exactly when pos_to_token_topk is", topk_weights ? "given" : "absent");
  if (topk_weights) {
    check_rows_i32("pos_to_token_topk", *pos_to_token_topk);
    check::defined(fn, "topk_weights", *topk_weights);
    check::dtype(fn, "topk_weights", *topk_weights, DType::f32);
    check::contiguous(fn, "topk_weights", *topk_weights);
    detail::check_id_range(fn, "pos_to_token_topk", *pos_to_token_topk, -1, topk_weights->numel());
    a.pos_to_token_topk = static_cast<const int32_t*>(pos_to_token_topk->data_ptr());
    a.weights = static_cast<const float*>(topk_weights->data_ptr());
  }
}

kernels::SwigluCastArgs swiglu_args(const char* fn, const Tensor& x,
                                    const std::optional<Tensor>& pos_to_expert,
                                    std::optional<float> swiglu_clamp_value,
                                    const std::optional<Tensor>& pos_to_token_topk,
                                    const std::optional<Tensor>& topk_weights) {
  detail::check_rows(fn, "x", x, {DType::f32, DType::bf16});
  DSK_CHECK_ARG(x.size(1) % 2 == 0, fn, "x", "an even number of columns ([gate | up])",
                x.describe());
  kernels::SwigluCastArgs a;
  a.cast.x = x.data_ptr();
  a.cast.x_stride = x.stride(0);
  a.cast.cols = x.size(1) / 2;
  if (swiglu_clamp_value) {
    DSK_CHECK_ARG(*swiglu_clamp_value > 0.0f, fn, "swiglu_clamp_value", "a positive value",
                  *swiglu_clamp_value);
    a.has_clamp = true;
    a.clamp = *swiglu_clamp_value;
  }
  check_swiglu_extras(fn, x.size(0), pos_to_expert, pos_to_token_topk, topk_weights, a);
  return a;
}

void run_swiglu(const kernels::SwigluCastArgs& a, const Tensor& x) {
  const auto kernel = detail::kernel_table().swiglu_cast[x_index(x)];
  detail::parallel_rows(x.size(0), 8 * a.cast.cols, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(static_cast<size_t>(a.cast.cols) + 16);
    kernel(a, r0, r1, scratch.data());
  });
}

}  // namespace

QuantTensor per_token_cast(const Tensor& x, std::string_view fmt, int num_per_channels,
                           bool use_tma_aligned_col_major_sf, bool round_sf,
                           bool use_packed_ue8m0) {
  constexpr const char* fn = "tk::per_token_cast";
  detail::check_rows(fn, "x", x, {DType::f32, DType::bf16});
  const int64_t rows = x.size(0), hidden = x.size(1);
  const QuantFormat f =
      check_token_cast(fn, x, hidden, fmt, num_per_channels, round_sf, use_packed_ue8m0);
  const int64_t group = num_per_channels;
  CastOutput o = alloc_cast_output(rows, hidden, f, rows, ceil_div(hidden, group),
                                   use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0);
  kernels::TokenCastArgs a;
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.cols = hidden;
  a.group = group;
  a.q = o.q;
  const auto kernel = detail::kernel_table().token_cast[x_index(x)];
  detail::parallel_rows(rows, 2 * hidden, [&](int64_t r0, int64_t r1) { kernel(a, r0, r1); });
  return o.result;
}

QuantTensor per_block_cast(const Tensor& x, std::string_view fmt, BlockSize block_size,
                           bool use_tma_aligned_col_major_sf, bool round_sf,
                           bool use_packed_ue8m0) {
  constexpr const char* fn = "tk::per_block_cast";
  detail::check_rows(fn, "x", x, {DType::f32, DType::bf16});
  const QuantFormat f = detail::parse_quant_format(fn, fmt);
  const auto [bm, bk] = block_size;
  check::in_range(fn, "block_size.first", bm, 1, 1 << 20);
  check::in_range(fn, "block_size.second", bk, 1, 1 << 20);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (f == QuantFormat::e2m1)
    DSK_CHECK_ARG(cols % 2 == 0 && bk % 2 == 0, fn, "x", "an even width and block width for e2m1",
                  x.describe());
  detail::check_cast_options(fn, f, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0);
  const int64_t block_rows = ceil_div(rows, bm);
  CastOutput o = alloc_cast_output(rows, cols, f, block_rows, ceil_div(cols, bk),
                                   use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0);
  kernels::BlockCastArgs a;
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.rows = rows;
  a.cols = cols;
  a.block_rows = bm;
  a.block_cols = bk;
  a.q = o.q;
  // A large output (8 MiB or more of a weight's codes) goes around the caches: nothing reads it in
  // this call, and a plain store first reads the line it writes (7168 x 2048 bf16, two threads, six
  // alternated pairs: 1.1-1.6x). The row casts, tried the same way, were not faster
  // (docs/tk-performance-log.md, thirteenth round).
  a.q.stream = o.result.data.nbytes() >= dsk::detail::kStreamCopyBytes;
  const auto kernel = detail::kernel_table().block_cast[x_index(x)];
  detail::parallel_rows(block_rows, 2 * bm * cols,
                        [&](int64_t b0, int64_t b1) { kernel(a, b0, b1); });
  return o.result;
}

QuantTensor per_channel_cast(const Tensor& x, std::string_view fmt, int num_per_tokens,
                             bool round_sf) {
  constexpr const char* fn = "tk::per_channel_cast";
  detail::check_rows(fn, "x", x, {DType::f32, DType::bf16});
  const QuantFormat f = detail::parse_quant_format(fn, fmt);
  check::in_range(fn, "num_per_tokens", num_per_tokens, 1, 1 << 20);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (f == QuantFormat::e2m1)
    DSK_CHECK_ARG(cols % 2 == 0, fn, "x", "an even width for e2m1", x.describe());
  const int64_t block_rows = ceil_div(rows, num_per_tokens);
  CastOutput o = alloc_cast_output(rows, cols, f, block_rows, cols, false, round_sf, false);
  kernels::BlockCastArgs a;
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.rows = rows;
  a.cols = cols;
  a.block_rows = num_per_tokens;
  a.block_cols = 1;
  a.q = o.q;
  const auto kernel = detail::kernel_table().channel_cast[x_index(x)];
  detail::parallel_rows(block_rows, 2 * num_per_tokens * cols,
                        [&](int64_t b0, int64_t b1) { kernel(a, b0, b1); });
  return o.result;
}

Tensor swiglu_forward(const Tensor& x, const std::optional<Tensor>& pos_to_expert,
                      std::optional<float> swiglu_clamp_value,
                      const std::optional<Tensor>& pos_to_token_topk,
                      const std::optional<Tensor>& topk_weights) {
  constexpr const char* fn = "tk::swiglu_forward";
  kernels::SwigluCastArgs a =
      swiglu_args(fn, x, pos_to_expert, swiglu_clamp_value, pos_to_token_topk, topk_weights);
  Tensor out = Tensor::empty({x.size(0), a.cast.cols}, DType::f32);
  a.f32_out = static_cast<float*>(out.data_ptr());
  run_swiglu(a, x);
  return out;
}

QuantTensor swiglu_forward_and_per_token_cast(
    const Tensor& x, std::string_view fmt, int num_per_channels,
    const std::optional<Tensor>& pos_to_expert, std::optional<float> swiglu_clamp_value,
    const std::optional<Tensor>& pos_to_token_topk, const std::optional<Tensor>& topk_weights,
    bool use_tma_aligned_col_major_sf, bool round_sf, bool use_packed_ue8m0) {
  constexpr const char* fn = "tk::swiglu_forward_and_per_token_cast";
  kernels::SwigluCastArgs a =
      swiglu_args(fn, x, pos_to_expert, swiglu_clamp_value, pos_to_token_topk, topk_weights);
  const int64_t rows = x.size(0), hidden = a.cast.cols;
  const QuantFormat f =
      check_token_cast(fn, x, hidden, fmt, num_per_channels, round_sf, use_packed_ue8m0);
  CastOutput o = alloc_cast_output(rows, hidden, f, rows, ceil_div(hidden, num_per_channels),
                                   use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0);
  a.cast.group = num_per_channels;
  a.cast.q = o.q;
  run_swiglu(a, x);
  return o.result;
}

QuantTensor rmsnorm_forward_and_per_token_cast(const Tensor& x, const Tensor& weight, float eps,
                                               std::string_view fmt, int num_per_channels,
                                               bool use_tma_aligned_col_major_sf, bool round_sf,
                                               bool use_packed_ue8m0) {
  constexpr const char* fn = "tk::rmsnorm_forward_and_per_token_cast";
  detail::check_rows(fn, "x", x, {DType::f32, DType::bf16});
  const int64_t rows = x.size(0), hidden = x.size(1);
  check::defined(fn, "weight", weight);
  check::dtype_in(fn, "weight", weight, {DType::f32, DType::bf16});
  check::shape(fn, "weight", weight, {hidden});
  check::contiguous(fn, "weight", weight);
  DSK_CHECK_ARG(eps >= 0.0f, fn, "eps", "a non-negative value", eps);
  const QuantFormat f =
      check_token_cast(fn, x, hidden, fmt, num_per_channels, round_sf, use_packed_ue8m0);
  CastOutput o = alloc_cast_output(rows, hidden, f, rows, ceil_div(hidden, num_per_channels),
                                   use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0);
  kernels::NormCastArgs a;
  a.cast.x = x.data_ptr();
  a.cast.x_stride = x.stride(0);
  a.cast.cols = hidden;
  a.cast.group = num_per_channels;
  a.cast.q = o.q;
  a.weight = weight.data_ptr();
  a.eps = eps;
  a.prefetch_rows = x.nbytes() >= dsk::detail::kStreamCopyBytes;
  const auto kernel =
      detail::kernel_table().norm_cast[x_index(x)][weight.dtype() == DType::f32 ? 0 : 1];
  detail::parallel_rows(rows, 4 * hidden, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(static_cast<size_t>(hidden) + 16);
    kernel(a, r0, r1, scratch.data());
  });
  return o.result;
}

Tensor cast_back(const QuantTensor& x, std::string_view fmt, BlockSize block_size) {
  constexpr const char* fn = "tk::cast_back";
  const DType out_dtype = detail::parse_float_format(fn, "fmt", fmt);
  check::defined(fn, "x.data", x.data);
  check::dtype_in(fn, "x.data", x.data, {DType::e4m3, DType::fp4x2});
  check::dim(fn, "x.data", x.data, 2);
  check::last_dim_contiguous(fn, "x.data", x.data);
  const auto [bm, bk] = block_size;
  check::in_range(fn, "block_size.first", bm, 1, 1 << 20);
  check::in_range(fn, "block_size.second", bk, 1, 1 << 20);
  const bool fp4 = x.data.dtype() == DType::fp4x2;
  if (fp4) DSK_CHECK_ARG(bk % 2 == 0, fn, "block_size.second", "even for e2m1 data", bk);
  const int64_t rows = x.data.size(0);
  const int64_t cols = x.data.size(1) * (fp4 ? 2 : 1);
  kernels::CastBackArgs a;
  a.fmt = fp4 ? QuantFormat::e2m1 : QuantFormat::e4m3;
  a.x = x.data.data_ptr();
  a.x_stride = x.data.stride(0);
  a.cols = cols;
  a.block_rows = bm;
  a.block_cols = bk;
  a.sf = detail::read_scales(fn, "x.sf", x.sf, ceil_div(rows, bm), ceil_div(cols, bk));
  Tensor out = Tensor::empty({rows, cols}, out_dtype);
  a.out = out.data_ptr();
  a.out_stride = cols;
  const auto kernel = detail::kernel_table().cast_back[out_dtype == DType::f32 ? 0 : 1];
  detail::parallel_rows(rows, 2 * cols, [&](int64_t r0, int64_t r1) { kernel(a, r0, r1); });
  return out;
}

}  // namespace dsk::tk
