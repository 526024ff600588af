// The "core" module: the bulk dtype conversions (dsk::convert_*) checked bit for bit against the
// scalar rules of <dsk/kernels/numeric.hpp>, and convert_f32_to_bf16 benchmarked as the
// memory-bound kernel it is (DRAM roof, peer: the scalar rule in a plain loop).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include <fmt/format.h>

#include <dsk/core/dtype.hpp>
#include <dsk/core/tensor.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

// ---- storage ----

// Elements of storage that `n` values occupy (fp4x2 packs two values per byte).
template <class T>
size_t storage_count(size_t n) {
  return std::is_same_v<T, fp4x2> ? n / 2 : n;
}

template <class T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> v(storage_count<T>(n));
  std::memset(v.data(), 0xFF, v.size() * sizeof(T));  // NaN in every format that has one
  return v;
}

// ---- random inputs ----

// f32 inputs for narrowing conversions: a quarter raw bit patterns (NaN, inf, subnormals, huge
// values), the rest values of random sign around the formats' ranges, and a sprinkling of the
// values where rounding rules differ (ties, the largest finite values, zeros).
std::vector<float> random_f32(size_t n, std::mt19937_64& rng) {
  static const float kEdges[] = {0.0f,      -0.0f,          448.0f,
                                 464.0f,    57344.0f,       61440.0f,
                                 65504.0f,  65520.0f,       6.0f,
                                 5.0f,      0.25f,          0.75f,
                                 2.5f,      1.0f + 0x1p-8f, 0x1p-126f,
                                 0x1p-149f, 3.0e38f,        std::numeric_limits<float>::infinity()};
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 20), pick(0, 15);
  std::vector<float> v(n);
  for (float& x : v) {
    const int kind = pick(rng);
    if (kind < 4) {
      const uint32_t b = bits(rng);
      std::memcpy(&x, &b, 4);
    } else if (kind == 4) {
      x = kEdges[bits(rng) % std::size(kEdges)];
    } else {
      x = std::ldexp(mantissa(rng), exponent(rng));
    }
    if (bits(rng) & 1) x = -x;
  }
  return v;
}

// Every bit pattern is a valid input for widening conversions, NaNs included.
template <class T>
std::vector<T> random_bits(size_t count, std::mt19937_64& rng) {
  std::vector<T> v(count);
  for (T& x : v) x.bits = static_cast<decltype(x.bits)>(rng());
  return v;
}

// ---- the checks ----

template <class T>
size_t mismatches(const std::vector<T>& got, const std::vector<T>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return bad;
}

// Converts `src` with the bulk function and the scalar rule, whole and from an odd offset (so
// unaligned heads and every tail length are exercised), and counts differing output elements.
template <class Src, class Dst, class Bulk, class Scalar>
double count_mismatches(const std::vector<Src>& src, size_t n, Bulk bulk, Scalar scalar) {
  const size_t offset = std::is_same_v<Src, fp4x2> || std::is_same_v<Dst, fp4x2> ? 2 : 1;
  double bad = 0;
  for (size_t start : {size_t{0}, offset}) {
    const size_t count = n - start;
    std::vector<Dst> got = poisoned<Dst>(count), want = poisoned<Dst>(count);
    bulk(src.data() + storage_count<Src>(start), got.data(), count);
    scalar(src.data() + storage_count<Src>(start), want.data(), count);
    bad += static_cast<double>(mismatches(got, want));
  }
  return bad;
}

template <class Src, class Dst>
using BulkFn = void (*)(const Src*, Dst*, size_t);

// A verify case for a narrowing conversion f32 -> Dst whose scalar rule is `rule`.
template <class Dst>
VerifyCase narrowing_case(const char* name, BulkFn<float, Dst> bulk, Dst (*rule)(float), size_t n) {
  return {.name = name,
          .shape = fmt::format("n={}", n),
          .metric = "mismatches",
          .tolerance = 0,
          .run = [=](const CaseContext&) {
            std::mt19937_64 rng = fresh_rng();
            const std::vector<float> src = random_f32(n, rng);
            return count_mismatches<float, Dst>(src, n, bulk,
                                                [&](const float* s, Dst* d, size_t k) {
                                                  for (size_t i = 0; i < k; ++i) d[i] = rule(s[i]);
                                                });
          }};
}

// A verify case for a widening conversion Src -> Dst, checked on random bit patterns.
template <class Src, class Dst>
VerifyCase widening_case(const char* name, BulkFn<Src, Dst> bulk, Dst (*rule)(Src), size_t n) {
  return {.name = name,
          .shape = fmt::format("n={}", n),
          .metric = "mismatches",
          .tolerance = 0,
          .run = [=](const CaseContext&) {
            std::mt19937_64 rng = fresh_rng();
            const std::vector<Src> src = random_bits<Src>(n, rng);
            return count_mismatches<Src, Dst>(src, n, bulk, [&](const Src* s, Dst* d, size_t k) {
              for (size_t i = 0; i < k; ++i) d[i] = rule(s[i]);
            });
          }};
}

bf16 e4m3_to_bf16_rule(e4m3 x) {
  return numeric::f32_to_bf16(numeric::e4m3_to_f32(x));
}

