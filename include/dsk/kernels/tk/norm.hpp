// Row normalisations with f32 math: RMSNorm and LayerNorm, for rows of f32 / bf16 / f16 with an
// f32 or bf16 weight (and bias), written to f32 / bf16 / f16 rows or handed to a fused consumer.
//
//   RMSNorm:   rstd = 1 / sqrt(sum(x^2) / n + eps),              y = (x * rstd) * w
//   LayerNorm: mean = sum(x) / n, var = sum((x - mean)^2) / n,
//              rstd = 1 / sqrt(var + eps),                        y = ((x - mean) * rstd) * w + b
// Sums run over 16 lanes (lane j holds elements j, j + 16, ...; RMSNorm's sum of squares over four
// such accumulators, and of bf16 rows in pairs, see rms_rstd) combined in the Simd tree, so all
// ISAs give the same bits; every operation is rounded once (FMA only for the squares of bf16
// values, in every ISA).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {

// One norm call over rows [r0, r1): x and out rows are `cols` contiguous elements `*_stride`
// elements apart; weight (and bias) are `cols` contiguous elements of type W.
struct NormArgs {
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* weight = nullptr;
  const void* bias = nullptr;  // LayerNorm only; may be null (no bias)
  int64_t cols = 0;
  float eps = 1e-6f;
  void* out = nullptr;
  int64_t out_stride = 0;
};

