// dsk::ep — DeepEP on CPU ranks (../shared/spec/ep.md): MoE token dispatch and combine between
// processes started by mpirun, over POSIX shared memory (ranks on one host) or MPI.
//
// One long-lived Buffer per expert-parallel group. Experts are placed contiguously: expert e lives
// on rank e / (num_experts / num_ranks). Every call is collective: all ranks of the group issue
// the same calls in the same order. Every wait for a peer gives up after DSK_EP_TIMEOUT_S seconds
// (default 300) and raises dsk::Error; after a failed exchange the buffer refuses further work
// (destroy it and build a new one).
//
// Layouts (upstream V1 Buffer and V2.5 EPBuffer):
//   dispatch       one row per (token, destination rank), grouped by source rank ascending, then
//                  in the source's token order (= sorted by global source id rank*Tmax+token, so
//                  every run is deterministic); recv_topk_idx holds local expert ids or -1 (with
//                  weight 0); num_recv_tokens_per_expert_list counts selections per local expert,
//                  each rounded up to expert_alignment.
//   expand mode    one row per (token, local expert), grouped by expert; expert e's block starts
//                  at a multiple of expert_alignment (default gemm's contiguous-layout alignment),
//                  gaps optionally zeroed, 1-D weights; handle.psum_num_recv_tokens_per_expert is
//                  the grouped_layout of gemm::m_grouped_*_contiguous(use_psum_layout = true).
//   combine        out[t] = bf16( f32(bias0) + f32(bias1) + Σ partial_r ), partial_r = the bf16
//                  sum of rank r's rows for t (expand mode: of its slots, in top-k order), the
//                  partials added in the order of each rank's last top-k slot (refs.py order).
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <dsk/core/tensor.hpp>
#include <dsk/gemm.hpp>

namespace dsk::ep {

namespace detail {
struct CommImpl;
struct BufferImpl;
struct EventState;
struct Plan;
struct LowLatencyPlan;
}  // namespace detail

// ---- Communicator: the group of ranks, an MPI communicator underneath ----
class Communicator {
 public:
  // MPI_COMM_WORLD. Initialises MPI (MPI_THREAD_MULTIPLE) when nobody has, and then finalises it
  // at process exit.
  static Communicator world();
  // Any MPI communicator, by its Fortran handle (MPI_Comm_c2f(comm), mpi4py's comm.py2f()), so
  // this header does not need <mpi.h>. The communicator is duplicated; the caller keeps its own.
  static Communicator from_fortran_handle(int64_t handle);

  int rank() const;
  int size() const;
  // Whether all ranks share this host (the shared-memory transport needs it).
  bool single_host() const;
  // Whether the calling process was started by an MPI launcher (mpirun / mpiexec / srun).
  static bool launched_by_mpi();

  // Plain collectives over the group, for benchmarks and tests (each waits at most
  // DSK_EP_TIMEOUT_S). alltoallv is a plain MPI_Alltoallv of byte blocks: block r of `send`
  // (send_bytes[r] bytes, packed in rank order) goes to rank r; recv gets one block per rank.
  void barrier() const;
  double allreduce_max(double value) const;
  void alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                 const std::vector<int64_t>& recv_bytes) const;

  const detail::CommImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<detail::CommImpl> impl_;
};

#ifdef MPI_VERSION
// With <mpi.h> included first: a Communicator for an MPI_Comm.
inline Communicator from_mpi(MPI_Comm comm) {
  return Communicator::from_fortran_handle(static_cast<int64_t>(MPI_Comm_c2f(comm)));
}
#endif

// How the bytes travel. automatic: shared memory when every rank is on this host, else mpi.
// mpi: the faster MPI variant as measured (docs/ep.md): mpi_alltoallv (counts, then one
// MPI_Alltoallv) or mpi_one_sided (MPI_Put into a window + ordered signal + flush, the
// shared-memory protocol over MPI RMA; destroying its buffer is collective, with the timeout).
enum class Transport { automatic, shared_memory, mpi, mpi_alltoallv, mpi_one_sided };
const char* transport_name(Transport t);

