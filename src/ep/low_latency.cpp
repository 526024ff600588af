// dsk::ep::Buffer low-latency mode (upstream V1 low_latency_dispatch / low_latency_combine): no
// sizing round, outputs in the masked layout [E_local, R*Tmax, H], one message per (token,
// selected expert), results in the buffer's two low-latency blocks, an optional receive hook.
//
// Dispatch record of one (token, destination rank) pair, so a token that selects several of a
// rank's experts travels once: [x row (bf16, or e4m3)][scales (f32 per 128, or UE8M0 bytes)]
// [int32 source token][int32 local expert of each selecting slot, then -1s], padded to 16. The
// receiver writes the row once per listed expert.
// Combine record: [bf16 row] of one (token, expert) pair, or with use_logfmt its LogFMT-10
// message (ep/logfmt.hpp), sent back in the owner's token order, each token's slots in top-k
// order (the dispatch's receive notes that order). The owner sums a token in top-k order as soon
// as its records from every rank arrived, reading them where the channel holds them (or, on
// channels that cannot hold them, from a staged copy), so results do not depend on arrival
// order. With zero_copy the rows come from one of two buffer-owned tensors that
// get_next_low_latency_combine_buffer hands out, not from x: every transport streams records
// through fixed per-peer slots in the owner's order, so the masked layout cannot be the
// transport's own memory, and packing from the buffer-owned tensor is the one copy x's path makes.
#include <algorithm>
#include <cstring>

#include <dsk/core/check.hpp>
#include <dsk/core/dtype.hpp>
#include <dsk/core/error.hpp>
#include <dsk/tk.hpp>

#include "ep/internal.hpp"
#include "ep/logfmt.hpp"
#include "ep/reduce.hpp"
#include "ep/routing.hpp"

namespace dsk::ep {
namespace detail {
namespace {

constexpr const char* kDispatch = "ep::Buffer::low_latency_dispatch";
constexpr const char* kCombine = "ep::Buffer::low_latency_combine";

// Header of the exchange: the signature, this sender's T and record count to the receiver, then
// (as in normal mode) rows to every rank and the (token, expert) pairs per receiver's expert.
void fill_headers(ExchangeSpec& spec, const Signature& sig, int R, int64_t T,
                  const std::vector<int64_t>& records, const std::vector<int32_t>* expert_pairs,
                  int El) {
  for (int d = 0; d < R; ++d) {
    const HeaderView h{spec.send_headers.data() + spec.header_bytes * d, R};
    h.sig() = sig;
    h.tail() = {T, records[d]};
    for (int j = 0; j < R; ++j) h.row_counts()[j] = static_cast<int32_t>(records[j]);
    for (int e = 0; e < El && expert_pairs; ++e) h.expert_counts()[e] = (*expert_pairs)[d * El + e];
  }
  spec.send_records = records;
}

// Shrink mode: the ranks masked now, as ExchangeSpec::masked (empty when none, or when the buffer
// is not in shrink mode).
std::vector<char> masked_ranks(const BufferImpl& b) {
  if (!b.config.enable_shrink) return {};
  const std::vector<int> masks = b.masks();
  std::vector<char> out(masks.size(), 0);
  bool any = false;
  for (size_t r = 0; r < masks.size(); ++r) any |= (out[r] = masks[r] != 0 ? 1 : 0) != 0;
  return any ? out : std::vector<char>{};
}

// Marks rank p in a left-out list of R ranks (allocated on first use).
void mark_left_out(std::vector<char>& left_out, int R, int p) {
  if (left_out.empty()) left_out.assign(static_cast<size_t>(R), 0);
  left_out[p] = 1;
}

void init_spec(ExchangeSpec& spec, int R, int El, size_t record_bytes) {
  spec.header_bytes = header_bytes(R, El);
  spec.send_headers.assign(spec.header_bytes * R, std::byte{0});
  spec.recv_headers.assign(spec.header_bytes * R, std::byte{0});
  spec.record_bytes = record_bytes;
  spec.recv_records.assign(R, 0);
}

// ---- Dispatch ----
struct DispatchFormat {
  bool fp8 = false, round_scale = false, ue8m0 = false;
  int64_t H = 0;
  size_t x_bytes = 0, sf_bytes = 0, token = 0, experts = 0, bytes = 0;
};

DispatchFormat dispatch_format(int64_t H, int K, const LowLatencyDispatchArgs& a) {
  DispatchFormat f;
  f.fp8 = a.use_fp8;
  f.round_scale = a.round_scale;
  f.ue8m0 = a.use_ue8m0;
  f.H = H;
  f.x_bytes = static_cast<size_t>(H) * (f.fp8 ? 1 : 2);
  f.sf_bytes = !f.fp8 ? 0 : static_cast<size_t>(H / 128) * (f.ue8m0 ? 1 : 4);
  f.token = f.x_bytes + f.sf_bytes;
  f.experts = f.token + 4;
  f.bytes = align_up(f.experts + 4 * static_cast<size_t>(K), 16);
  return f;
}

struct LowLatencyDispatchOp final : Operation {
  DispatchFormat fmt;
  std::shared_ptr<LowLatencyPlan> plan;
  int64_t RT = 0;  // R * Tmax rows per expert
  // Sender: the rows (BF16, or quantised once for every destination) and the tokens per
  // destination with their local experts there.
  const std::byte* x = nullptr;
  std::vector<std::byte> scale_bytes;  // UE8M0: one exponent byte per 128 channels [T][H/128]
  const std::byte* sf = nullptr;
  std::vector<std::vector<int32_t>> send_list;
  std::vector<Tensor> keep;
  // Receiver.
  std::byte* recv_x = nullptr;
  std::byte* recv_sf = nullptr;
  int32_t* src_info = nullptr;
  int64_t* layout_range = nullptr;
  int32_t* recv_count = nullptr;
  std::vector<int64_t> cursor;  // [El*R] next row per (expert, source)
  std::optional<Tensor> stats;
  bool partial_sources = false;  // shrink mode dropped a source whose records may be in part here