inline namespace DSK_TILE_ABI {
namespace norm_detail {

// Calls fn(offset, live, x) for the row's 16-value vectors (live < 16 only for the last one, whose
// other lanes read 0).
template <class S, class T, class Fn>
inline void for_each_vector(const T* row, int64_t cols, Fn fn) {
  int64_t i = 0;
  for (; i + 16 <= cols; i += 16) fn(i, 16, S::load(row + i));
  if (i < cols) fn(i, static_cast<int>(cols - i), S::load_n(row + i, static_cast<int>(cols - i)));
}

template <class S, class T>
inline typename S::F load_part(const T* p, int live) {
  return live == 16 ? S::load(p) : S::load_n(p, live);
}

template <class S, class T>
inline void store_part(T* p, typename S::F x, int live) {
  if (live == 16)
    S::store(p, x);
  else
    S::store_n(p, x, live);
}

}  // namespace norm_detail

// 1 / sqrt(mean(x^2) + eps) of one row. Four accumulators: vector v of the row (values 16v ..
// 16v + 15) goes to accumulator v % 4, and they are combined as (a0 + a1) + (a2 + a3) before the
// lane tree; one accumulator made the sum a chain of dependent adds, half the time of rms_norm.
// BF16 rows are read in pairs: in each whole step of 64 values from i, lane j of accumulators 0
// to 3 takes values i + 2j, i + 2j + 1, i + 32 + 2j and i + 33 + 2j; the last partial step goes
// by vectors as above. A bf16 pair is one 32-bit word: a load, a shift and an and per 32 values
// where load() widens 16 by a shuffle and a shift (hot, one thread, 32 x 7168: the pass went from
// about 0.034 to 0.022 ns per value).
template <class S, class T>
inline float rms_rstd(const T* row, int64_t cols, float eps) {
  // Named accumulators: GCC keeps an array of them in memory when the loop over it is not unrolled.
  auto s0 = S::zero(), s1 = S::zero(), s2 = S::zero(), s3 = S::zero();
  const auto square = [](auto x) { return S::mul(x, x); };
  int64_t i = 0;
  if constexpr (std::is_same_v<T, bf16>) {
    for (; i + 64 <= cols; i += 64) {
      typename S::F e0, o0, e1, o1;
      S::load_bf16_pairs(row + i, &e0, &o0);
      S::load_bf16_pairs(row + i + 32, &e1, &o1);
      // A bf16 value's square is exact in f32 (8 significant bits twice) unless it falls below
      // f32's normal range (|x| < 2^-63), so the FMA rounds once where the product and sum did:
      // the same sums but for such tiny squares, one operation fewer (RMSNorm + cast, hot,
      // 1.02x). Every backend takes the FMA (the generic one std::fma), so they still agree.
      s0 = S::fma(e0, e0, s0);
      s1 = S::fma(o0, o0, s1);
      s2 = S::fma(e1, e1, s2);
      s3 = S::fma(o1, o1, s3);
    }
  } else {
    for (; i + 64 <= cols; i += 64) {
      s0 = S::add(s0, square(S::load(row + i)));
      s1 = S::add(s1, square(S::load(row + i + 16)));
      s2 = S::add(s2, square(S::load(row + i + 32)));
      s3 = S::add(s3, square(S::load(row + i + 48)));
    }
  }
  // The last 0 to 4 vectors, the last one maybe partial (its other lanes read 0).
  const auto part = [&](int64_t at) {
    return square(
        norm_detail::load_part<S>(row + at, static_cast<int>(std::min<int64_t>(cols - at, 16))));
  };
  if (i < cols) s0 = S::add(s0, part(i));
  if (i + 16 < cols) s1 = S::add(s1, part(i + 16));
  if (i + 32 < cols) s2 = S::add(s2, part(i + 32));
  if (i + 48 < cols) s3 = S::add(s3, part(i + 48));
  const auto total = S::add(S::add(s0, s1), S::add(s2, s3));
  const float mean = S::reduce_add(total) / static_cast<float>(cols);
  return 1.0f / std::sqrt(mean + eps);
}

// y = (x * rstd) * w for one row, passed to sink(offset, live, y).
template <class S, class T, class W, class Sink>
inline void rms_norm_row(const T* row, const W* weight, int64_t cols, float rstd, Sink sink) {
  const auto r = S::set1(rstd);
  norm_detail::for_each_vector<S>(row, cols, [&](int64_t i, int live, auto x) {
    sink(i, live, S::mul(S::mul(x, r), norm_detail::load_part<S>(weight + i, live)));
  });
}

namespace norm_detail {

// rms_norm_row of the first `blocks` x 32 values of a bf16 row into a bf16 row, in pairs: a bf16
// pair is one 32-bit word, so a load, a shift and an and split 32 values into f32 (where load()
// widens 16 by a shuffle and a shift), the weights are split the same way (bf16) or by two
// permutes (f32), and both halves narrow in one conversion and one permute. The same two rounded
// products per value as rms_norm_row, so the same bits.
template <class S, class W>
DSK_TK_INLINE void rms_norm_row_pairs(const bf16* row, const W* weight, int64_t blocks, float rstd,
                                      bf16* out, int64_t prefetch_stride) {
  const auto r = S::set1(rstd);
  for (int64_t b = 0; b < blocks; ++b, row += 32, out += 32, weight += 32) {
    prefetch_ahead(row, prefetch_stride);
    typename S::F even, odd, w_even, w_odd;
    S::load_bf16_pairs(row, &even, &odd);
    if constexpr (std::is_same_v<W, bf16>)
      S::load_bf16_pairs(weight, &w_even, &w_odd);
    else
      S::load_f32_pairs(weight, &w_even, &w_odd);
    S::store_pairs(out, S::mul(S::mul(even, r), w_even), S::mul(S::mul(odd, r), w_odd));
  }
}

}  // namespace norm_detail

template <tile::Isa I, class T, class W, class O>
void rms_norm_rows(const NormArgs& a, int64_t r0, int64_t r1) {
  using S = SimdOf<I>;
  if constexpr (std::is_same_v<T, bf16> && std::is_same_v<O, bf16>) {
    const int64_t blocks = a.cols / 32, done = 32 * blocks;
    const W* weight = static_cast<const W*>(a.weight);
    for (int64_t r = r0; r < r1; ++r) {
      const bf16* row = static_cast<const bf16*>(a.x) + r * a.x_stride;
      bf16* out = static_cast<bf16*>(a.out) + r * a.out_stride;
      const float rstd = rms_rstd<S>(row, a.cols, a.eps);
      norm_detail::rms_norm_row_pairs<S>(row, weight, blocks, rstd, out, a.x_stride);
      if (done < a.cols)
        rms_norm_row<S>(row + done, weight + done, a.cols - done, rstd,
                        [&](int64_t i, int live, auto y) {
                          norm_detail::store_part<S>(out + done + i, y, live);
                        });
    }
    return;
  }
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = static_cast<const T*>(a.x) + r * a.x_stride;
    O* out = static_cast<O*>(a.out) + r * a.out_stride;
    const float rstd = rms_rstd<S>(row, a.cols, a.eps);
    // The second pass fetches the next row into L1 for the first pass of the next row, which
    // otherwise waited on its misses (cold 4096 x 7168 bf16: 0.8 of a streaming read-write of the
    // same bytes -> 1.0).
    rms_norm_row<S>(row, static_cast<const W*>(a.weight), a.cols, rstd,
                    [&](int64_t i, int live, auto y) {
                      prefetch_ahead(row + i, a.x_stride);
                      norm_detail::store_part<S>(out + i, y, live);
                    });
  }
}

