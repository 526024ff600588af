// The one-sided MPI transport: the shared-memory transport's protocol (fixed-capacity,
// double-buffered slots per peer, monotonic counters as signals, no queues) with the receiver's
// memory in an MPI window and every write a put: data with MPI_Put, then MPI_Win_flush, then the
// counter with an element-atomic MPI_Accumulate(MPI_REPLACE) and another flush, so a receiver that
// sees the counter sees the data (DeepEP's put + ordered signal + flush).
//
// Window of rank d (the receiver; senders push into it):
//   control   per peer p, each counter on its own cache line, all monotonic:
//               header_posted[p]  (put by p)  headers p posted for d
//               header_taken[p]   (put by p)  headers p took from d's posts
//               chunk_posted[p]   (put by p)  record chunks p posted for d
//               chunk_taken[p]    (put by p)  chunks p took from d's posts
//   headers   [R][header_capacity]   header from sender p
//   slots     [R][2][chunk_bytes]    record chunks from sender p
// The window stays in one MPI_Win_lock_all epoch for its life; local reads of what peers put
// follow MPI_Win_sync (the unified memory model).
#include <algorithm>
#include <cstring>

#include <dsk/core/error.hpp>

#include "ep/internal.hpp"

namespace dsk::ep::detail {
namespace {

constexpr const char* kFn = "ep::Buffer (MPI one-sided)";

enum Counter { kHeaderPosted = 0, kHeaderTaken = 1, kChunkPosted = 2, kChunkTaken = 3 };

class RmaExchange;

class RmaChannel final : public Channel {
 public:
  RmaChannel(const CommImpl& comm, int64_t num_bytes, double timeout_s)
      : rank_(comm.rank),
        size_(comm.size),
        bytes_(static_cast<size_t>(num_bytes)),
        timeout_s_(timeout_s) {
    header_cap_ = header_capacity(size_);
    const size_t fixed = control_bytes(size_) + header_cap_ * size_;
    DSK_CHECK(bytes_ > fixed + 2 * 64 * static_cast<size_t>(size_), kFn,
              "num_bytes " + std::to_string(num_bytes) + " is too small: the control area alone " +
                  "needs " + std::to_string(fixed) + " bytes");
    chunk_ = (bytes_ - fixed) / (2 * static_cast<size_t>(size_)) / 64 * 64;
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Comm_idup(comm.comm, &comm_, &request), kFn, "MPI_Comm_idup");
    wait_request(request, timeout_s, kFn, "the other ranks to create the buffer");
    // NOTES: MPI_Win_allocate is collective and blocking; every rank reached the idup above, so
    // none is missing here.
    check_mpi(
        MPI_Win_allocate(static_cast<MPI_Aint>(bytes_), 1, MPI_INFO_NULL, comm_, &base_, &win_),
        kFn, "MPI_Win_allocate");
    std::memset(base_, 0, control_bytes(size_));
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), kFn, "MPI_Win_lock_all");
    MPI_Request barrier = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(comm_, &barrier), kFn, "MPI_Ibarrier");
    wait_request(barrier, timeout_s, kFn, "the other ranks to zero their counters");
    staging_.resize(chunk_);
    posted_.assign(size_, 0);
    taken_.assign(size_, 0);
  }

  // NOTES: freeing a window is collective. A buffer whose exchange failed (a peer died or
  // stalled), or whose peers do not arrive within the timeout, leaks it instead of hanging.
  ~RmaChannel() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || win_ == MPI_WIN_NULL) return;
    MPI_Win_unlock_all(win_);
    if (failed_) return;
    try {
      MPI_Request barrier = MPI_REQUEST_NULL;
      check_mpi(MPI_Ibarrier(comm_, &barrier), kFn, "MPI_Ibarrier");
      wait_request(barrier, timeout_s_, kFn, "the other ranks to free the buffer");
    } catch (const Error&) {
      return;
    }
    MPI_Win_free(&win_);
    MPI_Comm_free(&comm_);
  }

  size_t max_header_bytes() const override { return header_cap_; }
  size_t chunk_bytes() const override { return chunk_; }
  std::unique_ptr<Exchange> start(ExchangeSpec& spec, const char* fn) override;

 private:
  friend class RmaExchange;
  static size_t counter_offset(int peer, Counter which) {
    return (static_cast<size_t>(peer) * 4 + which) * 64;
  }
  size_t header_offset(int sender) const {
    return control_bytes(size_) + header_cap_ * static_cast<size_t>(sender);
  }
  size_t slot_offset(int sender, uint64_t chunk) const {
    return control_bytes(size_) + header_cap_ * size_ +
           (static_cast<size_t>(sender) * 2 + chunk % 2) * chunk_;
  }
  // This rank's copy of counter `which` for `peer`, as peers last put it.
  uint64_t local_counter(int peer, Counter which) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(static_cast<const std::byte*>(base_) +
                                                             counter_offset(peer, which)),
                           __ATOMIC_ACQUIRE);
  }
  const std::byte* local(size_t offset) const {
    return static_cast<const std::byte*>(base_) + offset;
  }
  // Writes `bytes` at `offset` of `target`'s window and waits until they are there.
  void put(int target, size_t offset, const void* data, size_t bytes, const char* fn) {
    check_mpi(MPI_Put(data, static_cast<int>(bytes), MPI_BYTE, target,
                      static_cast<MPI_Aint>(offset), static_cast<int>(bytes), MPI_BYTE, win_),
              fn, "MPI_Put");
    check_mpi(MPI_Win_flush(target, win_), fn, "MPI_Win_flush");
  }
  // Sets `target`'s counter `which` for this rank to `value` (element-atomic), after the puts
  // before it completed.
  void signal(int target, Counter which, uint64_t value, const char* fn) {
    check_mpi(MPI_Accumulate(&value, 1, MPI_UINT64_T, target,
                             static_cast<MPI_Aint>(counter_offset(rank_, which)), 1, MPI_UINT64_T,
                             MPI_REPLACE, win_),
              fn, "MPI_Accumulate");
    check_mpi(MPI_Win_flush(target, win_), fn, "MPI_Win_flush");
  }
  // Lets MPI progress (transfers that need the target's help) and makes peers' puts visible.
  void refresh() {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    MPI_Win_sync(win_);
  }

  int rank_, size_;
  size_t bytes_, header_cap_ = 0, chunk_ = 0;
  double timeout_s_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  void* base_ = nullptr;
  bool failed_ = false;
  std::vector<std::byte> staging_;  // a chunk packed here, then put
  uint64_t exchanges_ = 0;
  std::vector<uint64_t> posted_;  // chunks posted to each receiver so far
  std::vector<uint64_t> taken_;   // chunks taken from each sender so far
};

