// dsk::ref::mla: FlashMLA's reference attention (tests/ref.py, tests/quant.py) as fp64 loops
// (contracts in include/dsk/ref.hpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <dsk/core/check.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/kernels/mla/kv_format.hpp>
#include <dsk/ref.hpp>

#include "walk.hpp"

namespace dsk::ref::mla {
namespace {

namespace kv_format = kernels::mla;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(detail::value_count(t)));
  detail::for_each_raw_row(
      t, [&](const detail::RawRow& row) { detail::read_row(t.dtype(), row, out); });
  return out;
}

std::vector<int64_t> integers(const Tensor& t) {
  const std::vector<double> v = values(t);
  return std::vector<int64_t>(v.begin(), v.end());
}

Tensor f32_tensor(const Shape& shape, const std::vector<double>& v) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::transform(v.begin(), v.end(), t.data<float>(),
                 [](double x) { return static_cast<float>(x); });
  return t;
}

// ---- the attention of one block of query heads over one list of keys ----

struct Attended {
  std::vector<double> out;        // [heads, d_v]; all 0 when there is no key
  std::vector<double> lse;        // [heads]; -inf when there is no key
  std::vector<double> max_logit;  // [heads]; -inf when there is no key
};

// Heads per block: the accumulators of one block's logits fit the SSE2 registers of baseline
// x86-64, and the blocks of one row are separate tasks, so even one query row keeps every thread
// busy.
constexpr int64_t kHeadBlock = 16;

// q: fp64 [heads, d_qk] (heads <= kHeadBlock); keys[j]: fp64 [d_qk] (V = its first d_v dims). Each
// logit is a plain dot product summed in increasing d (the loop over heads is innermost so that it
// vectorises without reordering any sum); out sums over the keys in their order.
Attended attend(const double* q, int64_t heads, const std::vector<const double*>& keys,
                int64_t d_qk, int64_t d_v, double scale) {
  const auto n = static_cast<int64_t>(keys.size());
  std::vector<double> q_t(static_cast<size_t>(d_qk * kHeadBlock), 0.0);  // [d_qk, kHeadBlock]
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t d = 0; d < d_qk; ++d) q_t[d * kHeadBlock + h] = q[h * d_qk + d];
  std::vector<double> logits(static_cast<size_t>(heads * n));
  for (int64_t j = 0; j < n; ++j) {
    double dot[kHeadBlock] = {};
    for (int64_t d = 0; d < d_qk; ++d) {
      const double k = keys[j][d];
      for (int64_t h = 0; h < kHeadBlock; ++h) dot[h] += q_t[d * kHeadBlock + h] * k;
    }
    for (int64_t h = 0; h < heads; ++h) logits[h * n + j] = dot[h] * scale;
  }
  Attended r{std::vector<double>(static_cast<size_t>(heads * d_v), 0.0),
             std::vector<double>(static_cast<size_t>(heads), -kInf),
             std::vector<double>(static_cast<size_t>(heads), -kInf)};
  if (n == 0) return r;
  // Softmax weights per head (in place of the logits), then out[h] = sum_j weight[h][j] * V[j]
  // with the keys outermost, so each key row is read once per block.
  for (int64_t h = 0; h < heads; ++h) {
    double* p = logits.data() + h * n;
    double m = p[0];
    for (int64_t j = 1; j < n; ++j) m = std::isnan(p[j]) || p[j] > m ? p[j] : m;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - m);
    r.lse[h] = m + std::log(sum);
    r.max_logit[h] = m;
    for (int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - r.lse[h]);
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t h = 0; h < heads; ++h) {
      const double w = logits[h * n + j];
      double* o = r.out.data() + h * d_v;
      for (int64_t c = 0; c < d_v; ++c) o[c] += w * keys[j][c];
    }
  return r;
}

// Runs attend over every (row, block of heads) on the thread pool. q_of(row): the row's queries,
// fp64 [heads, d_qk]; keys_of(row, storage, keys): lists the row's keys in `keys`, pointing into
// `storage` (a per-thread buffer) or elsewhere; store(row, head0, result): writes the results of
// heads [head0, head0 + result.lse.size()).
template <class QOf, class KeysOf, class Store>
void attend_rows(int64_t rows, int64_t heads, int64_t d_qk, int64_t d_v, double scale,
                 const QOf& q_of, const KeysOf& keys_of, const Store& store) {
  const int64_t blocks = (heads + kHeadBlock - 1) / kHeadBlock;
  parallel_for(rows * blocks, [&](int64_t begin, int64_t end, int) {
    std::vector<double> storage;
    std::vector<const double*> keys;
    int64_t listed = -1;  // the row whose keys `keys` holds
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / blocks, head0 = task % blocks * kHeadBlock;
      if (row != listed) keys_of(row, storage, keys);
      listed = row;
      Attended r = attend(q_of(row) + head0 * d_qk, std::min(kHeadBlock, heads - head0), keys, d_qk,
                          d_v, scale);
      store(row, head0, r);
    }
  });
}

