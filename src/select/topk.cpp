// select::topk and its transforms: argument checks, then the kernels. Rows longer than
// kSegmentLength are cut into segments whose top-k candidates are selected in parallel and merged
// per row; the cut depends only on the row, never on the thread count, so results do not either.
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include <dsk/core/check.hpp>
#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/select.hpp>

#include "kernels.hpp"

namespace dsk::select {
namespace {

using detail::KernelTable;
using kernels::Buffer;
using kernels::RowArgs;

// Rows up to this length are selected whole by one thread; longer ones in segments of it.
constexpr int64_t kSegmentLength = 65536;
// Below this many values a call runs on the caller: the pool would cost more than it saves.
constexpr int64_t kMinParallelValues = 65536;

const KernelTable& kernel_table() {
  return backend() == Backend::generic ? detail::kernel_table_generic()
                                       : detail::kernel_table_avx512();
}

// A candidate buffer for `capacity` candidates: one uninitialised tensor (the kernels write every
// entry before they read it) carved into bits, positions and keys, each on its own cache lines.
// NOTES: it is a tensor so that its memory comes from the tensor allocator's cache of freed blocks
// (core/tensor.cpp). As std::vectors, the ~116 KB of a k = 2048 buffer went back to the kernel
// after every call and were faulted in and zeroed again by the next: a 262144-value row (four
// segments and a merge) took 400-700 us instead of about 50.
struct Scratch {
  explicit Scratch(int64_t capacity)
      : entries((capacity + 15) / 16 * 16),
        memory(Tensor::empty({16 * entries}, DType::u8)),
        bits(static_cast<uint32_t*>(memory.data_ptr())),
        pos(reinterpret_cast<int32_t*>(bits + entries)),
        buffer{bits, pos, bits + 2 * entries} {}
  int64_t entries;  // capacity rounded up to 16 (a 64-byte line of bits)
  Tensor memory;    // bits [entries], pos [entries], keys [2 * entries]
  uint32_t* bits;
  int32_t* pos;
  Buffer buffer;
};

// ---- argument checks ----

const int32_t* row_values(const char* fn, const char* arg, const std::optional<Tensor>& t,
                          int64_t rows) {
  if (!t) return nullptr;
  check::defined(fn, arg, *t);
  check::dtype(fn, arg, *t, DType::i32);
  check::shape(fn, arg, *t, {rows});
  check::contiguous(fn, arg, *t);
  return t->data<int32_t>();
}

void check_x(const char* fn, const Tensor& x, int64_t k) {
  check::defined(fn, "x", x);
  check::dtype_in(fn, "x", x, {DType::f32, DType::bf16});
  check::dim(fn, "x", x, 2);
  check::last_dim_contiguous(fn, "x", x);
  DSK_CHECK_ARG(x.size(1) < INT32_MAX, fn, "x", "fewer than 2^31 - 1 columns", x.size(1));
  DSK_CHECK_ARG(k >= 1 && k <= kMaxTopk, fn, "k", "1 to " + std::to_string(kMaxTopk), k);
}

// 0 <= starts[i] <= ends[i] <= cols, naming the first row that breaks it.
void check_ranges(const char* fn, const RowArgs& a, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t begin = kernels::row_begin(a, i), end = kernels::row_end(a, i);
    DSK_CHECK_ARG(begin >= 0 && begin <= end && end <= a.cols, fn, "starts/ends",
                  "0 <= starts[i] <= ends[i] <= " + std::to_string(a.cols),
                  "row " + std::to_string(i) + ": [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ")");
  }
}

void check_offsets(const char* fn, const char* arg, const RowArgs& a, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i)
    DSK_CHECK_ARG(a.offsets[i] >= 0 && a.offsets[i] + kernels::row_end(a, i) <= INT32_MAX, fn, arg,
                  "offsets >= 0 that keep every index below 2^31",
                  "row " + std::to_string(i) + ": " + std::to_string(a.offsets[i]));
}

// The blocks covering each row's range exist and hold non-negative block ids.
void check_page_table(const char* fn, const Tensor& table, int64_t page_block_size, RowArgs& a,
                      int64_t rows) {
  check::defined(fn, "page_table", table);
  check::dtype(fn, "page_table", table, DType::i32);
  check::dim(fn, "page_table", table, 2);
  check::size(fn, "page_table", table, 0, rows);
  check::last_dim_contiguous(fn, "page_table", table);
  DSK_CHECK_ARG(page_block_size >= 1 && page_block_size <= (int64_t{1} << 20), fn,
                "page_block_size", "1 to 2^20", page_block_size);
  a.page_table = table.data<int32_t>();
  a.page_stride = table.stride(0);
  a.page_block_size = page_block_size;
  const int64_t max_blocks = table.size(1);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t begin = kernels::row_begin(a, i), end = kernels::row_end(a, i);
    if (begin == end) continue;
    const int64_t last = (end - 1) / page_block_size;
    DSK_CHECK_ARG(last < max_blocks, fn, "page_table",
                  "blocks covering ends[i] (" + std::to_string(last + 1) + " for row " +
                      std::to_string(i) + ")",
                  max_blocks);
    for (int64_t blk = begin / page_block_size; blk <= last; ++blk) {
      const int64_t id = a.page_table[i * a.page_stride + blk];
      DSK_CHECK_ARG(id >= 0 && (id + 1) * page_block_size <= INT32_MAX, fn, "page_table",
                    "non-negative block ids whose slots fit in int32",
                    "page_table[" + std::to_string(i) + ", " + std::to_string(blk) +
                        "] = " + std::to_string(id));
    }
  }
}

// ---- launch ----

struct Segment {
  int64_t row, begin, end;
};

int64_t segments_of(int64_t length) {
  return std::max<int64_t>(1, (length + kSegmentLength - 1) / kSegmentLength);
}

void run(const RowArgs& a, int64_t rows, int elt) {
  const KernelTable& table = kernel_table();
  const int64_t cap = kernels::buffer_capacity(a.k);
  int64_t total_values = 0, max_segments = 1;
  std::vector<Segment> segments;  // of the rows that are cut
  std::vector<int64_t> whole;     // rows selected whole
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t begin = kernels::row_begin(a, row), end = kernels::row_end(a, row);
    const int64_t n = segments_of(end - begin);
    total_values += end - begin;
    max_segments = std::max(max_segments, n);
    if (n == 1) {
      whole.push_back(row);
      continue;
    }
    for (int64_t s = 0; s < n; ++s)
      segments.push_back({row, begin + (end - begin) * s / n, begin + (end - begin) * (s + 1) / n});
  }
  const int64_t items = static_cast<int64_t>(whole.size() + segments.size());
  // Candidates of every segment: k slots each.
  std::vector<uint32_t> seg_bits(segments.size() * static_cast<size_t>(a.k));
  std::vector<int32_t> seg_pos(seg_bits.size());
  std::vector<int64_t> seg_count(segments.size());
  auto work = [&](int64_t i0, int64_t i1, int) {
    Scratch scratch(cap);
    for (int64_t i = i0; i < i1; ++i) {
      if (i < static_cast<int64_t>(whole.size())) {
        const int64_t row = whole[static_cast<size_t>(i)];
        table.rows[elt](a, row, row + 1, scratch.buffer);
        continue;
      }
      const size_t s = static_cast<size_t>(i) - whole.size();
      const Segment& seg = segments[s];
      const int64_t n = table.segment[elt](a, seg.row, seg.begin, seg.end, scratch.buffer);
      std::copy_n(scratch.bits, n, seg_bits.begin() + static_cast<int64_t>(s) * a.k);
      std::copy_n(scratch.pos, n, seg_pos.begin() + static_cast<int64_t>(s) * a.k);
      seg_count[s] = n;
    }
  };
  const bool parallel = total_values >= kMinParallelValues && items > 1;
  if (parallel)
    parallel_for(items, work);
  else
    work(0, items, 0);
  if (segments.empty()) return;
  // Merge the segments of each cut row (they are consecutive in `segments`).
  std::vector<size_t> firsts;
  for (size_t s = 0; s < segments.size(); ++s)
    if (s == 0 || segments[s].row != segments[s - 1].row) firsts.push_back(s);
  firsts.push_back(segments.size());
  auto merge = [&](int64_t r0, int64_t r1, int) {
    Scratch scratch(std::max(cap, max_segments * a.k + 16));
    for (int64_t r = r0; r < r1; ++r) {
      int64_t n = 0;
      for (size_t s = firsts[static_cast<size_t>(r)]; s < firsts[static_cast<size_t>(r) + 1]; ++s) {
        const int64_t from = static_cast<int64_t>(s) * a.k;
        std::copy_n(seg_bits.begin() + from, seg_count[s], scratch.bits + n);
        std::copy_n(seg_pos.begin() + from, seg_count[s], scratch.pos + n);
        n += seg_count[s];
      }
      table.merge[elt](a, segments[firsts[static_cast<size_t>(r)]].row, n, scratch.buffer);
    }
  };
  const int64_t cut_rows = static_cast<int64_t>(firsts.size()) - 1;
  if (parallel && cut_rows > 1)
    parallel_for(cut_rows, merge);
  else
    merge(0, cut_rows, 0);
}