VerifyCase fp4_pack_case(size_t n) {
  return {.name = "convert_f32_to_fp4x2",
          .shape = fmt::format("n={}", n),
          .metric = "mismatches",
          .tolerance = 0,
          .run = [=](const CaseContext&) {
            std::mt19937_64 rng = fresh_rng();
            const std::vector<float> src = random_f32(n, rng);
            auto rule = [](const float* s, fp4x2* d, size_t k) {
              for (size_t i = 0; i < k / 2; ++i)
                d[i] = numeric::pack_e2m1(numeric::f32_to_e2m1(s[2 * i]),
                                          numeric::f32_to_e2m1(s[2 * i + 1]));
            };
            return count_mismatches<float, fp4x2>(src, n, convert_f32_to_fp4x2, rule);
          }};
}

VerifyCase fp4_unpack_case(size_t n) {
  return {.name = "convert_fp4x2_to_f32",
          .shape = fmt::format("n={}", n),
          .metric = "mismatches",
          .tolerance = 0,
          .run = [=](const CaseContext&) {
            std::mt19937_64 rng = fresh_rng();
            const std::vector<fp4x2> src = random_bits<fp4x2>(n / 2, rng);
            auto rule = [](const fp4x2* s, float* d, size_t k) {
              for (size_t i = 0; i < k / 2; ++i) {
                d[2 * i] = numeric::e2m1_to_f32(numeric::e2m1_low(s[i]));
                d[2 * i + 1] = numeric::e2m1_to_f32(numeric::e2m1_high(s[i]));
              }
            };
            return count_mismatches<fp4x2, float>(src, n, convert_fp4x2_to_f32, rule);
          }};
}

void add_conversion_checks(Registry& r) {
  constexpr size_t n = 100003;      // odd: every vector width leaves a tail
  constexpr size_t n_fp4 = 100002;  // fp4x2 arrays need an even count
  r.add(narrowing_case<bf16>("convert_f32_to_bf16", convert_f32_to_bf16, numeric::f32_to_bf16, n));
  r.add(widening_case<bf16, float>("convert_bf16_to_f32", convert_bf16_to_f32, numeric::bf16_to_f32,
                                   n));
  r.add(narrowing_case<f16>("convert_f32_to_f16", convert_f32_to_f16, numeric::f32_to_f16, n));
  r.add(
      widening_case<f16, float>("convert_f16_to_f32", convert_f16_to_f32, numeric::f16_to_f32, n));
  r.add(narrowing_case<e4m3>("convert_f32_to_e4m3", convert_f32_to_e4m3, numeric::f32_to_e4m3, n));
  r.add(widening_case<e4m3, float>("convert_e4m3_to_f32", convert_e4m3_to_f32, numeric::e4m3_to_f32,
                                   n));
  r.add(widening_case<e4m3, bf16>("convert_e4m3_to_bf16", convert_e4m3_to_bf16, e4m3_to_bf16_rule,
                                  n));
  r.add(narrowing_case<e5m2>("convert_f32_to_e5m2", convert_f32_to_e5m2, numeric::f32_to_e5m2, n));
  r.add(widening_case<e5m2, float>("convert_e5m2_to_f32", convert_e5m2_to_f32, numeric::e5m2_to_f32,
                                   n));
  r.add(fp4_pack_case(n_fp4));
  r.add(fp4_unpack_case(n_fp4));
}

// ---- the benchmark ----

// The peer: the scalar rule in a plain loop, as a user without dsk would write it.
void scalar_f32_to_bf16(const float* src, bf16* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = numeric::f32_to_bf16(src[i]);
}

// `copies` pairs of (f32 source, bf16 destination) buffers, rotated so every call streams from
// DRAM.
struct ConvertBuffers {
  std::vector<Tensor> src, dst;
};

BenchCase convert_bench(size_t n, bool quick) {
  const size_t working_set = n * (sizeof(float) + sizeof(bf16));
  return {.name = "convert_f32_to_bf16",
          .shape = fmt::format("n={}Mi", n >> 20),
          .ceiling = "dram_read",
          .peer = "scalar loop",
          .residency = Residency::cold,
          .working_set_bytes = working_set,
          .quick = quick,
          .prepare = [n, working_set](const CaseContext& ctx) {
            auto buffers = std::make_shared<ConvertBuffers>();
            for (int c = 0; c < ctx.copies; ++c) {
              Tensor src = Tensor::empty({static_cast<int64_t>(n)}, DType::f32);
              fill_uniform(src.data<float>(), n, 0x9E3779B97F4A7C15ull + c);
              buffers->src.push_back(src);
              buffers->dst.push_back(Tensor::empty({static_cast<int64_t>(n)}, DType::bf16));
              buffers->dst.back().fill_bytes_(0xFF);  // fault the pages in before timing
            }
            Prepared p;
            p.kernel = [buffers, n](int c) {
              convert_f32_to_bf16(buffers->src[c].data<float>(), buffers->dst[c].data<bf16>(), n);
            };
            p.peer = [buffers, n](int c) {
              scalar_f32_to_bf16(buffers->src[c].data<float>(), buffers->dst[c].data<bf16>(), n);
            };
            p.flops = static_cast<double>(n);  // one conversion per element
            p.bytes = static_cast<double>(working_set);
            return p;
          }};
}

}  // namespace

void register_core_cases(Registry& r) {
  add_conversion_checks(r);
  r.add(convert_bench(size_t{4} << 20, true));
  r.add(convert_bench(size_t{32} << 20, false));
}

}  // namespace dsk::bench