  void drop_partial_sources();

  void pack(int d, int64_t first, int64_t n, std::byte* dst) const;
  void on_headers();
  void unpack(int s, int64_t first, int64_t n, const std::byte* src);
  void finish() override {
    wait_stats.add_to_tensor();
    if (partial_sources) drop_partial_sources();
    if (!stats) return;
    for (int e = 0; e < plan->num_local_experts; ++e) stats->data<int32_t>()[e] += recv_count[e];
  }
};

void LowLatencyDispatchOp::pack(int d, int64_t first, int64_t n, std::byte* dst) const {
  const int K = plan->num_topk, El = plan->num_local_experts;
  const int32_t lo = d * El;
  for (int64_t i = 0; i < n; ++i, dst += fmt.bytes) {
    const int32_t t = send_list[d][first + i];
    std::memcpy(dst, x + static_cast<size_t>(t) * fmt.x_bytes, fmt.x_bytes);
    if (fmt.sf_bytes) std::memcpy(dst + fmt.x_bytes, sf + t * fmt.sf_bytes, fmt.sf_bytes);
    std::memcpy(dst + fmt.token, &t, 4);
    auto* experts = reinterpret_cast<int32_t*>(dst + fmt.experts);
    int n_local = 0;
    for (int k = 0; k < K; ++k) {
      const int32_t g = plan->topk[t * K + k];
      if (g >= lo && g < lo + El) experts[n_local++] = g - lo;
    }
    for (int k = n_local; k < K; ++k) experts[k] = -1;
  }
}

void LowLatencyDispatchOp::on_headers() {
  const int R = plan->num_ranks, El = plan->num_local_experts;
  check_signatures(spec, R, plan->rank, kDispatch);
  plan->rows.assign(static_cast<size_t>(El * R), 0);
  plan->begin.assign(static_cast<size_t>(El * R), 0);
  for (int s = 0; s < R; ++s) {
    if (spec.is_masked(s)) continue;  // shrink mode: nothing from it
    const HeaderView h{spec.recv_headers.data() + spec.header_bytes * s, R};
    spec.recv_records[s] = h.tail().num_records;
    for (int e = 0; e < El; ++e) plan->rows[e * R + s] = h.expert_counts()[e];
  }
  for (int e = 0; e < El; ++e) {
    int64_t next = 0;
    for (int s = 0; s < R; ++s) {
      plan->begin[e * R + s] = next;
      layout_range[e * R + s] = (next << 32) | plan->rows[e * R + s];
      next += plan->rows[e * R + s];
    }
    // At most Tmax tokens per source, each selecting an expert at most K times; a header that
    // claims more would write past the expert's rows.
    DSK_CHECK(next <= RT, kDispatch,
              "internal: " + std::to_string(next) + " rows for local expert " + std::to_string(e));
    recv_count[e] = static_cast<int32_t>(next);
    std::fill(src_info + e * RT + next, src_info + (e + 1) * RT, -1);
  }
  cursor = plan->begin;
  plan->back_rows.assign(R, {});
  for (int s = 0; s < R; ++s) {
    int64_t rows_from_s = 0;
    for (int e = 0; e < El; ++e) rows_from_s += plan->rows[e * R + s];
    plan->back_rows[s].reserve(static_cast<size_t>(rows_from_s));
  }
}

void LowLatencyDispatchOp::unpack(int s, int64_t first, int64_t n, const std::byte* src) {
  (void)first;  // records arrive in order: the cursors know where each goes
  const int K = plan->num_topk, R = plan->num_ranks;
  for (int64_t i = 0; i < n; ++i, src += fmt.bytes) {
    int32_t token = 0;
    std::memcpy(&token, src + fmt.token, 4);
    const auto* experts = reinterpret_cast<const int32_t*>(src + fmt.experts);
    for (int k = 0; k < K && experts[k] >= 0; ++k) {
      const int e = experts[k];
      const int64_t row = cursor[e * R + s]++;
      const int64_t flat = e * RT + row;
      plan->back_rows[s].push_back(flat);  // records come in token order, experts in slot order
      std::memcpy(recv_x + flat * fmt.x_bytes, src, fmt.x_bytes);
      if (fmt.sf_bytes) std::memcpy(recv_sf + flat * fmt.sf_bytes, src + fmt.x_bytes, fmt.sf_bytes);
      src_info[flat] = token;
    }
  }
}

// Shrink mode left out sources after their headers arrived, so their records may have come in
// part: their rows are removed, each expert's later rows move down so that its rows stay
// contiguous from row 0, and the counts, layout ranges, source info and the combine's row lists
// follow, as if those sources had been masked from the start.
void LowLatencyDispatchOp::drop_partial_sources() {
  const int R = plan->num_ranks, El = plan->num_local_experts;
  std::vector<int64_t> shift(static_cast<size_t>(El * R), 0);
  for (int e = 0; e < El; ++e) {
    int64_t removed = 0;
    for (int s = 0; s < R; ++s) {
      const int64_t i = e * R + s;
      const int64_t from = e * RT + plan->begin[i], n = plan->rows[i];
      plan->begin[i] -= removed;
      shift[i] = removed;
      if (plan->is_left_out(s)) {
        removed += n;
        plan->rows[i] = 0;
      } else if (removed > 0) {
        const int64_t to = from - removed;
        std::memmove(recv_x + to * fmt.x_bytes, recv_x + from * fmt.x_bytes, n * fmt.x_bytes);
        if (fmt.sf_bytes)
          std::memmove(recv_sf + to * fmt.sf_bytes, recv_sf + from * fmt.sf_bytes,
                       n * fmt.sf_bytes);
        std::memmove(src_info + to, src_info + from, n * sizeof(int32_t));
      }
      layout_range[i] = (plan->begin[i] << 32) | plan->rows[i];
    }
    recv_count[e] -= static_cast<int32_t>(removed);
    std::fill(src_info + e * RT + recv_count[e], src_info + (e + 1) * RT, -1);
  }
  for (int s = 0; s < R; ++s) {
    if (plan->is_left_out(s)) {
      plan->back_rows[s].clear();
      continue;
    }
    for (int64_t& flat : plan->back_rows[s]) flat -= shift[(flat / RT) * R + s];
  }
}

// A wait-statistics tensor: i64 [R], contiguous.
void check_wait_stats(const BufferImpl& b, const char* fn, const char* name,
                      const std::optional<Tensor>& stats) {
  if (!stats) return;
  check::dtype(fn, name, *stats, DType::i64);
  check::shape(fn, name, *stats, {b.num_ranks});
  check::contiguous(fn, name, *stats);
}

void check_dispatch(const BufferImpl& b, const Tensor& x, const Tensor& topk_idx, int64_t tmax,
                    int num_experts, const LowLatencyDispatchArgs& a) {
  check::dim(kDispatch, "x", x, 2);
  check::dtype(kDispatch, "x", x, DType::bf16);
  check::contiguous(kDispatch, "x", x);
  const int64_t T = x.size(0), H = x.size(1);
  DSK_CHECK_ARG(H > 0 && H % 8 == 0, kDispatch, "x",
                "a hidden size that is a positive multiple of 8", x.describe());
  if (b.config.hidden > 0)
    DSK_CHECK_ARG(H == b.config.hidden, kDispatch, "x.size(1)",
                  "the buffer's hidden size " + std::to_string(b.config.hidden), H);
  DSK_CHECK_ARG(num_experts == b.config.num_experts, kDispatch, "num_experts",
                "the buffer's " + std::to_string(b.config.num_experts), num_experts);
  check::in_range(kDispatch, "num_max_dispatch_tokens_per_rank", tmax, 1, int64_t{1} << 24);
  DSK_CHECK_ARG(T <= tmax, kDispatch, "x.size(0)",
                "at most num_max_dispatch_tokens_per_rank = " + std::to_string(tmax), T);
  DSK_CHECK_ARG(topk_idx.dim() == 2 && topk_idx.size(0) == T, kDispatch, "topk_idx",
                "[T = " + std::to_string(T) + ", K]", topk_idx.describe());
  DSK_CHECK_ARG(!a.use_fp8 || H % 128 == 0, kDispatch, "x",
                "a hidden size that is a multiple of 128 with use_fp8", H);
  DSK_CHECK_ARG(
      !a.use_ue8m0 || (a.use_fp8 && a.round_scale), kDispatch, "use_ue8m0",
      "use_fp8 and round_scale with it",
      "use_fp8=" + std::to_string(a.use_fp8) + " round_scale=" + std::to_string(a.round_scale));
  DSK_CHECK_ARG(!a.use_ue8m0 || H % 512 == 0, kDispatch, "x",
                "a hidden size that is a multiple of 512 with use_ue8m0 (4 scales per int32)", H);
  DSK_CHECK_ARG(!(a.async_finish && a.return_recv_hook), kDispatch, "async_finish",
                "false with return_recv_hook (the hook receives)", "both true");
  check_wait_stats(b, kDispatch, "dispatch_wait_recv_cost_stats", a.dispatch_wait_recv_cost_stats);
  if (a.cumulative_local_expert_recv_stats) {
    check::dtype(kDispatch, "cumulative_local_expert_recv_stats",
                 *a.cumulative_local_expert_recv_stats, DType::i32);
    check::shape(kDispatch, "cumulative_local_expert_recv_stats",
                 *a.cumulative_local_expert_recv_stats, {b.num_local_experts});
    check::contiguous(kDispatch, "cumulative_local_expert_recv_stats",
                      *a.cumulative_local_expert_recv_stats);
  }
}

// The sender's rows: BF16 as given, or cast to FP8 once (tk's per-token cast: the quantisation
// rules every dsk module shares).
void prepare_rows(LowLatencyDispatchOp& op, const Tensor& x) {
  if (!op.fmt.fp8) {
    op.x = static_cast<const std::byte*>(x.data_ptr());
    op.keep.push_back(x);
    return;
  }
  const tk::QuantTensor q = tk::per_token_cast(x, "e4m3", 128, false, op.fmt.round_scale, false);
  op.keep.push_back(q.data);
  op.keep.push_back(q.sf);
  op.x = static_cast<const std::byte*>(q.data.data_ptr());
  op.sf = static_cast<const std::byte*>(q.sf.data_ptr());
  if (!op.fmt.ue8m0) return;
  // Rounded scales are powers of two: the exponent byte is the whole value (UE8M0), packed four
  // to an int32 in gemm::pack_ue8m0_to_int's byte order.
  const float* sf = q.sf.data<float>();
  op.scale_bytes.resize(static_cast<size_t>(q.sf.numel()));
  for (size_t i = 0; i < op.scale_bytes.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, sf + i, 4);
    op.scale_bytes[i] = static_cast<std::byte>(bits >> 23);
  }
  op.sf = op.scale_bytes.data();
}

template <class Result>
void attach_completion(BufferImpl& b, const std::shared_ptr<Operation>& op, bool hook, bool async,
                       const char* fn, Result& out) {
  if (hook) {
    b.defer(op, fn);
    BufferImpl* impl = &b;
    out.hook = [impl, op, fn] {
      if (impl->is_deferred(op.get())) impl->complete_deferred(fn);
      EventOverlap(op->event).wait();  // raises what the receive raised, wherever it ran
    };
    return;
  }
  b.execute(op, async, fn);
  if (async) out.event = EventOverlap(op->event);
}

}  // namespace

LowLatencyDispatchResult run_low_latency_dispatch(BufferImpl& b, const Tensor& x,
                                                  const Tensor& topk_idx, int64_t tmax,
                                                  int num_experts,
                                                  const LowLatencyDispatchArgs& a) {
  b.check_usable(kDispatch);
  check_dispatch(b, x, topk_idx, tmax, num_experts, a);
  const int R = b.num_ranks, El = b.num_local_experts;
  const int64_t T = x.size(0), H = x.size(1);

  auto plan = std::make_shared<LowLatencyPlan>();
  plan->buffer = &b;
  plan->num_ranks = R;
  plan->rank = b.rank;
  plan->num_local_experts = El;
  plan->num_tokens = T;
  plan->tmax = tmax;
  plan->hidden = H;
  plan->topk = read_topk_idx(kDispatch, "topk_idx", topk_idx, num_experts);
  const int K = static_cast<int>(topk_idx.size(1));
  plan->num_topk = K;

  plan->left_out = masked_ranks(b);

  auto op = std::make_shared<LowLatencyDispatchOp>();
  op->sized_by_headers = false;  // every output has its worst-case shape
  op->shrink = b.config.enable_shrink;
  op->plan = plan;
  op->fmt = dispatch_format(H, K, a);
  op->RT = R * tmax;
  op->stats = a.cumulative_local_expert_recv_stats;
  prepare_rows(*op, x);

  // Tokens per destination (once per rank), (token, expert) pairs per expert, and the order the
  // experts' rows come back in combine: token, then slot, per expert rank.
  op->send_list.assign(R, {});
  plan->back_slots.assign(R, {});
  std::vector<int32_t> pairs(static_cast<size_t>(num_experts), 0);
  std::vector<int64_t> listed(R, -1);  // the last token listed for each rank
  for (int64_t t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t g = plan->topk[t * K + k];
      if (g < 0 || plan->is_left_out(g / El)) continue;  // shrink mode: not to masked ranks
      ++pairs[g];
      plan->back_slots[g / El].push_back(static_cast<int32_t>(t * K + k));
      if (listed[g / El] == t) continue;
      listed[g / El] = t;
      op->send_list[g / El].push_back(static_cast<int32_t>(t));
    }
  }

