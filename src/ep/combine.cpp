// dsk::ep::Buffer::combine: the inverse of a dispatch, summing each token's partial results in
// upstream's order (refs.py): a rank's slots of one token in top-k order (expand mode) give its
// BF16 partial; the token's owner starts from f32(bias0) + f32(bias1) and adds the partials in the
// order of each rank's last top-k slot (ascending rank when the dispatch had no top-k ids), then
// rounds to BF16.
//
// Single reduction (expand mode with BufferConfig::allow_multiple_reduction = false): the expert
// rank sends every slot's row as it is, and the owner adds them all in top-k slot order onto the
// bias sum with one rounding at the end, so the result does not depend on where experts live.
//
// Records, one fixed size per operation, padded to 16:
//   partials      one per (received row, owner): [bf16 partial row][f32 weights x K]
//   single        one per (received row, local slot), the slots of a row in top-k order:
//                 [bf16 slot row][f32 weight of that slot]. The owner knows from its routing which
//                 of its slots live on the sender, so the records need no slot index; a record is
//                 never larger than a dispatch record, so whatever slot size carries a dispatch
//                 carries it, and the (up to min(K, E_local) times) more records stream through
//                 the slots in more rounds.
#include <algorithm>
#include <cstring>

#include <dsk/core/check.hpp>
#include <dsk/core/dtype.hpp>
#include <dsk/core/error.hpp>

#include "ep/internal.hpp"
#include "ep/reduce.hpp"
#include "ep/routing.hpp"

namespace dsk::ep {
namespace detail {
namespace {

constexpr const char* kFn = "ep::Buffer::combine";

struct Checked {
  int64_t H = 0, T = 0;
  int K = 0;
  const uint16_t* x = nullptr;
  const float* weights = nullptr;
  std::vector<const uint16_t*> bias;
};

Checked check_inputs(const BufferImpl& b, const Tensor& x, const DispatchHandle& h,
                     const CombineArgs& a) {
  Checked c;
  DSK_CHECK_ARG(h.plan && h.plan->buffer == &b, kFn, "handle",
                "a handle returned by a dispatch on this buffer", "another buffer's handle");
  const Plan& plan = *h.plan;
  check::dim(kFn, "x", x, 2);
  check::dtype(kFn, "x", x, DType::bf16);
  check::contiguous(kFn, "x", x);
  DSK_CHECK_ARG(x.size(0) == h.num_recv_rows, kFn, "x.size(0)",
                "the rows the dispatch returned (" + std::to_string(h.num_recv_rows) + ")",
                x.size(0));
  c.H = x.size(1);
  c.T = plan.num_tokens;
  c.K = plan.num_topk;
  DSK_CHECK_ARG(c.H > 0, kFn, "x", "a positive hidden size", x.describe());
  c.x = reinterpret_cast<const uint16_t*>(x.data_ptr());
  DSK_CHECK_ARG(a.bias.size() <= 2, kFn, "bias", "0, 1 or 2 tensors", a.bias.size());
  for (const Tensor& t : a.bias) {
    check::dtype(kFn, "bias", t, DType::bf16);
    check::shape(kFn, "bias", t, {c.T, c.H});
    check::contiguous(kFn, "bias", t);
    c.bias.push_back(reinterpret_cast<const uint16_t*>(t.data_ptr()));
  }
  if (a.topk_weights) {
    DSK_CHECK_ARG(plan.has_topk, kFn, "topk_weights", "a handle of a dispatch with topk_idx",
                  "a dispatch without top-k ids");
    check::dtype(kFn, "topk_weights", *a.topk_weights, DType::f32);
    if (plan.expand) {
      check::shape(kFn, "topk_weights", *a.topk_weights, {h.num_recv_rows});
    } else {
      check::shape(kFn, "topk_weights", *a.topk_weights, {h.num_recv_rows, c.K});
    }
    check::contiguous(kFn, "topk_weights", *a.topk_weights);
    c.weights = a.topk_weights->data<float>();
  }
  return c;
}

// The ranks holding token t, in the order their partials are added.
int reduction_order(const Plan& plan, int64_t t, int* ranks) {
  const int R = plan.num_ranks, K = plan.num_topk, El = plan.num_local_experts;
  int n = 0;
  if (!plan.has_topk) {
    for (int r = 0; r < R; ++r)
      if (plan.send_pos[t * R + r] >= 0) ranks[n++] = r;
    return n;
  }
  // A rank's partial sits at its last slot; slots are visited in order.
  const int32_t* ids = plan.topk.data() + t * K;
  for (int k = 0; k < K; ++k) {
    if (ids[k] < 0) continue;
    const int r = ids[k] / El;
    bool later = false;
    for (int j = k + 1; j < K && !later; ++j) later = ids[j] >= 0 && ids[j] / El == r;
    if (!later) ranks[n++] = r;
  }
  return n;
}

// One combine: the sender packs (and, in expand mode, reduces) its rows. On channels that hold
// records (shared memory, MPI) the owner reduces each token as soon as all its records arrived,
// reading them where they landed, and releases them once every token that reads them is done;
// the senders stream in token order, so the tokens complete in order. Elsewhere, and where the
// channel cannot hold all of a token's records from one rank at once (single reduction through
// small slots, which would otherwise stall), the owner stages the records per source rank in
// stream order and reduces them in finish().
struct CombineOp final : Operation {
  Checked c;
  std::shared_ptr<const Plan> plan;
  std::vector<Tensor> keep;  // the inputs the callbacks read, alive until the exchange ends
  size_t row_bytes = 0, w_bytes = 0;
  bool single = false;  // one record per slot, one reduction at the owner
  kernels::SumRowsFn sum = row_sums().sum;
  // Single reduction. Sender: per owner, the expanded rows in stream order. Owner: [T*K] each
  // slot's record index in its expert rank's stream, or -1.
  std::vector<std::vector<int32_t>> slot_rows;
  std::vector<int32_t> slot_record;
  StagedRecords staged;  // when not held
  Tensor combined_x, combined_w;
  // Hold mode: per expert rank, where each record is readable, how many arrived, the token each
  // record belongs to (stream order), and how many of them no unreduced token reads.
  bool held = false;
  std::vector<std::vector<const std::byte*>> held_row;   // each record's row
  std::vector<std::vector<const std::byte*>> held_tail;  // the rest of it (its weights)
  std::vector<int64_t> arrived;
  std::vector<std::vector<int32_t>> record_token;
  std::vector<int64_t> released;
  int64_t next_token = 0;  // tokens [0, next_token) are reduced
  std::vector<const bf16*> rows_scratch;
  std::vector<int> ranks_scratch;

