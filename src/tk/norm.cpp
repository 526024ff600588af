// Norm, RoPE and Hadamard entry points, and DeepSeek's YaRN frequency table.
#include <cmath>
#include <numbers>

#include <dsk/tk.hpp>

#include "common.hpp"

namespace dsk::tk {
namespace {

using detail::Elt;

// x as rows: a 2-D tensor with contiguous rows as it is, anything else viewed as [-1, last dim]
// (then it must be contiguous). Returns {rows tensor, row stride}.
Tensor as_rows(const char* fn, const char* arg, const Tensor& x) {
  check::defined(fn, arg, x);
  DSK_CHECK_ARG(x.dim() >= 1, fn, arg, "at least 1 dimension", x.dim());
  check::last_dim_contiguous(fn, arg, x);
  if (x.dim() == 2) return x;
  check::contiguous(fn, arg, x);
  return x.view({x.numel() / std::max<int64_t>(x.size(-1), 1), x.size(-1)});
}

void check_vector(const char* fn, const char* arg, const Tensor& t, int64_t n) {
  check::defined(fn, arg, t);
  check::dtype_in(fn, arg, t, {DType::f32, DType::bf16});
  check::shape(fn, arg, t, {n});
  check::contiguous(fn, arg, t);
}

enum class NormKind { rms, layer };

Tensor norm(const char* fn, NormKind kind, const Tensor& x, const Tensor& weight,
            const std::optional<Tensor>& bias, float eps, std::optional<DType> out_dtype) {
  const Tensor rows = as_rows(fn, "x", x);
  check::dtype_in(fn, "x", x, {DType::f32, DType::bf16, DType::f16});
  const int64_t hidden = rows.size(1);
  check_vector(fn, "weight", weight, hidden);
  if (bias) {
    check_vector(fn, "bias", *bias, hidden);
    check::dtype(fn, "bias", *bias, weight.dtype());
  }
  DSK_CHECK_ARG(eps >= 0.0f, fn, "eps", "a non-negative value", eps);
  const DType od = out_dtype.value_or(x.dtype());
  DSK_CHECK_ARG(od == DType::f32 || od == DType::bf16 || od == DType::f16, fn, "out_dtype",
                "float32, bfloat16 or float16", od);
  Tensor out = Tensor::empty(x.sizes(), od);
  if (rows.size(0) == 0 || hidden == 0) return out;
  kernels::NormArgs a;
  a.x = rows.data_ptr();
  a.x_stride = rows.stride(0);
  a.weight = weight.data_ptr();
  a.bias = bias ? bias->data_ptr() : nullptr;
  a.cols = hidden;
  a.eps = eps;
  a.out = out.data_ptr();
  a.out_stride = hidden;
  const Elt xe = detail::elt_of(fn, "x", x.dtype());
  const int we = weight.dtype() == DType::f32 ? 0 : 1;
  const Elt oe = detail::elt_of(fn, "out_dtype", od);
  const auto& table = detail::kernel_table();
  const auto kernel =
      kind == NormKind::rms ? table.rms_norm[xe][we][oe] : table.layer_norm[xe][we][oe];
  detail::parallel_rows(rows.size(0), 3 * hidden,
                        [&](int64_t r0, int64_t r1) { kernel(a, r0, r1); });
  return out;
}

// The number of dimensions (of rot_dim) whose wavelength completes num_rotations turns within
// original_seq_len positions (YaRN's find_correction_dim).
double correction_dim(double num_rotations, const RopeConfig& c) {
  return c.rot_dim *
         std::log(static_cast<double>(c.original_seq_len) /
                  (num_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(c.rope_theta));
}

void check_config(const char* fn, const RopeConfig& c) {
  DSK_CHECK_ARG(c.rot_dim >= 2 && c.rot_dim % 2 == 0 && c.rot_dim <= kernels::kMaxRotDim, fn,
                "config.rot_dim", "an even number in [2, 256]", c.rot_dim);
  DSK_CHECK_ARG(c.max_seq_len >= 1 && c.max_seq_len <= (int64_t{1} << 24), fn, "config.max_seq_len",
                "1 to 2^24 positions", c.max_seq_len);
  DSK_CHECK_ARG(c.rope_theta > 1.0, fn, "config.rope_theta", "a base above 1", c.rope_theta);
  DSK_CHECK_ARG(c.rope_factor >= 1.0, fn, "config.rope_factor", "a factor of at least 1",
                c.rope_factor);
  DSK_CHECK_ARG(c.original_seq_len >= 1, fn, "config.original_seq_len", "a positive length",
                c.original_seq_len);
  DSK_CHECK_ARG(c.beta_fast > 0.0 && c.beta_slow > 0.0, fn, "config.beta_fast",
                "positive beta_fast and beta_slow", c.beta_fast);
}

// A head tensor of apply_rotary as [tokens, heads, rot_dim] plus its (token, head) strides.
struct Heads {
  int64_t batch = 1, seqlen = 0, num_heads = 0;
  int64_t batch_stride = 0, token_stride = 0, head_stride = 0;
};

Heads heads_of(const char* fn, const char* arg, const Tensor& t, int64_t rot_dim) {
  check::defined(fn, arg, t);
  DSK_CHECK_ARG(t.dim() == 3 || t.dim() == 4, fn, arg,
                "[num_tokens, num_heads, rot_dim] or [batch, seqlen, num_heads, rot_dim]",
                t.describe());
  check::dtype_in(fn, arg, t, {DType::f32, DType::bf16, DType::f16});
  check::size(fn, arg, t, -1, rot_dim);
  check::last_dim_contiguous(fn, arg, t);
  Heads h;
  const int o = t.dim() == 4 ? 1 : 0;
  if (o == 1) {
    h.batch = t.size(0);
    h.batch_stride = t.stride(0);
  }
  h.seqlen = t.size(o);
  h.token_stride = t.stride(o);
  h.num_heads = t.size(o + 1);
  h.head_stride = t.stride(o + 1);
  return h;
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, std::optional<DType> out_dtype) {
  return norm("tk::rms_norm", NormKind::rms, x, weight, std::nullopt, eps, out_dtype);
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                  float eps, std::optional<DType> out_dtype) {
  return norm("tk::layer_norm", NormKind::layer, x, weight, bias, eps, out_dtype);
}

std::pair<int, int> yarn_correction_range(const RopeConfig& config) {
  check_config("tk::yarn_correction_range", config);
  const int low = static_cast<int>(std::floor(correction_dim(config.beta_fast, config)));
  const int high = static_cast<int>(std::ceil(correction_dim(config.beta_slow, config)));
  return {std::max(low, 0), std::min(high, config.rot_dim - 1)};
}

std::vector<double> rope_frequencies(const RopeConfig& config) {
  check_config("tk::rope_frequencies", config);
  const int half = config.rot_dim / 2;
  std::vector<double> freqs(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    freqs[i] = 1.0 / std::pow(config.rope_theta, 2.0 * i / config.rot_dim);
  if (config.max_seq_len <= config.original_seq_len) return freqs;
  auto [low, high] = yarn_correction_range(config);
  const double span = low == high ? 0.001 : static_cast<double>(high - low);
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / span, 0.0, 1.0);
    freqs[i] = freqs[i] / config.rope_factor * ramp + freqs[i] * (1.0 - ramp);
  }
  return freqs;
}

Tensor yarn_cos_sin_cache(const RopeConfig& config) {
  const std::vector<double> freqs = rope_frequencies(config);
  const int half = config.rot_dim / 2;
  Tensor cache = Tensor::empty({config.max_seq_len, config.rot_dim}, DType::f32);
  auto* c = static_cast<float*>(cache.data_ptr());
  detail::parallel_rows(config.max_seq_len, 64 * half, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * freqs[i];
        c[p * config.rot_dim + i] = static_cast<float>(std::cos(angle));
        c[p * config.rot_dim + half + i] = static_cast<float>(std::sin(angle));
      }
  });
  return cache;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

void apply_rotary(const Tensor& query, const Tensor& cos_sin_cache,
                  const std::optional<Tensor>& key, const std::optional<Tensor>& positions,
                  bool interleaved, bool conjugate, int64_t seqlen_offset) {
  constexpr const char* fn = "tk::apply_rotary";
  check::defined(fn, "cos_sin_cache", cos_sin_cache);
  check::dtype(fn, "cos_sin_cache", cos_sin_cache, DType::f32);
  check::dim(fn, "cos_sin_cache", cos_sin_cache, 2);
  check::last_dim_contiguous(fn, "cos_sin_cache", cos_sin_cache);
  const int64_t rot_dim = cos_sin_cache.size(1);
  DSK_CHECK_ARG(rot_dim == 32 || rot_dim == 64 || rot_dim == 128 || rot_dim == 256, fn,
                "cos_sin_cache", "rot_dim (columns) 32, 64, 128 or 256", cos_sin_cache.describe());
  const int64_t cache_rows = cos_sin_cache.size(0);
  const Heads q = heads_of(fn, "query", query, rot_dim);
  Heads k;
  if (key) {
    k = heads_of(fn, "key", *key, rot_dim);
    DSK_CHECK_ARG(key->dim() == query.dim() && key->dtype() == query.dtype() &&
                      k.batch == q.batch && k.seqlen == q.seqlen,
                  fn, "key", "query's dtype and leading shape", key->describe());
  }
  if (positions) {
    check::defined(fn, "positions", *positions);
    check::dtype_in(fn, "positions", *positions, {DType::i32, DType::i64});
    if (query.dim() == 3)
      check::shape(fn, "positions", *positions, {q.seqlen});
    else
      check::shape(fn, "positions", *positions, {q.batch, q.seqlen});
    check::contiguous(fn, "positions", *positions);
  }
  // Every row a token reads must lie in the cache.
  const int64_t num_tokens = q.batch * q.seqlen;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t base = positions ? (positions->dtype() == DType::i32
                                          ? static_cast<const int32_t*>(positions->data_ptr())[t]
                                          : static_cast<const int64_t*>(positions->data_ptr())[t])
                                   : t % std::max<int64_t>(q.seqlen, 1);
    const int64_t p = base + seqlen_offset;
    DSK_CHECK_ARG(p >= 0 && p < cache_rows, fn, positions ? "positions" : "seqlen_offset",
                  "cache rows in [0, " + std::to_string(cache_rows) + ")",
                  std::to_string(p) + " for token " + std::to_string(t));
  }
  const auto rotate = [&](const Tensor& x, const Heads& h) {
    if (x.numel() == 0) return;
    const auto kernel = detail::kernel_table().rope[detail::elt_of(fn, "query", x.dtype())];
    for (int64_t b = 0; b < h.batch; ++b) {
      kernels::RopeArgs a;
      a.x = static_cast<char*>(x.data_ptr()) +
            b * h.batch_stride * static_cast<int64_t>(x.element_size());
      a.token_stride = h.token_stride;
      a.head_stride = h.head_stride;
      a.num_heads = h.num_heads;
      a.rot_dim = static_cast<int>(rot_dim);
      a.cache = static_cast<const float*>(cos_sin_cache.data_ptr());
      a.cache_stride = cos_sin_cache.stride(0);
      if (positions) {
        if (positions->dtype() == DType::i32)
          a.positions32 = static_cast<const int32_t*>(positions->data_ptr()) + b * h.seqlen;
        else
          a.positions64 = static_cast<const int64_t*>(positions->data_ptr()) + b * h.seqlen;
      }
      a.offset = seqlen_offset;
      a.interleaved = interleaved;
      a.conjugate = conjugate;
      detail::parallel_rows(h.seqlen, h.num_heads * rot_dim,
                            [&](int64_t t0, int64_t t1) { kernel(a, t0, t1); });
    }
  };
  rotate(query, q);
  if (key) rotate(*key, k);
}

Tensor hadamard_transform(const Tensor& x, float scale) {
  constexpr const char* fn = "tk::hadamard_transform";
  const Tensor rows = as_rows(fn, "x", x);
  check::dtype_in(fn, "x", x, {DType::f32, DType::bf16, DType::f16});
  const int64_t n = rows.size(1);
  DSK_CHECK_ARG(n >= 16 && n <= kernels::kMaxHadamard && (n & (n - 1)) == 0, fn, "x",
                "a last dimension that is a power of two in [16, 1024]", x.describe());
  Tensor out = Tensor::empty(x.sizes(), x.dtype());
  if (rows.size(0) == 0) return out;
  kernels::HadamardArgs a;
  a.x = rows.data_ptr();
  a.x_stride = rows.stride(0);
  a.out = out.data_ptr();
  a.out_stride = n;
  a.n = static_cast<int>(n);
  a.scale = scale;
  const auto kernel = detail::kernel_table().hadamard[detail::elt_of(fn, "x", x.dtype())];
  detail::parallel_rows(rows.size(0), 8 * n, [&](int64_t r0, int64_t r1) { kernel(a, r0, r1); });
  return out;
}

}  // namespace dsk::tk
