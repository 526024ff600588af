// dsk::mla::quantize_kv_tokens / dequantize_kv_tokens: whole tensors of KV rows to and from the
// 656-byte tokens of dsk/kernels/mla/kv_format.hpp, one token per call of its per-token functions,
// in parallel over tokens.
#include <cstring>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/mla.hpp>

namespace dsk::mla {
namespace {

namespace kv_format = kernels::mla;

// Tokens per parallel task: a few dozen KiB of work, so small tensors stay on one thread.
constexpr int64_t kTokensPerTask = 64;

// The element offset of row r of t, counting rows over every dimension but the last (any
// strides).
int64_t row_offset(const Tensor& t, int64_t r) {
  int64_t offset = 0;
  for (int d = t.dim() - 2; d >= 0; --d) {
    offset += (r % t.size(d)) * t.stride(d);
    r /= t.size(d);
  }
  return offset;
}

// One token's latent as f32 and RoPE part as bf16 (rounded when kv is f32).
void read_kv_row(const Tensor& kv, int64_t offset, float* latent, bf16* rope) {
  if (kv.dtype() == DType::f32) {
    const float* x = kv.data<float>() + offset;
    std::memcpy(latent, x, sizeof(float) * kv_format::kLatentDim);
    for (int64_t r = 0; r < kv_format::kRopeDim; ++r)
      rope[r] = numeric::f32_to_bf16(x[kv_format::kLatentDim + r]);
  } else {
    const bf16* x = kv.data<bf16>() + offset;
    for (int64_t d = 0; d < kv_format::kLatentDim; ++d) latent[d] = numeric::bf16_to_f32(x[d]);
    std::memcpy(rope, x + kv_format::kLatentDim, sizeof(bf16) * kv_format::kRopeDim);
  }
}

}  // namespace

Tensor quantize_kv_tokens(const Tensor& kv) {
  constexpr const char* fn = "mla::quantize_kv_tokens";
  check::dtype_in(fn, "kv", kv, {DType::f32, DType::bf16});
  check::dim(fn, "kv", kv, 2);
  check::size(fn, "kv", kv, 1, kv_format::kQkDim);
  check::last_dim_contiguous(fn, "kv", kv);
  const int64_t n = kv.size(0);
  Tensor tokens = Tensor::empty({n, kv_format::kTokenBytes}, DType::u8);
  uint8_t* dst = tokens.data<uint8_t>();
  parallel_for(
      n,
      [&](int64_t begin, int64_t end, int) {
        float latent[kv_format::kLatentDim];
        bf16 rope[kv_format::kRopeDim];
        for (int64_t i = begin; i < end; ++i) {
          read_kv_row(kv, i * kv.stride(0), latent, rope);
          kv_format::quantize_token(latent, rope, dst + i * kv_format::kTokenBytes);
        }
      },
      kTokensPerTask);
  return tokens;
}

Tensor dequantize_kv_tokens(const Tensor& tokens) {
  constexpr const char* fn = "mla::dequantize_kv_tokens";
  check::dtype_in(fn, "tokens", tokens, {DType::u8, DType::i8, DType::e4m3});
  DSK_CHECK_ARG(tokens.dim() >= 1, fn, "tokens", "at least 1 dimension", tokens.describe());
  check::size(fn, "tokens", tokens, -1, kv_format::kTokenBytes);
  check::last_dim_contiguous(fn, "tokens", tokens);
  Shape shape = tokens.sizes();
  shape.back() = kv_format::kQkDim;
  Tensor out = Tensor::empty(shape, DType::bf16);
  const auto* src = static_cast<const uint8_t*>(tokens.data_ptr());
  bf16* dst = out.data<bf16>();
  parallel_for(
      tokens.numel() / kv_format::kTokenBytes,
      [&](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i)
          kv_format::dequantize_token_bf16(src + row_offset(tokens, i),
                                           dst + i * kv_format::kQkDim);
      },
      kTokensPerTask);
  return out;
}

}  // namespace dsk::mla
