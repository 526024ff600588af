// dsk::ep internals shared by the communicator, the transports and the Buffer operations.
//
// Every dispatch and combine is one *exchange*: each rank sends every rank (itself included) a
// fixed-size header, then a stream of fixed-size records whose counts the receivers learn from
// the headers. A transport (Channel) moves the bytes; the operation supplies pack/unpack callbacks
// that turn records into tensor rows, so the transports know nothing about tokens or experts.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings warn
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <any>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <dsk/ep.hpp>

namespace dsk::ep::detail {

// ---- MPI ----
struct CommImpl {
  MPI_Comm comm = MPI_COMM_NULL;  // our own duplicate: bootstrap traffic never meets the user's
  int rank = 0;
  int size = 1;
  bool single_host = true;
  ~CommImpl();
};

// Raises dsk::Error naming `fn` and the MPI error text when `rc` is not MPI_SUCCESS.
void check_mpi(int rc, const char* fn, const char* what);

// The seconds every wait may take: BufferConfig::timeout_s, else DSK_EP_TIMEOUT_S, else 300.
double resolve_timeout_s(double configured);
// DSK_EP_PROGRESS_THREAD: 1 yes, 0 no, auto (default) when this process may run on more than one
// CPU. A rank bound to one CPU (mpirun binds each rank to a core when there are no more ranks
// than cores) gains nothing from the thread: it can only take turns with the compute on that CPU
// (measured in docs/ep.md).
bool progress_thread_wanted();

// Polls with a growing back-off (spin, then yield, then short sleeps so an idle rank leaves its
// core to the ranks that work) and raises dsk::Error once `timeout_s` passed without progress.
class Waiter {
 public:
  Waiter(double timeout_s, const char* fn, const char* what);
  void progressed();  // something moved: restart the back-off and the deadline
  // Nothing moved: back off; raises once timeout_s passed without progress, unless the caller
  // handles timeouts itself (raise_on_timeout false: it checks expired() and calls fail()).
  void pause(bool raise_on_timeout = true);
  bool expired() const;            // timeout_s passed without progress
  [[noreturn]] void fail() const;  // raises the timeout

 private:
  using Clock = std::chrono::steady_clock;
  double timeout_s_;
  const char* fn_;
  const char* what_;
  Clock::time_point since_;
  int64_t idle_polls_ = 0;
};

// Completes an MPI request within the timeout (MPI_Test in a Waiter loop).
void wait_request(MPI_Request& request, double timeout_s, const char* fn, const char* what);
// All-gather of `bytes` bytes per rank, with the timeout.
void allgather(const CommImpl& comm, const void* in, void* out, size_t bytes, double timeout_s,
               const char* fn);

// ---- Exchanges and transports ----
struct ExchangeSpec {
  size_t header_bytes = 0;              // per (sender, receiver) pair; the same on every rank
  std::vector<std::byte> send_headers;  // [R][header_bytes]
  std::vector<std::byte> recv_headers;  // [R][header_bytes], filled by the transport
  size_t record_bytes = 0;              // a multiple of 16
  std::vector<int64_t> send_records;    // [R]
  std::vector<int64_t> recv_records;    // [R], set by on_headers
  // Runs once every header has arrived: checks them, sets recv_records, allocates outputs.
  std::function<void()> on_headers;
  // Writes records [first, first + n) for `peer` to dst / reads those from `peer` at src.
  std::function<void(int peer, int64_t first, int64_t n, std::byte* dst)> pack;
  std::function<void(int peer, int64_t first, int64_t n, const std::byte* src)> unpack;
  // Optional, on channels whose holds_records() is true, instead of unpack: records
  // [first, first + n) from `peer` are readable at src until released(peer) (monotonic) covers
  // them, so the receiver can use them in place, in an order of its own.
  std::function<void(int peer, int64_t first, int64_t n, const std::byte* src)> hold;
  std::function<int64_t(int peer)> released;
  // Optional, with hold: record i to this rank itself, whole, where it already is. A channel
  // that holds records hands these over one by one (hold(me, i, 1, own_record(i))) instead of
  // packing them; records to itself are then neither packed nor unpacked.
  std::function<const std::byte*(int64_t i)> own_record;
  // Optional, with direct rows (and released): as hold, but the records travelled as tails (see
  // below) at src and their rows apart: row i is at rows + i * direct_row_bytes, readable as long
  // as the records are. Channels call it where a row need not be copied to be read in place: a
  // rank's rows to itself (read where direct_src says they are) and rows a channel received
  // apart from their records. With hold as well, the operation reads the records in an order of
  // its own (combine); without it (expand-mode dispatch), records not handed over this way
  // arrive through unpack, and the operation releases what it was handed as it reads it.
  std::function<void(int peer, int64_t first, int64_t n, const std::byte* src,
                     const std::byte* rows)>
      hold_rows;
  // Optional direct rows: each record starts with a row of direct_row_bytes that a channel may
  // move by itself, from the sender's memory straight into the receiver's output, instead of in
  // the record. A record whose row moves apart travels as its *tail*: the record without the
  // row, tail_bytes() long, tails packed one after the other (record i's tail at
  // i * tail_bytes()), so the bytes that cross with the records are only those of the tails.
  // - direct_dest (receiver, after on_headers): where row 0 of `peer`'s records goes (rows
  //   contiguous), or null for "in the records". The shared-memory channel uses it only inside
  //   Channel::shared_output memory. Unset when rows never land in an output (combines, expand
  //   dispatch): senders then need no reply from the receiver before they send.
  // - direct_src (sender): the row of record i to `peer` (MPI channels gather rows from there).
  // - pack_direct writes the tails of records [first, first + n) to dst, and their rows to
  //   `rows` (row i at rows + i * direct_row_bytes) unless rows is null (the channel moves them).
  // - unpack_direct reads the tails of records whose rows went to direct_dest.
  size_t direct_row_bytes = 0;
  std::function<std::byte*(int peer)> direct_dest;
  std::function<const std::byte*(int peer, int64_t i)> direct_src;
  std::function<void(int peer, int64_t first, int64_t n, std::byte* dst, std::byte* rows)>
      pack_direct;
  std::function<void(int peer, int64_t first, int64_t n, const std::byte* src)> unpack_direct;