// The sink rule: out *= 1 / (1 + exp(sink - lse)) (= exp(lse) / (exp(lse) + exp(sink))) for rows
// with a key; a row without one keeps out = 0.
void apply_sinks(Attended& r, const std::vector<double>& sinks, int64_t head0, int64_t d_v) {
  if (sinks.empty()) return;
  for (size_t h = 0; h < r.lse.size(); ++h) {
    if (r.lse[h] == -kInf) continue;
    const double factor = 1.0 / (1.0 + std::exp(sinks[head0 + h] - r.lse[h]));
    for (int64_t c = 0; c < d_v; ++c) r.out[h * d_v + c] *= factor;
  }
}

// ---- argument checks shared by the three functions ----

std::vector<double> sink_values(const char* fn, const std::optional<Tensor>& attn_sink,
                                int64_t h_q) {
  if (!attn_sink) return {};
  check::shape(fn, "attn_sink", *attn_sink, {h_q});
  return values(*attn_sink);
}

// Per row: the number of leading entries that may be valid (topk when topk_length is absent).
std::vector<int64_t> row_lengths(const char* fn, const std::optional<Tensor>& topk_length,
                                 int64_t rows, int64_t topk) {
  if (!topk_length) return std::vector<int64_t>(static_cast<size_t>(rows), topk);
  check::shape(fn, "topk_length", *topk_length, {rows});
  return integers(*topk_length);
}

void check_d_v(const char* fn, int64_t d_v, int64_t d_qk) {
  DSK_CHECK_ARG(d_v >= 1 && d_v <= d_qk, fn, "d_v", fmt::format("1 <= d_v <= d_qk ({})", d_qk),
                d_v);
}

// ---- 656-byte tokens ----

using TokenBytes = std::array<uint8_t, kv_format::kTokenBytes>;

// The 576 values of a token, as upstream's dequantize_k_cache: code times scale in f32, stored as
// bf16; the RoPE part as stored.
void dequantize_token(const TokenBytes& token, double* out) {
  for (int64_t d = 0; d < kv_format::kLatentDim; ++d) {
    const float scale = kv_format::token_scale(token.data(), d / kv_format::kScaleTile);
    out[d] = numeric::round_to_bf16(numeric::e4m3_to_f32(e4m3{token[d]}) * scale);
  }
  for (int64_t r = 0; r < kv_format::kRopeDim; ++r) {
    bf16 x;
    std::memcpy(&x, token.data() + kv_format::kRopeOffset + 2 * r, 2);
    out[kv_format::kLatentDim + r] = numeric::bf16_to_f32(x);
  }
}

TokenBytes token_bytes(const detail::RawRow& row) {
  TokenBytes token;
  for (int64_t i = 0; i < kv_format::kTokenBytes; ++i)
    token[i] = static_cast<uint8_t>(row.first[i * row.stride_bytes]);
  return token;
}

void check_token_dtype(const char* fn, const char* arg, const Tensor& t) {
  check::dtype_in(fn, arg, t, {DType::u8, DType::i8, DType::e4m3});
  DSK_CHECK_ARG(t.dim() >= 1 && t.size(-1) == kv_format::kTokenBytes, fn, arg,
                fmt::format("a last dimension of {} bytes", kv_format::kTokenBytes), t.describe());
}

}  // namespace

SparseFwdResult sparse_fwd(const Tensor& q, const Tensor& kv, const Tensor& indices,
                           double sm_scale, int64_t d_v, const std::optional<Tensor>& attn_sink,
                           const std::optional<Tensor>& topk_length) {
  constexpr const char* fn = "dsk::ref::mla::sparse_fwd";
  check::dim(fn, "q", q, 3);
  const int64_t s_q = q.size(0), h_q = q.size(1), d_qk = q.size(2);
  check::shape(fn, "kv", kv, {-1, 1, d_qk});
  check::shape(fn, "indices", indices, {s_q, 1, -1});
  check_d_v(fn, d_v, d_qk);
  const int64_t s_kv = kv.size(0), topk = indices.size(2);
  const std::vector<double> qv = values(q), kvv = values(kv),
                            sinks = sink_values(fn, attn_sink, h_q);
  const std::vector<int64_t> idx = integers(indices);
  const std::vector<int64_t> lengths = row_lengths(fn, topk_length, s_q, topk);
  std::vector<double> out(static_cast<size_t>(s_q * h_q * d_v)),
      lse(static_cast<size_t>(s_q * h_q)), max_logits(lse.size());
  attend_rows(
      s_q, h_q, d_qk, d_v, sm_scale, [&](int64_t i) { return &qv[i * h_q * d_qk]; },
      [&](int64_t i, std::vector<double>&, std::vector<const double*>& keys) {
        keys.clear();
        for (int64_t j = 0; j < std::min(topk, lengths[i]); ++j) {
          const int64_t t = idx[i * topk + j];
          if (t >= 0 && t < s_kv) keys.push_back(&kvv[t * d_qk]);
        }
      },
      [&](int64_t i, int64_t head0, Attended& r) {
        apply_sinks(r, sinks, head0, d_v);
        for (size_t hh = 0; hh < r.lse.size(); ++hh) {
          const int64_t at = i * h_q + head0 + static_cast<int64_t>(hh);
          std::copy_n(&r.out[hh * d_v], d_v, &out[at * d_v]);
          lse[at] = r.lse[hh] == -kInf ? kInf : r.lse[hh];
          max_logits[at] = r.max_logit[hh];
        }
      });
  return {f32_tensor({s_q, h_q, d_v}, out), f32_tensor({s_q, h_q}, max_logits),
          f32_tensor({s_q, h_q}, lse)};
}

Tensor dequantize_kv_tokens(const Tensor& tokens) {
  check_token_dtype("dsk::ref::mla::dequantize_kv_tokens", "tokens", tokens);
  Shape shape = tokens.sizes();
  shape.back() = kv_format::kQkDim;
  Tensor out = Tensor::empty(shape, DType::bf16);
  bf16* o = out.data<bf16>();
  std::array<double, kv_format::kQkDim> token_values;
  detail::for_each_raw_row(tokens, [&](const detail::RawRow& row) {
    dequantize_token(token_bytes(row), token_values.data());
    for (double v : token_values) *o++ = numeric::f32_to_bf16(static_cast<float>(v));
  });
  return out;
}

KvcacheResult sparse_decode(const Tensor& q, const Tensor& k_cache, const Tensor& indices,
                            double sm_scale, int64_t d_v, const std::optional<Tensor>& attn_sink,
                            const std::optional<Tensor>& topk_length) {
  constexpr const char* fn = "dsk::ref::mla::sparse_decode";
  constexpr int64_t d_qk = kv_format::kQkDim;
  check::dim(fn, "q", q, 4);
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  check::shape(fn, "q", q, {b, s_q, h_q, d_qk});
  check_token_dtype(fn, "k_cache", k_cache);
  check::shape(fn, "k_cache", k_cache, {-1, -1, 1, kv_format::kTokenBytes});
  check::shape(fn, "indices", indices, {b, s_q, -1});
  check_d_v(fn, d_v, d_qk);
  const int64_t page = k_cache.size(1), num_slots = k_cache.size(0) * page, topk = indices.size(2);
  const std::vector<double> qv = values(q), sinks = sink_values(fn, attn_sink, h_q);
  const std::vector<int64_t> idx = integers(indices);
  const std::vector<int64_t> lengths = row_lengths(fn, topk_length, b, topk);
  for (int64_t slot : idx)
    DSK_CHECK_ARG(slot == -1 || (slot >= 0 && slot < num_slots), fn, "indices",
                  fmt::format("-1 or a slot in [0, {})", num_slots), slot);
  auto token_row = [&](int64_t slot) {
    const int64_t offset = (slot / page) * k_cache.stride(0) + (slot % page) * k_cache.stride(1);
    return detail::RawRow{static_cast<char*>(k_cache.data_ptr()) + offset, kv_format::kTokenBytes,
                          k_cache.stride(3)};
  };
  std::vector<double> out(static_cast<size_t>(b * s_q * h_q * d_v)),
      lse(static_cast<size_t>(b * h_q * s_q));
  attend_rows(
      b * s_q, h_q, d_qk, d_v, sm_scale, [&](int64_t row) { return &qv[row * h_q * d_qk]; },
      [&](int64_t row, std::vector<double>& storage, std::vector<const double*>& keys) {
        const int64_t* entries = &idx[row * topk];
        const int64_t used = std::min(topk, lengths[row / s_q]);
        const auto n = used - std::count(entries, entries + used, -1);
        storage.resize(static_cast<size_t>(n * d_qk));
        keys.clear();
        for (int64_t j = 0; j < used; ++j) {
          if (entries[j] == -1) continue;
          double* key = storage.data() + keys.size() * d_qk;
          dequantize_token(token_bytes(token_row(entries[j])), key);
          std::replace_if(
              key, key + d_qk, [](double x) { return std::isnan(x); }, 0.0);
          keys.push_back(key);
        }
      },
      [&](int64_t row, int64_t head0, Attended& r) {
        apply_sinks(r, sinks, head0, d_v);
        const int64_t i = row / s_q, t = row % s_q;
        for (size_t hh = 0; hh < r.lse.size(); ++hh) {
          const int64_t h = head0 + static_cast<int64_t>(hh);
          std::copy_n(&r.out[hh * d_v], d_v, &out[(row * h_q + h) * d_v]);
          lse[(i * h_q + h) * s_q + t] = r.lse[hh] == -kInf ? kInf : r.lse[hh];
        }
      });
  return {f32_tensor({b, s_q, h_q, d_v}, out), f32_tensor({b, h_q, s_q}, lse)};
}

