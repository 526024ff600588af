// dsk::select — DeepSelect on CPU: the top k positions of each row of scores, with per-row
// [start, end) ranges, an index offset, padding of short rows, and the FlashMLA global-slot
// transform of the V3.2 indexer (docs/select.md).
//
// Semantics shared by every function here:
//   - Row i considers the positions j in [starts[i], ends[i]) (default [0, N)); the result holds
//     k int32 entries per row, in no particular order (sorted_index: ascending positions).
//   - A row with ends[i] - starts[i] <= k selects every position, in order, and pads the rest of
//     its k entries with idx_oob_fill_value (values: -inf).
//   - Order: larger value first; every NaN ranks above +inf (torch.topk's order), -inf below every
//     number; equal values are interchangeable (which of them is kept depends only on the input and
//     the thread count, so results repeat bit for bit).
//   - The fill value defaults to -1, because sparse decode (FlashMLA) treats only -1 as invalid;
//     upstream DeepSelect's default is INT32_MAX.
#pragma once

#include <cstdint>
#include <optional>

#include <dsk/core/tensor.hpp>

namespace dsk::select {

inline constexpr int64_t kMaxTopk = 4096;

struct TopkResult {
  Tensor indices;  // int32 [b, k]
  Tensor values;   // x's dtype [b, k] when return_value, else undefined
};

// The top k (1 <= k <= 4096) positions of each row of x (f32 or bf16 [b, N], last dimension
// contiguous, N < 2^31). ends / starts: int32 [b] with 0 <= starts[i] <= ends[i] <= N.
// output_idx_offset: int32 [b], added to every selected position of row i (not to the fill).
TopkResult topk(const Tensor& x, int64_t k, const std::optional<Tensor>& ends = std::nullopt,
                const std::optional<Tensor>& starts = std::nullopt,
                const std::optional<Tensor>& output_idx_offset = std::nullopt,
                int32_t idx_oob_fill_value = -1, bool sorted_index = false,
                bool return_value = false);

// topk, then each selected position j of row i becomes the FlashMLA global slot
// page_table[i, j / page_block_size] * page_block_size + j % page_block_size; padding is -1.
// page_table: int32 [b, max_blocks] (row stride any) covering [starts[i], ends[i]) with
// non-negative block ids. This is the index table of sparse FP8 decode.
Tensor topk_page_table_transform(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                                 const Tensor& page_table, int64_t page_block_size = 64,
                                 const std::optional<Tensor>& starts = std::nullopt);

// topk with the row's start inside a packed (ragged) KV added to each position: the index table
// of sparse prefill over a batch packed into one kv. offsets: int32 [b]; padding is -1.
Tensor topk_ragged_transform(const Tensor& x, int64_t k, const std::optional<Tensor>& ends,
                             const Tensor& offsets,
                             const std::optional<Tensor>& starts = std::nullopt);

}  // namespace dsk::select
