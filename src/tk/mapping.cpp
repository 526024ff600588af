// MoE mapping entry points: the fused (expert-major, aligned) layout of routed tokens, the copy of
// token rows into it, and the weighted combine back to tokens.
#include <algorithm>
#include <cstring>

#include <dsk/core/threads.hpp>
#include <dsk/tk.hpp>

#include "common.hpp"
#include "core/copy.hpp"

namespace dsk::tk {
namespace {

using detail::align_up;
using detail::ceil_div;

// The fewest ids get_fused_mapping gives a thread. On two cores of the Zen 5 VM a second thread
// did not pay at any size measured (T = 4096 to 65536 at top-8: 1.0x; at T = 4096 it was 1.35x
// slower, 101 us against 76, the pool's wake-ups and the serial fills and checks outweighing half
// of a 2.3 ns-per-id scatter), so only inputs of 65536 ids or more are split.
constexpr int64_t kIdsPerMappingChunk = 65536;

// Checks that token_topk_to_pos and pos_to_expert describe one mapping: every referenced row lies
// in [0, num_rows), is referenced once and belongs to an expert, and every expert row is
// referenced. Without this, rows would be written twice (a race) or left unwritten.
void check_mapping(const char* fn, const Tensor& token_topk_to_pos, const Tensor& pos_to_expert,
                   int64_t num_tokens) {
  check::defined(fn, "token_topk_to_pos", token_topk_to_pos);
  check::dtype(fn, "token_topk_to_pos", token_topk_to_pos, DType::i32);
  check::dim(fn, "token_topk_to_pos", token_topk_to_pos, 2);
  check::size(fn, "token_topk_to_pos", token_topk_to_pos, 0, num_tokens);
  check::contiguous(fn, "token_topk_to_pos", token_topk_to_pos);
  check::defined(fn, "pos_to_expert", pos_to_expert);
  check::dtype(fn, "pos_to_expert", pos_to_expert, DType::i32);
  check::dim(fn, "pos_to_expert", pos_to_expert, 1);
  check::contiguous(fn, "pos_to_expert", pos_to_expert);
  const int64_t num_rows = pos_to_expert.size(0);
  const auto* pos = static_cast<const int32_t*>(token_topk_to_pos.data_ptr());
  const auto* expert = static_cast<const int32_t*>(pos_to_expert.data_ptr());
  std::vector<uint8_t> seen(static_cast<size_t>(num_rows), 0);
  const int64_t n = token_topk_to_pos.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = pos[i];
    if (p == -1) continue;
    DSK_CHECK_ARG(p >= 0 && p < num_rows && expert[p] >= 0 && seen[p] == 0, fn, "token_topk_to_pos",
                  "-1 or distinct rows of pos_to_expert that belong to an expert",
                  std::to_string(p) + " at flat index " + std::to_string(i));
    seen[p] = 1;
  }
  for (int64_t p = 0; p < num_rows; ++p)
    DSK_CHECK_ARG(expert[p] < 0 || seen[p] != 0, fn, "pos_to_expert",
                  "expert rows that token_topk_to_pos references",
                  "row " + std::to_string(p) + " (expert " + std::to_string(expert[p]) +
                      ") that no token maps to");
}

// Copies token rows of `row_bytes` bytes from src (rows src_stride bytes apart) to their fused
// rows in dst (dst_stride apart) and zeroes the padding rows. An output of kStreamCopyBytes or
// more is written by non-temporal stores: nothing reads it in this call, and a plain store first
// reads the line it writes (4096 x 2048 bf16 at k = 8, a 134 MB output: 17 bytes of traffic per
// 9.5 counted instead of 9.5).
void expand_rows(const char* src, int64_t src_stride, char* dst, int64_t dst_stride,
                 int64_t row_bytes, const Tensor& token_topk_to_pos, const Tensor& pos_to_expert) {
  const int64_t num_tokens = token_topk_to_pos.size(0);
  const int64_t k = token_topk_to_pos.size(1);
  const auto* pos = static_cast<const int32_t*>(token_topk_to_pos.data_ptr());
  const auto* expert = static_cast<const int32_t*>(pos_to_expert.data_ptr());
  const int64_t num_rows = pos_to_expert.size(0);
  const auto bytes = static_cast<size_t>(row_bytes);
  const bool stream = static_cast<size_t>(num_rows) * bytes >= dsk::detail::kStreamCopyBytes;
  const auto row = [&](int64_t p) { return reinterpret_cast<std::byte*>(dst + p * dst_stride); };
  // The call for tokens [t0, t1) also zeroes the padding among rows [t0, t1) * num_rows /
  // num_tokens, so the padding (about an eighth of the output at alignment 32, E = 256, k = 8) is
  // written by all threads, not by the caller after them.
  const auto rows_of = [&](int64_t t) { return t * num_rows / num_tokens; };  // num_tokens > 0
  detail::parallel_rows(num_tokens, row_bytes * k / 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (pos[t * k + j] >= 0)
          dsk::detail::copy_row(row(pos[t * k + j]),
                                reinterpret_cast<const std::byte*>(src + t * src_stride), bytes,
                                stream);
    for (int64_t p = rows_of(t0), end = rows_of(t1); p < end; ++p)
      if (expert[p] < 0) dsk::detail::zero_row(row(p), bytes, stream);
    if (stream) dsk::detail::stream_fence();  // before the pool reports this chunk done
  });
  if (num_tokens == 0)
    for (int64_t p = 0; p < num_rows; ++p)
      if (expert[p] < 0) std::memset(dst + p * dst_stride, 0, bytes);
}

