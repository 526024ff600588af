// MoE routing kernels: top-k selection over a token's expert scores, and the DeepSeek gate (score
// function, correction bias, group-limited selection, weight normalisation) for a range of tokens.
//
// Selection order (the tie rule every tk routing op documents): experts are ranked by score,
// higher first; equal scores rank the smaller expert index first; NaN ranks below every number
// (-inf included); -0 and +0 are equal. Selections are written best first. Groups are ranked the
// same way by their group score (the sum of their top `topk_sum` biased scores).
//
// Kernels assume valid arguments (the API layer, src/tk/routing.cpp, checks them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <dsk/kernels/tk/math.hpp>
#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {

// Limits of the routing kernels (stack buffers are sized by them).
inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxTopk = 32;
inline constexpr int kMaxGroups = 32;

enum class Scoring : int { sigmoid = 0, sqrtsoftplus = 1, softmax = 2, identity = 3 };

// topk_gate: idx[t, j] = the j-th best expert of scores row t.
struct TopkArgs {
  const float* scores = nullptr;
  int64_t scores_stride = 0;  // elements between rows
  int num_experts = 0;
  int num_topk = 0;
  int64_t* idx = nullptr;  // [T, num_topk] contiguous
};

// The gate of one layer for rows [t0, t1):
//   s      = scoring(logits)                                  (unbiased scores)
//   b      = s + bias                                         (biased scores; bias may be null)
//   groups = the num_topk_groups best of num_groups groups by the sum of their topk_sum best b
//   idx    = the num_topk best experts by b inside the kept groups
//   w_j    = s[idx_j] / (1e-20 + sum_j s[idx_j]) * scale     (normalize; sum in slot order)
//          = s[idx_j] * scale                                 (otherwise)
struct GateArgs {
  const float* logits = nullptr;
  int64_t logits_stride = 0;
  const float* bias = nullptr;  // [num_experts] or null
  int num_experts = 0;
  int num_topk = 0;
  int num_groups = 1;  // 1: no group limit
  int num_topk_groups = 1;
  int topk_sum = 2;  // 1 or 2
  Scoring scoring = Scoring::sigmoid;
  bool normalize = true;
  float scale = 1.0f;
  // Optional per-row controls: rows with mask[t] == 0 are not routed (idx -1, weight 0); rows
  // with fix_mask[t] != 0 keep the experts fixed_idx[t, :] (weights computed as above).
  const uint8_t* mask = nullptr;
  const uint8_t* fix_mask = nullptr;
  const int64_t* fixed_idx = nullptr;
  int64_t fixed_stride = 0;
  // Outputs: row t's num_topk selections at idx + t * out_stride (and weights likewise).
  int64_t* idx = nullptr;
  float* weights = nullptr;
  int64_t out_stride = 0;
  // Set to 1 for rows whose logits hold NaN or inf (the API layer then raises); may be null.
  uint8_t* non_finite = nullptr;
};

// topk_sum_and_topk_group_idx: the num_topk_groups best groups of each row.
struct GroupArgs {
  const float* scores = nullptr;  // [T, num_groups * experts_per_group]
  int64_t scores_stride = 0;
  int num_groups = 0;
  int experts_per_group = 0;
  int topk_sum = 2;
  int num_topk_groups = 0;
  int64_t* idx = nullptr;  // [T, num_topk_groups] contiguous
};

DSK_SILENCE_GCC_BUG_105593_BEGIN  // see dsk/kernels/abi.hpp