// ---- Events (upstream EventOverlap) ----
// The completion of one operation. A default-constructed event is complete; a synchronous
// operation returns a complete one. With async_finish the call returns once the sizes are known
// (the result tensors exist) and the buffer's communication thread moves the rows while the caller
// computes; wait() blocks until the operation finished (raising dsk::Error if it failed or timed
// out), then runs the hook registered with register_hook_after_wait, once: later waits do not
// repeat it, a hook that throws is not retried, and a wait that fails leaves the hook registered.
// Until then the result tensors must not be read. The next operation on the buffer waits for it.
class EventOverlap {
 public:
  EventOverlap() = default;
  explicit EventOverlap(std::shared_ptr<detail::EventState> state) : state_(std::move(state)) {}

  bool done() const;
  // Returns what the hook returned (upstream V2.5: the deferred epilogue's results), the same
  // value on every later wait; an empty std::any without a hook or for a void hook.
  std::any wait() const;
  void current_stream_wait() const { wait(); }
  // One hook at a time; registering replaces the previous one. Any callable, returning a value
  // (which wait() then returns) or void.
  template <class Hook>
  void register_hook_after_wait(Hook hook) const {
    if constexpr (std::is_void_v<std::invoke_result_t<Hook&>>) {
      set_hook([h = std::move(hook)]() mutable -> std::any {
        h();
        return {};
      });
    } else {
      set_hook([h = std::move(hook)]() mutable -> std::any { return std::any(h()); });
    }
  }

 private:
  void set_hook(std::function<std::any()> hook) const;
  std::shared_ptr<detail::EventState> state_;
};

// ---- Buffer configuration ----
// Give either num_bytes, or the MoE sizes the buffer is sized from (get_buffer_size_hint). Every
// rank must pass the same values: construction fails on every rank otherwise.
struct BufferConfig {
  int64_t num_bytes = 0;                // 0: size from the fields below
  int64_t num_max_tokens_per_rank = 0;  // Tmax, the same on every rank; T <= Tmax per call
  int64_t hidden = 0;
  int num_topk = 0;
  int num_experts = 0;  // E, a multiple of the number of ranks, E / ranks <= 1024
  bool use_fp8_dispatch = false;
  bool deterministic = false;  // rows are always sorted by global source id; kept for upstream
  // Expand-mode combine. true: each rank first sums its own slots of a token into one BF16 partial
  // (one row per (token, rank) travels back). false (upstream EPBuffer
  // allow_multiple_reduction=False): every slot's row travels back (up to min(K, E_local) rows per
  // (token, rank)) and the owner reduces once, out[t] = bf16(f32(bias0) + f32(bias1) + sum over
  // slots k in top-k order of f32(row_k)), so the result is bitwise the same for any number of
  // ranks and any expert placement. Non-expand combine is unchanged (the caller already reduced
  // over the local experts).
  bool allow_multiple_reduction = true;
  Transport transport = Transport::automatic;
  double timeout_s = 0;             // 0: DSK_EP_TIMEOUT_S (default 300)
  bool explicitly_destroy = false;  // when true, the owner must call destroy()
  // Shrink mode (upstream enable_shrink; the shared-memory transport only): low-latency dispatch
  // and combine leave masked ranks out, and a rank such an exchange waits for past timeout_s is
  // masked instead of failing the call. See Buffer::low_latency_update_mask_buffer.
  bool enable_shrink = false;
};

// ---- Layout ----
struct DispatchLayout {
  Tensor num_tokens_per_rank{};                      // i32 [R]: tokens, once per destination rank
  std::optional<Tensor> num_tokens_per_rdma_rank{};  // none (one host per shared-memory group)
  Tensor num_tokens_per_expert{};                    // i32 [E]: selections
  Tensor is_token_in_rank{};                         // bool [T, R]
  EventOverlap event{};
};

// ---- Handle: what combine and cached dispatch reuse ----
struct DispatchHandle {
  Tensor rank_prefix_matrix{};  // i32 [R, R]: P[i][j] = rows rank j received from ranks 0..i
  Tensor recv_src_idx{};        // i32 [N]: each received row's token position in its source rank
  Tensor is_token_in_rank{};    // bool [T, R] of this rank's tokens
  std::optional<Tensor>
      topk_idx{};  // [T, K] copy of the routing (absent for a top-k-less dispatch)
  // Expand mode: i32 [N, 2+K] per received token: global source id, source rank*K + first local
  // slot, then the expanded row of each top-k slot or -1. Non-expand: global id, source rank*K +
  // first local slot (or -1), then -1s.
  Tensor recv_src_metadata{};
  Tensor psum_num_recv_tokens_per_expert{};  // i32 [E_local], inclusive, over the aligned starts
  std::vector<int> num_recv_tokens_per_expert_list{};  // aligned counts
  bool do_expand = false;
  int num_experts = 0;
  int expert_alignment = 1;
  int64_t num_max_tokens_per_rank = 0;
  int64_t num_recv_tokens = 0;  // N: received rows (tokens) before expansion
  int64_t num_recv_rows = 0;    // rows of recv_x (N, the expanded count, or num_worst_tokens)
  std::shared_ptr<const detail::Plan> plan{};  // the routing in the form combine reads
};