Tensor reduce_impl(const char* fn, const Tensor& x, const Tensor* x_sf,
                   const std::optional<Tensor>& topk_weights, const Tensor& token_topk_to_pos,
                   std::string_view fp8_format, const std::optional<Tensor>& sf,
                   const std::optional<Tensor>& out) {
  detail::check_rows(fn, "x", x,
                     x_sf ? std::initializer_list<DType>{DType::f32, DType::bf16, DType::e4m3}
                          : std::initializer_list<DType>{DType::f32, DType::bf16});
  const int64_t num_rows = x.size(0);
  const int64_t hidden = x.size(1);
  check::defined(fn, "token_topk_to_pos", token_topk_to_pos);
  check::dtype(fn, "token_topk_to_pos", token_topk_to_pos, DType::i32);
  check::dim(fn, "token_topk_to_pos", token_topk_to_pos, 2);
  check::contiguous(fn, "token_topk_to_pos", token_topk_to_pos);
  const int64_t num_tokens = token_topk_to_pos.size(0);
  const int64_t k = token_topk_to_pos.size(1);
  check::in_range(fn, "token_topk_to_pos.size(1)", k, 0, kernels::kMaxReduceSlots);
  detail::check_id_range(fn, "token_topk_to_pos", token_topk_to_pos, -1, num_rows);
  if (topk_weights) {
    check::defined(fn, "topk_weights", *topk_weights);
    check::dtype(fn, "topk_weights", *topk_weights, DType::f32);
    check::shape(fn, "topk_weights", *topk_weights, {num_tokens, k});
    check::contiguous(fn, "topk_weights", *topk_weights);
  }
  if (x_sf) {
    check::defined(fn, "x.sf", *x_sf);
    check::dtype(fn, "x.sf", *x_sf, DType::f32);
    check::shape(fn, "x.sf", *x_sf, {num_rows});
    check::contiguous(fn, "x.sf", *x_sf);
  }
  DSK_CHECK_ARG(fp8_format.empty() || fp8_format == "e4m3", fn, "fp8_format", "\"\" or \"e4m3\"",
                fp8_format);
  const bool fp8_out = fp8_format == "e4m3";
  DSK_CHECK_ARG(!sf || fp8_out, fn, "sf", "given only with fp8_format \"e4m3\"", "given");
  if (sf) {
    check::defined(fn, "sf", *sf);
    check::dtype(fn, "sf", *sf, DType::f32);
    check::shape(fn, "sf", *sf, {1});
  }
  const DType out_dtype =
      fp8_out ? DType::e4m3 : (x.dtype() == DType::e4m3 ? DType::bf16 : x.dtype());
  Tensor result;
  if (out) {
    check::defined(fn, "out", *out);
    check::dtype(fn, "out", *out, out_dtype);
    check::shape(fn, "out", *out, {num_tokens, hidden});
    check::last_dim_contiguous(fn, "out", *out);
    result = *out;
  } else {
    result = Tensor::empty({num_tokens, hidden}, out_dtype);
  }
  if (num_tokens == 0 || hidden == 0) return result;
  kernels::ReduceArgs a;
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.x_sf = x_sf ? static_cast<const float*>(x_sf->data_ptr()) : nullptr;
  a.weights = topk_weights ? static_cast<const float*>(topk_weights->data_ptr()) : nullptr;
  a.pos = static_cast<const int32_t*>(token_topk_to_pos.data_ptr());
  a.num_topk = static_cast<int>(k);
  a.cols = hidden;
  a.has_sf = sf.has_value();
  a.sf = sf ? *static_cast<const float*>(sf->data_ptr()) : 1.0f;
  a.out = result.data_ptr();
  a.out_stride = result.stride(0);
  const auto kernel =
      detail::kernel_table()
          .reduce[detail::elt_of(fn, "x", x.dtype())][detail::elt_of(fn, "out", out_dtype)];
  detail::parallel_rows(num_tokens, hidden * (k + 1),
                        [&](int64_t t0, int64_t t1) { kernel(a, t0, t1); });
  return result;
}

}  // namespace