KvcacheResult dense_decode(const Tensor& q, const Tensor& k_cache, const Tensor& block_table,
                           const Tensor& cache_seqlens, double sm_scale, int64_t d_v, bool causal,
                           const std::optional<Tensor>& attn_sink) {
  constexpr const char* fn = "dsk::ref::mla::dense_decode";
  check::dim(fn, "q", q, 4);
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), d_qk = q.size(3);
  check::shape(fn, "k_cache", k_cache, {-1, -1, -1, d_qk});
  check::shape(fn, "block_table", block_table, {b, -1});
  check::shape(fn, "cache_seqlens", cache_seqlens, {b});
  check_d_v(fn, d_v, d_qk);
  const int64_t num_blocks = k_cache.size(0), page = k_cache.size(1), h_kv = k_cache.size(2);
  DSK_CHECK_ARG(h_kv >= 1 && h_q % h_kv == 0, fn, "k_cache",
                fmt::format("a number of kv heads dividing h_q = {}", h_q), h_kv);
  const std::vector<double> qv = values(q), sinks = sink_values(fn, attn_sink, h_q);
  const std::vector<int64_t> table = integers(block_table), seqlens = integers(cache_seqlens);
  const int64_t max_blocks = block_table.size(1), heads_per_kv = h_q / h_kv;
  for (int64_t i = 0; i < b; ++i) {
    DSK_CHECK_ARG(seqlens[i] >= 0 && seqlens[i] <= max_blocks * page, fn, "cache_seqlens",
                  fmt::format("values in [0, {}] (block_table columns x page)", max_blocks * page),
                  seqlens[i]);
    for (int64_t k = 0; k < (seqlens[i] + page - 1) / page; ++k)
      DSK_CHECK_ARG(table[i * max_blocks + k] >= 0 && table[i * max_blocks + k] < num_blocks, fn,
                    "block_table", fmt::format("block ids in [0, {})", num_blocks),
                    table[i * max_blocks + k]);
  }
  std::vector<double> out(static_cast<size_t>(b * s_q * h_q * d_v)),
      lse(static_cast<size_t>(b * h_q * s_q));
  // Row ((i * h_kv + g) * s_q + t): query position t of request i, the heads of kv head g.
  const auto es = static_cast<int64_t>(k_cache.element_size());
  attend_rows(
      b * h_kv * s_q, heads_per_kv, d_qk, d_v, sm_scale,
      [&](int64_t row) {
        const int64_t i = row / (h_kv * s_q), g = row / s_q % h_kv, t = row % s_q;
        return &qv[((i * s_q + t) * h_q + g * heads_per_kv) * d_qk];
      },
      [&](int64_t row, std::vector<double>& storage, std::vector<const double*>& keys) {
        const int64_t i = row / (h_kv * s_q), g = row / s_q % h_kv, t = row % s_q;
        const int64_t s_k = seqlens[i];
        const int64_t visible = causal ? std::clamp<int64_t>(s_k - s_q + t + 1, 0, s_k) : s_k;
        storage.clear();
        for (int64_t s = 0; s < visible; ++s) {
          const int64_t at = table[i * max_blocks + s / page] * k_cache.stride(0) +
                             (s % page) * k_cache.stride(1) + g * k_cache.stride(2);
          detail::read_row(
              k_cache.dtype(),
              {static_cast<char*>(k_cache.data_ptr()) + at * es, d_qk, k_cache.stride(3) * es},
              storage);
        }
        keys.clear();
        for (int64_t s = 0; s < visible; ++s) keys.push_back(storage.data() + s * d_qk);
      },
      [&](int64_t row, int64_t head0, Attended& r) {
        const int64_t i = row / (h_kv * s_q), g = row / s_q % h_kv, t = row % s_q;
        apply_sinks(r, sinks, g * heads_per_kv + head0, d_v);
        for (size_t hh = 0; hh < r.lse.size(); ++hh) {
          const int64_t h = g * heads_per_kv + head0 + static_cast<int64_t>(hh);
          std::copy_n(&r.out[hh * d_v], d_v, &out[((i * s_q + t) * h_q + h) * d_v]);
          lse[(i * h_q + h) * s_q + t] = r.lse[hh] == -kInf ? kInf : r.lse[hh];
        }
      });
  return {f32_tensor({b, s_q, h_q, d_v}, out), f32_tensor({b, h_q, s_q}, lse)};
}

}  // namespace dsk::ref::mla