struct DispatchArgs {
  std::optional<DispatchHandle> handle{};         // cached dispatch: replay this routing
  std::optional<Tensor> num_tokens_per_rank{};    // i32 [R] (checked against the routing)
  std::optional<Tensor> is_token_in_rank{};       // bool [T, R]
  std::optional<Tensor> num_tokens_per_expert{};  // i32 [E] (checked against topk_idx)
  std::optional<Tensor> topk_idx{};               // i64 or i32 [T, K], -1 = no expert
  std::optional<Tensor> topk_weights{};           // f32 [T, K]
  // Rounding of the per-expert counts (and block starts in expand mode). Default: 1, or in
  // expand mode gemm::get_mk_alignment_for_contiguous_layout().
  std::optional<int> expert_alignment{};
  int64_t num_worst_tokens = 0;  // > 0: allocate that many rows, no exact sizing
  bool do_expand = false;
  bool do_zero_padding = true;                   // expand mode: zero the rows between expert blocks
  std::optional<EventOverlap> previous_event{};  // waited for before the operation starts
  bool async_finish = false;             // return once sized; rows land before event.wait() returns
  bool allocate_on_comm_stream = false;  // accepted; no meaning on CPU
};

struct DispatchResult {
  Tensor recv_x{};                                     // bf16 or e4m3 [rows, H]
  std::optional<Tensor> recv_x_sf{};                   // f32 [rows, H/128] for FP8
  std::optional<Tensor> recv_topk_idx{};               // [rows, K] local ids or -1 (non-expand)
  std::optional<Tensor> recv_topk_weights{};           // f32 [rows, K], or [rows] in expand mode
  std::vector<int> num_recv_tokens_per_expert_list{};  // empty when num_worst_tokens > 0
  DispatchHandle handle{};
  EventOverlap event{};

  // Waits for the operation (event.wait()) and returns these results, then valid.
  const DispatchResult& wait() const {
    event.wait();
    return *this;
  }
};

struct CombineArgs {
  std::optional<Tensor> topk_weights{};  // f32 [N, K] (expand mode: [rows]) routed back
  std::vector<Tensor> bias{};            // 0, 1 or 2 bf16 [T, H]: shared-expert output, residual
  std::optional<EventOverlap> previous_event{};
  bool async_finish = false;
  bool allocate_on_comm_stream = false;
};

struct CombineResult {
  Tensor combined_x{};                            // bf16 [T, H]
  std::optional<Tensor> combined_topk_weights{};  // f32 [T, K] when topk_weights were given
  EventOverlap event{};

  // Waits for the operation (event.wait()) and returns these results, then valid.
  const CombineResult& wait() const {
    event.wait();
    return *this;
  }
};

// ---- Low-latency mode (upstream V1 low_latency_dispatch / low_latency_combine) ----
// No host-side sizing round: every output has its worst-case shape, fixed by
// num_max_dispatch_tokens_per_rank (Tmax, the same on every rank, T <= Tmax). One message per
// (token, selected expert); experts receive in the masked layout [E_local, R*Tmax, H] of
// gemm::m_grouped_*_masked, only rows [0, recv_count[e]) of expert e valid, the rows of source rank
// s at layout_range[e][s] in the source's token order (ascending source rank, so runs are
// deterministic).
//
// Results live in two buffers the Buffer keeps (upstream's odd/even buffers): at most two
// low-latency results (recv_x / recv_x_sf of a dispatch, combined_x of a combine without `out`)
// may be alive at once. A call while two are still referenced raises dsk::Error on the calling
// rank (its peers then time out): drop an earlier result first.
struct LowLatencyHandle {
  Tensor src_info{};      // i32 [E_local, R*Tmax]: each row's token index in its source rank
  Tensor layout_range{};  // i64 [E_local, R]: (begin << 32) | count of each source rank's rows
  int64_t num_max_dispatch_tokens_per_rank = 0;
  int64_t hidden = 0;
  int num_experts = 0;
  std::shared_ptr<const detail::LowLatencyPlan> plan{};  // the routing combine sends back along
};