  // Outputs: recv_x and the scales in one low-latency block; the small tensors on the heap.
  const int64_t RT = op->RT;
  const size_t x_total = static_cast<size_t>(El * RT) * op->fmt.x_bytes;
  const size_t sf_offset = align_up(x_total, 64);
  const size_t sf_total = static_cast<size_t>(El * RT) * op->fmt.sf_bytes;
  const std::shared_ptr<std::byte> block = b.low_latency_block(sf_offset + sf_total, kDispatch);
  LowLatencyDispatchResult out;
  out.recv_x = Tensor::from_blob(block.get(), {El, RT, H}, op->fmt.fp8 ? DType::e4m3 : DType::bf16,
                                 {}, block);
  if (op->fmt.fp8) {
    out.recv_x_sf =
        op->fmt.ue8m0
            ? Tensor::from_blob(block.get() + sf_offset, {El, RT, H / 512}, DType::i32, {}, block)
            : Tensor::from_blob(block.get() + sf_offset, {El, RT, H / 128}, DType::f32, {}, block);
  }
  out.recv_count = Tensor::empty({El}, DType::i32);
  out.handle.src_info = Tensor::empty({El, RT}, DType::i32);
  out.handle.layout_range = Tensor::empty({El, R}, DType::i64);
  op->recv_x = block.get();
  op->recv_sf = block.get() + sf_offset;
  op->recv_count = out.recv_count.data<int32_t>();
  op->src_info = out.handle.src_info.data<int32_t>();
  op->layout_range = out.handle.layout_range.data<int64_t>();
  // The operation holds what its callbacks write, so a result dropped early stays valid memory.
  op->keep.push_back(out.recv_x);
  op->keep.push_back(out.recv_count);
  op->keep.push_back(out.handle.src_info);
  op->keep.push_back(out.handle.layout_range);

  ExchangeSpec& spec = op->spec;
  init_spec(spec, R, El, op->fmt.bytes);
  std::vector<int64_t> records(R);
  for (int d = 0; d < R; ++d) records[d] = static_cast<int64_t>(op->send_list[d].size());
  const Signature sig{.kind = 3,
                      .hidden = static_cast<int32_t>(H),
                      .num_topk = K,
                      .fp8 = (a.use_fp8 ? 1 : 0) | (a.round_scale ? 2 : 0) | (a.use_ue8m0 ? 4 : 0),
                      .has_topk = 1,
                      .has_weights = 0,
                      .expand = 0,
                      .alignment = 0,
                      .num_experts = num_experts,
                      .cached = 0,
                      .tmax = static_cast<int32_t>(tmax),
                      .logfmt = 0};
  fill_headers(spec, sig, R, T, records, &pairs, El);
  spec.masked = plan->left_out;
  LowLatencyDispatchOp* self = op.get();
  spec.on_drop = [self, R](int p, bool after_headers) {
    mark_left_out(self->plan->left_out, R, p);
    self->partial_sources |= after_headers;
  };
  spec.pack = [self](int d, int64_t first, int64_t n, std::byte* dst) {
    self->pack(d, first, n, dst);
  };
  spec.on_headers = [self] { self->on_headers(); };
  spec.unpack = [self](int s, int64_t first, int64_t n, const std::byte* src) {
    self->unpack(s, first, n, src);
  };
  op->wait_stats = RecvWaitStats(a.dispatch_wait_recv_cost_stats, R);
  op->wait_stats.track(spec);

  out.handle.num_max_dispatch_tokens_per_rank = tmax;
  out.handle.hidden = H;
  out.handle.num_experts = num_experts;
  out.handle.plan = plan;
  attach_completion(b, op, a.return_recv_hook, a.async_finish, kDispatch, out);
  return out;
}

// ---- Combine ----
namespace {

struct LowLatencyCombineOp final : Operation {
  std::shared_ptr<const LowLatencyPlan> plan;
  int64_t H = 0;
  int K = 0;
  bool logfmt = false;  // records are LogFMT-10 messages, decoded by the owner
  const uint16_t* x = nullptr;
  const float* weights = nullptr;
  kernels::WeightedSumRowsFn weighted_sum = row_sums().weighted;
  Tensor combined;
  std::vector<Tensor> keep;
  // Owner: slot t*K+k's record index in its expert rank's stream, or -1.
  std::vector<int32_t> slot_record;
  // Held records: where record i of rank r is readable, how many of r's arrived and were
  // released, and the tokens [0, next_token) already summed. Otherwise the records are staged,
  // per rank in stream order, and summed once the exchange ended.
  bool held = false;
  std::vector<std::vector<const std::byte*>> held_record;
  std::vector<int64_t> arrived, released;
  int64_t next_token = 0;
  StagedRecords staged;
  std::vector<const bf16*> rows_scratch;
  std::vector<float> weights_scratch, acc_scratch;
  // Shrink mode: expert ranks whose rows are not summed (left out by the dispatch or now);
  // empty when none.
  std::vector<char> skipped;