class RmaExchange final : public Exchange {
 public:
  RmaExchange(RmaChannel& channel, ExchangeSpec& spec, const char* fn)
      : ch_(channel), spec_(spec), fn_(fn), R_(channel.size_) {
    DSK_CHECK(spec.header_bytes <= ch_.header_cap_, fn, "internal: header larger than its slot");
    per_chunk_ = static_cast<int64_t>(ch_.chunk_ / spec.record_bytes);
    DSK_CHECK(per_chunk_ > 0, fn,
              "the buffer is too small: one row needs " + std::to_string(spec.record_bytes) +
                  " bytes, a slot holds " + std::to_string(ch_.chunk_) +
                  " (size the buffer with Buffer::get_buffer_size_hint)");
    seq_ = ++ch_.exchanges_;
    sent_.assign(R_, 0);
    got_.assign(R_, 0);
    recv_total_.assign(R_, 0);
    send_total_.assign(R_, 0);
    for (int d = 0; d < R_; ++d) send_total_[d] = chunks_of(spec.send_records[d]);
    header_posted_.assign(R_, false);
    header_read_.assign(R_, false);
    ch_.failed_ = true;  // until this exchange completes
  }

  bool has_headers() const override { return headers_left_ == 0; }
  bool moved() const override { return moved_; }