inline namespace DSK_TILE_ABI {
namespace routing_detail {

// Keys that order f32 scores as the tie rule says, as int32: larger key = better. -0 becomes +0,
// NaN becomes kNanKey, removed candidates get kRemoved (below everything).
inline constexpr int32_t kRemoved = std::numeric_limits<int32_t>::min();
inline constexpr int32_t kNanKey = kRemoved + 1;

template <class S>
DSK_TK_INLINE typename S::I32 keys_of(typename S::F x) {
  const auto canonical = S::add(x, S::zero());  // -0 + 0 = +0 in round to nearest
  const auto b = S::bits(canonical);
  // Negative floats: flip the magnitude bits so that larger magnitudes give smaller keys.
  const auto negative = S::ilt(b, S::iset1(0));
  const auto flipped = S::ixor(b, S::iset1(0x7FFFFFFF));
  const auto k = S::iselect(negative, flipped, b);
  return S::iselect(S::isnan(x), S::iset1(kNanKey), k);
}

// Candidates of one top-k selection as 64-bit keys, score key in the high half and ~position in
// the low half, so the largest key is the best candidate and, among equal scores, the earliest
// position; positions are filled in increasing expert index, so that is the smaller index.
struct Candidates {
  alignas(64) int64_t key[kMaxExperts + 8];  // + 8: whole-vector stores past the last one
  int32_t index[kMaxExperts + 8];
  int count = 0;
};

inline int64_t candidate_key(int32_t score_key, int position) {
  return static_cast<int64_t>(score_key) * (int64_t{1} << 32) +
         static_cast<int64_t>(0xFFFFFFFFu - static_cast<uint32_t>(position));
}

// Appends the experts of [first, first + n) whose int32 score key (keys[expert]) is at least
// `floor`: a floor at or below the k-th best key keeps every expert the selection can pick.
template <class S>
DSK_TK_INLINE void add_candidates(Candidates& c, const int32_t* keys, int first, int n,
                                  int32_t floor = std::numeric_limits<int32_t>::min()) {
  int i = 0;
#if DSK_TILE_HAS_AVX512
  if constexpr (std::is_same_v<S, Simd<tile::avx512_t>>) {
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i low_ones = _mm512_set1_epi64(0xFFFFFFFF);
    const __m256i floor8 = _mm256_set1_epi32(floor);
    for (; i + 8 <= n; i += 8) {
      const __m256i key32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + first + i));
      // No early exit on an empty mask: which chunks hold candidates is data dependent, and a
      // mispredicted branch costs more than the few instructions it would skip.
      const __mmask8 keep = _mm256_cmpge_epi32_mask(key32, floor8);
      // Positions count kept candidates: compress the kept lanes' experts, then number them.
      const __m256i experts =
          _mm256_add_epi32(_mm256_set1_epi32(first + i), _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0));
      const __m512i score = _mm512_cvtepi32_epi64(_mm256_maskz_compress_epi32(keep, key32));
      const __m512i position = _mm512_add_epi64(_mm512_set1_epi64(c.count), lane);
      _mm512_storeu_si512(c.key + c.count, _mm512_or_si512(_mm512_slli_epi64(score, 32),
                                                           _mm512_sub_epi64(low_ones, position)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c.index + c.count),
                          _mm256_maskz_compress_epi32(keep, experts));
      c.count += __builtin_popcount(keep);
    }
  }
#endif
  for (; i < n; ++i) {
    if (keys[first + i] < floor) continue;
    c.key[c.count] = candidate_key(keys[first + i], c.count);
    c.index[c.count] = first + i;
    ++c.count;
  }
}

// A floor for add_candidates: with the experts of `ranges` (a list of [first, first + n) with n a
// multiple of 16), lane-wise maxima over their 16-key vectors are 16 distinct candidates; the
// smallest of them is at or below the 16th best key, so for k <= 16 it is a valid floor.
template <class S>
DSK_TK_INLINE int32_t candidate_floor(const int32_t* keys, const int* firsts, int num_ranges, int n,
                                      int k) {
  constexpr int32_t kNone = std::numeric_limits<int32_t>::min();
  if (k > 16 || n % 16 != 0) return kNone;
  auto m = S::iset1(kNone);
  for (int r = 0; r < num_ranges; ++r)
    for (int i = 0; i < n; i += 16) m = S::imax(m, S::iload(keys + firsts[r] + i));
  alignas(64) int32_t lanes[16];
  S::istore(lanes, m);
  int32_t floor = lanes[0];
  for (int l = 1; l < 16; ++l) floor = lanes[l] < floor ? lanes[l] : floor;
  return floor;
}