  void pack(int d, int64_t first, int64_t n, std::byte* dst) const;
  const std::byte* record(int r, int64_t i) const {
    return held ? held_record[r][i] : staged.record(r, i);
  }
  int rank_of(int64_t slot) const { return plan->topk[slot] / plan->num_local_experts; }
  // Whether slot's row is summed: a valid id on a rank that is not skipped.
  bool summed(int64_t slot) const {
    return plan->topk[slot] >= 0 && (skipped.empty() || !skipped[rank_of(slot)]);
  }
  void reduce_token(int64_t t);
  void reduce_complete_tokens();
  void hold(int r, int64_t first, int64_t n, const std::byte* src);
  int64_t release_upto(int r);
  std::vector<int> waiting_for() const;
  void finish() override;
};

void LowLatencyCombineOp::pack(int d, int64_t first, int64_t n, std::byte* dst) const {
  const size_t rb = spec.record_bytes;
  const std::vector<int64_t>& rows = plan->back_rows[d];
  for (int64_t i = 0; i < n; ++i, dst += rb) {
    const uint16_t* row = x + rows[first + i] * H;
    if (logfmt) {
      logfmt::encode(row, H, dst);
    } else {
      std::memcpy(dst, row, 2 * static_cast<size_t>(H));
    }
  }
}

// combined[t] = bf16(sum over slots in top-k order of w * f32(row)), from zero
// (dsk/kernels/ep/reduce.hpp); a LogFMT row adds its decoded f32 values (upstream's
// decode_and_accumulate).
void LowLatencyCombineOp::reduce_token(int64_t t) {
  int n = 0;
  for (int k = 0; k < K; ++k) {
    const int64_t slot = t * K + k;
    if (!summed(slot)) continue;
    rows_scratch[n] = reinterpret_cast<const bf16*>(record(rank_of(slot), slot_record[slot]));
    weights_scratch[n++] = weights[slot];
  }
  bf16* out = combined.data<bf16>() + t * H;
  if (!logfmt) return weighted_sum(rows_scratch.data(), weights_scratch.data(), n, H, out);
  std::fill(acc_scratch.begin(), acc_scratch.end(), 0.0f);
  for (int i = 0; i < n; ++i)
    logfmt::decode_accumulate(reinterpret_cast<const std::byte*>(rows_scratch[i]), H,
                              weights_scratch[i], acc_scratch.data());
  convert_f32_to_bf16(acc_scratch.data(), out, static_cast<size_t>(H));
}

// Records [first, first + n) of rank r are readable at src; sums every token now complete.
void LowLatencyCombineOp::hold(int r, int64_t first, int64_t n, const std::byte* src) {
  for (int64_t i = 0; i < n; ++i)
    held_record[r][first + i] = src + static_cast<size_t>(i) * spec.record_bytes;
  arrived[r] = first + n;
  reduce_complete_tokens();
}

// Sums the tokens, in order, whose summed rows have all arrived.
void LowLatencyCombineOp::reduce_complete_tokens() {
  const auto complete = [&](int64_t t) {
    for (int k = 0; k < K; ++k) {
      const int64_t slot = t * K + k;
      if (summed(slot) && slot_record[slot] >= arrived[rank_of(slot)]) return false;
    }
    return true;
  };
  while (next_token < plan->num_tokens && complete(next_token)) reduce_token(next_token++);
}

// The ranks whose record for the oldest unsummed token has not arrived. Each sends in token order,
// so such a rank holds none of this rank's ring slots for later tokens: it is the one stalled.
std::vector<int> LowLatencyCombineOp::waiting_for() const {
  std::vector<int> ranks;
  for (int k = 0; k < K && next_token < plan->num_tokens; ++k) {
    const int64_t slot = next_token * K + k;
    if (!summed(slot) || slot_record[slot] < arrived[rank_of(slot)]) continue;
    if (std::find(ranks.begin(), ranks.end(), rank_of(slot)) == ranks.end())
      ranks.push_back(rank_of(slot));
  }
  return ranks;
}

// Rank r's records that no unsummed token reads (its stream is in token order).
int64_t LowLatencyCombineOp::release_upto(int r) {
  const std::vector<int32_t>& slots = plan->back_slots[r];
  int64_t& done = released[r];
  while (done < static_cast<int64_t>(slots.size()) && slots[done] / K < next_token) ++done;
  return done;
}

void LowLatencyCombineOp::finish() {
  wait_stats.add_to_tensor();
  if (held) {
    DSK_CHECK(next_token == plan->num_tokens, kCombine, "internal: a token's rows never arrived");
    return;
  }
  for (int64_t t = 0; t < plan->num_tokens; ++t) reduce_token(t);
}

Shape combine_buffer_shape(const LowLatencyPlan& plan) {
  return {plan.num_local_experts, plan.num_ranks * plan.tmax, plan.hidden};
}

void check_combine(const BufferImpl& b, const Tensor& x, const Tensor& topk_idx,
                   const Tensor& topk_weights, const LowLatencyHandle& h,
                   const LowLatencyCombineArgs& a) {
  DSK_CHECK_ARG(h.plan && h.plan->buffer == &b, kCombine, "handle",
                "a handle returned by low_latency_dispatch on this buffer", "another handle");
  const LowLatencyPlan& plan = *h.plan;
  DSK_CHECK_ARG(!a.use_logfmt || logfmt::supports_hidden(plan.hidden), kCombine, "use_logfmt",
                "a hidden size that is a multiple of 512 (LogFMT-10 encodes 512- or 1024-channel "
                "chunks)",
                "hidden " + std::to_string(plan.hidden));
  DSK_CHECK_ARG(!(a.async_finish && a.return_recv_hook), kCombine, "async_finish",
                "false with return_recv_hook (the hook receives)", "both true");
  // With zero_copy x is not read (upstream ignores it too), but its shape is still checked.
  check::dtype(kCombine, "x", x, DType::bf16);
  check::shape(kCombine, "x", x, combine_buffer_shape(plan));
  check::contiguous(kCombine, "x", x);
  const int slot = b.next_combine_buffer;
  DSK_CHECK_ARG(!a.zero_copy || (b.combine_buffer_ready[slot] &&
                                 b.combine_buffers[slot].sizes() == combine_buffer_shape(plan)),
                kCombine, "zero_copy",
                "a preceding get_next_low_latency_combine_buffer(handle) holding the experts' "
                "outputs (one call before every zero-copy combine)",
                "none for this combine");
  const int64_t T = plan.num_tokens;
  const int K = plan.num_topk;
  check::shape(kCombine, "topk_idx", topk_idx, {T, K});
  const std::vector<int32_t> ids =
      read_topk_idx(kCombine, "topk_idx", topk_idx, b.config.num_experts);
  DSK_CHECK_ARG(ids == plan.topk, kCombine, "topk_idx", "the topk_idx of the handle's dispatch",
                "different ids");
  check::dtype(kCombine, "topk_weights", topk_weights, DType::f32);
  check::shape(kCombine, "topk_weights", topk_weights, {T, K});
  check::contiguous(kCombine, "topk_weights", topk_weights);
  check_wait_stats(b, kCombine, "combine_wait_recv_cost_stats", a.combine_wait_recv_cost_stats);
  if (a.out) {
    check::dtype(kCombine, "out", *a.out, DType::bf16);
    check::shape(kCombine, "out", *a.out, {T, plan.hidden});
    check::contiguous(kCombine, "out", *a.out);
  }
}

// The rows the combine sends: x, or with zero_copy the buffer get_next_low_latency_combine_buffer
// handed out, whose turn then passes to the other one.
Tensor combine_source(BufferImpl& b, const Tensor& x, bool zero_copy) {
  if (!zero_copy) return x;
  const int slot = b.next_combine_buffer;
  b.combine_buffer_ready[slot] = false;
  b.next_combine_buffer = 1 - slot;
  return b.combine_buffers[slot];
}

}  // namespace

Tensor next_low_latency_combine_buffer(BufferImpl& b, const LowLatencyHandle& h) {
  const char* fn = "ep::Buffer::get_next_low_latency_combine_buffer";
  DSK_CHECK(!b.destroyed, fn, "the buffer was destroyed");
  DSK_CHECK_ARG(h.plan && h.plan->buffer == &b, fn, "handle",
                "a handle returned by low_latency_dispatch on this buffer", "another handle");
  const Shape shape = combine_buffer_shape(*h.plan);
  const int slot = b.next_combine_buffer;
  Tensor& buffer = b.combine_buffers[slot];
  if (!buffer.defined() || buffer.sizes() != shape) buffer = Tensor::empty(shape, DType::bf16);
  b.combine_buffer_ready[slot] = true;
  return buffer;
}

LowLatencyCombineResult run_low_latency_combine(BufferImpl& b, const Tensor& x,
                                                const Tensor& topk_idx, const Tensor& topk_weights,
                                                const LowLatencyHandle& h,
                                                const LowLatencyCombineArgs& a) {
  b.check_usable(kCombine);
  check_combine(b, x, topk_idx, topk_weights, h, a);
  const LowLatencyPlan& plan = *h.plan;
  const int R = b.num_ranks, El = b.num_local_experts, K = plan.num_topk;
  const int64_t T = plan.num_tokens, H = plan.hidden;

  auto op = std::make_shared<LowLatencyCombineOp>();
  op->sized_by_headers = false;
  op->shrink = b.config.enable_shrink;
  op->plan = h.plan;
  // Shrink mode: ranks the dispatch left out got no rows to send back; ranks masked since then
  // are not waited for either.
  op->skipped = masked_ranks(b);
  for (int r = 0; r < R && !plan.left_out.empty(); ++r)
    if (plan.left_out[r]) mark_left_out(op->skipped, R, r);
  op->H = H;
  op->K = K;
  op->logfmt = a.use_logfmt;
  const size_t row_bytes = a.use_logfmt ? logfmt::max_message_bytes(H) : 2 * static_cast<size_t>(H);
  const Tensor source = combine_source(b, x, a.zero_copy);
  op->x = reinterpret_cast<const uint16_t*>(source.data_ptr());
  op->weights = topk_weights.data<float>();
  op->keep = {source, topk_weights};
  std::vector<int64_t> records(R, 0);
  for (int s = 0; s < R; ++s)
    if (op->skipped.empty() || !op->skipped[s])
      records[s] = static_cast<int64_t>(plan.back_rows[s].size());
  // Each slot's place in its expert rank's stream, and the most records a token reads from one
  // rank (what holding the records needs).
  op->slot_record.assign(static_cast<size_t>(T * K), -1);
  int64_t most_per_token = 0;
  for (int r = 0; r < R; ++r) {
    const std::vector<int32_t>& slots = plan.back_slots[r];
    for (size_t i = 0, run = 0; i < slots.size(); ++i) {
      op->slot_record[slots[i]] = static_cast<int32_t>(i);
      run = i > 0 && slots[i] / K == slots[i - 1] / K ? run + 1 : 1;
      most_per_token = std::max(most_per_token, static_cast<int64_t>(run));
    }
  }
  op->rows_scratch.resize(static_cast<size_t>(K));
  op->weights_scratch.resize(static_cast<size_t>(K));
  if (a.use_logfmt) op->acc_scratch.resize(static_cast<size_t>(H));
  LowLatencyCombineResult out;
  if (a.out) {
    op->combined = *a.out;
  } else {
    const std::shared_ptr<std::byte> block =
        b.low_latency_block(static_cast<size_t>(T * H) * 2, kCombine);
    op->combined = Tensor::from_blob(block.get(), {T, H}, DType::bf16, {}, block);
  }
  out.combined_x = op->combined;

  ExchangeSpec& spec = op->spec;
  init_spec(spec, R, El, align_up(row_bytes, 16));
  op->held = b.channel->holds_records() &&
             b.channel->max_held_records(spec.record_bytes) >= most_per_token;
  if (op->held) {
    op->held_record.resize(R);
    for (int r = 0; r < R; ++r) op->held_record[r].resize(plan.back_slots[r].size());
    op->arrived.assign(R, 0);
    op->released.assign(R, 0);
  } else {
    std::vector<int64_t> counts(R);
    for (int r = 0; r < R; ++r) counts[r] = static_cast<int64_t>(plan.back_slots[r].size());
    op->staged = StagedRecords(counts, spec.record_bytes,
                               [&](int64_t bytes) { return b.pooled({bytes}, DType::u8); });
  }
  const Signature sig{.kind = 4,
                      .hidden = static_cast<int32_t>(H),
                      .num_topk = K,
                      .fp8 = 0,
                      .has_topk = 1,
                      .has_weights = 1,
                      .expand = 0,
                      .alignment = 0,
                      .num_experts = b.config.num_experts,
                      .cached = 0,
                      .tmax = static_cast<int32_t>(plan.tmax),
                      .logfmt = a.use_logfmt ? 1 : 0};
  fill_headers(spec, sig, R, T, records, nullptr, El);
  spec.masked = op->skipped;
  LowLatencyCombineOp* self = op.get();
  spec.pack = [self](int d, int64_t first, int64_t n, std::byte* dst) {
    self->pack(d, first, n, dst);
  };
  spec.on_drop = [self, R](int p, bool /*after_headers*/) {
    mark_left_out(self->skipped, R, p);
    if (self->held) self->reduce_complete_tokens();  // tokens that waited only for p
  };
  spec.on_headers = [self, R] {
    ExchangeSpec& sp = self->spec;
    check_signatures(sp, R, self->plan->rank, kCombine);
    for (int r = 0; r < R; ++r) {
      if (sp.is_masked(r)) continue;  // shrink mode: nothing from it
      const HeaderView hv{sp.recv_headers.data() + sp.header_bytes * r, R};
      const auto expected = static_cast<int64_t>(self->plan->back_slots[r].size());
      DSK_CHECK(hv.tail().num_records == expected, kCombine,
                "rank " + std::to_string(r) + " sends " + std::to_string(hv.tail().num_records) +
                    " rows back but was sent " + std::to_string(expected) +
                    " (a handle from another dispatch?)");
      sp.recv_records[r] = expected;
    }
  };
  if (op->held) {
    spec.hold = [self](int r, int64_t first, int64_t n, const std::byte* src) {
      self->hold(r, first, n, src);
    };
    spec.released = [self](int r) { return self->release_upto(r); };
    spec.waiting_for = [self] { return self->waiting_for(); };
    // A BF16 record is the row as it is (2H is a multiple of 16): this rank's own are summed
    // where they are.
    if (!a.use_logfmt && spec.record_bytes == 2 * static_cast<size_t>(H)) {
      spec.own_record = [self, me = b.rank](int64_t i) {
        return reinterpret_cast<const std::byte*>(self->x + self->plan->back_rows[me][i] * self->H);
      };
    }
  } else {
    spec.unpack = [self](int r, int64_t first, int64_t n, const std::byte* src) {
      self->staged.unpack(r, first, n, src);
    };
  }
  op->wait_stats = RecvWaitStats(a.combine_wait_recv_cost_stats, R);
  op->wait_stats.track(spec);
  attach_completion(b, op, a.return_recv_hook, a.async_finish, kCombine, out);
  return out;
}

}  // namespace detail
}  // namespace dsk::ep
