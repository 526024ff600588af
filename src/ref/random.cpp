// Seeded, counter-based random tensors: element i is a pure function of (seed, i), so generation
// runs in parallel and gives the same tensor for any thread count.
#include <cmath>
#include <limits>
#include <numbers>

#include <fmt/format.h>

#include <dsk/core/threads.hpp>
#include <dsk/ref.hpp>

namespace dsk::ref {
namespace {

// splitmix64's output function (Steele, Lea and Flood 2014).
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1] from 32 random bits (never 0, so log() is finite).
double unit_open_closed(uint32_t bits) {
  return (static_cast<double>(bits) + 1.0) * 0x1.0p-32;
}

// The dtypes random values can be drawn in (ue8m0 holds scales, not data).
bool is_float_dtype(DType t) {
  return is_floating_point(t) && t != DType::ue8m0;
}

// Stores value v as element i of a contiguous float array of `dtype` (not fp4x2). The wide formats
// get v rounded to bf16; the 8-bit ones quantize it directly.
void store_float(DType dtype, char* data, int64_t i, float v) {
  const float r = numeric::round_to_bf16(v);
  switch (dtype) {
    case DType::f64:
      reinterpret_cast<double*>(data)[i] = r;
      break;
    case DType::f32:
      reinterpret_cast<float*>(data)[i] = r;
      break;
    case DType::f16:
      reinterpret_cast<f16*>(data)[i] = numeric::f32_to_f16(r);
      break;
    case DType::bf16:
      reinterpret_cast<bf16*>(data)[i] = numeric::f32_to_bf16(r);
      break;
    case DType::e4m3:
      reinterpret_cast<e4m3*>(data)[i] = numeric::f32_to_e4m3(v);
      break;
    default:
      reinterpret_cast<e5m2*>(data)[i] = numeric::f32_to_e5m2(v);
      break;
  }
}

// A new tensor whose value j is value_of(j), filled in parallel (fp4x2: byte i holds values 2i
// and 2i+1).
template <class ValueOf>
Tensor generate_floats(const char* fn, const Shape& shape, DType dtype, ValueOf value_of) {
  DSK_CHECK_ARG(is_float_dtype(dtype), fn, "dtype",
                "a float dtype (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, "
                "float4_e2m1fn_x2)",
                dtype);
  Tensor t = Tensor::empty(shape, dtype);
  char* data = static_cast<char*>(t.data_ptr());
  auto fill = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const auto j = static_cast<uint64_t>(i);
      if (dtype == DType::fp4x2)
        reinterpret_cast<fp4x2*>(data)[i] = numeric::pack_e2m1(
            numeric::f32_to_e2m1(value_of(2 * j)), numeric::f32_to_e2m1(value_of(2 * j + 1)));
      else
        store_float(dtype, data, i, value_of(j));
    }
  };
  parallel_for(t.numel(), fill, 4096);
  return t;
}

void check_finite(const char* fn, const char* arg, float v) {
  DSK_CHECK_ARG(std::isfinite(v), fn, arg, "a finite value", v);
}

}  // namespace

uint64_t random_u64(uint64_t seed, uint64_t counter) {
  return mix64(mix64(seed) + (counter + 1) * 0x9E3779B97F4A7C15ull);
}

Tensor randn(const Shape& shape, DType dtype, uint64_t seed, float mean, float std) {
  check_finite("dsk::ref::randn", "mean", mean);
  check_finite("dsk::ref::randn", "std", std);
  DSK_CHECK_ARG(std >= 0.0f, "dsk::ref::randn", "std", "std >= 0", std);
  // Box-Muller on two 32-bit uniforms from one 64-bit draw (tails reach about 6.7 sigma).
  auto value_of = [=](uint64_t i) {
    const uint64_t bits = random_u64(seed, i);
    const double radius = std::sqrt(-2.0 * std::log(unit_open_closed(static_cast<uint32_t>(bits))));
    const double angle =
        2.0 * std::numbers::pi * unit_open_closed(static_cast<uint32_t>(bits >> 32));
    return static_cast<float>(mean + std * radius * std::cos(angle));
  };
  return generate_floats("dsk::ref::randn", shape, dtype, value_of);
}