// Writes the expert indices of the k best candidates to out, best first (clobbers the keys).
// Small sets rank every candidate at once (its rank is the number of larger keys; keys are
// distinct); larger ones take the best k times.
template <class S>
DSK_TK_INLINE void select_best(Candidates& c, int k, int64_t* out) {
  constexpr int64_t kGone = std::numeric_limits<int64_t>::min();
  const int padded = (c.count + 7) / 8 * 8;
  for (int i = c.count; i < padded; ++i) c.key[i] = kGone;
  if (c.count <= 64) {
    int64_t by_rank[64];  // every rank is written once; the first k are the selection
    for (int i = 0; i < c.count; ++i) {
      int rank = 0;
#if DSK_TILE_HAS_AVX512
      if constexpr (std::is_same_v<S, Simd<tile::avx512_t>>) {
        const __m512i key = _mm512_set1_epi64(c.key[i]);
        for (int v = 0; v < padded; v += 8)
          rank += __builtin_popcount(_mm512_cmpgt_epi64_mask(_mm512_load_si512(c.key + v), key));
      } else
#endif
      {
        for (int v = 0; v < c.count; ++v) rank += c.key[v] > c.key[i];
      }
      by_rank[rank] = c.index[i];
    }
    // Fewer candidates than k only for rows with NaN (whose keys order oddly and which the API
    // rejects): expert 0 keeps the later reads of scores in bounds.
    for (int j = c.count; j < k; ++j) by_rank[j] = 0;
    for (int j = 0; j < k; ++j) out[j] = by_rank[j];
    return;
  }
  for (int j = 0; j < k; ++j) {
    int64_t best = kGone;
#if DSK_TILE_HAS_AVX512
    if constexpr (std::is_same_v<S, Simd<tile::avx512_t>>) {
      // Two accumulators halve the dependency chain of the maxima.
      __m512i m0 = _mm512_set1_epi64(kGone), m1 = m0;
      int i = 0;
      for (; i + 16 <= padded; i += 16) {
        m0 = _mm512_max_epi64(m0, _mm512_load_si512(c.key + i));
        m1 = _mm512_max_epi64(m1, _mm512_load_si512(c.key + i + 8));
      }
      if (i < padded) m0 = _mm512_max_epi64(m0, _mm512_load_si512(c.key + i));
      best = _mm512_reduce_max_epi64(_mm512_max_epi64(m0, m1));
    } else
#endif
    {
      for (int i = 0; i < padded; ++i) best = c.key[i] > best ? c.key[i] : best;
    }
    const int position = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(best));
    out[j] = c.index[position];
#if DSK_TILE_HAS_AVX512
    if constexpr (std::is_same_v<S, Simd<tile::avx512_t>>) {
      // Rewrite the whole vector: the next scan's load then forwards from this store.
      int64_t* v = c.key + (position & ~7);
      _mm512_store_si512(v, _mm512_mask_mov_epi64(_mm512_load_si512(v),
                                                  static_cast<__mmask8>(1u << (position & 7)),
                                                  _mm512_set1_epi64(kGone)));
      continue;
    }
#endif
    c.key[position] = kGone;
  }
}

// Scores of one row, padded to whole vectors: `count` values from src (scored), the padding lanes
// set to `pad`.
template <class S>
DSK_TK_INLINE void load_padded(const float* src, int count, float pad, float* dst) {
  const int full = count / 16;
  for (int v = 0; v < full; ++v) S::store(dst + 16 * v, S::load(src + 16 * v));
  const int rest = count - 16 * full;
  if (rest > 0) {
    const auto x = S::load_n(src + 16 * full, rest);
    S::store(dst + 16 * full, S::select(first_lanes(rest), x, S::set1(pad)));
  }
}

// Whether any of num_vectors * 16 values is NaN or infinite.
template <class S>
DSK_TK_INLINE bool any_non_finite(const float* v, int num_vectors) {
  const auto inf = S::set1(std::numeric_limits<float>::infinity());
  Mask16 bad = 0;
  for (int i = 0; i < num_vectors; ++i) {
    const auto x = S::load(v + 16 * i);
    bad |= S::isnan(x) | S::eq(S::abs(x), inf);
  }
  return bad != 0;
}

template <class S>
DSK_TK_INLINE Mask16 non_finite_lanes(typename S::F x) {
#if DSK_TILE_HAS_AVX512
  if constexpr (std::is_same_v<S, Simd<tile::avx512_t>>)
    return _mm512_fpclass_ps_mask(x, 0x99);  // QNaN | SNaN | +inf | -inf
#endif
  return S::isnan(x) | S::eq(S::abs(x), S::set1(std::numeric_limits<float>::infinity()));
}

// An element-wise score function (not softmax) of one vector.
template <class S>
DSK_TK_INLINE typename S::F score_vector(typename S::F x, Scoring scoring) {
  switch (scoring) {
    case Scoring::sigmoid:
      return sigmoid<S>(x);
    case Scoring::sqrtsoftplus:
      return S::sqrt(softplus<S>(x));
    default:
      return x;
  }
}

// Vector v of the biased scores (score + bias) and of their keys (padding lanes removed).
template <class S>
DSK_TK_INLINE void bias_and_keys(const float* bias, int n, int v, typename S::F score,
                                 float* biased, int32_t* keys) {
  const int live = n - 16 * v;
  auto b = score;
  if (bias != nullptr)
    b = S::add(b, live >= 16 ? S::load(bias + 16 * v) : S::load_n(bias + 16 * v, live));
  S::store(biased + 16 * v, b);
  S::istore(keys + 16 * v, S::iselect(first_lanes(live), keys_of<S>(b), S::iset1(kRemoved)));
}

// Applies the score function to n values (padding lanes included) in place.
template <class S>
DSK_TK_INLINE void score_row(float* v, int count, int num_vectors, Scoring scoring) {
  using F = typename S::F;
  switch (scoring) {
    case Scoring::sigmoid:
      for (int i = 0; i < num_vectors; ++i) S::store(v + 16 * i, sigmoid<S>(S::load(v + 16 * i)));
      break;
    case Scoring::sqrtsoftplus:
      for (int i = 0; i < num_vectors; ++i)
        S::store(v + 16 * i, S::sqrt(softplus<S>(S::load(v + 16 * i))));
      break;
    case Scoring::softmax: {
      // max and sum over the real lanes only; lanes accumulate in vector order, then the tree.
      const F neg_inf = S::set1(-std::numeric_limits<float>::infinity());
      F m = neg_inf;
      for (int i = 0; i < num_vectors; ++i) {
        const int live = count - 16 * i;
        m = S::max(S::select(first_lanes(live), S::load(v + 16 * i), neg_inf), m);
      }
      const F row_max = S::set1(S::reduce_max(m));
      F sum = S::zero();
      for (int i = 0; i < num_vectors; ++i) {
        const int live = count - 16 * i;
        const F e =
            S::select(first_lanes(live), exp<S>(S::sub(S::load(v + 16 * i), row_max)), S::zero());
        S::store(v + 16 * i, e);
        sum = S::add(sum, e);
      }
      const F total = S::set1(S::reduce_add(sum));
      for (int i = 0; i < num_vectors; ++i)
        S::store(v + 16 * i, S::div(S::load(v + 16 * i), total));
      break;
    }
    case Scoring::identity:
      break;
  }
}

// The two largest of n finite values (second = -inf when n == 1); equal values count twice.
struct TopTwo {
  float first, second;
  float sum(int topk_sum) const { return topk_sum == 1 ? first : first + second; }
};

DSK_TK_INLINE TopTwo top_two_scalar(const float* v, int n) {
  TopTwo t{v[0], -std::numeric_limits<float>::infinity()};
  for (int i = 1; i < n; ++i) {
    if (v[i] > t.first) {
      t.second = t.first;
      t.first = v[i];
    } else if (v[i] > t.second) {
      t.second = v[i];
    }
  }
  return t;
}

// The same for n a multiple of 16 with lane-wise running maxima; it finds the same two values.
template <class S>
DSK_TK_INLINE TopTwo top_two_vector(const float* v, int n) {
  using F = typename S::F;
  const F neg_inf = S::set1(-std::numeric_limits<float>::infinity());
  F first = neg_inf, second = neg_inf;
  for (int i = 0; i < n; i += 16) {
    const F x = S::load(v + i);
    second = S::max(S::min(first, x), second);
    first = S::max(x, first);
  }
  const float top = S::reduce_max(first);
  const Mask16 at_top = S::eq(first, S::set1(top));
  if ((at_top & (at_top - 1)) != 0) return {top, top};  // the maximum occurs in two lanes
  return {top, S::reduce_max(S::max(S::select(at_top, neg_inf, first), second))};
}

template <class S>
DSK_TK_INLINE TopTwo group_top_two(const float* v, int n) {
  return n % 16 == 0 ? top_two_vector<S>(v, n) : top_two_scalar(v, n);
}

template <class S>
DSK_TK_INLINE float group_top_sum(const float* v, int n, int topk_sum) {
  return group_top_two<S>(v, n).sum(topk_sum);
}

// The int32 key of one finite or infinite score (keys_of for a scalar).
DSK_TK_INLINE int32_t key_of(float x) {
  const uint32_t b = numeric::bits_of(x + 0.0f);
  return static_cast<int32_t>((b & 0x80000000u) != 0 ? b ^ 0x7FFFFFFFu : b);
}

// The k-th largest of n keys (k <= n <= 64): a floor that keeps every candidate of a top-k
// selection when the n keys belong to distinct candidates.
DSK_TK_INLINE int32_t kth_largest(int32_t* keys, int n, int k) {
  if (n == k) {  // the usual case (DeepSeek: 4 groups x 2 = top-8): the minimum
    int32_t m = keys[0];
    for (int i = 1; i < n; ++i) m = keys[i] < m ? keys[i] : m;
    return m;
  }
  for (int j = 0; j < k; ++j) {  // selection sort of the first k
    int best = j;
    for (int i = j + 1; i < n; ++i) best = keys[i] > keys[best] ? i : best;
    const int32_t t = keys[j];
    keys[j] = keys[best];
    keys[best] = t;
  }
  return keys[k - 1];
}

// Ranks `num_groups` group scores: bit g of the result is set for the best `k` groups. A group's
// rank is the number of groups before it (higher score, or equal score and smaller index);
// computed for all groups at once, without data-dependent branches.
DSK_TK_INLINE uint32_t select_groups(const float* group_scores, int num_groups, int k) {
  uint32_t kept = 0;
  for (int g = 0; g < num_groups; ++g) {
    int rank = 0;
    for (int h = 0; h < num_groups; ++h)
      rank +=
          (group_scores[h] > group_scores[g]) | ((group_scores[h] == group_scores[g]) & (h < g));
    kept |= static_cast<uint32_t>(rank < k) << g;
  }
  return kept;
}

// The same, written best first (topk_sum_and_topk_group_idx's output order).
DSK_TK_INLINE void select_groups(const float* group_scores, int num_groups, int k, int* out) {
  for (int g = 0; g < num_groups; ++g) {
    int rank = 0;
    for (int h = 0; h < num_groups; ++h)
      rank +=
          (group_scores[h] > group_scores[g]) | ((group_scores[h] == group_scores[g]) & (h < g));
    if (rank < k) out[rank] = g;
  }
}

#if DSK_TILE_HAS_AVX512
// Folds of lane-wise top-2 pairs: (first, second) of a and b -> the top 2 of the four values
// (a multiset: equal values count twice). Exact, so any fold order finds the same two values.
DSK_TK_INLINE void merge_top_two(__m512& first, __m512& second, __m512 first_b, __m512 second_b) {
  second = _mm512_max_ps(_mm512_min_ps(first, first_b), _mm512_max_ps(second, second_b));
  first = _mm512_max_ps(first, first_b);
}

// The top two of each of 8 groups of 32 scores (DeepSeek-V3: 256 experts in 8 groups), all groups
// at once: each fold step halves the lanes a group spans and packs twice the groups per vector
// (16 lanes x 8 vectors -> 8 x 4 -> 4 x 2 -> 2 x 1 -> 1 lane pair), instead of two horizontal
// reductions per group. Writes group g's first and second best to first[g], second[g].
DSK_TK_INLINE void top_two_of_8_groups_of_32(const float* v, float* first, float* second) {
  __m512 f[8], s[8];
  for (int g = 0; g < 8; ++g) {
    const __m512 x0 = _mm512_loadu_ps(v + 32 * g), x1 = _mm512_loadu_ps(v + 32 * g + 16);
    f[g] = _mm512_max_ps(x0, x1);
    s[g] = _mm512_min_ps(x0, x1);
  }
  // 128-bit blocks: [A0 A1 B0 B1] with [A2 A3 B2 B3]: groups 2i, 2i+1 in 8 lanes each.
  for (int i = 0; i < 4; ++i) {
    const __m512 fa = f[2 * i], fb = f[2 * i + 1], sa = s[2 * i], sb = s[2 * i + 1];
    f[i] = _mm512_shuffle_f32x4(fa, fb, _MM_SHUFFLE(1, 0, 1, 0));
    s[i] = _mm512_shuffle_f32x4(sa, sb, _MM_SHUFFLE(1, 0, 1, 0));
    merge_top_two(f[i], s[i], _mm512_shuffle_f32x4(fa, fb, _MM_SHUFFLE(3, 2, 3, 2)),
                  _mm512_shuffle_f32x4(sa, sb, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // [P0 P2 Q0 Q2] with [P1 P3 Q1 Q3]: block m of vector j is group 4j + m.
  for (int j = 0; j < 2; ++j) {
    const __m512 fp = f[2 * j], fq = f[2 * j + 1], sp = s[2 * j], sq = s[2 * j + 1];
    f[j] = _mm512_shuffle_f32x4(fp, fq, _MM_SHUFFLE(2, 0, 2, 0));
    s[j] = _mm512_shuffle_f32x4(sp, sq, _MM_SHUFFLE(2, 0, 2, 0));
    merge_top_two(f[j], s[j], _mm512_shuffle_f32x4(fp, fq, _MM_SHUFFLE(3, 1, 3, 1)),
                  _mm512_shuffle_f32x4(sp, sq, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // Within blocks: lanes 0-1 of block m are group m, lanes 2-3 group m + 4.
  __m512 f3 = _mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(1, 0, 1, 0));
  __m512 s3 = _mm512_shuffle_ps(s[0], s[1], _MM_SHUFFLE(1, 0, 1, 0));
  merge_top_two(f3, s3, _mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(3, 2, 3, 2)),
                _mm512_shuffle_ps(s[0], s[1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Lane pairs: lane 4m holds group m, lane 4m + 2 group m + 4.
  __m512 f4 = _mm512_permute_ps(f3, _MM_SHUFFLE(2, 2, 0, 0));
  __m512 s4 = _mm512_permute_ps(s3, _MM_SHUFFLE(2, 2, 0, 0));
  merge_top_two(f4, s4, _mm512_permute_ps(f3, _MM_SHUFFLE(3, 3, 1, 1)),
                _mm512_permute_ps(s3, _MM_SHUFFLE(3, 3, 1, 1)));
  const __m512i order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 10, 6, 2, 12, 8, 4, 0);
  _mm256_storeu_ps(first, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f4)));
  _mm256_storeu_ps(second, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, s4)));
}

// select_groups for 8 group scores: ranks by 64-bit keys (score key, then the smaller index),
// so a group's rank is the number of larger keys.
DSK_TK_INLINE uint32_t select_8_groups(const float* group_scores, int k) {
  const __m256 x = _mm256_add_ps(_mm256_loadu_ps(group_scores), _mm256_setzero_ps());  // -0 -> +0
  const __m256i b = _mm256_castps_si256(x);
  const __m256i key32 =
      _mm256_mask_xor_epi32(b, _mm256_movepi32_mask(b), b, _mm256_set1_epi32(0x7FFFFFFF));
  const __m512i key = _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepi32_epi64(key32), 32),
                                      _mm512_set_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  uint32_t kept = 0;
  for (int g = 0; g < 8; ++g) {
    const __m512i mine = _mm512_permutexvar_epi64(_mm512_set1_epi64(g), key);
    const int rank = __builtin_popcount(_mm512_cmpgt_epi64_mask(key, mine));
    kept |= static_cast<uint32_t>(rank < k) << g;
  }
  return kept;
}
#endif

// The num_topk best experts by biased score inside the best num_topk_groups groups.
template <class S>
DSK_TK_INLINE void select_experts(const GateArgs& a, int num_experts, int num_groups,
                                  const float* biased, const int32_t* keys, int64_t* selected) {
  Candidates c;
  if (a.num_topk_groups < num_groups) {
    const int per_group = num_experts / num_groups;
    TopTwo top[kMaxGroups];
    float group_scores[kMaxGroups];
    uint32_t kept = 0;
#if DSK_TILE_HAS_AVX512
    if (std::is_same_v<S, Simd<tile::avx512_t>> && num_groups == 8 && per_group == 32) {
      alignas(32) float first[8], second[8];
      top_two_of_8_groups_of_32(biased, first, second);
      for (int g = 0; g < 8; ++g) {
        top[g] = {first[g], second[g]};
        group_scores[g] = top[g].sum(a.topk_sum);
      }
      kept = select_8_groups(group_scores, a.num_topk_groups);
    } else
#endif
    {
      for (int g = 0; g < num_groups; ++g) {
        top[g] = group_top_two<S>(biased + g * per_group, per_group);
        group_scores[g] = top[g].sum(a.topk_sum);
      }
      kept = select_groups(group_scores, num_groups, a.num_topk_groups);
    }
    // Each kept group's two best are distinct candidates: the k-th best of them is a floor.
    // The kept groups are visited in increasing index by clearing the lowest set bit: a loop of
    // num_topk_groups iterations, where testing every group's bit mispredicts about half of them.
    int32_t witnesses[2 * kMaxGroups];
    int num_witnesses = 0;
    for (uint32_t rest = kept; rest != 0; rest &= rest - 1) {
      const int g = __builtin_ctz(rest);
      witnesses[num_witnesses++] = key_of(top[g].first);
      if (per_group >= 2) witnesses[num_witnesses++] = key_of(top[g].second);
    }
    const int32_t floor = num_witnesses >= a.num_topk
                              ? kth_largest(witnesses, num_witnesses, a.num_topk)
                              : std::numeric_limits<int32_t>::min();
    // Candidates in increasing expert index (the tie rule counts on it).
    for (uint32_t rest = kept; rest != 0; rest &= rest - 1)
      add_candidates<S>(c, keys, __builtin_ctz(rest) * per_group, per_group, floor);
  } else {
    const int first = 0;
    const int32_t floor = num_experts % 16 == 0
                              ? candidate_floor<S>(keys, &first, 1, num_experts, a.num_topk)
                              : std::numeric_limits<int32_t>::min();
    add_candidates<S>(c, keys, 0, num_experts, floor);
  }
  select_best<S>(c, a.num_topk, selected);
}

// Row outputs: the selection and its weights, w_j = s_j / sum * scale (sum = 1e-20 + s_0 + s_1
// + ... in slot order) or s_j * scale; the vector form does the same IEEE operations per slot.
template <class S>
DSK_TK_INLINE void write_weights(const GateArgs& a, const float* scores, const int64_t* selected,
                                 int64_t* idx, float* w) {
  float sum = 1e-20f;
#if DSK_TILE_HAS_AVX512
  if constexpr (std::is_same_v<S, Simd<tile::avx512_t>>) {
    if (a.num_topk <= 8) {
      const __mmask8 live = static_cast<__mmask8>((1u << a.num_topk) - 1);
      const __m512i sel = _mm512_maskz_loadu_epi64(live, selected);
      const __m256 s = _mm512_mask_i64gather_ps(_mm256_setzero_ps(), live, sel, scores, 4);
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, s);
      for (int j = 0; j < a.num_topk; ++j) sum += lanes[j];
      const __m256 scale = _mm256_set1_ps(a.scale);
      const __m256 wv = a.normalize ? _mm256_mul_ps(_mm256_div_ps(s, _mm256_set1_ps(sum)), scale)
                                    : _mm256_mul_ps(s, scale);
      _mm512_mask_storeu_epi64(idx, live, sel);
      _mm256_mask_storeu_ps(w, live, wv);
      return;
    }
  }
#endif
  for (int j = 0; j < a.num_topk; ++j) {
    idx[j] = selected[j];
    w[j] = scores[selected[j]];
    sum += w[j];
  }
  for (int j = 0; j < a.num_topk; ++j) w[j] = a.normalize ? w[j] / sum * a.scale : w[j] * a.scale;
}

}  // namespace routing_detail

// ---- kernels ----

template <tile::Isa I>
void topk_rows(const TopkArgs& a, int64_t t0, int64_t t1) {
  using S = SimdOf<I>;
  using namespace routing_detail;
  const int num_vectors = (a.num_experts + 15) / 16;
  alignas(64) int32_t keys[kMaxExperts];
  for (int64_t t = t0; t < t1; ++t) {
    const float* row = a.scores + t * a.scores_stride;
    for (int v = 0; v < num_vectors; ++v) {
      const int live = a.num_experts - 16 * v;
      const auto x = live >= 16 ? S::load(row + 16 * v) : S::load_n(row + 16 * v, live);
      S::istore(keys + 16 * v, S::iselect(first_lanes(live), keys_of<S>(x), S::iset1(kRemoved)));
    }
    Candidates c;
    add_candidates<S>(c, keys, 0, a.num_experts);
    select_best<S>(c, a.num_topk, a.idx + t * a.num_topk);
  }
}

template <tile::Isa I>
void group_rows(const GroupArgs& a, int64_t t0, int64_t t1) {
  using S = SimdOf<I>;
  using namespace routing_detail;
  float group_scores[kMaxGroups];
  int best[kMaxGroups];
  for (int64_t t = t0; t < t1; ++t) {
    const float* row = a.scores + t * a.scores_stride;
    for (int g = 0; g < a.num_groups; ++g)
      group_scores[g] =
          group_top_sum<S>(row + g * a.experts_per_group, a.experts_per_group, a.topk_sum);
    select_groups(group_scores, a.num_groups, a.num_topk_groups, best);
    for (int j = 0; j < a.num_topk_groups; ++j) a.idx[t * a.num_topk_groups + j] = best[j];
  }
}

// kExperts / kGroups: compile-time num_experts / num_groups of an AOT instance, 0 for any.
template <tile::Isa I, int kExperts = 0, int kGroups = 0>
void gate_rows(const GateArgs& a, int64_t t0, int64_t t1) {
  using S = SimdOf<I>;
  using namespace routing_detail;
  const int n = kExperts != 0 ? kExperts : a.num_experts;
  const int num_groups = kGroups != 0 ? kGroups : a.num_groups;
  const int num_vectors = (n + 15) / 16;
  alignas(64) float scores[kMaxExperts];
  alignas(64) float biased[kMaxExperts];
  alignas(64) int32_t keys[kMaxExperts];
  int64_t selected[kMaxTopk];
  for (int64_t t = t0; t < t1; ++t) {
    int64_t* idx = a.idx + t * a.out_stride;
    float* w = a.weights + t * a.out_stride;
    if (a.mask != nullptr && a.mask[t] == 0) {
      for (int j = 0; j < a.num_topk; ++j) idx[j] = -1, w[j] = 0.0f;
      continue;
    }
    const float* logits = a.logits + t * a.logits_stride;
    if (a.scoring == Scoring::softmax) {
      load_padded<S>(logits, n, 0.0f, scores);
      if (a.non_finite != nullptr) a.non_finite[t] = any_non_finite<S>(scores, num_vectors);
      score_row<S>(scores, n, num_vectors, a.scoring);
      for (int v = 0; v < num_vectors; ++v)
        bias_and_keys<S>(a.bias, n, v, S::load(scores + 16 * v), biased, keys);
    } else {
      // Element-wise scores: one pass from the logits to scores, biased scores and keys.
      Mask16 bad = 0;
      for (int v = 0; v < num_vectors; ++v) {
        const int live = n - 16 * v;
        const auto x = live >= 16 ? S::load(logits + 16 * v) : S::load_n(logits + 16 * v, live);
        bad |= non_finite_lanes<S>(x);
        const auto s = score_vector<S>(x, a.scoring);
        S::store(scores + 16 * v, s);
        bias_and_keys<S>(a.bias, n, v, s, biased, keys);
      }
      if (a.non_finite != nullptr) a.non_finite[t] = bad != 0;
    }
    const bool fixed = a.fix_mask != nullptr && a.fix_mask[t] != 0;
    if (fixed) {
      for (int j = 0; j < a.num_topk; ++j) selected[j] = a.fixed_idx[t * a.fixed_stride + j];
    } else {
      select_experts<S>(a, n, num_groups, biased, keys, selected);
    }
    write_weights<S>(a, scores, selected, idx, w);
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels

DSK_SILENCE_GCC_BUG_105593_END
