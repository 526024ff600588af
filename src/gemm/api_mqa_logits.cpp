// gemm::fp8_mqa_logits: argument checks, the upstream output strides, kv widened once into
// panels, then blocks of queries over the threads, split by their amount of kv (causal prefill
// gives later queries more).
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <dsk/core/check.hpp>
#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/gemm.hpp>

#include "gemm/mqa_kernels.hpp"

namespace dsk::gemm {
namespace {

using kernels::gemm::kMqaPanel;
using kernels::gemm::kMqaQueries;
using kernels::gemm::MqaArgs;
using kernels::gemm::MqaScratch;

constexpr const char* kFn = "gemm::fp8_mqa_logits";

const detail::MqaKernels& mqa_kernels() {
  return backend() == Backend::generic ? detail::mqa_kernels_generic()
                                       : detail::mqa_kernels_avx512();
}

int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

const int32_t* check_bounds(const char* arg, const Tensor& t, int64_t s) {
  check::defined(kFn, arg, t);
  check::dtype(kFn, arg, t, DType::i32);
  check::shape(kFn, arg, t, {s});
  check::contiguous(kFn, arg, t);
  return t.data<int32_t>();
}

struct Shapes {
  int64_t s, h, d, skv;
};

Shapes check_inputs(const Tensor& q, const Fp8Tensor& kv, const Tensor& weights) {
  check::defined(kFn, "q", q);
  check::dtype(kFn, "q", q, DType::e4m3);
  check::dim(kFn, "q", q, 3);
  check::last_dim_contiguous(kFn, "q", q);
  const Shapes sh{q.size(0), q.size(1), q.size(2), kv.data.defined() ? kv.data.size(0) : 0};
  DSK_CHECK_ARG(sh.h >= 4 && sh.h <= 128 && sh.h % 4 == 0, kFn, "q",
                "a multiple of 4 heads, 4 to 128", sh.h);
  DSK_CHECK_ARG(sh.d == 32 || sh.d == 64 || sh.d == 128, kFn, "q", "head dim 32, 64 or 128", sh.d);
  check::defined(kFn, "kv", kv.data);
  check::dtype(kFn, "kv", kv.data, DType::e4m3);
  check::dim(kFn, "kv", kv.data, 2);
  check::size(kFn, "kv", kv.data, 1, sh.d);
  check::last_dim_contiguous(kFn, "kv", kv.data);
  DSK_CHECK_ARG(sh.skv < std::numeric_limits<int32_t>::max(), kFn, "kv", "fewer than 2^31 rows",
                sh.skv);
  check::defined(kFn, "kv_sf", kv.sf);
  check::dtype(kFn, "kv_sf", kv.sf, DType::f32);
  check::shape(kFn, "kv_sf", kv.sf, {sh.skv});
  check::contiguous(kFn, "kv_sf", kv.sf);
  check::defined(kFn, "weights", weights);
  check::dtype(kFn, "weights", weights, DType::f32);
  check::shape(kFn, "weights", weights, {sh.s, sh.h});
  check::last_dim_contiguous(kFn, "weights", weights);
  return sh;
}

// Query blocks [b0, b1) of each thread, with about equal kv rows each.
std::vector<int64_t> balanced_split(const int32_t* ks, const int32_t* ke, int64_t s, int parts) {
  const int64_t blocks = (s + kMqaQueries - 1) / kMqaQueries;
  std::vector<int64_t> cost(static_cast<size_t>(blocks) + 1, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t c = kMqaPanel;  // a block with nothing to do still costs its set-up
    for (int64_t i = b * kMqaQueries; i < std::min(s, (b + 1) * kMqaQueries); ++i)
      c += ke[i] - ks[i];
    cost[static_cast<size_t>(b) + 1] = cost[static_cast<size_t>(b)] + c;
  }
  std::vector<int64_t> bounds(static_cast<size_t>(parts) + 1, blocks);
  bounds[0] = 0;
  for (int p = 1; p < parts; ++p) {
    const int64_t target = cost.back() * p / parts;
    bounds[static_cast<size_t>(p)] =
        std::lower_bound(cost.begin(), cost.end(), target) - cost.begin();
  }
  return bounds;
}

}  // namespace

Tensor fp8_mqa_logits(const Tensor& q, const Fp8Tensor& kv, const Tensor& weights,
                      const Tensor& cu_seq_len_k_start, const Tensor& cu_seq_len_k_end,
                      bool clean_logits, int64_t max_seqlen_k, DType logits_dtype) {
  const Shapes sh = check_inputs(q, kv, weights);
  const int32_t* ks = check_bounds("cu_seq_len_k_start", cu_seq_len_k_start, sh.s);
  const int32_t* ke = check_bounds("cu_seq_len_k_end", cu_seq_len_k_end, sh.s);
  DSK_CHECK_ARG(logits_dtype == DType::f32 || logits_dtype == DType::bf16, kFn, "logits_dtype",
                "float32 or bfloat16", dtype_name(logits_dtype));
  DSK_CHECK_ARG(max_seqlen_k >= 0, kFn, "max_seqlen_k", ">= 0", max_seqlen_k);
  DSK_CHECK_ARG(max_seqlen_k == 0 || !clean_logits, kFn, "clean_logits",
                "false with a compressed output (max_seqlen_k > 0)", "true");
  for (int64_t i = 0; i < sh.s; ++i) {
    DSK_CHECK_ARG(0 <= ks[i] && ks[i] <= ke[i] && ke[i] <= sh.skv, kFn, "cu_seq_len_k_start/end",
                  "0 <= start <= end <= " + std::to_string(sh.skv),
                  "row " + std::to_string(i) + ": [" + std::to_string(ks[i]) + ", " +
                      std::to_string(ke[i]) + ")");
    DSK_CHECK_ARG(max_seqlen_k == 0 || ke[i] - ks[i] <= max_seqlen_k, kFn, "max_seqlen_k",
                  "at least every row's end - start",
                  std::to_string(max_seqlen_k) + " < " + std::to_string(ke[i] - ks[i]) + " (row " +
                      std::to_string(i) + ")");
  }
  // Upstream's strides: align(cols + 256, 1024 bytes / element size) elements.
  const int64_t cols = max_seqlen_k > 0 ? max_seqlen_k : sh.skv;
  const int64_t stride =
      align_up(cols + 256, 1024 / static_cast<int64_t>(element_size(logits_dtype)));
  Tensor storage = Tensor::empty({sh.s, stride}, logits_dtype);
  Tensor logits = storage.slice(1, 0, cols);
  if (sh.s == 0) return logits;

  const detail::MqaKernels& k = mqa_kernels();
  const int64_t panels = std::max<int64_t>(1, (sh.skv + kMqaPanel - 1) / kMqaPanel);
  std::vector<bf16> kv_panels(static_cast<size_t>(panels * kMqaPanel * sh.d));
  std::vector<float> kv_sf(static_cast<size_t>(panels * kMqaPanel), 0.0f);
  std::copy_n(kv.sf.data<float>(), sh.skv, kv_sf.begin());
  parallel_for(panels, [&](int64_t p0, int64_t p1, int) {
    std::vector<bf16> row(static_cast<size_t>(sh.d));
    k.pack_kv(kv.data.data<e4m3>(), kv.data.stride(0), sh.skv, sh.d, p0, p1, kv_panels.data(),
              row.data());
  });

  MqaArgs a;
  a.kv_panels = kv_panels.data();
  a.kv_sf = kv_sf.data();
  a.skv = sh.skv;
  a.d = sh.d;
  a.heads = sh.h;
  a.q = q.data<e4m3>();
  a.q_stride_s = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.w = weights.data<float>();
  a.w_stride = weights.stride(0);
  a.ks = ks;
  a.ke = ke;
  a.out = storage.data_ptr();
  a.out_stride = stride;
  a.out_bf16 = logits_dtype == DType::bf16;
  a.compressed = max_seqlen_k > 0;

  const int parts = get_num_threads();
  const std::vector<int64_t> bounds = balanced_split(ks, ke, sh.s, parts);
  parallel_for(parts, [&](int64_t t0, int64_t t1, int) {
    std::vector<bf16> qbuf(static_cast<size_t>(kMqaQueries * sh.h * sh.d));
    std::vector<float> tile(6 * kMqaPanel), logit(kMqaQueries * kMqaPanel);
    MqaScratch scratch{qbuf.data(), tile.data(), logit.data()};
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t b = bounds[static_cast<size_t>(t)]; b < bounds[static_cast<size_t>(t) + 1];
           ++b) {
        const int64_t i0 = b * kMqaQueries, nq = std::min(kMqaQueries, sh.s - i0);
        k.block(a, i0, nq, scratch);
        if (!clean_logits) continue;
        for (int64_t i = i0; i < i0 + nq; ++i)
          for (int64_t j = 0; j < sh.skv; ++j) {
            if (j == ks[i]) j = ke[i];
            if (j >= sh.skv) break;
            kernels::gemm::mqa_detail::store_logit(a, i, j,
                                                   -std::numeric_limits<float>::infinity());
          }
      }
    }
  });
  return logits;
}

}  // namespace dsk::gemm