namespace norm_detail {

// LayerNorm of rows of kVectors * 16 values (the indexer's 128): the same operations in the same
// order per row as the general loop of layer_norm_rows, in two steps per batch of rows.
// layer_norm_stats takes the means and rstds of kRows rows interleaved, so that one row's
// reductions overlap the other's arithmetic; each pass reads the rows again from L1 (keeping all
// 4 x 8 vectors in registers made GCC spill them; reloading is 1.13x faster on cold data).
template <class S, int kVectors, int kRows, class T>
DSK_TK_INLINE void layer_norm_stats(const T* row, int64_t x_stride, float eps, float* mean_out,
                                    float* rstd_out) {
  constexpr float n = 16.0f * kVectors;
  typename S::F sum[kRows], sq[kRows], mean[kRows];
  const auto x_at = [&](int r, int i) { return S::load(row + r * x_stride + 16 * i); };
  for (int r = 0; r < kRows; ++r) sum[r] = S::zero(), sq[r] = S::zero();
  for (int i = 0; i < kVectors; ++i)
    for (int r = 0; r < kRows; ++r) sum[r] = S::add(sum[r], x_at(r, i));
  for (int r = 0; r < kRows; ++r) {
    mean_out[r] = S::reduce_add(sum[r]) / n;
    mean[r] = S::set1(mean_out[r]);
  }
  for (int i = 0; i < kVectors; ++i)
    for (int r = 0; r < kRows; ++r) {
      const auto d = S::sub(x_at(r, i), mean[r]);
      sq[r] = S::add(sq[r], S::mul(d, d));
    }
  for (int r = 0; r < kRows; ++r) rstd_out[r] = 1.0f / std::sqrt(S::reduce_add(sq[r]) / n + eps);
}

// The outputs of `rows` rows whose means and rstds layer_norm_stats gave, a row at a time, two
// vectors at a time (a bf16 row is converted 32 values per instruction: Simd::store2).
template <class S, int kVectors, bool kBias, class T, class W, class O>
DSK_TK_INLINE void layer_norm_outputs(const T* row, int64_t x_stride, int64_t rows,
                                      const float* mean, const float* rstd, const W* weight,
                                      const W* bias, O* out, int64_t out_stride) {
  static_assert(kVectors % 2 == 0);
  for (int64_t r = 0; r < rows; ++r, row += x_stride, out += out_stride) {
    const auto m = S::set1(mean[r]), s = S::set1(rstd[r]);
    const auto y_at = [&](int i) {
      const auto y = S::mul(S::mul(S::sub(S::load(row + 16 * i), m), s), S::load(weight + 16 * i));
      if constexpr (kBias)
        return S::add(y, S::load(bias + 16 * i));
      else
        return y;
    };
    for (int i = 0; i < kVectors; i += 2) S::store2(out + 16 * i, y_at(i), y_at(i + 1));
  }
}

// layer_norm_stats of a batch of kLayerNormBatch rows (4 at a time), then their outputs. Taken row
// group by row group, each group's output pass waited on its own reduction chains (two lane trees,
// a square root and a division); with the statistics of a batch first, those chains overlap the
// next group's loads, and the output pass has no dependency left. Same process, alternated,
// 2048 x 128 bf16 hot: one thread 0.162 -> 0.133 ns per value, two threads 0.109 -> 0.088;
// 262144 x 128 cold, two threads, 1.06-1.08x. Batches of 32 rows were no faster than 16.
inline constexpr int64_t kLayerNormBatch = 16;
template <class S, int kVectors, class T, class W, class O>
DSK_TK_INLINE void layer_norm_rows_batched(const T* x, int64_t x_stride, int64_t rows,
                                           const W* weight, const W* bias, float eps, O* out,
                                           int64_t out_stride) {
  float mean[kLayerNormBatch], rstd[kLayerNormBatch];
  for (int64_t r0 = 0; r0 < rows; r0 += kLayerNormBatch) {
    const T* row = x + r0 * x_stride;
    const int64_t n = std::min(kLayerNormBatch, rows - r0);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4)
      layer_norm_stats<S, kVectors, 4>(row + r * x_stride, x_stride, eps, mean + r, rstd + r);
    for (; r < n; ++r)
      layer_norm_stats<S, kVectors, 1>(row + r * x_stride, x_stride, eps, mean + r, rstd + r);
    if (bias != nullptr)
      layer_norm_outputs<S, kVectors, true>(row, x_stride, n, mean, rstd, weight, bias,
                                            out + r0 * out_stride, out_stride);
    else
      layer_norm_outputs<S, kVectors, false>(row, x_stride, n, mean, rstd, weight, bias,
                                             out + r0 * out_stride, out_stride);
  }
}

}  // namespace norm_detail

