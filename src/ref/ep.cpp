// dsk::ref::ep: upstream's refs.py dispatch and combine and the low-latency mode's, each field
// moved by one plain Communicator::alltoallv (contracts in include/dsk/ref.hpp).
#include <algorithm>
#include <cstring>
#include <numeric>

#include <dsk/core/check.hpp>
#include <dsk/ref.hpp>

namespace dsk::ref::ep {
namespace {

using dsk::ep::Communicator;

constexpr const char* kDispatch = "dsk::ref::ep::dispatch";
constexpr const char* kCombine = "dsk::ref::ep::combine";
constexpr const char* kLowLatencyDispatch = "dsk::ref::ep::low_latency_dispatch";
constexpr const char* kLowLatencyCombine = "dsk::ref::ep::low_latency_combine";

int64_t expert_at(const Tensor& topk_idx, int64_t t, int64_t k) {
  return topk_idx.dtype() == DType::i32 ? topk_idx.at<int32_t>({t, k})
                                        : topk_idx.at<int64_t>({t, k});
}

// The routing of this rank's tokens (expert e lives on rank e / experts_per_rank): the ranks each
// token visits, in the order of their last top-k slot. Raises on an id outside [-1, E).
struct Routing {
  int experts_per_rank = 1;
  std::vector<std::vector<int>> ranks;  // per token

  Routing(const Tensor& topk_idx, int num_experts, int group_size, const char* fn)
      : experts_per_rank(num_experts / group_size) {
    const int64_t T = topk_idx.size(0), K = topk_idx.size(1);
    ranks.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = expert_at(topk_idx, t, k);
        DSK_CHECK_ARG(e >= -1 && e < num_experts, fn, "topk_idx",
                      "expert ids in [-1, " + std::to_string(num_experts) + ")", e);
        if (e < 0) continue;
        bool last = true;
        for (int64_t j = k + 1; j < K && last; ++j) {
          const int64_t f = expert_at(topk_idx, t, j);
          last = !(f >= 0 && f / experts_per_rank == e / experts_per_rank);
        }
        if (last) ranks[t].push_back(static_cast<int>(e / experts_per_rank));
      }
    }
  }
  bool visits(int64_t t, int d) const {
    const auto& r = ranks[static_cast<size_t>(t)];
    return std::find(r.begin(), r.end(), d) != r.end();
  }
};

// Block d of per_rank (count_to[d] rows of `row` elements) to rank d; returns the blocks received,
// in source rank order (count_from[s] rows from rank s).
template <class T>
std::vector<T> exchange(const Communicator& comm, const std::vector<std::vector<T>>& per_rank,
                        const std::vector<int64_t>& count_to,
                        const std::vector<int64_t>& count_from, size_t row) {
  const int R = comm.size();
  std::vector<T> send;
  std::vector<int64_t> send_bytes(R), recv_bytes(R);
  int64_t received = 0;
  for (int r = 0; r < R; ++r) {
    send.insert(send.end(), per_rank[r].begin(), per_rank[r].end());
    send_bytes[r] = count_to[r] * static_cast<int64_t>(row * sizeof(T));
    recv_bytes[r] = count_from[r] * static_cast<int64_t>(row * sizeof(T));
    received += count_from[r] * static_cast<int64_t>(row);
  }
  std::vector<T> recv(static_cast<size_t>(received));
  comm.alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  return recv;
}

// The rows each rank sends this one, from the rows this one sends each rank.
std::vector<int64_t> counts_from(const Communicator& comm, const std::vector<int64_t>& to) {
  const std::vector<int64_t> eight(static_cast<size_t>(comm.size()), sizeof(int64_t));
  std::vector<int64_t> from(to.size(), 0);
  comm.alltoallv(to.data(), eight, from.data(), eight);
  return from;
}

// A tensor of `values` (already of shape `shape`).
template <class T>
Tensor tensor_of(const std::vector<T>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

void check_topk(const Tensor& topk_idx, int64_t T, const char* fn) {
  DSK_CHECK_ARG(topk_idx.dim() == 2 && topk_idx.size(0) == T, fn, "topk_idx", "[T, K]",
                topk_idx.describe());
  DSK_CHECK_ARG(topk_idx.dtype() == DType::i32 || topk_idx.dtype() == DType::i64, fn, "topk_idx",
                "int32 or int64", dtype_name(topk_idx.dtype()));
}

}  // namespace

Dispatch dispatch(const Communicator& comm, const Tensor& x, const std::optional<Tensor>& x_sf,
                  const Tensor& topk_idx, const std::optional<Tensor>& topk_weights,
                  int num_experts) {
  const int R = comm.size(), me = comm.rank();
  DSK_CHECK_ARG(num_experts > 0 && num_experts % R == 0, kDispatch, "num_experts",
                "a positive multiple of the group size " + std::to_string(R), num_experts);
  DSK_CHECK_ARG(x.dim() == 2 && (x.dtype() == DType::bf16 || x.dtype() == DType::e4m3), kDispatch,
                "x", "bf16 or e4m3 [T, H]", x.describe());
  DSK_CHECK_ARG(x.dtype() == DType::bf16 || x_sf.has_value(), kDispatch, "x_sf",
                "f32 [T, H / 128] with e4m3 x", "none");
  const int64_t T = x.size(0), H = x.size(1);
  check_topk(topk_idx, T, kDispatch);
  const int64_t K = topk_idx.size(1);
  const int64_t nsf = x_sf ? x_sf->size(1) : 0;
  if (x_sf)
    DSK_CHECK_ARG(x_sf->dim() == 2 && x_sf->size(0) == T && x_sf->dtype() == DType::f32, kDispatch,
                  "x_sf", "f32 [T, H / 128]", x_sf->describe());
  if (topk_weights)
    DSK_CHECK_ARG(topk_weights->dim() == 2 && topk_weights->size(0) == T &&
                      topk_weights->size(1) == K && topk_weights->dtype() == DType::f32,
                  kDispatch, "topk_weights", "f32 [T, K]", topk_weights->describe());
  const Tensor rows = x.contiguous();
  const size_t row_bytes = static_cast<size_t>(H) * x.element_size();
  const Routing routing(topk_idx, num_experts, R, kDispatch);
  const int El = routing.experts_per_rank;

  std::vector<std::vector<std::byte>> sx(R);
  std::vector<std::vector<float>> ssf(R), sw(R);
  std::vector<std::vector<int64_t>> sidx(R);
  std::vector<std::vector<int32_t>> ssrc(R);
  std::vector<int64_t> to(R, 0);
  for (int d = 0; d < R; ++d) {
    for (int64_t t = 0; t < T; ++t) {
      if (!routing.visits(t, d)) continue;
      ++to[d];
      const auto* row = static_cast<const std::byte*>(rows.data_ptr()) + t * row_bytes;
      sx[d].insert(sx[d].end(), row, row + row_bytes);
      for (int64_t j = 0; j < nsf; ++j) ssf[d].push_back(x_sf->at<float>({t, j}));
      for (int64_t k = 0; k < K; ++k) {
        sidx[d].push_back(expert_at(topk_idx, t, k));
        sw[d].push_back(topk_weights ? topk_weights->at<float>({t, k}) : 0.0f);
      }
      ssrc[d].push_back(static_cast<int32_t>(t));
    }
  }
  const std::vector<int64_t> from = counts_from(comm, to);
  const int64_t N = std::accumulate(from.begin(), from.end(), int64_t{0});

  Dispatch out;
  out.rows_per_rank = from;
  out.x = tensor_of(exchange(comm, sx, to, from, row_bytes), {N, H}, x.dtype());
  if (x_sf) out.x_sf = tensor_of(exchange(comm, ssf, to, from, nsf), {N, nsf}, DType::f32);
  std::vector<int64_t> idx = exchange(comm, sidx, to, from, static_cast<size_t>(K));
  std::vector<float> w = exchange(comm, sw, to, from, static_cast<size_t>(K));
  out.rows_per_expert.assign(El, 0);
  for (size_t i = 0; i < idx.size(); ++i) {
    const bool local = idx[i] >= int64_t{me} * El && idx[i] < int64_t{me + 1} * El;
    idx[i] = local ? idx[i] - int64_t{me} * El : -1;
    if (local) ++out.rows_per_expert[idx[i]];
    if (!local) w[i] = 0.0f;
  }
  out.topk_idx = tensor_of(idx, {N, K}, DType::i64);
  if (topk_weights) out.topk_weights = tensor_of(w, {N, K}, DType::f32);
  out.src_idx = tensor_of(exchange(comm, ssrc, to, from, 1), {N}, DType::i32);
  return out;
}

Combine combine(const Communicator& comm, const Tensor& y, const Dispatch& dispatched,
                const Tensor& topk_idx, const std::vector<Tensor>& bias, int num_experts) {
  const int R = comm.size();
  DSK_CHECK_ARG(num_experts > 0 && num_experts % R == 0, kCombine, "num_experts",
                "a positive multiple of the group size " + std::to_string(R), num_experts);
  const int64_t N = dispatched.x.size(0);
  DSK_CHECK_ARG(y.dim() == 2 && y.size(0) == N && y.dtype() == DType::bf16, kCombine, "y",
                "bf16 [" + std::to_string(N) + ", H]", y.describe());
  const int64_t T = topk_idx.size(0), H = y.size(1);
  check_topk(topk_idx, T, kCombine);
  const int64_t K = topk_idx.size(1);
  DSK_CHECK_ARG(dispatched.rows_per_rank.size() == static_cast<size_t>(R), kCombine, "dispatched",
                "the reference dispatch of this group of " + std::to_string(R) + " ranks",
                dispatched.rows_per_rank.size());
  DSK_CHECK_ARG(bias.size() <= 2, kCombine, "bias", "0, 1 or 2 tensors", bias.size());
  for (const Tensor& b : bias)
    DSK_CHECK_ARG(b.dim() == 2 && b.size(0) == T && b.size(1) == H && b.dtype() == DType::bf16,
                  kCombine, "bias", "bf16 [T, H]", b.describe());
  const Routing routing(topk_idx, num_experts, R, kCombine);

  // Back to the sources: block s of the received rows (and weights) to rank s.
  const Tensor rows = y.contiguous();
  const bool weights = dispatched.topk_weights.has_value();
  std::vector<std::vector<bf16>> sy(R);
  std::vector<std::vector<float>> sw(R);
  int64_t first = 0;
  for (int s = 0; s < R; ++s) {
    const int64_t n = dispatched.rows_per_rank[s];
    sy[s].assign(rows.data<bf16>() + first * H, rows.data<bf16>() + (first + n) * H);
    if (weights)
      sw[s].assign(dispatched.topk_weights->data<float>() + first * K,
                   dispatched.topk_weights->data<float>() + (first + n) * K);
    first += n;
  }
  std::vector<int64_t> visitors(R, 0);
  std::vector<std::vector<int64_t>> row_of(R, std::vector<int64_t>(static_cast<size_t>(T), -1));
  for (int d = 0; d < R; ++d)
    for (int64_t t = 0; t < T; ++t)
      if (routing.visits(t, d)) row_of[d][t] = visitors[d]++;
  const std::vector<bf16> back = exchange(comm, sy, dispatched.rows_per_rank, visitors, H);
  const std::vector<float> back_w =
      weights ? exchange(comm, sw, dispatched.rows_per_rank, visitors, static_cast<size_t>(K))
              : std::vector<float>();
  std::vector<int64_t> block(R, 0);  // first returned row of each rank
  for (int d = 1; d < R; ++d) block[d] = block[d - 1] + visitors[d - 1];

  Combine out;
  out.x = Tensor::empty({T, H}, DType::bf16);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float acc = bias.empty() ? 0.0f : bf16_to_f32(bias[0].at<bf16>({t, h}));
      if (bias.size() > 1) acc = acc + bf16_to_f32(bias[1].at<bf16>({t, h}));
      for (int d : routing.ranks[t])
        acc = acc + bf16_to_f32(back[static_cast<size_t>((block[d] + row_of[d][t]) * H + h)]);
      out.x.at<bf16>({t, h}) = f32_to_bf16(acc);
    }
  }
  if (weights) {
    out.topk_weights = Tensor::empty({T, K}, DType::f32);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        float acc = 0.0f;
        for (int d : routing.ranks[t])
          acc = acc + back_w[static_cast<size_t>((block[d] + row_of[d][t]) * K + k)];
        out.topk_weights->at<float>({t, k}) = acc;
      }
    }
  }
  return out;
}

LowLatencyDispatch low_latency_dispatch(const Communicator& comm, const Tensor& x,
                                        const std::optional<Tensor>& x_sf, const Tensor& topk_idx,
                                        int64_t num_max_dispatch_tokens_per_rank, int num_experts) {
  const int R = comm.size();
  const int64_t Tmax = num_max_dispatch_tokens_per_rank;
  DSK_CHECK_ARG(num_experts > 0 && num_experts % R == 0, kLowLatencyDispatch, "num_experts",
                "a positive multiple of the group size " + std::to_string(R), num_experts);
  DSK_CHECK_ARG(x.dim() == 2 && (x.dtype() == DType::bf16 || x.dtype() == DType::e4m3),
                kLowLatencyDispatch, "x", "bf16 or e4m3 [T, H]", x.describe());
  DSK_CHECK_ARG(x.dtype() == DType::bf16 || x_sf.has_value(), kLowLatencyDispatch, "x_sf",
                "f32 [T, H / 128] with e4m3 x", "none");
  const int64_t T = x.size(0), H = x.size(1);
  DSK_CHECK_ARG(T <= Tmax, kLowLatencyDispatch, "num_max_dispatch_tokens_per_rank",
                "at least the " + std::to_string(T) + " tokens of x", Tmax);
  check_topk(topk_idx, T, kLowLatencyDispatch);
  const int64_t K = topk_idx.size(1);
  const int64_t nsf = x_sf ? x_sf->size(1) : 0;
  if (x_sf)
    DSK_CHECK_ARG(x_sf->dim() == 2 && x_sf->size(0) == T && x_sf->dtype() == DType::f32,
                  kLowLatencyDispatch, "x_sf", "f32 [T, H / 128]", x_sf->describe());
  const Routing routing(topk_idx, num_experts, R, kLowLatencyDispatch);  // checks the ids
  const int El = routing.experts_per_rank;
  const Tensor rows = x.contiguous();
  const size_t row_bytes = static_cast<size_t>(H) * x.element_size();

  // Per destination: (local expert, token) of each message, expert by expert, tokens in order.
  std::vector<std::vector<int64_t>> smeta(R);
  std::vector<std::vector<std::byte>> sx(R);
  std::vector<std::vector<float>> ssf(R);
  std::vector<int64_t> to(R, 0);
  for (int d = 0; d < R; ++d) {
    for (int el = 0; el < El; ++el) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t k = 0; k < K; ++k) {
          if (expert_at(topk_idx, t, k) != int64_t{d} * El + el) continue;
          ++to[d];
          smeta[d].insert(smeta[d].end(), {el, t});
          const auto* row = static_cast<const std::byte*>(rows.data_ptr()) + t * row_bytes;
          sx[d].insert(sx[d].end(), row, row + row_bytes);
          for (int64_t j = 0; j < nsf; ++j) ssf[d].push_back(x_sf->at<float>({t, j}));
        }
      }
    }
  }
  const std::vector<int64_t> from = counts_from(comm, to);
  const std::vector<int64_t> meta = exchange(comm, smeta, to, from, 2);
  const std::vector<std::byte> got = exchange(comm, sx, to, from, row_bytes);
  const std::vector<float> got_sf = exchange(comm, ssf, to, from, static_cast<size_t>(nsf));

  LowLatencyDispatch out;
  const int64_t RT = R * Tmax;
  out.x = Tensor::zeros({El, RT, H}, x.dtype());
  if (x_sf) out.x_sf = Tensor::zeros({El, RT, nsf}, DType::f32);
  out.count = Tensor::zeros({El}, DType::i32);
  out.src_info = Tensor::empty({El, RT}, DType::i32);
  std::fill_n(out.src_info.data<int32_t>(), El * RT, -1);
  out.layout_range = Tensor::zeros({El, R}, DType::i64);
  int64_t record = 0;
  for (int s = 0; s < R; ++s) {
    for (int64_t i = 0; i < from[s]; ++i, ++record) {
      const int64_t el = meta[2 * record], t = meta[2 * record + 1];
      int32_t& n = out.count.data<int32_t>()[el];
      DSK_CHECK(n < RT, kLowLatencyDispatch,
                "more than R * Tmax rows for local expert " + std::to_string(el) +
                    " (a token that selects one expert twice)");
      std::memcpy(static_cast<std::byte*>(out.x.data_ptr()) + (el * RT + n) * row_bytes,
                  got.data() + record * row_bytes, row_bytes);
      if (x_sf)
        std::memcpy(&out.x_sf->at<float>({el, n, 0}), got_sf.data() + record * nsf,
                    static_cast<size_t>(nsf) * sizeof(float));
      out.src_info.at<int32_t>({el, n}) = static_cast<int32_t>(t);
      ++out.layout_range.at<int64_t>({el, s});  // the count; the first rows are added below
      ++n;
    }
  }
  for (int64_t el = 0; el < El; ++el) {
    int64_t first = 0;
    for (int s = 0; s < R; ++s) {
      int64_t& range = out.layout_range.at<int64_t>({el, s});
      const int64_t n = range;
      range = (first << 32) | n;
      first += n;
    }
  }
  return out;
}

Tensor low_latency_combine(const Communicator& comm, const Tensor& y,
                           const LowLatencyDispatch& dispatched, const Tensor& topk_idx,
                           const Tensor& topk_weights, int num_experts) {
  const int R = comm.size(), me = comm.rank();
  DSK_CHECK_ARG(num_experts > 0 && num_experts % R == 0, kLowLatencyCombine, "num_experts",
                "a positive multiple of the group size " + std::to_string(R), num_experts);
  DSK_CHECK_ARG(y.dtype() == DType::bf16 && y.sizes() == dispatched.x.sizes(), kLowLatencyCombine,
                "y", "bf16 of the dispatch's shape " + dispatched.x.describe(), y.describe());
  const int64_t T = topk_idx.size(0), El = y.size(0), RT = y.size(1), H = y.size(2);
  check_topk(topk_idx, T, kLowLatencyCombine);
  const int64_t K = topk_idx.size(1);
  DSK_CHECK_ARG(topk_weights.dim() == 2 && topk_weights.size(0) == T && topk_weights.size(1) == K &&
                    topk_weights.dtype() == DType::f32,
                kLowLatencyCombine, "topk_weights", "f32 [T, K]", topk_weights.describe());
  const Routing routing(topk_idx, num_experts, R, kLowLatencyCombine);  // checks the ids

  // Back to the sources: (global expert, token) and the row of every valid row.
  const Tensor rows = y.contiguous();
  std::vector<std::vector<int64_t>> smeta(R);
  std::vector<std::vector<bf16>> sy(R);
  std::vector<int64_t> to(R, 0);
  for (int64_t el = 0; el < El; ++el) {
    for (int s = 0; s < R; ++s) {
      const int64_t range = dispatched.layout_range.at<int64_t>({el, s});
      const int64_t first = range >> 32, n = range & 0xFFFFFFFF;
      for (int64_t i = first; i < first + n; ++i) {
        ++to[s];
        smeta[s].insert(smeta[s].end(),
                        {int64_t{me} * El + el, dispatched.src_info.at<int32_t>({el, i})});
        const bf16* row = rows.data<bf16>() + (el * RT + i) * H;
        sy[s].insert(sy[s].end(), row, row + H);
      }
    }
  }
  const std::vector<int64_t> from = counts_from(comm, to);
  const std::vector<int64_t> meta = exchange(comm, smeta, to, from, 2);
  const std::vector<bf16> back = exchange(comm, sy, to, from, static_cast<size_t>(H));

  // Each token's returned rows by global expert.
  std::vector<std::vector<std::pair<int64_t, const bf16*>>> returned(static_cast<size_t>(T));
  for (size_t r = 0; r < meta.size() / 2; ++r)
    returned[static_cast<size_t>(meta[2 * r + 1])].emplace_back(meta[2 * r], back.data() + r * H);
  Tensor out = Tensor::empty({T, H}, DType::bf16);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<const bf16*> slot_rows(static_cast<size_t>(K), nullptr);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = expert_at(topk_idx, t, k);
      if (e < 0) continue;
      for (const auto& [expert, row] : returned[t])
        if (expert == e) slot_rows[k] = row;
      DSK_CHECK(slot_rows[k] != nullptr, kLowLatencyCombine,
                "token " + std::to_string(t) + " got no row back from expert " + std::to_string(e));
    }
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        if (slot_rows[k] == nullptr) continue;
        const float product = topk_weights.at<float>({t, k}) * bf16_to_f32(slot_rows[k][h]);
        acc = acc + product;
      }
      out.at<bf16>({t, h}) = f32_to_bf16(acc);
    }
  }
  return out;
}

}  // namespace dsk::ref::ep
