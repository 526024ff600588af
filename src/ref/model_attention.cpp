// dsk::ref::model: the attention half of a layer (spec/attention.md §5.3 steps 2-5, with the
// §5.5 fix) — query and latent KV, the indexer's FP8 scores and top-k, and MLA in the absorbed
// form over the selected cache entries.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <dsk/core/threads.hpp>

#include "model_impl.hpp"

namespace dsk::ref::model {
namespace {

using detail::Matrix;

void append(std::vector<float>& cache, const float* values, int64_t n) {
  cache.insert(cache.end(), values, values + n);
}

// The positions [0, visible) ranked by score (larger first, equal scores by smaller position),
// the first k of them, ascending. All of them when visible <= k.
std::vector<int64_t> top_positions(const std::vector<double>& score, int64_t visible, int64_t k) {
  std::vector<int64_t> order(static_cast<size_t>(visible));
  std::iota(order.begin(), order.end(), 0);
  if (visible > k) {
    std::nth_element(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
  }
  return order;
}

// softmax(logits) in place, fp64; with round_p, each exp(logit - max) is rounded to bf16 before
// it is divided by the (unrounded) sum, as FlashMLA feeds P to its P . V product.
void softmax(std::vector<double>& logits, bool round_p) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (double& l : logits) sum += (l = std::exp(l - max));
  for (double& l : logits) l = (round_p ? numeric::round_to_bf16(static_cast<float>(l)) : l) / sum;
}

}  // namespace

// The model's top-k set of token t (replayed), judged against the reference's own: a swapped pair
// is a near-tie when the scores differ by at most 10% of the row's largest |score|. (Past the
// first layer the two runs' activations differ by FP8 code flips; the scores then move by up to
// about 7% of the largest, measured on v32-tiny.)
std::vector<int64_t> Reference::Impl::replayed_positions(int layer, int64_t t, int64_t visible,
                                                         const std::vector<double>& score,
                                                         const std::vector<int64_t>& own) const {
  const Tensor& table = (*replay)[static_cast<size_t>(layer)].positions;
  std::vector<int64_t> forced;
  for (int64_t j = 0; j < table.size(1); ++j) {
    const int64_t p = table.at<int32_t>({t, j});
    if (p >= 0) forced.push_back(p);
  }
  double largest = 0;
  for (double v : score) largest = std::max(largest, std::abs(v));
  bool in_range = true;
  for (int64_t p : forced) in_range = in_range && p < visible;
  judge(layer, own, forced, [&](int64_t a, int64_t b) {
    return in_range && std::abs(score[a] - score[b]) <= 0.1 * largest;
  });
  if (!in_range) return own;
  return forced;
}

detail::Selections Reference::Impl::indexer(int layer, detail::LayerCache& cache, int64_t first,
                                            const Matrix& x_n, const Matrix& qr) const {
  const detail::LayerWeights& w = layers[layer];
  const int64_t tokens = x_n.rows, heads = config.index_n_heads, d = config.index_head_dim;
  const int64_t rot = config.qk_rope_head_dim;
  const double hadamard_scale = 1.0 / std::sqrt(static_cast<double>(d));
  // The demo's LayerNorm default eps (the indexer's k_norm does not take the config's).
  constexpr double kLayerNormEps = 1e-6;

  // Keys of the new tokens: LayerNorm, RoPE (rotate-half), Hadamard, one FP8 scale per token.
  Matrix k = detail::layer_norm(detail::fp8_linear(x_n, w.index_wk), w.index_k_norm_weight,
                                w.index_k_norm_bias, kLayerNormEps);
  for (int64_t t = 0; t < tokens; ++t) {
    float* key = k.row(t);
    detail::rotate(key, cos_sin_row(first + t), rot, /*interleaved=*/false);
    detail::hadamard(key, d, hadamard_scale);
    cache.index_scale.push_back(detail::quantize_fp8_block(key, d));
    append(cache.index_codes, key, d);
  }

  // Queries: the same transforms with one scale per head, folded into the head weights
  // w'[h] = weights_proj(x_n)[h] * heads^-0.5 * q_scale[h] * d^-0.5 (f32, the demo's order).
  Matrix q = detail::fp8_linear(qr, w.index_wq_b);
  const Matrix head_weights = detail::matmul_nt(x_n, w.index_weights_proj);
  const auto heads_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(heads)));
  const auto softmax_scale = static_cast<float>(hadamard_scale);
  Matrix weight(tokens, heads);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* query = q.row(t) + h * d;
      detail::rotate(query, cos_sin_row(first + t), rot, /*interleaved=*/false);
      detail::hadamard(query, d, hadamard_scale);
      const float q_scale = detail::quantize_fp8_block(query, d);
      weight.row(t)[h] = head_weights.row(t)[h] * heads_scale * q_scale * softmax_scale;
    }

  // I[t, s] = k_scale[s] * sum_h w'[h] * relu(q_codes[t, h] . k_codes[s]) over s <= t's position.
  detail::Selections selected(static_cast<size_t>(tokens));
  parallel_for(tokens, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t visible = first + t + 1;
      std::vector<double> score(static_cast<size_t>(visible));
      for (int64_t s = 0; s < visible; ++s) {
        const float* key = cache.index_codes.data() + s * d;
        double total = 0.0;
        for (int64_t h = 0; h < heads; ++h) {
          const float* query = q.row(t) + h * d;
          total += weight.row(t)[h] * std::max(detail::dot(query, key, d), 0.0);
        }
        score[s] = cache.index_scale[s] * total;
      }
      selected[t] = top_positions(score, visible, config.index_topk);
      if (replay) selected[t] = replayed_positions(layer, t, visible, score, selected[t]);
    }
  });
  return selected;
}

Matrix Reference::Impl::attention(int layer, detail::Sequence& seq, int64_t first,
                                  const Matrix& x_n) const {
  const detail::LayerWeights& w = layers[layer];
  detail::LayerCache& cache = seq.layers[layer];
  const double eps = config.rms_norm_eps;
  const int64_t tokens = x_n.rows, heads = config.n_heads;
  const int64_t nope = config.qk_nope_head_dim, rot = config.qk_rope_head_dim;
  const int64_t qk = config.qk_head_dim(), lora = config.kv_lora_rank, v = config.v_head_dim;

  // Query: q = wq_b(RMSNorm(wq_a x)) per head [nope | rope], interleaved RoPE on the rope part.
  const Matrix qr = detail::rms_norm(detail::fp8_linear(x_n, w.wq_a), w.q_norm, eps);
  Matrix q = detail::fp8_linear(qr, w.wq_b);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      detail::rotate(q.row(t) + h * qk + nope, cos_sin_row(first + t), rot, /*interleaved=*/true);

  // Latent KV of the new tokens into the cache: c = RMSNorm(kv[:lora]) through the FP8 token's
  // round trip, k_pe = RoPE(kv[lora:]).
  Matrix kv = detail::fp8_linear(x_n, w.wkv_a);
  Matrix c = detail::rms_norm(detail::columns(kv, 0, lora), w.kv_norm, eps);
  for (int64_t t = 0; t < tokens; ++t) {
    detail::fp8_round_trip_latent(c.row(t), lora);
    append(cache.latent, c.row(t), lora);
    float* k_pe = kv.row(t) + lora;
    detail::rotate(k_pe, cos_sin_row(first + t), rot, /*interleaved=*/true);
    append(cache.rope, k_pe, rot);
  }

  const detail::Selections selected = indexer(layer, cache, first, x_n, qr);
  cache.last_selection = selected.back();

  // Per (token, head): q_abs = q_nope . W_UK (bf16), softmax over the selected entries of
  // scale * ([q_abs | q_pe] . [c | k_pe]), o_lat = P . c (bf16), o = W_UV . o_lat (bf16).
  const double scale = config.softmax_scale();
  Matrix o(tokens, heads * v);
  parallel_for(tokens * heads, [&](int64_t i0, int64_t i1, int) {
    std::vector<double> acc(static_cast<size_t>(lora));
    std::vector<float> q_abs(static_cast<size_t>(lora)), o_lat(static_cast<size_t>(lora));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / heads, h = i % heads;
      const float* q_nope = q.row(t) + h * qk;
      const float* q_pe = q_nope + nope;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t dd = 0; dd < nope; ++dd) {
        const float* w_uk = w.w_uk.data() + (h * nope + dd) * lora;
        for (int64_t cc = 0; cc < lora; ++cc) acc[cc] += static_cast<double>(q_nope[dd]) * w_uk[cc];
      }
      for (int64_t cc = 0; cc < lora; ++cc)
        q_abs[cc] = numeric::round_to_bf16(static_cast<float>(acc[cc]));

      const std::vector<int64_t>& keys = selected[t];
      std::vector<double> p(keys.size());
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* latent = cache.latent.data() + keys[j] * lora;
        const float* rope = cache.rope.data() + keys[j] * rot;
        p[j] = scale * (detail::dot(q_abs.data(), latent, lora) + detail::dot(q_pe, rope, rot));
      }
      softmax(p, options.round_p_to_bf16);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* latent = cache.latent.data() + keys[j] * lora;
        for (int64_t cc = 0; cc < lora; ++cc) acc[cc] += p[j] * latent[cc];
      }
      for (int64_t cc = 0; cc < lora; ++cc)
        o_lat[cc] = numeric::round_to_bf16(static_cast<float>(acc[cc]));

      for (int64_t dd = 0; dd < v; ++dd) {
        const float* w_uv = w.w_uv.data() + (h * v + dd) * lora;
        const double sum = detail::dot(w_uv, o_lat.data(), lora);
        o.row(t)[h * v + dd] = numeric::round_to_bf16(static_cast<float>(sum));
      }
    }
  });
  return detail::fp8_linear(o, w.wo);
}

}  // namespace dsk::ref::model