template <tile::Isa I, class T, class W, class O>
void layer_norm_rows(const NormArgs& a, int64_t r0, int64_t r1) {
  using S = SimdOf<I>;
  using norm_detail::for_each_vector;
  using norm_detail::load_part;
  const W* weight = static_cast<const W*>(a.weight);
  const W* bias = static_cast<const W*>(a.bias);
  const float n = static_cast<float>(a.cols);
  if (a.cols == 128) {
    norm_detail::layer_norm_rows_batched<S, 8>(
        static_cast<const T*>(a.x) + r0 * a.x_stride, a.x_stride, r1 - r0, weight, bias, a.eps,
        static_cast<O*>(a.out) + r0 * a.out_stride, a.out_stride);
    return;
  }
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = static_cast<const T*>(a.x) + r * a.x_stride;
    O* out = static_cast<O*>(a.out) + r * a.out_stride;
    auto sum = S::zero();
    for_each_vector<S>(row, a.cols, [&](int64_t, int, auto x) { sum = S::add(sum, x); });
    const auto mean = S::set1(S::reduce_add(sum) / n);
    auto sq = S::zero();
    for_each_vector<S>(row, a.cols, [&](int64_t, int live, auto x) {
      const auto d = S::select(first_lanes(live), S::sub(x, mean), S::zero());
      sq = S::add(sq, S::mul(d, d));
    });
    const auto rstd = S::set1(1.0f / std::sqrt(S::reduce_add(sq) / n + a.eps));
    for_each_vector<S>(row, a.cols, [&](int64_t i, int live, auto x) {
      auto y = S::mul(S::mul(S::sub(x, mean), rstd), load_part<S>(weight + i, live));
      if (bias != nullptr) y = S::add(y, load_part<S>(bias + i, live));
      norm_detail::store_part<S>(out + i, y, live);
    });
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels
