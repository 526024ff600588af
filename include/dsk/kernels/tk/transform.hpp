// Position and basis transforms of attention inputs, in place on rows of f32 / bf16 / f16:
//
// RoPE (apply_rotary): each head vector of rot_dim values is rotated pairwise by the angles of its
// token's position, c = cos_sin_cache[pos, i], s = cos_sin_cache[pos, rot_dim / 2 + i]
// (s negated when conjugate):
//   interleaved (GPT-J, MLA):   pairs (2i, 2i + 1)
//   half split (NeoX, indexer): pairs (i, i + rot_dim / 2)
//   (a, b) -> (a * c - b * s, b * c + a * s), each product and sum rounded once in f32.
//
// Hadamard: y = scale * H_n x with H_n the Sylvester-ordered Walsh-Hadamard matrix
// (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]), n a power of two in [16, 1024], evaluated in f32
// as butterflies (a, b) -> (a + b, a - b) with strides 1, 2, 4, ... n / 2, then one multiply.
#pragma once

#include <cstdint>

#include <dsk/kernels/tk/simd.hpp>

namespace dsk::tk::kernels {

inline constexpr int kMaxRotDim = 256;
inline constexpr int kMaxHadamard = 1024;

// Rows are (token, head) pairs: head h of token t starts at x + t * token_stride + h * head_stride
// (elements); the position of token t is positions[t] (int32 or int64, whichever is non-null) plus
// offset, or t + offset without positions.
struct RopeArgs {
  void* x = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t num_heads = 0;
  int rot_dim = 64;
  const float* cache = nullptr;
  int64_t cache_stride = 0;
  const int32_t* positions32 = nullptr;
  const int64_t* positions64 = nullptr;
  int64_t offset = 0;
  bool interleaved = false;
  bool conjugate = false;
};

struct HadamardArgs {
  void* x = nullptr;  // rows of n elements, x_stride apart; transformed in place into out
  int64_t x_stride = 0;
  void* out = nullptr;
  int64_t out_stride = 0;
  int n = 128;
  float scale = 1.0f;
};

inline namespace DSK_TILE_ABI {

inline int64_t rope_position(const RopeArgs& a, int64_t t) {
  const int64_t p = a.positions32 ? a.positions32[t] : a.positions64 ? a.positions64[t] : t;
  return p + a.offset;
}

// Tokens [t0, t1).
template <tile::Isa I, class T>
void rope_rows(const RopeArgs& a, int64_t t0, int64_t t1) {
  using S = SimdOf<I>;
  const int half = a.rot_dim / 2;
  const float sign = a.conjugate ? -1.0f : 1.0f;
  alignas(64) float cos_row[kMaxRotDim];
  alignas(64) float sin_row[kMaxRotDim];  // signed: interleaved lanes 2i hold -s, 2i + 1 hold +s
  for (int64_t t = t0; t < t1; ++t) {
    const float* c = a.cache + rope_position(a, t) * a.cache_stride;
    if (a.interleaved) {
      for (int i = 0; i < half; ++i) {
        cos_row[2 * i] = cos_row[2 * i + 1] = c[i];
        sin_row[2 * i] = -(sign * c[half + i]);
        sin_row[2 * i + 1] = sign * c[half + i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        cos_row[i] = c[i];
        sin_row[i] = sign * c[half + i];
      }
    }
    for (int64_t h = 0; h < a.num_heads; ++h) {
      T* v = static_cast<T*>(a.x) + t * a.token_stride + h * a.head_stride;
      if (a.interleaved) {
        for (int i = 0; i < a.rot_dim; i += 16) {
          const auto x = S::load(v + i);
          const auto partner = S::template swap_lanes<1>(x);
          S::store(v + i,
                   S::add(S::mul(x, S::load(cos_row + i)), S::mul(partner, S::load(sin_row + i))));
        }
      } else {
        for (int i = 0; i < half; i += 16) {
          const auto lo = S::load(v + i);
          const auto hi = S::load(v + half + i);
          const auto cs = S::load(cos_row + i);
          const auto sn = S::load(sin_row + i);
          S::store(v + i, S::sub(S::mul(lo, cs), S::mul(hi, sn)));
          S::store(v + half + i, S::add(S::mul(hi, cs), S::mul(lo, sn)));
        }
      }
    }
  }
}

namespace hadamard_detail {

// One in-vector butterfly stage: lanes with bit kStride clear get a + b, the others b - a, as
// b + a * (+-1) (the same IEEE results in one FMA instead of add, sub, blend).
template <class S, int kStride>
DSK_TK_INLINE typename S::F butterfly(typename S::F x) {
  constexpr Mask16 kUpper = kStride == 1   ? 0xAAAAu
                            : kStride == 2 ? 0xCCCCu
                            : kStride == 4 ? 0xF0F0u
                                           : 0xFF00u;
  const auto sign = S::select(kUpper, S::set1(-1.0f), S::set1(1.0f));
  return S::add_signed(S::template swap_lanes<kStride>(x), x, sign);
}

// The four in-vector stages (strides 1, 2, 4, 8).
template <class S>
DSK_TK_INLINE typename S::F butterflies_in_vector(typename S::F x) {
  return butterfly<S, 8>(butterfly<S, 4>(butterfly<S, 2>(butterfly<S, 1>(x))));
}

// One butterfly stage between the vectors i and i + kH of a row, for every i with bit kH clear.
// The loop has a constant trip count and kH is a constant, so it unrolls completely and x stays
// in registers (with a runtime stride GCC kept x on the stack and reloaded it every stage).
template <class S, int kH, int kVectors>
DSK_TK_INLINE void butterflies_across_vectors(typename S::F (&x)[kVectors]) {
  if constexpr (kH < kVectors) {
#pragma GCC unroll 16
    for (int i = 0; i < kVectors; ++i) {
      if ((i & kH) != 0) continue;
      const auto lo = x[i], hi = x[i + kH];
      x[i] = S::add(lo, hi);
      x[i + kH] = S::sub(lo, hi);
    }
  }
}

// A row of kVectors * 16 values kept in registers: the same operations, in the same order per
// value, as the buffered loop of hadamard_rows, without its store-to-load round trip per stage.
template <class S, int kVectors, class T>
DSK_TK_INLINE void hadamard_row_in_registers(const T* src, T* dst, typename S::F scale) {
  typename S::F x[kVectors];
#pragma GCC unroll 16
  for (int i = 0; i < kVectors; ++i) x[i] = butterflies_in_vector<S>(S::load(src + 16 * i));
  butterflies_across_vectors<S, 1>(x);
  butterflies_across_vectors<S, 2>(x);
  butterflies_across_vectors<S, 4>(x);
  butterflies_across_vectors<S, 8>(x);
#pragma GCC unroll 16
  for (int i = 0; i < kVectors; i += 2)
    S::store2(dst + 16 * i, S::mul(x[i], scale), S::mul(x[i + 1], scale));
}

}  // namespace hadamard_detail

// Rows [r0, r1).
template <tile::Isa I, class T>
void hadamard_rows(const HadamardArgs& a, int64_t r0, int64_t r1) {
  using S = SimdOf<I>;
  alignas(64) float buf[kMaxHadamard];
  const int n = a.n;
  const auto scale = S::set1(a.scale);
  if (n == 64 || n == 128 || n == 256) {  // 128: the indexer's size
    for (int64_t r = r0; r < r1; ++r) {
      const T* src = static_cast<const T*>(a.x) + r * a.x_stride;
      T* dst = static_cast<T*>(a.out) + r * a.out_stride;
      if (n == 64)
        hadamard_detail::hadamard_row_in_registers<S, 4>(src, dst, scale);
      else if (n == 128)
        hadamard_detail::hadamard_row_in_registers<S, 8>(src, dst, scale);
      else
        hadamard_detail::hadamard_row_in_registers<S, 16>(src, dst, scale);
    }
    return;
  }
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = static_cast<const T*>(a.x) + r * a.x_stride;
    for (int i = 0; i < n; i += 16) {
      S::store(buf + i, hadamard_detail::butterflies_in_vector<S>(S::load(src + i)));
    }
    for (int h = 16; h < n; h *= 2) {
      for (int base = 0; base < n; base += 2 * h) {
        for (int i = base; i < base + h; i += 16) {
          const auto lo = S::load(buf + i);
          const auto hi = S::load(buf + i + h);
          S::store(buf + i, S::add(lo, hi));
          S::store(buf + i + h, S::sub(lo, hi));
        }
      }
    }
    T* dst = static_cast<T*>(a.out) + r * a.out_stride;
    for (int i = 0; i < n; i += 16) S::store(dst + i, S::mul(S::load(buf + i), scale));
  }
}

}  // namespace DSK_TILE_ABI
}  // namespace dsk::tk::kernels