struct Prepared {
  RowArgs args;
  TopkResult result;
  int elt = 0;
};

Prepared prepare(const char* fn, const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                 const std::optional<Tensor>& starts, bool return_value) {
  check_x(fn, x, k);
  const int64_t rows = x.size(0);
  Prepared p;
  p.elt = x.dtype() == DType::f32 ? 0 : 1;
  RowArgs& a = p.args;
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.cols = x.size(1);
  a.k = k;
  a.ends = row_values(fn, "ends", ends, rows);
  a.starts = row_values(fn, "starts", starts, rows);
  check_ranges(fn, a, rows);
  p.result.indices = Tensor::empty({rows, k}, DType::i32);
  a.indices = p.result.indices.data<int32_t>();
  if (return_value) {
    p.result.values = Tensor::empty({rows, k}, x.dtype());
    a.values = p.result.values.data_ptr();
  }
  return p;
}

}  // namespace

TopkResult topk(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                const std::optional<Tensor>& starts, const std::optional<Tensor>& output_idx_offset,
                int32_t idx_oob_fill_value, bool sorted_index, bool return_value) {
  constexpr const char* fn = "select::topk";
  Prepared p = prepare(fn, x, k, ends, starts, return_value);
  p.args.offsets = row_values(fn, "output_idx_offset", output_idx_offset, x.size(0));
  if (p.args.offsets) check_offsets(fn, "output_idx_offset", p.args, x.size(0));
  p.args.fill = idx_oob_fill_value;
  p.args.sorted_index = sorted_index;
  run(p.args, x.size(0), p.elt);
  return p.result;
}

Tensor topk_page_table_transform(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                                 const Tensor& page_table, int64_t page_block_size,
                                 const std::optional<Tensor>& starts) {
  constexpr const char* fn = "select::topk_page_table_transform";
  Prepared p = prepare(fn, x, k, ends, starts, false);
  check_page_table(fn, page_table, page_block_size, p.args, x.size(0));
  run(p.args, x.size(0), p.elt);
  return p.result.indices;
}

Tensor topk_ragged_transform(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                             const Tensor& offsets, const std::optional<Tensor>& starts) {
  constexpr const char* fn = "select::topk_ragged_transform";
  Prepared p = prepare(fn, x, k, ends, starts, false);
  check::defined(fn, "offsets", offsets);
  p.args.offsets = row_values(fn, "offsets", offsets, x.size(0));
  check_offsets(fn, "offsets", p.args, x.size(0));
  run(p.args, x.size(0), p.elt);
  return p.result.indices;
}

}  // namespace dsk::select