  // Where records [first, first + n) to `peer` have their rows at direct_src, one after the other
  // (then rows can be read or sent as one block): the first row, else null.
  const std::byte* contiguous_rows(int peer, int64_t first, int64_t n) const;
  // How many of records [first, first + most) to `peer` have their rows one after the other at
  // direct_src, from the first on (at least 1).
  int64_t consecutive_rows(int peer, int64_t first, int64_t most) const;
  // Bytes of a record without its row (direct rows).
  size_t tail_bytes() const { return record_bytes - direct_row_bytes; }
  // Optional, with direct rows and hold_rows: a channel whose ranks map each other's shared outputs
  // (shared memory) may leave the rows to a peer where they are when they lie one after the other
  // inside this rank's shared outputs (a combine of the dispatch's own recv_x); the peer then
  // reads them there in place, only the tails cross, and the exchange ends on this rank once the
  // peer released every chunk, i.e. stopped reading the rows.
  bool rows_readable_in_place = false;

  // Shrink mode (low-latency operations on channels that can leave peers out): masked[p] != 0
  // leaves peer p out of the exchange, no header or record to or from it (empty: nobody). The
  // operation counts 0 records from p in on_headers. A peer dropped while the exchange runs (it
  // stalled past the timeout) is added here and reported to on_drop, with whether its header had
  // arrived (its records may then be partly received).
  std::vector<char> masked;
  std::function<void(int peer, bool after_headers)> on_drop;
  // Optional, with hold: the peers whose records the operation needs next and lacks. A peer
  // whose records stopped because this rank holds every chunk of its ring waits for this rank,
  // not the other way round; an operation that holds records can tell the two apart, the
  // channel cannot.
  std::function<std::vector<int>()> waiting_for;
  bool is_masked(int p) const { return !masked.empty() && masked[p] != 0; }
};

// One exchange in flight. poll() moves whatever is ready without blocking and returns true once
// the exchange finished; it raises dsk::Error when on_headers raises or the transport fails.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual bool poll() = 0;
  virtual bool has_headers() const = 0;  // every header arrived (outputs are allocated)
  virtual bool moved() const = 0;        // the last poll() moved something
  // Shrink mode, on the shared-memory channel (the only one that supports it): the peers the
  // exchange still waits for, those it receives from and, with `sending`, those that do not take
  // what it sends; and leaving one of them out of the rest of the exchange.
  virtual std::vector<int> stalled_peers(bool /*sending*/) const { return {}; }
  virtual void drop(int /*peer*/) {}
};