struct LowLatencyDispatchArgs {
  bool use_fp8 = true;       // cast to e4m3 on the sender, one scale per 128 channels (amax/448)
  bool round_scale = false;  // scales rounded up to powers of two (UE8M0 values, still f32)
  bool use_ue8m0 = false;    // with round_scale: scales packed 4 per int32 [E_local, R*Tmax, H/512]
  std::optional<Tensor> cumulative_local_expert_recv_stats{};  // i32 [E_local], += recv_count
  // i64 [R]: += the nanoseconds this rank's receive waited for each source rank's rows (from the
  // start of the receive, the call or the hook, to the arrival of that rank's last row; 0 for
  // rows already there), written when the operation completes (the call, its event or its
  // hook). A straggler shows up in its peers' entries. Upstream counts GPU cycles.
  std::optional<Tensor> dispatch_wait_recv_cost_stats{};
  bool async_finish = false;      // rows move on the communication thread until event.wait()
  bool return_recv_hook = false;  // the call only sends; calling `hook` receives
};

struct LowLatencyDispatchResult {
  Tensor recv_x{};                    // bf16 or e4m3 [E_local, R*Tmax, H]
  std::optional<Tensor> recv_x_sf{};  // FP8: f32 [E_local, R*Tmax, H/128] or i32 [.., H/512]
  Tensor recv_count{};                // i32 [E_local]
  LowLatencyHandle handle{};
  EventOverlap event{};
  // With return_recv_hook: completes the receive (the results are valid once it returned); later
  // calls do nothing. Any later operation on the buffer completes it too. Call it before the
  // buffer is destroyed. Empty otherwise.
  std::function<void()> hook{};

  // Completes the operation (its hook, or its event) and returns these results, then valid.
  const LowLatencyDispatchResult& wait() const {
    if (hook) hook();
    event.wait();
    return *this;
  }
};

struct LowLatencyCombineArgs {
  // Rows travel as LogFMT-10 (upstream DeepEP's 10-bit logarithmic format, docs/ep.md): each
  // 512- or 1024-channel chunk whose magnitudes are all below 1 is encoded, the rest stays BF16;
  // the owner sums the decoded f32 values. Needs a hidden size that is a multiple of 512.
  bool use_logfmt = false;
  // Send from the tensor get_next_low_latency_combine_buffer(handle) returned (call it before
  // every zero-copy combine and write the experts' outputs into it); x is then not read, only
  // its shape checked (as upstream).
  bool zero_copy = false;
  bool async_finish = false;
  bool return_recv_hook = false;
  std::optional<Tensor> out{};  // bf16 [T, H] written in place of a buffer-owned result
  // i64 [R]: += the nanoseconds this rank waited for each expert rank's rows, as the dispatch's
  // dispatch_wait_recv_cost_stats.
  std::optional<Tensor> combine_wait_recv_cost_stats{};
};

struct LowLatencyCombineResult {
  Tensor combined_x{};  // bf16 [T, H]
  EventOverlap event{};
  std::function<void()> hook{};  // as in LowLatencyDispatchResult

  // Completes the operation (its hook, or its event) and returns these results, then valid.
  const LowLatencyCombineResult& wait() const {
    if (hook) hook();
    event.wait();
    return *this;
  }
};

// ---- Buffer ----
class Buffer {
 public:
  // Collective over `comm`: checks that every rank passed the same configuration (raising
  // dsk::Error on every rank when not), allocates the symmetric buffers and maps the peers'.
  Buffer(const Communicator& comm, const BufferConfig& config);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // The bytes one rank's buffer needs for these sizes (what num_bytes = 0 allocates).
  static int64_t get_buffer_size_hint(int num_ranks, int64_t num_max_tokens_per_rank,
                                      int64_t hidden, int num_topk, bool use_fp8_dispatch);

  // Frees the buffers (local: peers keep their mappings; with mpi_one_sided the window is freed
  // collectively once every rank arrives within the timeout, else leaked). Refused while an
  // operation is outstanding. Later calls on the buffer raise dsk::Error.
  void destroy();
  bool is_available() const;
  // Collective: replaces the communication buffers with ones of `num_bytes` per rank (0: sized
  // from the configuration's MoE sizes), keeping the configuration otherwise. Refused on every rank
  // (dsk::Error) while any rank has an operation outstanding; clears a failed exchange's state.
  // Handles of earlier dispatches stay valid.
  void resize(int64_t num_bytes);