Tensor rand_uniform(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi) {
  check_finite("dsk::ref::rand_uniform", "lo", lo);
  check_finite("dsk::ref::rand_uniform", "hi", hi);
  DSK_CHECK_ARG(lo <= hi, "dsk::ref::rand_uniform", "hi", fmt::format("hi >= lo ({})", lo), hi);
  auto value_of = [=](uint64_t i) {
    const double u = static_cast<double>(random_u64(seed, i) >> 11) * 0x1.0p-53;  // [0, 1)
    return static_cast<float>(lo + (static_cast<double>(hi) - lo) * u);
  };
  return generate_floats("dsk::ref::rand_uniform", shape, dtype, value_of);
}

Tensor rand_wide(const Shape& shape, DType dtype, uint64_t seed, int max_exponent) {
  DSK_CHECK_ARG(max_exponent >= 0 && max_exponent <= 100, "dsk::ref::rand_wide", "max_exponent",
                "0 to 100", max_exponent);
  auto value_of = [=](uint64_t i) {
    const uint64_t bits = random_u64(seed, i);
    const auto m = static_cast<float>(1.0 + static_cast<double>(bits >> 40) * 0x1.0p-24);
    const int e =
        static_cast<int>((bits >> 8) % static_cast<uint64_t>(2 * max_exponent + 1)) - max_exponent;
    return std::ldexp((bits & 1) != 0 ? -m : m, e);
  };
  return generate_floats("dsk::ref::rand_wide", shape, dtype, value_of);
}

Tensor randint(const Shape& shape, DType dtype, uint64_t seed, int64_t lo, int64_t hi) {
  constexpr const char* kFn = "dsk::ref::randint";
  DSK_CHECK_ARG(lo < hi, kFn, "hi", fmt::format("hi > lo ({})", lo), hi);
  int64_t min = 0, max = 0;
  switch (dtype) {
    case DType::i8:
      min = INT8_MIN, max = INT8_MAX;
      break;
    case DType::u8:
      min = 0, max = UINT8_MAX;
      break;
    case DType::i16:
      min = INT16_MIN, max = INT16_MAX;
      break;
    case DType::i32:
      min = INT32_MIN, max = INT32_MAX;
      break;
    case DType::boolean:
      min = 0, max = 1;
      break;
    case DType::i64:
    case DType::f32:
    case DType::f64:
      min = std::numeric_limits<int64_t>::min(), max = std::numeric_limits<int64_t>::max();
      break;
    default:
      DSK_CHECK_ARG(false, kFn, "dtype", "an integer dtype, float32 or float64", dtype);
  }
  DSK_CHECK_ARG(lo >= min && hi - 1 <= max, kFn, "lo, hi",
                fmt::format("a range inside [{}, {}] for {}", min, max, dtype_name(dtype)),
                fmt::format("[{}, {})", lo, hi));
  const auto range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  Tensor t = Tensor::empty(shape, dtype);
  char* data = static_cast<char*>(t.data_ptr());
  auto fill = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      // Multiply-shift maps 64 random bits onto the range (bias below range / 2^64).
      const auto offset = static_cast<uint64_t>(
          (static_cast<unsigned __int128>(random_u64(seed, static_cast<uint64_t>(i))) * range) >>
          64);
      const int64_t v = static_cast<int64_t>(static_cast<uint64_t>(lo) + offset);
      switch (dtype) {
        case DType::i8:
          reinterpret_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
          break;
        case DType::u8:
        case DType::boolean:
          reinterpret_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
          break;
        case DType::i16:
          reinterpret_cast<int16_t*>(data)[i] = static_cast<int16_t>(v);
          break;
        case DType::i32:
          reinterpret_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
          break;
        case DType::i64:
          reinterpret_cast<int64_t*>(data)[i] = v;
          break;
        case DType::f32:
          reinterpret_cast<float*>(data)[i] = static_cast<float>(v);
          break;
        default:
          reinterpret_cast<double*>(data)[i] = static_cast<double>(v);
          break;
      }
    }
  };
  parallel_for(t.numel(), fill, 4096);
  return t;
}

}  // namespace dsk::ref