FusedMapping get_fused_mapping(const Tensor& topk_idx, int num_experts, int64_t num_expanded_tokens,
                               std::optional<int> alignment, bool force_no_sync) {
  constexpr const char* fn = "tk::get_fused_mapping";
  detail::check_ids_tensor(fn, "topk_idx", topk_idx);
  check::in_range(fn, "num_experts", num_experts, 1, 1 << 20);
  const int align = alignment ? *alignment : gemm::get_mk_alignment_for_contiguous_layout();
  check::in_range(fn, "alignment", align, 1, 1 << 20);
  check::in_range(fn, "num_expanded_tokens", num_expanded_tokens, 0, int64_t{1} << 31);
  detail::check_id_range(fn, "topk_idx", topk_idx, -1, num_experts);
  const int64_t num_tokens = topk_idx.size(0);
  const int64_t k = topk_idx.size(1);
  const int64_t n = num_tokens * k;

  // Counting sort by expert, stable in (token, slot): per-chunk counts, then offsets per chunk, so
  // every thread count gives the same positions. A chunk takes at least kIdsPerMappingChunk ids.
  const int chunks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), n / kIdsPerMappingChunk)));
  std::vector<std::vector<int64_t>> counts(chunks, std::vector<int64_t>(num_experts, 0));
  const auto chunk_begin = [&](int64_t c) { return n * c / chunks; };
  parallel_for(chunks, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c)
      detail::with_ids(topk_idx, [&](const auto* ids) {
        int64_t* count = counts[c].data();
        for (int64_t i = chunk_begin(c), end = chunk_begin(c + 1); i < end; ++i)
          if (ids[i] >= 0) ++count[ids[i]];
      });
  });
  FusedMapping m;
  m.expert_start = Tensor::empty({num_experts}, DType::i32);
  m.expert_end = Tensor::empty({num_experts}, DType::i32);
  m.num_tokens_per_expert = Tensor::empty({num_experts}, DType::i32);
  auto* start = static_cast<int32_t*>(m.expert_start.data_ptr());
  auto* end = static_cast<int32_t*>(m.expert_end.data_ptr());
  auto* rows = static_cast<int32_t*>(m.num_tokens_per_expert.data_ptr());
  int64_t total = 0;
  for (int e = 0; e < num_experts; ++e) {
    int64_t count = 0;
    for (int c = 0; c < chunks; ++c) {
      const int64_t here = counts[c][e];
      counts[c][e] = total + count;  // where chunk c's rows of expert e start
      count += here;
    }
    const int64_t aligned = align_up(count, align);
    start[e] = static_cast<int32_t>(total);
    rows[e] = static_cast<int32_t>(aligned);
    total += aligned;
    end[e] = static_cast<int32_t>(total);
  }
  DSK_CHECK(total < (int64_t{1} << 31), fn, "the fused layout exceeds 2^31 rows");
  const bool sized_here = num_expanded_tokens == 0;
  if (sized_here) {
    num_expanded_tokens =
        force_no_sync ? align_up(n + int64_t{align - 1} * num_experts, align) : total;
    if (!force_no_sync) m.num_tokens_per_expert_list.assign(rows, rows + num_experts);
  }
  DSK_CHECK_ARG(num_expanded_tokens >= total, fn, "num_expanded_tokens",
                "at least the rows of the layout (" + std::to_string(total) + ")",
                num_expanded_tokens);

  m.pos_to_expert = Tensor::empty({num_expanded_tokens}, DType::i32);
  m.pos_to_token = Tensor::empty({num_expanded_tokens}, DType::i32);
  m.pos_to_token_topk = Tensor::empty({num_expanded_tokens}, DType::i32);
  m.token_topk_to_pos = Tensor::empty({num_tokens, k}, DType::i32);
  auto* to_expert = static_cast<int32_t*>(m.pos_to_expert.data_ptr());
  auto* to_token = static_cast<int32_t*>(m.pos_to_token.data_ptr());
  auto* to_slot = static_cast<int32_t*>(m.pos_to_token_topk.data_ptr());
  auto* slot_to_pos = static_cast<int32_t*>(m.token_topk_to_pos.data_ptr());
  std::fill_n(to_expert, num_expanded_tokens, -1);
  std::fill_n(to_token, num_expanded_tokens, -1);
  std::fill_n(to_slot, num_expanded_tokens, -1);
  // The scatter keeps its bounds and pointers in locals and walks (token, slot) by counters:
  // written against the closure, every store (which may alias anything) made it reload them, and
  // it divided twice per id (about 7 ns per id, of which the divisions were 60%).
  parallel_for(chunks, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c)
      detail::with_ids(topk_idx,
                       [&, k, to_expert, to_token, to_slot, slot_to_pos](const auto* ids) {
                         int64_t* next = counts[c].data();
                         const int64_t begin = chunk_begin(c), end = chunk_begin(c + 1);
                         int64_t token = begin / k, slot = begin % k;
                         for (int64_t i = begin; i < end; ++i) {
                           const int64_t e = ids[i];
                           if (e < 0) {
                             slot_to_pos[i] = -1;
                           } else {
                             const int64_t p = next[e]++;
                             slot_to_pos[i] = static_cast<int32_t>(p);
                             to_expert[p] = static_cast<int32_t>(e);
                             to_token[p] = static_cast<int32_t>(token);
                             to_slot[p] = static_cast<int32_t>(i);
                           }
                           if (++slot == k) {
                             slot = 0;
                             ++token;
                           }
                         }
                       });
  });
  return m;
}

