// The wire format of dispatch and combine headers and the small helpers both operations share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <dsk/core/check.hpp>
#include <dsk/core/error.hpp>

#include "ep/internal.hpp"

namespace dsk::ep::detail {

// What every rank must agree on for one operation; compared bytewise between all headers, so
// every rank sees the same disagreement and raises the same error.
struct Signature {
  int32_t kind;  // 1 dispatch, 2 combine, 3 low-latency dispatch, 4 low-latency combine
  int32_t hidden;
  int32_t num_topk;
  int32_t fp8;
  int32_t has_topk;
  int32_t has_weights;
  int32_t expand;
  int32_t alignment;
  int32_t num_experts;
  int32_t cached;
  int32_t tmax;    // low-latency: num_max_dispatch_tokens_per_rank
  int32_t logfmt;  // low-latency combine: 1 = LogFMT-10 records (ep/logfmt.hpp); else 0
};
static_assert(sizeof(Signature) % 8 == 0);

// Header = Signature, then these, then int32 row counts to every rank [R], then int32 selection
// counts for each of the receiver's local experts [E_local].
struct HeaderTail {
  int64_t num_tokens;   // the sender's T
  int64_t num_records;  // records the sender sends this receiver
};

inline size_t header_bytes(int num_ranks, int num_local_experts) {
  return align_up(sizeof(Signature) + sizeof(HeaderTail) +
                      4 * static_cast<size_t>(num_ranks + num_local_experts),
                  16);
}

// A view of one header in a buffer.
struct HeaderView {
  std::byte* base;
  int num_ranks;
  Signature& sig() const { return *reinterpret_cast<Signature*>(base); }
  HeaderTail& tail() const { return *reinterpret_cast<HeaderTail*>(base + sizeof(Signature)); }
  int32_t* row_counts() const {
    return reinterpret_cast<int32_t*>(base + sizeof(Signature) + sizeof(HeaderTail));
  }
  int32_t* expert_counts() const { return row_counts() + num_ranks; }
};

inline std::string describe(const Signature& s) {
  static constexpr const char* kNames[] = {"?", "dispatch", "combine", "low_latency_dispatch",
                                           "low_latency_combine"};
  return std::string(kNames[s.kind >= 1 && s.kind <= 4 ? s.kind : 0]) +
         "(hidden=" + std::to_string(s.hidden) + ", num_topk=" + std::to_string(s.num_topk) +
         ", fp8=" + std::to_string(s.fp8) + ", topk_idx=" + std::to_string(s.has_topk) +
         ", topk_weights=" + std::to_string(s.has_weights) +
         ", expand=" + std::to_string(s.expand) + ", alignment=" + std::to_string(s.alignment) +
         ", num_experts=" + std::to_string(s.num_experts) + ", cached=" + std::to_string(s.cached) +
         ", num_max_dispatch_tokens_per_rank=" + std::to_string(s.tmax) +
         ", use_logfmt=" + std::to_string(s.logfmt) + ")";
}

// Raises on every rank when the ranks' signatures differ.
inline void check_signatures(const ExchangeSpec& spec, int num_ranks, int rank, const char* fn) {
  const auto* mine = reinterpret_cast<const Signature*>(spec.send_headers.data());
  for (int s = 0; s < num_ranks; ++s) {
    if (spec.is_masked(s)) continue;  // shrink mode: no header from it
    const auto* theirs =
        reinterpret_cast<const Signature*>(spec.recv_headers.data() + spec.header_bytes * s);
    DSK_CHECK(std::memcmp(mine, theirs, sizeof(Signature)) == 0, fn,
              "ranks disagree on the operation: rank " + std::to_string(rank) + " calls " +
                  describe(*mine) + ", rank " + std::to_string(s) + " calls " + describe(*theirs));
  }
}

// The largest record of a dispatch or combine: a BF16 row with int32 ids and f32 weights per
// slot and the source token index, or a low-latency LogFMT message (a BF16 row's room plus 4
// bytes of meta per 128 channels).
inline size_t max_record_bytes(int64_t hidden, int num_topk) {
  const size_t extra = std::max(8 * static_cast<size_t>(num_topk) + 4,
                                4 * static_cast<size_t>((hidden + 127) / 128));
  return align_up(2 * static_cast<size_t>(hidden) + extra, 16);
}

// topk_idx [T, K] (i64 or i32, any strides) as int32 global ids; raises on ids outside [-1, E).
inline std::vector<int32_t> read_topk_idx(const char* fn, const char* arg, const Tensor& t,
                                          int num_experts) {
  check::dim(fn, arg, t, 2);
  check::dtype_in(fn, arg, t, {DType::i64, DType::i32});
  check::in_range(fn, "num_topk (topk_idx.size(1))", t.size(1), 0, kMaxTopk);
  const int64_t T = t.size(0), K = t.size(1);
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  // Through a pointer and the strides: Tensor::at checks every coordinate, which cost 0.2 ms
  // of a 7 ms dispatch at T = 4096, top-8.
  const int64_t row_stride = t.stride(0), col_stride = t.stride(1);
  auto read = [&]<typename I>(const I* data) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t v = data[i * row_stride + k * col_stride];
        DSK_CHECK_ARG(v >= -1 && v < num_experts, fn, arg,
                      "expert ids in [-1, " + std::to_string(num_experts) + ")",
                      "topk_idx[" + std::to_string(i) + ", " + std::to_string(k) +
                          "] = " + std::to_string(v));
        ids[static_cast<size_t>(i * K + k)] = static_cast<int32_t>(v);
      }
    }
  };
  if (t.dtype() == DType::i64) {
    read(t.data<int64_t>());
  } else {
    read(t.data<int32_t>());
  }
  return ids;
}

// One operation's implementation entry points (dispatch.cpp, combine.cpp, low_latency.cpp).
DispatchResult run_dispatch(BufferImpl& b, const Tensor& x, const Tensor* x_sf,
                            const DispatchArgs& args);
CombineResult run_combine(BufferImpl& b, const Tensor& x, const DispatchHandle& handle,
                          const CombineArgs& args);
LowLatencyDispatchResult run_low_latency_dispatch(BufferImpl& b, const Tensor& x,
                                                  const Tensor& topk_idx, int64_t tmax,
                                                  int num_experts,
                                                  const LowLatencyDispatchArgs& args);
Tensor next_low_latency_combine_buffer(BufferImpl& b, const LowLatencyHandle& handle);
LowLatencyCombineResult run_low_latency_combine(BufferImpl& b, const Tensor& x,
                                                const Tensor& topk_idx, const Tensor& topk_weights,
                                                const LowLatencyHandle& handle,
                                                const LowLatencyCombineArgs& args);

}  // namespace dsk::ep::detail