  bool poll() override {
    ch_.refresh();
    const bool posted = post_headers();
    bool moved = read_headers() || posted;
    bool done = headers_left_ == 0 && headers_to_post_ == 0;
    for (int d = 0; d < R_; ++d) {
      if (send(d)) moved = true;
      done = done && sent_[d] == send_total_[d];
    }
    if (headers_left_ == 0) {
      for (int s = 0; s < R_; ++s) {
        if (receive(s)) moved = true;
        done = done && got_[s] == recv_total_[s];
      }
    }
    moved_ = moved;
    if (done) ch_.failed_ = false;
    return done;
  }

 private:
  int64_t chunks_of(int64_t records) const { return (records + per_chunk_ - 1) / per_chunk_; }

  // A header goes out once the receiver took the previous exchange's one.
  bool post_headers() {
    bool moved = false;
    for (int d = 0; d < R_ && headers_to_post_ > 0; ++d) {
      if (header_posted_[d] || ch_.local_counter(d, kHeaderTaken) + 1 < seq_) continue;
      ch_.put(d, ch_.header_offset(ch_.rank_), spec_.send_headers.data() + spec_.header_bytes * d,
              spec_.header_bytes, fn_);
      ch_.signal(d, kHeaderPosted, seq_, fn_);
      header_posted_[d] = true;
      --headers_to_post_;
      moved = true;
    }
    return moved;
  }

  bool read_headers() {
    if (headers_left_ == 0) return false;
    bool moved = false;
    for (int s = 0; s < R_; ++s) {
      if (header_read_[s] || ch_.local_counter(s, kHeaderPosted) < seq_) continue;
      std::memcpy(spec_.recv_headers.data() + spec_.header_bytes * s,
                  ch_.local(ch_.header_offset(s)), spec_.header_bytes);
      ch_.signal(s, kHeaderTaken, seq_, fn_);
      header_read_[s] = true;
      --headers_left_;
      moved = true;
    }
    if (headers_left_ == 0) {
      spec_.on_headers();
      for (int s = 0; s < R_; ++s) recv_total_[s] = chunks_of(spec_.recv_records[s]);
    }
    return moved;
  }

  // Two slots per pair: the receiver copies one out while the next is put.
  bool send(int d) {
    bool moved = false;
    uint64_t& posted = ch_.posted_[d];
    while (sent_[d] < send_total_[d] && posted - ch_.local_counter(d, kChunkTaken) < 2) {
      const int64_t first = sent_[d] * per_chunk_;
      const int64_t n = std::min(per_chunk_, spec_.send_records[d] - first);
      spec_.pack(d, first, n, ch_.staging_.data());
      ch_.put(d, ch_.slot_offset(ch_.rank_, posted), ch_.staging_.data(),
              static_cast<size_t>(n) * spec_.record_bytes, fn_);
      ch_.signal(d, kChunkPosted, ++posted, fn_);
      ++sent_[d];
      moved = true;
    }
    return moved;
  }

  bool receive(int s) {
    bool moved = false;
    uint64_t& taken = ch_.taken_[s];
    while (got_[s] < recv_total_[s] && ch_.local_counter(s, kChunkPosted) > taken) {
      const int64_t first = got_[s] * per_chunk_;
      const int64_t n = std::min(per_chunk_, spec_.recv_records[s] - first);
      spec_.unpack(s, first, n, ch_.local(ch_.slot_offset(s, taken)));
      ch_.signal(s, kChunkTaken, ++taken, fn_);
      ++got_[s];
      moved = true;
    }
    return moved;
  }

  RmaChannel& ch_;
  ExchangeSpec& spec_;
  const char* fn_;
  int R_;
  int64_t per_chunk_ = 1;
  uint64_t seq_ = 0;
  int headers_to_post_ = R_;
  int headers_left_ = R_;
  bool moved_ = false;
  std::vector<bool> header_posted_, header_read_;
  std::vector<int64_t> sent_, send_total_, got_, recv_total_;
};

std::unique_ptr<Exchange> RmaChannel::start(ExchangeSpec& spec, const char* fn) {
  return std::make_unique<RmaExchange>(*this, spec, fn);
}

}  // namespace

std::unique_ptr<Channel> make_mpi_rma_channel(const CommImpl& comm, int64_t num_bytes,
                                              double timeout_s) {
  return std::make_unique<RmaChannel>(comm, num_bytes, timeout_s);
}

}  // namespace dsk::ep::detail