Tensor expand_to_fused(const Tensor& x, const Tensor& token_topk_to_pos,
                       const Tensor& pos_to_expert) {
  constexpr const char* fn = "tk::expand_to_fused";
  check::defined(fn, "x", x);
  check::dim(fn, "x", x, 2);
  check::last_dim_contiguous(fn, "x", x);
  check_mapping(fn, token_topk_to_pos, pos_to_expert, x.size(0));
  const int64_t num_rows = pos_to_expert.size(0);
  Tensor out = Tensor::empty({num_rows, x.size(1)}, x.dtype());
  const int64_t row_bytes = static_cast<int64_t>(x.size(1) * x.element_size());
  expand_rows(
      static_cast<const char*>(x.data_ptr()), x.stride(0) * static_cast<int64_t>(x.element_size()),
      static_cast<char*>(out.data_ptr()), row_bytes, row_bytes, token_topk_to_pos, pos_to_expert);
  return out;
}

QuantTensor expand_to_fused_with_sf(const QuantTensor& x, int num_per_channels,
                                    const Tensor& token_topk_to_pos, const Tensor& pos_to_expert,
                                    bool use_tma_aligned_col_major_sf) {
  constexpr const char* fn = "tk::expand_to_fused_with_sf";
  check::defined(fn, "x.data", x.data);
  check::dtype_in(fn, "x.data", x.data, {DType::e4m3, DType::fp4x2});
  check::dim(fn, "x.data", x.data, 2);
  check::last_dim_contiguous(fn, "x.data", x.data);
  const int64_t num_tokens = x.data.size(0);
  const int64_t hidden = x.data.size(1) * (x.data.dtype() == DType::fp4x2 ? 2 : 1);
  check::in_range(fn, "num_per_channels", num_per_channels, 1, 1 << 24);
  const int64_t blocks = ceil_div(hidden, num_per_channels);
  const kernels::ScaleLayout in = detail::read_scales(fn, "x.sf", x.sf, num_tokens, blocks);
  DSK_CHECK_ARG(!in.packed || use_tma_aligned_col_major_sf, fn, "use_tma_aligned_col_major_sf",
                "true for packed UE8M0 scales", "false");
  check_mapping(fn, token_topk_to_pos, pos_to_expert, num_tokens);
  const int64_t num_rows = pos_to_expert.size(0);
  QuantTensor out;
  out.data = Tensor::empty({num_rows, x.data.size(1)}, x.data.dtype());
  const int64_t row_bytes = x.data.size(1);
  expand_rows(static_cast<const char*>(x.data.data_ptr()), x.data.stride(0),
              static_cast<char*>(out.data.data_ptr()), row_bytes, row_bytes, token_topk_to_pos,
              pos_to_expert);
  // Scales: word by word (a packed word holds four blocks' exponents), 0 on padding rows.
  detail::Scales s =
      detail::alloc_scales(num_rows, blocks, use_tma_aligned_col_major_sf, in.packed);
  const int64_t words = in.packed ? ceil_div(blocks, 4) : blocks;
  const auto* pos = static_cast<const int32_t*>(token_topk_to_pos.data_ptr());
  const auto* expert = static_cast<const int32_t*>(pos_to_expert.data_ptr());
  auto* dst = static_cast<uint32_t*>(s.layout.data);
  const auto* src = static_cast<const uint32_t*>(in.data);
  for (int64_t p = 0; p < num_rows; ++p)
    if (expert[p] < 0)
      for (int64_t w = 0; w < words; ++w)
        dst[p * s.layout.row_stride + w * s.layout.col_stride] = 0;
  const int64_t k = token_topk_to_pos.size(1);
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = pos[t * k + j];
      if (p < 0) continue;
      for (int64_t w = 0; w < words; ++w)
        dst[p * s.layout.row_stride + w * s.layout.col_stride] =
            src[t * in.row_stride + w * in.col_stride];
    }
  out.sf = s.tensor;
  return out;
}

Tensor reduce_fused(const Tensor& x, const std::optional<Tensor>& topk_weights,
                    const Tensor& token_topk_to_pos, std::string_view fp8_format,
                    const std::optional<Tensor>& sf, const std::optional<Tensor>& out) {
  return reduce_impl("tk::reduce_fused", x, nullptr, topk_weights, token_topk_to_pos, fp8_format,
                     sf, out);
}

Tensor reduce_fused(const QuantTensor& x, const std::optional<Tensor>& topk_weights,
                    const Tensor& token_topk_to_pos, std::string_view fp8_format,
                    const std::optional<Tensor>& sf, const std::optional<Tensor>& out) {
  return reduce_impl("tk::reduce_fused", x.data, &x.sf, topk_weights, token_topk_to_pos, fp8_format,
                     sf, out);
}

}  // namespace dsk::tk
