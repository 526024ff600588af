// The MoE combine kernel: each token gathers its expert outputs back from the fused (expert-major)
// layout, weighted by its routing weights, in a fixed order:
//   acc = 0;  for j = 0 .. num_topk - 1 with p = pos[t, j] >= 0:
//     s = (weights ? weights[t, j] : 1) * (x_sf ? x_sf[p] : 1);   acc = acc + x[p, :] * s
//   out[t, :] = has_sf ? acc * sf : acc
// in f32, every product and sum rounded once; then stored as the output type (e4m3 saturates).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {

// The most selections per token reduce_rows gathers.
inline constexpr int kMaxReduceSlots = 64;

struct ReduceArgs {
  const void* x = nullptr;  // [num_expanded_tokens, cols]
  int64_t x_stride = 0;
  const float* x_sf = nullptr;     // [num_expanded_tokens] or null
  const float* weights = nullptr;  // [num_tokens, num_topk] contiguous or null
  const int32_t* pos = nullptr;    // [num_tokens, num_topk] contiguous
  int num_topk = 0;
  int64_t cols = 0;
  bool has_sf = false;
  float sf = 1.0f;
  void* out = nullptr;  // [num_tokens, cols]
  int64_t out_stride = 0;
};

inline namespace DSK_TILE_ABI {

// How far ahead of the columns it reads reduce_rows prefetches each gathered row, in bytes. Each
// row is a stream of its own, num_topk of them per thread, starting at random places every token,
// and the hardware prefetchers did not keep ahead of them (4096 x 2048 bf16, top-8, two threads:
// 1.1-1.2x faster cold with 2 KB; 4 KB and more ahead were no faster than none).
inline constexpr int64_t kReducePrefetchBytes = 2048;

namespace reduce_detail {

// A token's live selections: the rows it gathers and their scales, in slot order.
template <class X>
struct Gathered {
  const X* rows[kMaxReduceSlots];
  float scale[kMaxReduceSlots];
  int live = 0;
};

template <class X>
inline void gather(const ReduceArgs& a, int64_t t, Gathered<X>& g) {
  g.live = 0;
  for (int j = 0; j < a.num_topk; ++j) {
    const int32_t p = a.pos[t * a.num_topk + j];
    if (p < 0) continue;
    g.rows[g.live] = static_cast<const X*>(a.x) + p * a.x_stride;
    float s = a.weights != nullptr ? a.weights[t * a.num_topk + j] : 1.0f;
    if (a.x_sf != nullptr) s = s * a.x_sf[p];
    g.scale[g.live++] = s;
  }
}

// n (1..16) values of a gathered row as f32.
template <class S, class X>
DSK_TK_INLINE typename S::F load_values(const X* p, int n) {
  if constexpr (std::is_same_v<X, e4m3>) return S::load_e4m3_n(p, n);
  if (n == 16) return S::load(p);
  return S::load_n(p, n);
}

// The first n (1..16) values of acc as O.
template <class S, class O>
DSK_TK_INLINE void store_values(O* p, typename S::F acc, int n) {
  if constexpr (std::is_same_v<O, e4m3>) {
    if (n == 16) return S::store_e4m3(p, acc);
    return S::store_e4m3_n(p, acc, n);
  }
  if (n == 16) return S::store(p, acc);
  S::store_n(p, acc, n);
}

// 32 values as O (one conversion of both halves for bf16).
template <class S, class O>
DSK_TK_INLINE void store_values(O* p, typename S::F lo, typename S::F hi) {
  if constexpr (std::is_same_v<O, e4m3>) {
    S::store_e4m3(p, lo);
    S::store_e4m3(p + 16, hi);
  } else {
    S::store2(p, lo, hi);
  }
}

}  // namespace reduce_detail

// out[c, c + 32 * kBlocks) = (0 + x_0 * scale[0] + .. + x_(n-1) * scale[n-1]) [* *post_scale],
// x_j the row rows[j] from column c, every product and sum rounded once in that order (no FMA).
// 2 * kBlocks accumulators, each a chain of n dependent adds (the fixed order), so that enough
// independent chains are in flight to hide the adds' latency: hot, one thread, 16 columns at a
// time took 0.31 ns per output value, 64 at a time 0.235 and 128 at a time 0.21 (reduce_fused,
// bf16, top-8, 2048 columns). bf16 rows go in pairs (even and odd columns; one operation per 16
// values to widen instead of two), their sums re-interleaved as they are stored.
template <class S, int kBlocks, class X, class O>
DSK_TK_INLINE void weighted_sum_block(const X* const* rows, const float* scale, int n, int64_t c,
                                      O* out, const float* post_scale) {
  constexpr bool kPairs = std::is_same_v<X, bf16>;
  typename S::F acc[2 * kBlocks];
  for (auto& v : acc) v = S::zero();
  for (int j = 0; j < n; ++j) {
    const auto s = S::set1(scale[j]);
    for (int k = 0; k < kBlocks; ++k) {
      typename S::F x0, x1;
      if constexpr (kPairs) {
        S::load_bf16_pairs(rows[j] + c + 32 * k, &x0, &x1);
      } else {
        x0 = reduce_detail::load_values<S>(rows[j] + c + 32 * k, 16);
        x1 = reduce_detail::load_values<S>(rows[j] + c + 32 * k + 16, 16);
      }
      acc[2 * k] = S::add(acc[2 * k], S::mul(x0, s));
      acc[2 * k + 1] = S::add(acc[2 * k + 1], S::mul(x1, s));
    }
  }
  if (post_scale != nullptr)
    for (auto& v : acc) v = S::mul(v, S::set1(*post_scale));
  for (int k = 0; k < kBlocks; ++k) {
    if constexpr (kPairs)
      S::store_pairs(out + c + 32 * k, acc[2 * k], acc[2 * k + 1]);
    else
      reduce_detail::store_values<S>(out + c + 32 * k, acc[2 * k], acc[2 * k + 1]);
  }
}

// The columns weighted_sum_columns sums at a time.
inline constexpr int64_t kSumBlockColumns = 128;

// weighted_sum_block over columns [c0, c1): kSumBlockColumns at a time, each block announced first
// by on_block(c) (reduce_rows prefetches there), then 32 at a time, then the last 1 to 31 columns
// 16 at a time (the same sums).
template <class S, class X, class O, class OnBlock>
DSK_TK_INLINE void weighted_sum_columns(const X* const* rows, const float* scale, int n, int64_t c0,
                                        int64_t c1, O* out, const float* post_scale,
                                        OnBlock on_block) {
  int64_t c = c0;
  for (; c + kSumBlockColumns <= c1; c += kSumBlockColumns) {
    on_block(c);
    weighted_sum_block<S, kSumBlockColumns / 32>(rows, scale, n, c, out, post_scale);
  }
  for (; c + 32 <= c1; c += 32) weighted_sum_block<S, 1>(rows, scale, n, c, out, post_scale);
  for (; c < c1; c += 16) {
    const int w = static_cast<int>(c1 - c < 16 ? c1 - c : 16);
    auto acc = S::zero();
    for (int j = 0; j < n; ++j)
      acc = S::add(acc, S::mul(reduce_detail::load_values<S>(rows[j] + c, w), S::set1(scale[j])));
    if (post_scale != nullptr) acc = S::mul(acc, S::set1(*post_scale));
    reduce_detail::store_values<S>(out + c, acc, w);
  }
}

// Tokens [t0, t1). X is float, bf16 or e4m3; O is float, bf16 or e4m3.
template <tile::Isa I, class X, class O>
void reduce_rows(const ReduceArgs& a, int64_t t0, int64_t t1) {
  using S = SimdOf<I>;
  const int64_t row_bytes = a.cols * static_cast<int64_t>(sizeof(X));
  constexpr int64_t block_bytes = kSumBlockColumns * static_cast<int64_t>(sizeof(X));
  reduce_detail::Gathered<X> gathered[2];
  reduce_detail::gather(a, t0, gathered[0]);
  for (int64_t t = t0; t < t1; ++t) {
    // Named references, not a structured binding: the lambdas below capture them, which clang
    // accepts for bindings only from clang 16 (Debian 12 ships 14).
    const auto& current = gathered[(t - t0) & 1];
    const auto& rows = current.rows;
    const auto& scale = current.scale;
    const int live = current.live;
    auto& next = gathered[(t - t0 + 1) & 1];
    next.live = 0;
    if (t + 1 < t1) reduce_detail::gather(a, t + 1, next);
    // Slot j's prefetches run kReducePrefetchBytes ahead of its reads, into the next token's
    // slot j once past the row's end (its own row again when the next token has fewer slots: a
    // prefetch of bytes already read). Addresses as integers: those past a row are not pointers
    // into it.
    uintptr_t ahead[kMaxReduceSlots];
    for (int j = 0; j < live; ++j)
      ahead[j] = reinterpret_cast<uintptr_t>(rows[j]) + kReducePrefetchBytes;
    O* out = static_cast<O*>(a.out) + t * a.out_stride;
    // Columns [c0, c1), c0 a multiple of kSumBlockColumns, prefetching the lines of each slot
    // that lie kReducePrefetchBytes ahead of each block.
    const auto columns = [&](int64_t c0, int64_t c1) {
      weighted_sum_columns<S>(
          rows, scale, live, c0, c1, out, a.has_sf ? &a.sf : nullptr, [&](int64_t c) {
            for (int j = 0; j < live; ++j)
              for (int64_t b = 0; b < block_bytes; b += 64)
                __builtin_prefetch(reinterpret_cast<const void*>(ahead[j] + c * sizeof(X) + b));
          });
    };
    // The first block whose prefetch falls past the row's end.
    const int64_t turn = std::clamp<int64_t>(
        (row_bytes - kReducePrefetchBytes + block_bytes - 1) / block_bytes * kSumBlockColumns, 0,
        a.cols);
    columns(0, turn);
    for (int j = 0; j < live; ++j)
      ahead[j] = reinterpret_cast<uintptr_t>(j < next.live ? next.rows[j] : rows[j]) +
                 kReducePrefetchBytes - static_cast<uintptr_t>(row_bytes);
    columns(turn, a.cols);
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels
