// dsk::ep::Buffer::dispatch: normal (one row per token and destination rank) and expand (one row
// per token and local expert) layouts, BF16 or FP8 rows, cached replays of a handle.
//
// Record of one (token, destination) pair: [x row][FP8 scales][int32 global ids x K][f32 weights
// x K][int32 source token], each part present only when the operation carries it, padded to 16.
// Without expansion the row may travel apart (direct rows), the rest as a dense tail.
#include <algorithm>
#include <bit>
#include <cstring>

#include <dsk/core/check.hpp>
#include <dsk/core/error.hpp>
#include <dsk/gemm.hpp>

#include "core/copy.hpp"
#include "ep/internal.hpp"
#include "ep/routing.hpp"

namespace dsk::ep {
namespace detail {

using dsk::detail::copy_row;
using dsk::detail::kStreamCopyBytes;
using dsk::detail::stream_fence;
namespace {

constexpr const char* kFn = "ep::Buffer::dispatch";

int64_t align_to(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

// Byte offsets of the parts of one record.
// The row comes first (x = 0), as ExchangeSpec's direct rows require.
struct RecordLayout {
  size_t x = 0, sf = 0, ids = 0, weights = 0, src = 0, bytes = 0;
  size_t x_bytes = 0, sf_bytes = 0, ids_bytes = 0, weights_bytes = 0;
};

RecordLayout record_layout(size_t x_bytes, size_t sf_bytes, int K, bool topk, bool weights) {
  RecordLayout l;
  l.x_bytes = x_bytes;
  l.sf_bytes = sf_bytes;
  l.ids_bytes = topk ? 4 * static_cast<size_t>(K) : 0;
  l.weights_bytes = weights ? 4 * static_cast<size_t>(K) : 0;
  l.sf = l.x + x_bytes;
  l.ids = l.sf + sf_bytes;
  l.weights = l.ids + l.ids_bytes;
  l.src = l.weights + l.weights_bytes;
  l.bytes = align_up(l.src + 4, 16);
  return l;
}

// The inputs of one dispatch after validation.
struct Inputs {
  const std::byte* x = nullptr;
  const std::byte* sf = nullptr;
  const float* weights = nullptr;
  int64_t T = 0, H = 0;
  size_t x_row = 0, sf_row = 0;
  int K = 0;
  bool fp8 = false, cached = false, expand = false, zero_padding = true;
  int alignment = 1;
  int64_t num_worst = 0;
  DType x_dtype = DType::bf16;
  DType idx_dtype = DType::i64;
};

void check_x(const Tensor& x, const Tensor* sf, const BufferImpl& b, Inputs& in) {
  check::dim(kFn, "x", x, 2);
  check::dtype(kFn, "x", x, sf ? DType::e4m3 : DType::bf16);
  check::contiguous(kFn, "x", x);
  in.T = x.size(0);
  in.H = x.size(1);
  DSK_CHECK_ARG(in.H > 0, kFn, "x", "a positive hidden size", x.describe());
  if (b.config.hidden > 0)
    DSK_CHECK_ARG(in.H == b.config.hidden, kFn, "x.size(1)",
                  "the buffer's hidden size " + std::to_string(b.config.hidden), in.H);
  if (b.config.num_max_tokens_per_rank > 0)
    DSK_CHECK_ARG(in.T <= b.config.num_max_tokens_per_rank, kFn, "x.size(0)",
                  "at most num_max_tokens_per_rank = " +
                      std::to_string(b.config.num_max_tokens_per_rank) + " tokens",
                  in.T);
  in.x = static_cast<const std::byte*>(x.data_ptr());
  in.x_row = static_cast<size_t>(in.H) * x.element_size();
  in.x_dtype = x.dtype();
  if (sf) {
    in.fp8 = true;
    DSK_CHECK_ARG(in.H % 128 == 0, kFn, "x", "a hidden size that is a multiple of 128 for FP8",
                  in.H);
    check::dtype(kFn, "x.sf", *sf, DType::f32);
    check::shape(kFn, "x.sf", *sf, {in.T, in.H / 128});
    check::contiguous(kFn, "x.sf", *sf);
    in.sf = static_cast<const std::byte*>(sf->data_ptr());
    in.sf_row = static_cast<size_t>(in.H / 128) * 4;
  }
}

// Token membership per rank, from is_token_in_rank or from the top-k ids.
std::vector<uint8_t> membership(const Tensor* is_token_in_rank, const std::vector<int32_t>* ids,
                                int64_t T, int K, int R, int per_rank) {
  std::vector<uint8_t> in_rank(static_cast<size_t>(T * R), 0);
  if (ids) {
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (const int32_t e = (*ids)[t * K + k]; e >= 0) in_rank[t * R + e / per_rank] = 1;
  }
  if (is_token_in_rank) {
    check::dtype(kFn, "is_token_in_rank", *is_token_in_rank, DType::boolean);
    check::shape(kFn, "is_token_in_rank", *is_token_in_rank, {T, R});
    for (int64_t t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) {
        const uint8_t v = is_token_in_rank->at<bool>({t, r}) ? 1 : 0;
        if (ids)
          DSK_CHECK_ARG(v == in_rank[t * R + r], kFn, "is_token_in_rank",
                        "the membership topk_idx implies (as get_dispatch_layout computes it)",
                        "a mismatch at token " + std::to_string(t) + ", rank " + std::to_string(r));
        in_rank[t * R + r] = v;
      }
    }
  }
  return in_rank;
}

std::shared_ptr<Plan> make_plan(const BufferImpl& b, const DispatchArgs& a, Inputs& in) {
  const int R = b.num_ranks, El = b.num_local_experts, E = b.config.num_experts;
  auto plan = std::make_shared<Plan>();
  plan->buffer = &b;
  plan->num_ranks = R;
  plan->rank = b.rank;
  plan->num_local_experts = El;
  plan->num_tokens = in.T;
  std::vector<uint8_t> in_rank;
  if (in.cached) {
    const Plan& old = *a.handle->plan;
    plan->topk = old.topk;
    plan->has_topk = old.has_topk;
    plan->num_topk = old.num_topk;
    plan->send_list = old.send_list;
    plan->send_pos = old.send_pos;
    in.idx_dtype = a.handle->topk_idx ? a.handle->topk_idx->dtype() : DType::i64;
  } else {
    DSK_CHECK_ARG(a.topk_idx || a.is_token_in_rank, kFn, "topk_idx / is_token_in_rank",
                  "at least one of them (or a handle for a cached dispatch)", "neither");
    if (a.topk_idx) {
      plan->topk = read_topk_idx(kFn, "topk_idx", *a.topk_idx, E);
      DSK_CHECK_ARG(a.topk_idx->size(0) == in.T, kFn, "topk_idx.size(0)",
                    "x.size(0) = " + std::to_string(in.T), a.topk_idx->size(0));
      plan->has_topk = true;
      plan->num_topk = static_cast<int>(a.topk_idx->size(1));
      in.idx_dtype = a.topk_idx->dtype();
    }
    const int K = plan->num_topk;
    in_rank = membership(a.is_token_in_rank ? &*a.is_token_in_rank : nullptr,
                         plan->has_topk ? &plan->topk : nullptr, in.T, K, R, El);
    plan->send_list.assign(R, {});
    plan->send_pos.assign(static_cast<size_t>(in.T * R), -1);
    for (int64_t t = 0; t < in.T; ++t) {
      for (int r = 0; r < R; ++r) {
        if (!in_rank[t * R + r]) continue;
        plan->send_pos[t * R + r] = static_cast<int32_t>(plan->send_list[r].size());
        plan->send_list[r].push_back(static_cast<int32_t>(t));
      }
    }
    if (a.num_tokens_per_rank) {
      check::dtype(kFn, "num_tokens_per_rank", *a.num_tokens_per_rank, DType::i32);
      check::shape(kFn, "num_tokens_per_rank", *a.num_tokens_per_rank, {R});
      for (int r = 0; r < R; ++r)
        DSK_CHECK_ARG(a.num_tokens_per_rank->at<int32_t>({r}) ==
                          static_cast<int32_t>(plan->send_list[r].size()),
                      kFn, "num_tokens_per_rank", "the counts the routing implies",
                      "a mismatch at rank " + std::to_string(r));
    }
  }
  in.K = plan->num_topk;
  plan->expand = in.expand;
  return plan;
}

// Selections per (destination rank, local expert), from the ids or the caller's counts.
std::vector<int32_t> expert_counts(const BufferImpl& b, const DispatchArgs& a, const Plan& plan) {
  const int E = b.config.num_experts;
  std::vector<int32_t> counts(static_cast<size_t>(E), 0);
  if (plan.has_topk)
    for (int32_t e : plan.topk)
      if (e >= 0) ++counts[e];
  if (a.num_tokens_per_expert) {
    check::dtype(kFn, "num_tokens_per_expert", *a.num_tokens_per_expert, DType::i32);
    check::shape(kFn, "num_tokens_per_expert", *a.num_tokens_per_expert, {E});
    for (int e = 0; e < E; ++e) {
      const int32_t given = a.num_tokens_per_expert->at<int32_t>({e});
      if (plan.has_topk)
        DSK_CHECK_ARG(given == counts[e], kFn, "num_tokens_per_expert",
                      "the counts topk_idx implies", "a mismatch at expert " + std::to_string(e));
      DSK_CHECK_ARG(given >= 0, kFn, "num_tokens_per_expert", "non-negative counts", given);
      counts[e] = given;
    }
  }
  return counts;
}

// The receive side of one dispatch: outputs and where each record lands.
struct Receiver {
  BufferImpl* b = nullptr;
  const Inputs* in = nullptr;
  Plan* plan = nullptr;
  RecordLayout rec;
  int64_t tmax = 0;  // for global source ids
  int64_t rows = 0, needed_rows = 0, num_recv = 0;
  bool overflow = false;
  std::vector<int64_t> expert_count, expert_start, psum;
  std::vector<std::vector<int64_t>> cursor;  // [source][local expert] next expanded row
  std::vector<int32_t> prefix;               // [R*R] rank_prefix_matrix
  Tensor recv_x, recv_sf, recv_idx, recv_w, recv_src_idx, meta;

  void on_headers(ExchangeSpec& spec);
  // Records [first, first + n) from s. tails: src holds their tails (ExchangeSpec::tail_bytes()
  // apart) and their rows are at `rows` (row i at rows + i * rec.x_bytes), or, when rows is null,
  // were written straight into recv_x (direct rows); else src holds whole records.
  void unpack(int s, int64_t first, int64_t n, const std::byte* src, bool tails,
              const std::byte* rows = nullptr);
  // Records from each source unpacked so far (ExchangeSpec::released: nothing is held).
  std::vector<int64_t> unpacked;
  // Expand mode: whether rows are written to recv_x around the caches (a large output that
  // nothing reads before the dispatch returns).
  bool stream_x = false;
  // Direct rows: where row 0 of sender s's records goes, when recv_x is a shared output.
  std::byte* direct_dest(int s);
  bool shared_x = false;
  void finish();
};

void Receiver::on_headers(ExchangeSpec& spec) {
  const int R = b->num_ranks, El = b->num_local_experts, K = in->K;
  check_signatures(spec, R, b->rank, kFn);
  auto header = [&](int s) {
    return HeaderView{spec.recv_headers.data() + spec.header_bytes * s, R};
  };
  plan->recv_count.assign(R, 0);
  plan->recv_offset.assign(R, 0);
  prefix.assign(static_cast<size_t>(R * R), 0);
  expert_count.assign(El, 0);
  tmax = b->config.num_max_tokens_per_rank;
  for (int s = 0; s < R; ++s) {
    const HeaderView h = header(s);
    plan->recv_offset[s] = num_recv;
    plan->recv_count[s] = h.tail().num_records;
    num_recv += h.tail().num_records;
    spec.recv_records[s] = h.tail().num_records;
    for (int j = 0; j < R; ++j)
      prefix[s * R + j] = h.row_counts()[j] + (s > 0 ? prefix[(s - 1) * R + j] : 0);
    for (int e = 0; e < El; ++e) expert_count[e] += h.expert_counts()[e];
    if (b->config.num_max_tokens_per_rank == 0) tmax = std::max(tmax, h.tail().num_tokens);
  }

  // Expert blocks (expand mode) and the aligned per-expert counts.
  const int64_t A = in->alignment;
  expert_start.assign(El, 0);
  psum.assign(El, 0);
  for (int e = 0; e < El; ++e) {
    if (in->expand) {
      expert_start[e] = e == 0 ? 0 : align_to(psum[e - 1], A);
      psum[e] = expert_start[e] + expert_count[e];
    } else {
      psum[e] = (e == 0 ? 0 : psum[e - 1]) + align_to(expert_count[e], A);
    }
  }
  needed_rows = in->expand ? (El > 0 ? align_to(psum[El - 1], A) : 0) : num_recv;
  rows = in->num_worst > 0 ? in->num_worst : needed_rows;
  overflow = needed_rows > rows;
  if (in->expand) {
    cursor.assign(R, std::vector<int64_t>(El, 0));
    for (int e = 0; e < El; ++e) {
      int64_t next = expert_start[e];
      for (int s = 0; s < R; ++s) {
        cursor[s][e] = next;
        next += header(s).expert_counts()[e];
      }
    }
  }

  const int64_t alloc = overflow ? 0 : rows;
  // Without expansion every record's row has one place in recv_x, so the peers can write it
  // there themselves when recv_x lives in the channel's shared outputs.
  if (spec.direct_row_bytes > 0 && !in->expand && alloc > 0)
    recv_x = b->channel->shared_output({alloc, in->H}, in->x_dtype);
  shared_x = recv_x.defined();
  if (!shared_x) recv_x = b->pooled({alloc, in->H}, in->x_dtype);
  if (in->fp8) recv_sf = b->pooled({alloc, in->H / 128}, DType::f32);
  if (plan->has_topk && !in->expand) recv_idx = Tensor::empty({alloc, K}, in->idx_dtype);
  if (in->weights) {
    recv_w =
        in->expand ? Tensor::zeros({alloc}, DType::f32) : Tensor::empty({alloc, K}, DType::f32);
  }
  recv_src_idx = Tensor::empty({num_recv}, DType::i32);
  meta = Tensor::empty({num_recv, 2 + K}, DType::i32);
  if (in->expand) plan->expanded_rows.assign(static_cast<size_t>(num_recv * K), -1);
  stream_x = in->expand && static_cast<size_t>(alloc) * rec.x_bytes >= kStreamCopyBytes;
}

std::byte* Receiver::direct_dest(int s) {
  if (overflow || !recv_x.defined()) return nullptr;
  return static_cast<std::byte*>(recv_x.data_ptr()) + plan->recv_offset[s] * rec.x_bytes;
}

void Receiver::unpack(int s, int64_t first, int64_t n, const std::byte* src, bool tails,
                      const std::byte* rows) {
  unpacked[s] = first + n;
  if (overflow) return;  // drained; finish() raises
  const int K = in->K, El = b->num_local_experts, lo = b->rank * El;
  auto* out_x = static_cast<std::byte*>(recv_x.data_ptr());
  auto* out_sf = in->fp8 ? static_cast<std::byte*>(recv_sf.data_ptr()) : nullptr;
  float* out_w = in->weights ? recv_w.data<float>() : nullptr;
  int32_t* out_meta = meta.data<int32_t>();
  int32_t* out_src = recv_src_idx.data<int32_t>();
  const bool has_idx = recv_idx.defined();
  int64_t* out_idx64 = has_idx && in->idx_dtype == DType::i64 ? recv_idx.data<int64_t>() : nullptr;
  int32_t* out_idx32 = has_idx && in->idx_dtype != DType::i64 ? recv_idx.data<int32_t>() : nullptr;
  // Tails are the records from rec.sf on: their parts sit rec.sf earlier.
  const size_t skip = tails ? rec.sf : 0;
  const size_t stride = rec.bytes - skip;
  const bool rows_landed = tails && rows == nullptr;
  const int slots = rec.ids_bytes ? K : 0;  // top-k slots the records carry
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* r = src + static_cast<size_t>(i) * stride;
    auto part = [&](size_t offset) { return r + (offset - skip); };
    const std::byte* x_row = !tails        ? r + rec.x
                             : rows_landed ? nullptr
                                           : rows + static_cast<size_t>(i) * rec.x_bytes;
    const int64_t row = plan->recv_offset[s] + first + i;
    int32_t token = 0;
    std::memcpy(&token, part(rec.src), 4);
    out_src[row] = token;
    int32_t* m = out_meta + row * (2 + K);
    m[0] = static_cast<int32_t>(s * tmax + token);
    m[1] = -1;
    for (int k = 0; k < K; ++k) m[2 + k] = -1;
    int32_t ids[kMaxTopk];
    float w[kMaxTopk];
    if (rec.ids_bytes) std::memcpy(ids, part(rec.ids), rec.ids_bytes);
    if (rec.weights_bytes) std::memcpy(w, part(rec.weights), rec.weights_bytes);
    // Local ids, the first local slot and (below) the weights without branches on the ids: they
    // are random, and the mispredicted branches made the unpack of a dispatch's 8K records
    // (T = 4096, top-8, 2 ranks) cost 0.4-0.5 ms instead of 0.15-0.25.
    int local[kMaxTopk];
    int first_slot = -1;
    for (int k = slots - 1; k >= 0; --k) {
      const int32_t l = ids[k] - lo;
      local[k] = static_cast<uint32_t>(l) < static_cast<uint32_t>(El) ? l : -1;
      first_slot = local[k] >= 0 ? s * K + k : first_slot;
    }
    m[1] = first_slot;
    if (!in->expand) {
      if (!rows_landed) std::memcpy(out_x + row * rec.x_bytes, x_row, rec.x_bytes);
      if (out_sf) std::memcpy(out_sf + row * rec.sf_bytes, part(rec.sf), rec.sf_bytes);
      for (int k = 0; out_idx64 && k < slots; ++k) out_idx64[row * K + k] = local[k];
      for (int k = 0; out_idx32 && k < slots; ++k) out_idx32[row * K + k] = local[k];
      // Another rank's slot gets weight +0: its bits masked, not a branch (see above).
      for (int k = 0; out_w && k < slots; ++k) {
        const uint32_t keep = local[k] >= 0 ? ~uint32_t{0} : 0;
        out_w[row * K + k] = std::bit_cast<float>(std::bit_cast<uint32_t>(w[k]) & keep);
      }
      continue;
    }
    for (int k = 0; k < K; ++k) {
      if (local[k] < 0) continue;
      const int64_t erow = cursor[s][local[k]]++;
      copy_row(out_x + erow * rec.x_bytes, x_row, rec.x_bytes, stream_x);
      if (out_sf) std::memcpy(out_sf + erow * rec.sf_bytes, part(rec.sf), rec.sf_bytes);
      if (out_w) out_w[erow] = w[k];
      m[2 + k] = static_cast<int32_t>(erow);
      plan->expanded_rows[row * K + k] = static_cast<int32_t>(erow);
    }
  }
  // The thread that streamed orders its rows before anything it does next (this call may run on
  // the caller's thread or the communication thread).
  if (stream_x) stream_fence();
}

// Zeroes the rows no record wrote: the num_worst_tokens tail, and expand-mode gaps.
void Receiver::finish() {
  DSK_CHECK(!overflow, kFn,
            "num_worst_tokens = " + std::to_string(rows) + " is too small: this rank needs " +
                std::to_string(needed_rows) + " rows");
  auto zero_rows = [&](int64_t begin, int64_t end) {
    if (begin >= end) return;
    std::memset(static_cast<std::byte*>(recv_x.data_ptr()) + begin * rec.x_bytes, 0,
                static_cast<size_t>(end - begin) * rec.x_bytes);
    if (in->fp8)
      std::memset(static_cast<std::byte*>(recv_sf.data_ptr()) + begin * rec.sf_bytes, 0,
                  static_cast<size_t>(end - begin) * rec.sf_bytes);
  };
  const int K = in->K, El = b->num_local_experts;
  if (!in->expand) {
    zero_rows(num_recv, rows);
    for (int64_t row = num_recv; row < rows; ++row) {
      for (int k = 0; k < K && recv_idx.defined(); ++k) {
        if (in->idx_dtype == DType::i64) {
          recv_idx.data<int64_t>()[row * K + k] = -1;
        } else {
          recv_idx.data<int32_t>()[row * K + k] = -1;
        }
      }
      for (int k = 0; k < K && recv_w.defined(); ++k) recv_w.data<float>()[row * K + k] = 0.0f;
    }
    return;
  }
  if (!in->zero_padding) return;
  for (int e = 0; e < El; ++e) zero_rows(psum[e], e + 1 < El ? expert_start[e + 1] : rows);
}

struct DispatchOp final : Operation {
  Inputs in;
  Receiver recv;
  std::shared_ptr<Plan> plan;
  std::vector<Tensor> keep;  // the inputs the callbacks read, alive until the exchange ends
  void finish() override { recv.finish(); }
};

Signature make_signature(const BufferImpl& b, const Inputs& in, const Plan& plan) {
  return {.kind = 1,
          .hidden = static_cast<int32_t>(in.H),
          .num_topk = in.K,
          .fp8 = in.fp8 ? 1 : 0,
          .has_topk = plan.has_topk ? 1 : 0,
          .has_weights = in.weights ? 1 : 0,
          .expand = in.expand ? 1 : 0,
          .alignment = in.alignment,
          .num_experts = b.config.num_experts,
          .cached = in.cached ? 1 : 0,
          .tmax = 0,
          .logfmt = 0};
}

void check_args(const BufferImpl& b, const DispatchArgs& a, Inputs& in) {
  in.cached = a.handle.has_value();
  if (in.cached) {
    const DispatchHandle& h = *a.handle;
    DSK_CHECK_ARG(h.plan && h.plan->buffer == &b, kFn, "handle",
                  "a handle returned by a dispatch on this buffer", "another buffer's handle");
    DSK_CHECK_ARG(!a.topk_idx && !a.is_token_in_rank && !a.num_tokens_per_rank, kFn, "handle",
                  "no topk_idx / is_token_in_rank / num_tokens_per_rank with a handle",
                  "both a handle and a new routing");
    DSK_CHECK_ARG(h.plan->num_tokens == in.T, kFn, "x.size(0)",
                  "the handle's token count " + std::to_string(h.plan->num_tokens), in.T);
    DSK_CHECK_ARG(a.do_expand == h.do_expand, kFn, "do_expand",
                  "the handle's mode (" + std::to_string(h.do_expand) + ")", a.do_expand);
    in.alignment = a.expert_alignment.value_or(h.expert_alignment);
    DSK_CHECK_ARG(in.alignment == h.expert_alignment, kFn, "expert_alignment",
                  "the handle's alignment " + std::to_string(h.expert_alignment), in.alignment);
  } else {
    in.alignment = a.expert_alignment.value_or(
        a.do_expand ? gemm::get_mk_alignment_for_contiguous_layout() : 1);
    check::in_range(kFn, "expert_alignment", in.alignment, 1, 1 << 20);
  }
  in.expand = a.do_expand;
  in.zero_padding = a.do_zero_padding;
  in.num_worst = a.num_worst_tokens;
  check::in_range(kFn, "num_worst_tokens", in.num_worst, 0, int64_t{1} << 31);
}

void check_weights(const DispatchArgs& a, const Plan& plan, Inputs& in) {
  DSK_CHECK_ARG(!in.expand || plan.has_topk, kFn, "topk_idx",
                "top-k ids for an expand-mode dispatch", "none");
  if (!a.topk_weights) return;
  DSK_CHECK_ARG(plan.has_topk, kFn, "topk_weights", "topk_idx with them", "weights without ids");
  check::dtype(kFn, "topk_weights", *a.topk_weights, DType::f32);
  check::shape(kFn, "topk_weights", *a.topk_weights, {in.T, in.K});
  check::contiguous(kFn, "topk_weights", *a.topk_weights);
  in.weights = a.topk_weights->data<float>();
}

}  // namespace

DispatchResult run_dispatch(BufferImpl& b, const Tensor& x, const Tensor* x_sf,
                            const DispatchArgs& a) {
  b.check_usable(kFn);
  if (a.previous_event) a.previous_event->wait();
  Inputs in;
  check_x(x, x_sf, b, in);
  check_args(b, a, in);
  std::shared_ptr<Plan> plan = make_plan(b, a, in);
  check_weights(a, *plan, in);
  const std::vector<int32_t> counts = expert_counts(b, a, *plan);

  const int R = b.num_ranks, El = b.num_local_experts, K = in.K;
  auto op = std::make_shared<DispatchOp>();
  op->in = in;
  op->plan = plan;
  op->keep = {x, x_sf ? *x_sf : Tensor(), a.topk_weights.value_or(Tensor())};
  Receiver& recv = op->recv;
  recv.b = &b;
  recv.in = &op->in;
  recv.plan = plan.get();
  recv.rec = record_layout(in.x_row, in.sf_row, K, plan->has_topk, in.weights != nullptr);

  ExchangeSpec& spec = op->spec;
  spec.header_bytes = header_bytes(R, El);
  spec.send_headers.assign(spec.header_bytes * R, std::byte{0});
  spec.recv_headers.assign(spec.header_bytes * R, std::byte{0});
  spec.record_bytes = recv.rec.bytes;
  spec.send_records.assign(R, 0);
  spec.recv_records.assign(R, 0);
  const Signature sig = make_signature(b, in, *plan);
  for (int d = 0; d < R; ++d) {
    const HeaderView h{spec.send_headers.data() + spec.header_bytes * d, R};
    h.sig() = sig;
    h.tail() = {in.T, static_cast<int64_t>(plan->send_list[d].size())};
    for (int j = 0; j < R; ++j) h.row_counts()[j] = static_cast<int32_t>(plan->send_list[j].size());
    for (int e = 0; e < El; ++e) h.expert_counts()[e] = counts[d * El + e];
    spec.send_records[d] = h.tail().num_records;
  }
  // The callbacks may run on the communication thread: they reach everything through `self`,
  // which the operation owns.
  DispatchOp* self = op.get();
  // rows: where the records' rows go (direct rows), or null for "in the records" (in_record)
  // or "not at all" (the channel moves them).
  // in_record: whole records (the row included) at dst; else tails (the records from rec.sf on)
  // at dst, rows to `rows` when it is not null.
  auto pack = [self](int d, int64_t first, int64_t n, std::byte* dst, std::byte* rows,
                     bool in_record) {
    const RecordLayout& rec = self->recv.rec;
    const Inputs& in = self->in;
    const Plan& plan = *self->plan;
    const size_t skip = in_record ? 0 : rec.sf;
    const int32_t* tokens = plan.send_list[d].data() + first;
    for (int64_t i = 0; i < n; ++i, dst += rec.bytes - skip) {
      const int32_t t = tokens[i];
      auto part = [&](size_t offset) { return dst + (offset - skip); };
      if (in_record) std::memcpy(dst + rec.x, in.x + t * in.x_row, rec.x_bytes);
      if (rows) std::memcpy(rows + i * rec.x_bytes, in.x + t * in.x_row, rec.x_bytes);
      if (rec.sf_bytes) std::memcpy(part(rec.sf), in.sf + t * in.sf_row, rec.sf_bytes);
      if (rec.ids_bytes) std::memcpy(part(rec.ids), plan.topk.data() + t * in.K, rec.ids_bytes);
      if (rec.weights_bytes)
        std::memcpy(part(rec.weights), in.weights + t * in.K, rec.weights_bytes);
      std::memcpy(part(rec.src), &t, 4);
    }
  };
  spec.pack = [pack](int d, int64_t first, int64_t n, std::byte* dst) {
    pack(d, first, n, dst, nullptr, true);
  };
  spec.on_headers = [self] { self->recv.on_headers(self->spec); };
  spec.unpack = [self](int s, int64_t first, int64_t n, const std::byte* src) {
    self->recv.unpack(s, first, n, src, false);
  };
  recv.unpacked.assign(R, 0);
  spec.direct_row_bytes = recv.rec.x_bytes;
  spec.direct_src = [self](int d, int64_t i) {
    return self->in.x + self->plan->send_list[d][i] * self->in.x_row;
  };
  spec.pack_direct = [pack](int d, int64_t first, int64_t n, std::byte* dst, std::byte* rows) {
    pack(d, first, n, dst, rows, false);
  };
  if (in.expand) {
    // A row goes to one output row per local expert it selects, so it has no single place for
    // the peers to write it: the channels that hand rows over where they arrive (hold_rows)
    // let the receiver copy them from there to their expert rows, without a record around them.
    spec.hold_rows = [self](int s, int64_t first, int64_t n, const std::byte* src,
                            const std::byte* rows) {
      self->recv.unpack(s, first, n, src, true, rows);
    };
    spec.released = [self](int s) { return self->recv.unpacked[s]; };
  } else {
    spec.direct_dest = [self](int s) { return self->recv.direct_dest(s); };
    spec.unpack_direct = [self](int s, int64_t first, int64_t n, const std::byte* src) {
      self->recv.unpack(s, first, n, src, true);
    };
  }
  b.execute(op, a.async_finish, kFn);

  DispatchResult out;
  out.recv_x = recv.recv_x;
  if (in.fp8) out.recv_x_sf = recv.recv_sf;
  if (recv.recv_idx.defined() && !in.cached) out.recv_topk_idx = recv.recv_idx;
  if (recv.recv_w.defined()) out.recv_topk_weights = recv.recv_w;
  std::vector<int> list(El);
  for (int e = 0; e < El; ++e)
    list[e] = static_cast<int>(align_to(recv.expert_count[e], in.alignment));
  if (in.num_worst == 0) out.num_recv_tokens_per_expert_list = list;

  DispatchHandle& h = out.handle;
  h.rank_prefix_matrix = Tensor::empty({R, R}, DType::i32);
  std::copy(recv.prefix.begin(), recv.prefix.end(), h.rank_prefix_matrix.data<int32_t>());
  h.recv_src_idx = recv.recv_src_idx;
  h.is_token_in_rank = Tensor::zeros({in.T, R}, DType::boolean);
  bool* in_rank = h.is_token_in_rank.data<bool>();
  for (int r = 0; r < R; ++r)
    for (int32_t t : plan->send_list[r]) in_rank[t * R + r] = true;
  if (in.cached) {
    h.topk_idx = a.handle->topk_idx;
  } else if (a.topk_idx) {
    h.topk_idx = a.topk_idx->clone();
  }
  h.recv_src_metadata = recv.meta;
  h.psum_num_recv_tokens_per_expert = Tensor::empty({El}, DType::i32);
  for (int e = 0; e < El; ++e)
    h.psum_num_recv_tokens_per_expert.data<int32_t>()[e] = static_cast<int32_t>(recv.psum[e]);
  h.num_recv_tokens_per_expert_list = list;
  h.do_expand = in.expand;
  h.num_experts = b.config.num_experts;
  h.expert_alignment = in.alignment;
  h.num_max_tokens_per_rank = recv.tmax;
  h.num_recv_tokens = recv.num_recv;
  h.num_recv_rows = recv.rows;
  h.plan = plan;
  out.event = EventOverlap(op->event);
  return out;
}

}  // namespace detail

DispatchResult Buffer::dispatch(const Tensor& x, const DispatchArgs& args) {
  return detail::run_dispatch(*impl_, x, nullptr, args);
}

DispatchResult Buffer::dispatch(const gemm::Fp8Tensor& x, const DispatchArgs& args) {
  return detail::run_dispatch(*impl_, x.data, &x.sf, args);
}

}  // namespace dsk::ep