class Channel {
 public:
  virtual ~Channel() = default;
  // Collective: every rank starts its exchanges in the same order. `spec` must outlive it.
  virtual std::unique_ptr<Exchange> start(ExchangeSpec& spec, const char* fn) = 0;
  // The largest header an exchange may use.
  virtual size_t max_header_bytes() const = 0;
  // Bytes of one record slot chunk (records larger than this cannot travel); 0 = unlimited.
  virtual size_t chunk_bytes() const = 0;
  // Whether exchanges honour ExchangeSpec::hold / released.
  virtual bool holds_records() const { return false; }
  // With hold and records of record_bytes (no direct rows): the most consecutive records from one
  // peer that the receiver can hold at once. An operation that holds records until every record
  // of a token arrived needs at least a token's records from one peer, or the exchange stalls.
  virtual int64_t max_held_records(size_t /*record_bytes*/) const { return 0; }
  // An output the peers can write into (ExchangeSpec::direct_dest), or an undefined Tensor when
  // the channel has none or none is free.
  virtual Tensor shared_output(const Shape& /*shape*/, DType /*dtype*/) { return {}; }
  // The bytes reserved for shared outputs.
  virtual size_t shared_output_bytes() const { return 0; }
};

// Polls `exchange` until it finished (or, with until_headers, until every header arrived),
// backing off while nothing moves; raises dsk::Error after timeout_s without progress, unless
// `on_timeout` is given and returns true (it left the stalled peers out): the wait then restarts.
void drive(Exchange& exchange, double timeout_s, const char* fn, bool until_headers = false,
           const std::function<bool()>& on_timeout = {});

// Layout constants of the shared-memory buffer, shared with get_buffer_size_hint.
inline constexpr int kMaxLocalExperts = 1024;
inline constexpr int kMaxTopk = 32;
// What Transport::mpi means: the faster MPI variant in dsk bench ep (docs/ep.md).
inline constexpr Transport kDefaultMpiTransport = Transport::mpi_alltoallv;
size_t header_capacity(int num_ranks);
size_t control_bytes(int num_ranks);
size_t align_up(size_t x, size_t a);

// output_block_bytes: the size of each of the two shared outputs (0: none).
std::unique_ptr<Channel> make_shm_channel(const CommImpl& comm, int64_t num_bytes,
                                          size_t output_block_bytes, double timeout_s);
// The MPI transport moves rows in chunks of at most num_bytes / (R * 4) bytes (and 256 KB).
std::unique_ptr<Channel> make_mpi_channel(const CommImpl& comm, int64_t num_bytes,
                                          double timeout_s);
std::unique_ptr<Channel> make_mpi_rma_channel(const CommImpl& comm, int64_t num_bytes,
                                              double timeout_s);
// The channel of a resolved transport (shared_memory, mpi_alltoallv or mpi_one_sided).
std::unique_ptr<Channel> make_channel(Transport transport, const CommImpl& comm, int64_t num_bytes,
                                      size_t output_block_bytes, double timeout_s);
// The shared output block a buffer's dispatch needs at most: R * Tmax rows of hidden BF16 values
// (0 when the configuration does not say).
size_t shared_output_block_bytes(const BufferConfig& config, int num_ranks);

// ---- Events ----
struct EventState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = true;
  std::exception_ptr error;  // why the operation failed
  std::function<std::any()> hook;
  bool hook_ran = false;
  std::any hook_result;  // what wait() returns

  void complete(std::exception_ptr e);
};

// ---- Receive wait statistics (upstream's dispatch_ / combine_wait_recv_cost_stats) ----
// Per source rank, how long this rank's receive waited for it: the nanoseconds from the start of
// the receive (the call, or the receive hook) to the arrival of that rank's last record, or of its
// header when it sent none. Records that were already there when the receive started count 0. A
// rank that reaches the operation late shows up in its peers' entries. Added, when the operation
// finishes, to an i64 [R] tensor the caller keeps across calls.
class RecvWaitStats {
 public:
  RecvWaitStats() = default;
  RecvWaitStats(const std::optional<Tensor>& stats, int num_ranks);
  // Wraps spec's receive callbacks (on_headers, unpack, hold, hold_rows, unpack_direct) so that
  // every record they are handed counts as arrived; call once the spec is complete. Nothing to do
  // without a stats tensor.
  void track(ExchangeSpec& spec);
  void start();          // the receive begins
  void add_to_tensor();  // the operation finished: add each rank's wait
 private:
  using Clock = std::chrono::steady_clock;
  void arrived(int peer, int64_t n);
  void headers(const std::vector<int64_t>& recv_records);
  std::optional<Tensor> stats_;
  Clock::time_point start_{};
  bool have_headers_ = false;
  std::vector<int64_t> received_, expected_;
  std::vector<Clock::time_point> done_at_;
  std::vector<bool> done_;
};