  int rank() const;
  int num_ranks() const;
  int64_t num_bytes() const;  // this rank's buffer size
  // Shared memory this rank holds beyond num_bytes: on the shared-memory transport, two blocks of
  // R * num_max_tokens_per_rank * hidden BF16 values that dispatch outputs are allocated from, so
  // that peers write received rows in place (0 elsewhere, or when /dev/shm had no room for them).
  int64_t output_bytes() const;
  Transport transport() const;
  const BufferConfig& config() const;

  // Local (no communication): counts and membership of topk_idx [T, K] (i64 or i32).
  DispatchLayout get_dispatch_layout(const Tensor& topk_idx, int num_experts,
                                     std::optional<EventOverlap> previous_event = std::nullopt,
                                     bool async_finish = false,
                                     bool allocate_on_comm_stream = false) const;

  // x: bf16 [T, H], or FP8 {e4m3 [T, H], f32 [T, H/128]} (scale per 128 channels).
  DispatchResult dispatch(const Tensor& x, const DispatchArgs& args);
  DispatchResult dispatch(const gemm::Fp8Tensor& x, const DispatchArgs& args);

  // x: bf16 [N, H] (or [rows, H] in expand mode, or with num_worst_tokens rows) as dispatch
  // returned it, already reduced over the local experts in non-expand mode.
  CombineResult combine(const Tensor& x, const DispatchHandle& handle,
                        const CombineArgs& args = {});

  // x: bf16 [T, H]; topk_idx: i64 or i32 [T, K] global ids or -1; num_experts: the buffer's.
  LowLatencyDispatchResult low_latency_dispatch(const Tensor& x, const Tensor& topk_idx,
                                                int64_t num_max_dispatch_tokens_per_rank,
                                                int num_experts,
                                                const LowLatencyDispatchArgs& args = {});
  // zero_copy: the bf16 [E_local, R*Tmax, H] tensor (shape of the handle's dispatch) that the
  // next low_latency_combine with zero_copy = true sends from; write the experts' outputs into it.
  // It is one of two tensors the buffer owns and alternates between (upstream's odd/even
  // buffers), so it may be filled while the previous zero-copy combine is still in flight. The
  // transports stream records through fixed per-peer slots, so this is a buffer-owned staging
  // tensor, not transport memory; the combine packs its records straight from it.
  Tensor get_next_low_latency_combine_buffer(const LowLatencyHandle& handle);
  // x: bf16 [E_local, R*Tmax, H], the experts' outputs in the dispatch's masked layout (only the
  // valid rows are read); topk_idx: the dispatch's; topk_weights: f32 [T, K]. Returns
  // combined[t] = bf16(sum over k in top-k order, idx >= 0, of f32 w[t][k] * f32(x row of (t, k))),
  // with use_logfmt the rows' decoded LogFMT-10 values in place of f32(x row).
  LowLatencyCombineResult low_latency_combine(const Tensor& x, const Tensor& topk_idx,
                                              const Tensor& topk_weights,
                                              const LowLatencyHandle& handle,
                                              const LowLatencyCombineArgs& args = {});

  // ---- Shrink mode (BufferConfig::enable_shrink; local calls, no communication) ----
  // A masked rank takes no part in this rank's low-latency dispatches and combines: nothing is
  // sent to it or expected from it. Its tokens are not received (recv_count and layout_range
  // count the unmasked sources only), and the top-k slots of experts it holds add nothing to a
  // combined token (as if their ids were -1). A low-latency exchange that waits past timeout_s
  // for a rank (it stopped, died or hung) masks it and completes without it, instead of raising;
  // a rank that stopped sending is masked at the first timeout, one that only stopped taking
  // what this rank sends at the second. Ranks should agree on the masks: set them alike on every
  // active rank, between calls. A rank masked after a timeout can be unmasked only after a
  // resize(). Normal-mode dispatch and combine ignore the masks.
  // mask = true masks rank_to_mask (not this rank), false unmasks it.
  void low_latency_update_mask_buffer(int rank_to_mask, bool mask = false);
  // mask_status: i32 [R], set to 1 for each masked rank and 0 for the others.
  void low_latency_query_mask_buffer(const Tensor& mask_status) const;
  // Unmasks every rank (raising, and changing nothing, if one was masked after a timeout).
  void low_latency_clean_mask_buffer();

 private:
  std::unique_ptr<detail::BufferImpl> impl_;
};

}  // namespace dsk::ep