  void pack(int d, int64_t first, int64_t n, std::byte* dst);
  void pack_slots(int d, int64_t first, int64_t n, std::byte* dst);
  // Record `index` from rank r: its row, and its tail (what follows the row: the weights).
  const std::byte* staged_row(int r, int64_t index) const {
    if (held) return held_row[r][index];
    return staged.record(r, index);
  }
  const std::byte* staged_tail(int r, int64_t index) const {
    return held ? held_tail[r][index] : staged_row(r, index) + row_bytes;
  }
  // Token t's record from rank r.
  int64_t record_of(int r, int64_t t) const { return plan->send_pos[t * plan->num_ranks + r]; }
  const std::byte* row(int r, int64_t t) const { return staged_row(r, record_of(r, t)); }
  const std::byte* tail(int r, int64_t t) const { return staged_tail(r, record_of(r, t)); }
  // The record of slot k of token t (single reduction): its expert rank and index.
  int slot_rank(int64_t t, int k) const {
    return plan->topk[t * c.K + k] / plan->num_local_experts;
  }
  const std::byte* slot_row(int64_t t, int k) const {
    return staged_row(slot_rank(t, k), slot_record[t * c.K + k]);
  }
  const std::byte* slot_tail(int64_t t, int k) const {
    return staged_tail(slot_rank(t, k), slot_record[t * c.K + k]);
  }
  // Appends token t's rows to `rows` in reduction order (and fills its weights); returns the
  // new count.
  int partial_rows(const bf16** rows, int n, float* w, int64_t t, int* ranks) const;
  int slot_rows_of(const bf16** rows, int n, float* w, int64_t t) const;
  void reduce_token(int64_t t);
  bool has_arrived(int64_t t) const;  // hold mode: every record token t reads is readable
  void reduce_arrived();              // hold mode: reduces the tokens whose records all arrived
  int64_t release_upto(int r);        // hold mode: records of r that no unreduced token reads
  void finish() override;
};

void CombineOp::pack(int d, int64_t first, int64_t n, std::byte* dst) {
  if (single) return pack_slots(d, first, n, dst);
  const int64_t H = c.H;
  const int K = c.K;
  for (int64_t i = 0; i < n; ++i, dst += spec.record_bytes) {
    const int64_t row = plan->recv_offset[d] + first + i;
    float* w_out = reinterpret_cast<float*>(dst + row_bytes);
    if (!plan->expand) {
      std::memcpy(dst, c.x + row * H, row_bytes);
      if (c.weights) std::memcpy(w_out, c.weights + row * K, w_bytes);
      continue;
    }
    // The rank's partial: its slots' rows summed from 0 in top-k order.
    const bf16* rows[kMaxTopk];
    int live = 0;
    for (int k = 0; k < K; ++k) {
      const int32_t erow = plan->expanded_rows[row * K + k];
      if (erow >= 0) rows[live++] = reinterpret_cast<const bf16*>(c.x + erow * H);
      if (c.weights) w_out[k] = erow >= 0 ? c.weights[erow] : 0.0f;
    }
    if (live == 0) {
      std::memset(dst, 0, row_bytes);
    } else {
      sum(rows, live, true, H, reinterpret_cast<bf16*>(dst));
    }
  }
}

void CombineOp::pack_slots(int d, int64_t first, int64_t n, std::byte* dst) {
  const int32_t* rows = slot_rows[d].data() + first;
  for (int64_t i = 0; i < n; ++i, dst += spec.record_bytes) {
    std::memcpy(dst, c.x + static_cast<int64_t>(rows[i]) * c.H, row_bytes);
    if (c.weights) std::memcpy(dst + row_bytes, c.weights + rows[i], w_bytes);
  }
}

// Each rank's BF16 partial in reduction order; the weights come from the owning rank's record.
int CombineOp::partial_rows(const bf16** rows, int n, float* w, int64_t t, int* ranks) const {
  const int m = reduction_order(*plan, t, ranks);
  for (int i = 0; i < m; ++i) rows[n++] = reinterpret_cast<const bf16*>(row(ranks[i], t));
  for (int k = 0; k < c.K && w; ++k) {
    const int32_t e = plan->topk[t * c.K + k];
    w[k] = 0.0f;
    if (e >= 0) std::memcpy(&w[k], tail(e / plan->num_local_experts, t) + 4 * k, 4);
  }
  return n;
}

// Every slot's row in top-k order: the one reduction of allow_multiple_reduction = false.
int CombineOp::slot_rows_of(const bf16** rows, int n, float* w, int64_t t) const {
  for (int k = 0; k < c.K; ++k) {
    const bool routed = plan->topk[t * c.K + k] >= 0;
    if (routed) rows[n++] = reinterpret_cast<const bf16*>(slot_row(t, k));
    if (!w) continue;
    w[k] = 0.0f;
    if (routed) std::memcpy(&w[k], slot_tail(t, k), 4);  // 2H need not be 4-aligned
  }
  return n;
}

// Per token: f32(bias0) [+ f32(bias1)], or 0 without bias, then the partials (or slots) in order,
// rounded once to BF16 (dsk/kernels/ep/reduce.hpp).
void CombineOp::reduce_token(int64_t t) {
  const int64_t H = c.H;
  const bf16** rows = rows_scratch.data();
  int n = 0;
  for (const uint16_t* b : c.bias) rows[n++] = reinterpret_cast<const bf16*>(b + t * H);
  float* w = c.weights ? combined_w.data<float>() + t * c.K : nullptr;
  n = single ? slot_rows_of(rows, n, w, t) : partial_rows(rows, n, w, t, ranks_scratch.data());
  bf16* out = combined_x.data<bf16>() + t * H;
  if (n == 0) {
    std::memset(out, 0, static_cast<size_t>(H) * 2);
  } else {
    sum(rows, n, c.bias.empty(), H, out);
  }
}

bool CombineOp::has_arrived(int64_t t) const {
  const int R = plan->num_ranks;
  if (single) {
    for (int k = 0; k < c.K; ++k) {
      const int32_t e = plan->topk[t * c.K + k];
      if (e >= 0 && slot_record[t * c.K + k] >= arrived[e / plan->num_local_experts]) return false;
    }
    return true;
  }
  for (int r = 0; r < R; ++r) {
    const int32_t pos = plan->send_pos[t * R + r];
    if (pos >= 0 && pos >= arrived[r]) return false;
  }
  return true;
}

void CombineOp::reduce_arrived() {
  while (next_token < c.T && has_arrived(next_token)) reduce_token(next_token++);
}

int64_t CombineOp::release_upto(int r) {
  const std::vector<int32_t>& tokens = record_token[r];
  int64_t& done = released[r];
  while (done < static_cast<int64_t>(tokens.size()) && tokens[done] < next_token) ++done;
  return done;
}

void CombineOp::finish() {
  if (held) {
    reduce_arrived();  // the tokens after the last record
    DSK_CHECK(next_token == c.T, kFn, "internal: a token's records never arrived");
    return;
  }
  for (int64_t t = 0; t < c.T; ++t) reduce_token(t);
}

// Single reduction, both sides of the stream order: the sender walks its received rows per owner
// and each row's local slots in top-k order; the owner walks its send list per expert rank and
// each token's slots on that rank in top-k order, which visits the same slots in the same order.
// Returns the records each expert rank sends back.
std::vector<int64_t> plan_slot_streams(CombineOp& op) {
  const Plan& plan = *op.plan;
  const int R = plan.num_ranks, K = plan.num_topk, El = plan.num_local_experts;
  op.slot_rows.assign(R, {});
  for (int d = 0; d < R; ++d) {
    const int64_t begin = plan.recv_offset[d], end = begin + plan.recv_count[d];
    for (int64_t row = begin; row < end; ++row)
      for (int k = 0; k < K; ++k)
        if (const int32_t erow = plan.expanded_rows[row * K + k]; erow >= 0)
          op.slot_rows[d].push_back(erow);
  }
  op.slot_record.assign(static_cast<size_t>(plan.num_tokens * K), -1);
  op.record_token.assign(R, {});
  std::vector<int64_t> records(R, 0);
  for (int r = 0; r < R; ++r) {
    for (const int32_t t : plan.send_list[r]) {
      for (int k = 0; k < K; ++k) {
        const int32_t e = plan.topk[t * K + k];
        if (e >= 0 && e / El == r) {
          op.slot_record[t * K + k] = static_cast<int32_t>(records[r]++);
          op.record_token[r].push_back(t);
        }
      }
    }
  }
  return records;
}

// The most records one token reads from one rank: hold mode keeps them all held at once.
int64_t most_records_per_token(const CombineOp& op) {
  if (!op.single) return 1;
  const Plan& plan = *op.plan;
  const int K = plan.num_topk;
  int64_t most = 0;
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t e = plan.topk[t * K + k];
      if (e < 0) continue;
      int64_t same_rank = 0;
      for (int j = 0; j < K; ++j)
        same_rank += plan.topk[t * K + j] >= 0 &&
                     plan.topk[t * K + j] / plan.num_local_experts == e / plan.num_local_experts;
      most = std::max(most, same_rank);
    }
  }
  return most;
}

}  // namespace

CombineResult run_combine(BufferImpl& b, const Tensor& x, const DispatchHandle& h,
                          const CombineArgs& a) {
  b.check_usable(kFn);
  if (a.previous_event) a.previous_event->wait();
  auto op = std::make_shared<CombineOp>();
  op->sized_by_headers = false;
  op->c = check_inputs(b, x, h, a);
  op->plan = h.plan;
  op->keep = a.bias;
  op->keep.push_back(x);
  if (a.topk_weights) op->keep.push_back(*a.topk_weights);
  const Checked& c = op->c;
  const Plan& plan = *h.plan;
  const int R = b.num_ranks, K = c.K;
  const int64_t H = c.H, T = c.T;

  // Non-expand rows were reduced over the local experts by the caller: the flag changes nothing.
  op->single = plan.expand && !b.config.allow_multiple_reduction;
  op->row_bytes = 2 * static_cast<size_t>(H);
  // A partial record carries the weights of all K slots, a slot record its own.
  op->w_bytes = c.weights ? 4 * static_cast<size_t>(op->single ? 1 : K) : 0;
  ExchangeSpec& spec = op->spec;
  spec.header_bytes = header_bytes(R, b.num_local_experts);
  spec.send_headers.assign(spec.header_bytes * R, std::byte{0});
  spec.recv_headers.assign(spec.header_bytes * R, std::byte{0});
  spec.record_bytes = align_up(op->row_bytes + op->w_bytes, 16);
  spec.recv_records.assign(R, 0);
  // Records each rank sends back to this one.
  std::vector<int64_t> expected(R);
  if (op->single) {
    expected = plan_slot_streams(*op);
    spec.send_records.assign(R, 0);
    for (int d = 0; d < R; ++d)
      spec.send_records[d] = static_cast<int64_t>(op->slot_rows[d].size());
  } else {
    for (int r = 0; r < R; ++r) expected[r] = static_cast<int64_t>(plan.send_list[r].size());
    spec.send_records = plan.recv_count;
  }
  const Signature sig{.kind = 2,
                      .hidden = static_cast<int32_t>(H),
                      .num_topk = K,
                      .fp8 = 0,
                      .has_topk = plan.has_topk ? 1 : 0,
                      .has_weights = c.weights ? 1 : 0,
                      .expand = plan.expand ? 1 : 0,
                      .alignment = 0,
                      .num_experts = b.config.num_experts,
                      .cached = 0,
                      .tmax = 0,
                      .logfmt = 0};
  for (int d = 0; d < R; ++d) {
    const HeaderView hv{spec.send_headers.data() + spec.header_bytes * d, R};
    hv.sig() = sig;
    hv.tail() = {T, spec.send_records[d]};
  }
  op->combined_x = b.pooled({T, H}, DType::bf16);
  if (c.weights) op->combined_w = Tensor::empty({T, K}, DType::f32);
  op->rows_scratch.resize(static_cast<size_t>(2 + std::max(R, kMaxTopk)));
  op->ranks_scratch.resize(static_cast<size_t>(std::max(R, kMaxTopk)));
  // Records are read where they landed when the channel can hold a token's worth of them.
  op->held = b.channel->holds_records() &&
             b.channel->max_held_records(spec.record_bytes) >= most_records_per_token(*op);
  if (op->held) {
    if (!op->single) op->record_token = plan.send_list;
    op->held_row.resize(R);
    op->held_tail.resize(R);
    for (int r = 0; r < R; ++r) {
      op->held_row[r].resize(static_cast<size_t>(expected[r]));
      op->held_tail[r].resize(static_cast<size_t>(expected[r]));
    }
    op->arrived.assign(R, 0);
    op->released.assign(R, 0);
  } else {
    op->staged = StagedRecords(expected, spec.record_bytes,
                               [&](int64_t bytes) { return b.pooled({bytes}, DType::u8); });
  }

  // The callbacks may run on the communication thread; they reach everything through `self`.
  CombineOp* self = op.get();
  const int rank = b.rank;
  spec.pack = [self](int d, int64_t first, int64_t n, std::byte* dst) {
    self->pack(d, first, n, dst);
  };
  if (!plan.expand) {
    // A partial record is a row of x and its weights: the rows for rank d are x's rows
    // [recv_offset[d], + recv_count[d]), which MPI channels send from x itself.
    spec.direct_row_bytes = op->row_bytes;
    spec.direct_src = [self](int d, int64_t i) {
      return reinterpret_cast<const std::byte*>(self->c.x +
                                                (self->plan->recv_offset[d] + i) * self->c.H);
    };
    // When x is the dispatch's own recv_x in the shared-memory channel's outputs, the owners sum
    // the rows where they are: only the weights cross.
    spec.rows_readable_in_place = true;
    spec.pack_direct = [self](int d, int64_t first, int64_t n, std::byte* dst, std::byte* rows) {
      const int64_t H = self->c.H, K = self->c.K;
      for (int64_t i = 0; i < n; ++i, dst += self->spec.tail_bytes()) {
        const int64_t row = self->plan->recv_offset[d] + first + i;
        if (rows) std::memcpy(rows + i * self->row_bytes, self->c.x + row * H, self->row_bytes);
        if (self->c.weights) std::memcpy(dst, self->c.weights + row * K, self->w_bytes);
      }
    };
  } else if (op->single) {
    // A slot record is an expert output row of x, unchanged: MPI channels send the rows from x
    // (packing only chunks whose rows are not consecutive there) and the weights as tails.
    spec.direct_row_bytes = op->row_bytes;
    spec.direct_src = [self](int d, int64_t i) {
      return reinterpret_cast<const std::byte*>(self->c.x + self->slot_rows[d][i] * self->c.H);
    };
    spec.pack_direct = [self](int d, int64_t first, int64_t n, std::byte* dst, std::byte* rows) {
      const int32_t* slot = self->slot_rows[d].data() + first;
      for (int64_t i = 0; i < n; ++i, dst += self->spec.tail_bytes()) {
        if (rows)
          std::memcpy(rows + i * self->row_bytes, self->c.x + slot[i] * self->c.H, self->row_bytes);
        if (self->c.weights) std::memcpy(dst, self->c.weights + slot[i], self->w_bytes);
      }
    };
    // Without weights a record is its row: this rank's own are summed where they are in x.
    if (op->held && !c.weights)
      spec.own_record = [self, rank](int64_t i) {
        return reinterpret_cast<const std::byte*>(self->c.x + self->slot_rows[rank][i] * self->c.H);
      };
  }
  spec.on_headers = [self, R, rank, expected = std::move(expected)] {
    ExchangeSpec& sp = self->spec;
    check_signatures(sp, R, rank, kFn);
    for (int r = 0; r < R; ++r) {
      const HeaderView hv{sp.recv_headers.data() + sp.header_bytes * r, R};
      DSK_CHECK(hv.tail().num_records == expected[r], kFn,
                "rank " + std::to_string(r) + " sends " + std::to_string(hv.tail().num_records) +
                    " rows back but this rank expects " + std::to_string(expected[r]) +
                    " (a handle from another dispatch?)");
      sp.recv_records[r] = hv.tail().num_records;
    }
  };
  if (op->held) {
    spec.hold = [self](int r, int64_t first, int64_t n, const std::byte* src) {
      const size_t rb = self->spec.record_bytes;
      for (int64_t i = 0; i < n; ++i) {
        self->held_row[r][first + i] = src + static_cast<size_t>(i) * rb;
        self->held_tail[r][first + i] = src + static_cast<size_t>(i) * rb + self->row_bytes;
      }
      self->arrived[r] = first + n;
      self->reduce_arrived();
    };
    if (spec.direct_row_bytes > 0) {
      spec.hold_rows = [self](int r, int64_t first, int64_t n, const std::byte* src,
                              const std::byte* rows) {
        const size_t tail = self->spec.tail_bytes(), row = self->row_bytes;
        for (int64_t i = 0; i < n; ++i) {
          self->held_row[r][first + i] = rows + static_cast<size_t>(i) * row;
          self->held_tail[r][first + i] = src + static_cast<size_t>(i) * tail;
        }
        self->arrived[r] = first + n;
        self->reduce_arrived();
      };
    }
    spec.released = [self](int r) { return self->release_upto(r); };
  } else {
    spec.unpack = [self](int r, int64_t first, int64_t n, const std::byte* src) {
      self->staged.unpack(r, first, n, src);
    };
  }
  b.execute(op, a.async_finish, kFn);

  CombineResult out;
  out.combined_x = op->combined_x;
  if (c.weights) out.combined_topk_weights = op->combined_w;
  out.event = EventOverlap(op->event);
  return out;
}

}  // namespace detail

CombineResult Buffer::combine(const Tensor& x, const DispatchHandle& handle,
                              const CombineArgs& args) {
  return detail::run_combine(*impl_, x, handle, args);
}

}  // namespace dsk::ep