// One dispatch or combine: its exchange, and what runs once the exchange finished.
struct Operation {
  virtual ~Operation() = default;
  ExchangeSpec spec;
  std::unique_ptr<Exchange> exchange;
  std::shared_ptr<EventState> event = std::make_shared<EventState>();
  // Whether the outputs are sized by the peers' headers (dispatch), so an asynchronous call must
  // wait for them before it returns; a combine's outputs are known up front.
  bool sized_by_headers = true;
  RecvWaitStats wait_stats;   // started by BufferImpl as the receive begins
  bool shrink = false;        // a low-latency operation of a shrink-mode buffer
  virtual void finish() = 0;  // zero the unwritten rows / reduce; may raise
};

// ---- The routing a dispatch established, as combine and cached dispatch read it ----
struct Plan {
  const void* buffer = nullptr;  // the BufferImpl that made it
  int num_ranks = 0;
  int rank = 0;
  int num_topk = 0;
  int num_local_experts = 0;
  int64_t num_tokens = 0;
  bool has_topk = false;
  bool expand = false;
  std::vector<int32_t> topk;                    // [T*K] global expert ids or -1 (has_topk)
  std::vector<std::vector<int32_t>> send_list;  // per destination rank: token ids in order
  std::vector<int32_t> send_pos;                // [T*R]: index in send_list[r], or -1
  std::vector<int64_t> recv_count;              // per source rank: rows received
  std::vector<int64_t> recv_offset;             // per source rank: first row
  std::vector<int32_t> expanded_rows;           // [N*K] expand mode: row of each slot, or -1
};

// ---- The routing of a low-latency dispatch, as low_latency_combine sends the rows back ----
struct LowLatencyPlan {
  const void* buffer = nullptr;  // the BufferImpl that made it
  int num_ranks = 0;
  int rank = 0;
  int num_local_experts = 0;
  int num_topk = 0;
  int64_t num_tokens = 0;
  int64_t tmax = 0;  // num_max_dispatch_tokens_per_rank
  int64_t hidden = 0;
  std::vector<int32_t> topk;  // [T*K] global expert ids or -1
  // Shrink mode: the ranks this dispatch left out (masked, or dropped after a timeout); empty
  // when none. Their experts' slots were not sent, and nothing of theirs was received.
  std::vector<char> left_out;
  bool is_left_out(int r) const { return !left_out.empty() && left_out[r] != 0; }
  // The combine streams every owner's rows back in the owner's token order, each token's slots in
  // top-k order, so the owner can sum a token as soon as its rows arrived.
  // Owner side: per expert rank r, the slots t*K+k whose rows r sends back, in that order.
  std::vector<std::vector<int32_t>> back_slots;
  // Expert side: per source rank s, the flat rows e*R*Tmax+row of recv_x that go back to s, in
  // that order (set as the dispatch receives).
  std::vector<std::vector<int64_t>> back_rows;
  // Expert side: rows received per (local expert e, source rank s) at [e*R+s], and their first row.
  std::vector<int64_t> rows;
  std::vector<int64_t> begin;
};

// Records kept per source rank in stream order, for operations on channels that cannot hold
// them where they land (ExchangeSpec::unpack copies them here; record(r, i) reads them back).
class StagedRecords {
 public:
  StagedRecords() = default;
  // counts[r]: the records rank r sends; the memory comes from `pooled`.
  template <class Pooled>
  StagedRecords(const std::vector<int64_t>& counts, size_t record_bytes, Pooled pooled)
      : record_bytes_(record_bytes), offset_(counts.size(), 0) {
    int64_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      offset_[r] = total;
      total += counts[r];
    }
    memory_ = pooled(total * static_cast<int64_t>(record_bytes));
  }
  void unpack(int r, int64_t first, int64_t n, const std::byte* src) {
    std::memcpy(record_at(r, first), src, static_cast<size_t>(n) * record_bytes_);
  }
  const std::byte* record(int r, int64_t i) const { return record_at(r, i); }

 private:
  std::byte* record_at(int r, int64_t i) const {
    return static_cast<std::byte*>(memory_.data_ptr()) +
           static_cast<size_t>(offset_[r] + i) * record_bytes_;
  }
  size_t record_bytes_ = 0;
  std::vector<int64_t> offset_;
  Tensor memory_;
};

struct BufferImpl {
  Communicator comm;
  BufferConfig config;
  Transport transport = Transport::shared_memory;
  double timeout_s = 300;
  int64_t num_bytes = 0;
  std::unique_ptr<Channel> channel;
  bool destroyed = false;
  std::atomic<bool> broken{false};  // a failed exchange left the peers in an unknown state
  std::atomic<int> outstanding{0};  // operations started and not yet finished
  int rank = 0;
  int num_ranks = 1;
  int num_local_experts = 1;
  // Whether async_finish hands the data movement to the communication thread (else the call
  // moves it): see progress_thread_wanted().
  bool progress_thread = true;

  ~BufferImpl();

  // Raises unless the buffer can run an operation (waits for an asynchronous one first).
  void check_usable(const char* fn);
  // Starts `op`'s exchange. Synchronous: returns once it finished and op.finish() ran.
  // Asynchronous: returns once every header arrived (the outputs exist) and leaves the rest to
  // the communication thread; op.event completes when it is done. Marks the buffer broken when
  // the exchange fails.
  void execute(const std::shared_ptr<Operation>& op, bool async, const char* fn);
  // Waits until no asynchronous operation is in flight.
  void wait_idle();
  // return_recv_hook: starts `op`'s exchange and posts what can go now; the receive waits for
  // complete_deferred (the hook, or the next operation on the buffer).
  void defer(const std::shared_ptr<Operation>& op, const char* fn);
  // Finishes the deferred operation, if any (raising what it raised).
  void complete_deferred(const char* fn);
  bool is_deferred(const Operation* op) const { return deferred_.get() == op; }
  // Memory for one low-latency result: one of two blocks (upstream's odd/even buffers), taken in
  // turn; raises when both still back live results.
  std::shared_ptr<std::byte> low_latency_block(size_t bytes, const char* fn);
  // An uninitialised tensor whose memory is reused from earlier calls once nothing references it.
  Tensor pooled(const Shape& shape, DType dtype);

  // Shrink mode (BufferConfig::enable_shrink, low-latency operations only): per rank, 0 active,
  // 1 masked by update_mask, 2 masked because an exchange waited for it past the timeout (its
  // channel state is then unknown, so it cannot be unmasked until a resize). Written by the
  // caller's thread and by the communication thread, hence the mutex.
  std::vector<int> masks() const;
  void set_mask(int peer, int value);
  // Runs op's exchange to its end (or its headers); in shrink mode a timeout leaves the stalled
  // peers out and masks them instead of raising.
  void drive_op(Operation& op, const char* fn, bool until_headers = false);

  // zero_copy low-latency combine: two buffer-owned bf16 [E_local, R*Tmax, H] tensors, taken in
  // turn (upstream's odd/even send buffers), so the experts can fill the next one while a combine
  // still sends from the other. get_next_low_latency_combine_buffer hands out
  // combine_buffers[next_combine_buffer] and marks it ready; a zero-copy combine sends from it,
  // clears the mark and passes the turn.
  Tensor combine_buffers[2];
  bool combine_buffer_ready[2] = {false, false};
  int next_combine_buffer = 0;

 private:
  void progress_loop();

  // NOTES: the communication thread sleeps on a condition variable while there is nothing to
  // move, and the waits inside an exchange yield and then sleep, so it takes no core from the
  // compute threads when idle.
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::shared_ptr<Operation> pending_;
  bool stop_ = false;

  // NOTES: fresh pages cost a fault each (and, with transparent huge pages, compaction), which
  // made a 100 MB dispatch 10-20x slower than the copy itself; outputs and staging therefore come
  // from blocks kept here and handed out again once their last Tensor is gone.
  struct Block {
    std::shared_ptr<std::byte> memory;
    size_t bytes = 0;
  };
  std::mutex pool_mutex_;
  std::vector<Block> pool_;

  mutable std::mutex mask_mutex_;
  std::vector<int> mask_;

  std::shared_ptr<Operation> deferred_;
  Block low_latency_blocks_[2];
  int low_latency_next_ = 0;
};

}  // namespace dsk::ep::detail
