// The shared-memory transport: one POSIX shared-memory segment per rank, mapped by every rank of
// the group (symmetric buffers), bootstrapped over MPI.
//
// Segment of rank s (the sender; receivers pull from it):
//   control   per receiver d, each counter on its own cache line, all monotonic:
//               header_posted[d]  (written by s)  headers of exchanges posted for d
//               header_taken[d]   (written by d)  headers d has copied out
//               chunk_posted[d]   (written by s)  record chunks posted for d, over all exchanges
//               chunk_taken[d]    (written by d)  chunks d has copied out
//             per sender d of an exchange with direct rows (the segment's owner receiving):
//               reply_seq[d]      (written by s)  the last exchange whose reply is posted
//               reply_offset[d]   (written by s)  where d's rows go in this segment, + 1 (0: none)
//   headers   [R][header_capacity]
//   slots     [R][2 * chunk_bytes]: a fixed-capacity ring of record chunks per receiver
//   outputs   (from a 2 MiB boundary) two blocks that dispatch outputs are allocated from
// A chunk goes to ring slot (chunk index % slots) once chunk_taken shows that slot is free; the
// receiver reads it once chunk_posted covers it (release/acquire pairs, no queues, no locks).
// Everything is polled by one loop that moves whatever is ready, so no pair of ranks can wait on
// each other. A rank's records to itself skip the ring: they are packed into a small buffer of
// this process and unpacked from it at once, so they cross memory once; rows the receiver reads
// in place (ExchangeSpec::hold_rows, combine) are not copied at all.
//
// NOTES: every exchange cuts the ring into chunks of about kChunkTarget bytes and keeps at most
// kInFlight bytes of them posted and not taken. The receiver then reads a chunk while the
// sender's writes still sit in the caches, so a byte that crosses between ranks costs one DRAM
// read and one DRAM write, as a memcpy does, instead of a write to and a read from a ring as
// large as the whole exchange (measured in docs/ep.md). The geometry may differ between
// exchanges, so an exchange posts its first chunk to a receiver only once that receiver took
// every chunk of the exchanges before.
//
// Direct rows (dispatch): a receiver whose output was allocated in its segment's output blocks
// replies with the output's offset once it has read every header; the senders then write each
// token's row straight into it and only the small rest of the record travels through the ring,
// so a row is copied once, as in a memcpy, instead of into the ring and out again.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <random>

#include <dsk/core/error.hpp>

#include "ep/internal.hpp"

namespace dsk::ep::detail {

size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

size_t header_capacity(int num_ranks) {
  // Fixed fields, one count per rank, one count per local expert.
  return align_up(128 + 4 * static_cast<size_t>(num_ranks) + 4 * kMaxLocalExperts, 64);
}

// Counters per (owner, peer) pair, one 64-byte line each (ShmChannel::counter).
constexpr size_t kCountersPerPeer = 7;

size_t control_bytes(int num_ranks) {
  return kCountersPerPeer * 64 * static_cast<size_t>(num_ranks);
}

namespace {

constexpr const char* kFn = "ep::Buffer (shared memory)";
// The chunk size an exchange aims for and the bytes it keeps in flight per receiver (see NOTES).
constexpr size_t kChunkTarget = size_t{128} << 10;
constexpr size_t kInFlight = size_t{512} << 10;

uint64_t load_acquire(const uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
void store_release(uint64_t* p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// One mapped segment.
struct Mapping {
  std::byte* base = nullptr;
  size_t bytes = 0;
};

class ShmExchange;

// How an exchange cuts a channel's slots of chunk_bytes for records of record_bytes: records per
// ring chunk, the chunk's bytes, and the chunks in flight per receiver.
struct RingGeometry {
  int64_t per_chunk = 1;
  size_t slot_bytes = 0;
  uint64_t slots = 2;
};

RingGeometry ring_geometry(size_t chunk_bytes, size_t record_bytes) {
  RingGeometry g;
  g.per_chunk = static_cast<int64_t>(
      std::clamp(kChunkTarget / record_bytes, size_t{1}, chunk_bytes / record_bytes));
  g.slot_bytes = static_cast<size_t>(g.per_chunk) * record_bytes;
  g.slots = std::clamp(kInFlight / g.slot_bytes, size_t{2}, 2 * chunk_bytes / g.slot_bytes);
  return g;
}

class ShmChannel final : public Channel {
 public:
  ShmChannel(const CommImpl& comm, int64_t num_bytes, size_t output_block_bytes, double timeout_s)
      : rank_(comm.rank),
        size_(comm.size),
        bytes_(static_cast<size_t>(num_bytes)),
        outputs_at_(align_up(bytes_, kOutputAlign)),
        output_block_(align_up(output_block_bytes, kOutputAlign)) {
    header_cap_ = header_capacity(size_);
    const size_t fixed = control_bytes(size_) + header_cap_ * size_;
    DSK_CHECK(bytes_ > fixed + 2 * 64 * static_cast<size_t>(size_), kFn,
              "num_bytes " + std::to_string(num_bytes) + " is too small: the control area alone " +
                  "needs " + std::to_string(fixed) + " bytes");
    chunk_ = (bytes_ - fixed) / (2 * static_cast<size_t>(size_)) / 64 * 64;
    map_all(comm, timeout_s);
    // Each output block keeps the own mapping alive while a tensor uses it.
    for (int i = 0; i < 2 && output_block_ > 0 && outputs_reserved_; ++i) {
      std::byte* at = maps_[rank_].base + outputs_at_ + i * output_block_;
      outputs_[i] = std::shared_ptr<std::byte>(at, [keep = own_](std::byte*) {});
    }
    posted_.assign(size_, 0);
    read_.assign(size_, 0);
    taken_.assign(size_, 0);
    exchanges_.assign(size_, 0);
  }

  ~ShmChannel() override {
    for (int r = 0; r < static_cast<int>(maps_.size()); ++r)
      if (maps_[r].base && r != rank_) munmap(maps_[r].base, maps_[r].bytes);
  }

  size_t max_header_bytes() const override { return header_cap_; }
  size_t chunk_bytes() const override { return chunk_; }
  bool holds_records() const override { return true; }
  // Held records keep their ring chunks (and a rank's own, their buffers): `slots` chunks, and n
  // consecutive records may start at the last record of a chunk.
  int64_t max_held_records(size_t record_bytes) const override {
    if (record_bytes == 0 || record_bytes > chunk_) return 0;
    const RingGeometry g = ring_geometry(chunk_, record_bytes);
    return static_cast<int64_t>(g.slots - 1) * g.per_chunk + 1;
  }
  size_t shared_output_bytes() const override { return outputs_reserved_ ? 2 * output_block_ : 0; }

  Tensor shared_output(const Shape& shape, DType dtype) override {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (static_cast<size_t>(numel) * element_size(dtype) > output_block_) return {};
    for (const std::shared_ptr<std::byte>& block : outputs_)
      if (block && block.use_count() == 1)  // only the channel holds it
        return Tensor::from_blob(block.get(), shape, dtype, {}, block);
    return {};
  }

  std::unique_ptr<Exchange> start(ExchangeSpec& spec, const char* fn) override;

 private:
  friend class ShmExchange;
  // Counter `which` of peer `d` in the segment of `owner`: 0 header posted, 1 header taken, 2
  // chunks posted, 3 chunks taken, 4 reply posted, 5 the reply (where d's rows land in owner's
  // outputs), 6 where owner's rows for d lie in owner's outputs when d reads them in place.
  uint64_t* counter(int owner, int d, int which) const {
    return reinterpret_cast<uint64_t*>(maps_[owner].base +
                                       (static_cast<size_t>(d) * kCountersPerPeer + which) * 64);
  }
  // Offset + 1 of p in this rank's output blocks, or 0 when p is not in them.
  uint64_t output_offset(const std::byte* p) const {
    const std::byte* begin = maps_[rank_].base + outputs_at_;
    if (p == nullptr || p < begin || p >= begin + 2 * output_block_) return 0;
    return static_cast<uint64_t>(p - maps_[rank_].base) + 1;
  }
  std::byte* header(int owner, int d) const {
    return maps_[owner].base + control_bytes(size_) + header_cap_ * d;
  }
  // Ring slot `chunk % slots` of `slot_bytes` in the ring of receiver `d` in `owner`'s segment.
  std::byte* slot(int owner, int d, uint64_t chunk, uint64_t slots, size_t slot_bytes) const {
    return maps_[owner].base + control_bytes(size_) + header_cap_ * size_ +
           static_cast<size_t>(d) * 2 * chunk_ + (chunk % slots) * slot_bytes;
  }

  void map_all(const CommImpl& comm, double timeout_s);

  static constexpr size_t kOutputAlign = size_t{2} << 20;
  int rank_, size_;
  size_t bytes_, header_cap_ = 0, chunk_ = 0;
  size_t outputs_at_ = 0, output_block_ = 0;  // the output blocks' offset and size
  bool outputs_reserved_ = true;              // tmpfs had room for them
  size_t segment_bytes() const { return outputs_at_ + 2 * output_block_; }
  std::vector<Mapping> maps_;
  std::shared_ptr<std::byte> own_;  // this rank's mapping (maps_[rank_])
  std::shared_ptr<std::byte> outputs_[2];
  // Exchanges this channel ran with each peer (itself included). Counted per pair, so that
  // exchanges that leave a peer out (shrink mode) keep the count of every other pair in step.
  std::vector<uint64_t> exchanges_;
  std::vector<uint64_t> posted_;  // chunks posted to each receiver so far
  std::vector<uint64_t> read_;    // chunks read from each sender so far
  std::vector<uint64_t> taken_;   // chunks released to each sender so far (<= read_)
  // Buffers for the chunks a rank sends itself, reused by every exchange.
  // NOTES: buffers that died with their exchange made glibc trim its heap after every
  // operation; each trim is a TLB shootdown that interrupts the other rank's CPU as well (5% of
  // a combine's time on the 2-core VM, T=4096).
  std::vector<std::vector<std::byte>> spare_;
};

// NOTES: rank 0 draws a random name stem and shares it, every rank creates its own segment, all
// map all, and each unlinks its own name once everybody has mapped it: the memory then lives
// exactly as long as some mapping does, so nothing is left in /dev/shm even if a rank dies.
void ShmChannel::map_all(const CommImpl& comm, double timeout_s) {
  uint64_t stem = 0;
  if (rank_ == 0) stem = std::random_device{}() ^ (static_cast<uint64_t>(getpid()) << 20);
  std::vector<uint64_t> stems(size_);
  allgather(comm, &stem, stems.data(), sizeof stem, timeout_s, kFn);
  auto name = [&](int r) {
    return "/dsk_ep_" + std::to_string(stems[0]) + "_" + std::to_string(r);
  };

  // Create and size this rank's segment; every rank learns whether all succeeded.
  std::string error;
  const std::string own = name(rank_);
  const int fd = shm_open(own.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = "shm_open(" + own + ") failed: " + std::strerror(errno);
  } else if (ftruncate(fd, static_cast<off_t>(segment_bytes())) != 0) {
    error = "ftruncate(" + std::to_string(segment_bytes()) + ") failed: " + std::strerror(errno);
  } else if (output_block_ > 0 && posix_fallocate(fd, static_cast<off_t>(outputs_at_),
                                                  static_cast<off_t>(2 * output_block_)) != 0) {
    // NOTES: tmpfs gives pages on first touch, and a touch it cannot serve is a SIGBUS; the
    // output blocks are therefore reserved up front, and without room for them dispatch outputs
    // come from private memory (peers only write where this rank's reply points).
    outputs_reserved_ = false;
  }
  if (fd >= 0) close(fd);
  int ok = error.empty() ? 1 : 0;
  std::vector<int> oks(size_);
  allgather(comm, &ok, oks.data(), sizeof ok, timeout_s, kFn);

  maps_.resize(size_);
  for (int r = 0; r < size_ && ok && *std::min_element(oks.begin(), oks.end()); ++r) {
    const int pfd = shm_open(name(r).c_str(), O_RDWR, 0600);
    void* p = pfd < 0 ? MAP_FAILED
                      : mmap(nullptr, segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    if (pfd >= 0) close(pfd);
    if (p == MAP_FAILED) {
      error = "mapping rank " + std::to_string(r) + "'s segment failed: " + std::strerror(errno);
      ok = 0;
      break;
    }
    maps_[r] = {static_cast<std::byte*>(p), segment_bytes()};
  }
  if (ok) std::memset(maps_[rank_].base, 0, control_bytes(size_));  // counters start at 0
  allgather(comm, &ok, oks.data(), sizeof ok, timeout_s, kFn);
  shm_unlink(own.c_str());
  if (*std::min_element(oks.begin(), oks.end()) == 0) {
    for (Mapping& m : maps_)
      if (m.base) munmap(m.base, m.bytes);
    maps_.clear();
    DSK_FAIL(kFn, error.empty() ? "another rank could not set up its shared memory" : error);
  }
  own_ = std::shared_ptr<std::byte>(maps_[rank_].base,
                                    [bytes = segment_bytes()](std::byte* p) { munmap(p, bytes); });
}

// One exchange in flight on a ShmChannel; poll() moves whatever is ready.
class ShmExchange final : public Exchange {
 public:
  ShmExchange(ShmChannel& channel, ExchangeSpec& spec, const char* fn)
      : ch_(channel), spec_(spec), R_(channel.size_) {
    DSK_CHECK(spec.header_bytes <= ch_.header_cap_, fn, "internal: header larger than its slot");
    DSK_CHECK(spec.record_bytes <= ch_.chunk_, fn,
              "the buffer is too small: one row needs " + std::to_string(spec.record_bytes) +
                  " bytes, a slot holds " + std::to_string(ch_.chunk_) +
                  " (size the buffer with Buffer::get_buffer_size_hint)");
    const RingGeometry g = ring_geometry(ch_.chunk_, spec.record_bytes);
    per_chunk_ = g.per_chunk;
    slot_bytes_ = g.slot_bytes;
    slots_ = g.slots;
    sent_.assign(R_, 0);
    got_.assign(R_, 0);
    recv_total_.assign(R_, 0);
    send_total_.assign(R_, 0);
    for (int d = 0; d < R_; ++d) send_total_[d] = chunks_of(spec.send_records[d]);
    header_posted_.assign(R_, false);
    header_read_.assign(R_, false);
    ring_free_.assign(R_, false);
    held_.resize(R_);
    rows_to_.assign(R_, nullptr);
    // A reply only says where rows land; without direct_dest they never do.
    reply_read_.assign(R_, spec.direct_row_bytes == 0 || !spec.direct_dest);
    rows_from_.assign(R_, false);
    rows_in_place_to_.assign(R_, 0);
    rows_in_place_from_.assign(R_, nullptr);
    seq_.assign(R_, 0);
    left_out_.assign(R_, false);
    for (int p = 0; p < R_; ++p) {
      if (spec.masked.empty() || !spec.masked[p]) {
        seq_[p] = ++ch_.exchanges_[p];
      } else {
        leave_out(p);
      }
    }
    for (int d = 0; d < R_; ++d)
      if (d != ch_.rank_ && !left_out_[d]) rows_in_place_to_[d] = rows_in_place_offset(d);
  }

  bool has_headers() const override { return headers_left_ == 0; }

  // Peers this exchange still waits for: those whose header or records have not all arrived,
  // and with `sending`, also those that did not take this rank's header or chunks (such a peer
  // may itself be waiting for a third rank, so it is named only once the first kind is gone).
  std::vector<int> stalled_peers(bool sending) const override {
    std::vector<bool> needed(R_, false);
    if (headers_left_ == 0 && spec_.waiting_for) {
      for (int p : spec_.waiting_for()) needed[p] = true;
    } else {
      for (int p = 0; p < R_; ++p) needed[p] = headers_left_ == 0 && got_[p] < recv_total_[p];
    }
    std::vector<int> peers;
    for (int p = 0; p < R_; ++p) {
      if (p == ch_.rank_ || left_out_[p]) continue;
      const bool receiving = !header_read_[p] || needed[p];
      const bool sends = !header_posted_[p] || sent_[p] < send_total_[p] || rows_still_read(p);
      if (receiving || (sending && sends)) peers.push_back(p);
    }
    return peers;
  }

  // Leaves peer p out of the rest of the exchange: nothing more is sent to it or read from it,
  // and the operation learns it (ExchangeSpec::on_drop) to drop what p already sent.
  void drop(int p) override {
    if (p == ch_.rank_ || left_out_[p]) return;
    if (spec_.masked.empty()) spec_.masked.assign(R_, 0);
    spec_.masked[p] = 1;
    const bool after_headers = headers_left_ == 0;
    leave_out(p);
    held_[p].clear();  // p's chunks stay mapped; nothing reads them any more
    if (spec_.on_drop) spec_.on_drop(p, after_headers);
    if (!after_headers && headers_left_ == 0) headers_complete();
  }

  bool poll() override {
    const bool posted = post_headers();  // both run every poll
    bool moved = read_headers() || posted;
    bool done = headers_left_ == 0 && headers_to_post_ == 0;
    for (int d = 0; d < R_; ++d) {
      if (d != ch_.rank_ && send(d)) moved = true;
      done = done && sent_[d] == send_total_[d] && !rows_still_read(d);
    }
    if (headers_left_ == 0) {
      for (int s = 0; s < R_; ++s) {
        if (s == ch_.rank_ ? to_self() : receive(s)) moved = true;
        if ((spec_.hold || spec_.hold_rows) && release(s)) moved = true;
        done = done && got_[s] == recv_total_[s] && held_[s].empty();
      }
    }
    moved_ = moved;
    return done;
  }

  bool moved() const override { return moved_; }

 private:
  int64_t chunks_of(int64_t records) const { return (records + per_chunk_ - 1) / per_chunk_; }

  // A header goes out once the receiver took the previous exchange's one.
  bool post_headers() {
    bool moved = false;
    for (int d = 0; d < R_ && headers_to_post_ > 0; ++d) {
      if (header_posted_[d] || load_acquire(ch_.counter(ch_.rank_, d, 1)) + 1 < seq_[d]) continue;
      std::memcpy(ch_.header(ch_.rank_, d), spec_.send_headers.data() + spec_.header_bytes * d,
                  spec_.header_bytes);
      __atomic_store_n(ch_.counter(ch_.rank_, d, 6), rows_in_place_to_[d], __ATOMIC_RELAXED);
      store_release(ch_.counter(ch_.rank_, d, 0), seq_[d]);
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
      if (header_read_[s] || load_acquire(ch_.counter(s, ch_.rank_, 0)) < seq_[s]) continue;
      std::memcpy(spec_.recv_headers.data() + spec_.header_bytes * s, ch_.header(s, ch_.rank_),
                  spec_.header_bytes);
      if (const uint64_t at = __atomic_load_n(ch_.counter(s, ch_.rank_, 6), __ATOMIC_RELAXED)) {
        DSK_CHECK(spec_.hold_rows != nullptr, "ep::Buffer (shared memory)",
                  "internal: rank " + std::to_string(s) +
                      " leaves its rows in place for an operation that cannot read them there");
        rows_in_place_from_[s] = ch_.maps_[s].base + (at - 1);
      }
      store_release(ch_.counter(s, ch_.rank_, 1), seq_[s]);
      header_read_[s] = true;
      --headers_left_;
      moved = true;
    }
    if (moved && headers_left_ == 0) headers_complete();
    return moved;
  }

  void headers_complete() {
    spec_.on_headers();
    for (int s = 0; s < R_; ++s)
      recv_total_[s] = left_out_[s] ? 0 : chunks_of(spec_.recv_records[s]);
    if (spec_.direct_row_bytes > 0 && spec_.direct_dest) reply_with_destinations();
  }

  // Peer p takes no further part: its header counts as posted and read, its records as sent and
  // received (the pair's sequence number stays where it is when p is left out from the start).
  void leave_out(int p) {
    left_out_[p] = true;
    if (!header_posted_[p]) {
      header_posted_[p] = true;
      --headers_to_post_;
    }
    if (!header_read_[p]) {
      header_read_[p] = true;
      --headers_left_;
    }
    send_total_[p] = sent_[p];
    recv_total_[p] = got_[p];
    reply_read_[p] = true;
    rows_in_place_to_[p] = 0;
  }

  // Offset + 1 in this rank's segment of its rows to d when d may read them there (see
  // ExchangeSpec::rows_readable_in_place), else 0.
  uint64_t rows_in_place_offset(int d) const {
    const int64_t n = spec_.send_records[d];
    if (!spec_.rows_readable_in_place || !spec_.hold_rows || n == 0) return 0;
    const std::byte* rows = spec_.contiguous_rows(d, 0, n);
    const uint64_t begin = ch_.output_offset(rows);
    if (begin == 0 ||
        ch_.output_offset(rows + static_cast<size_t>(n) * spec_.direct_row_bytes - 1) == 0)
      return 0;
    return begin;
  }

  // Whether d may still be reading this rank's rows in place: it has not released every chunk.
  bool rows_still_read(int d) const {
    return rows_in_place_to_[d] != 0 &&
           load_acquire(ch_.counter(ch_.rank_, d, 3)) != ch_.posted_[d];
  }

  // Tells every sender where its rows go in this rank's outputs (or that they travel in the
  // records); this rank's own rows are written there directly.
  void reply_with_destinations() {
    const int me = ch_.rank_;
    for (int s = 0; s < R_; ++s) {
      if (left_out_[s]) continue;
      std::byte* dest = spec_.direct_dest(s);
      const uint64_t offset = ch_.output_offset(dest);
      rows_from_[s] = offset != 0;
      if (s == me) {
        rows_to_[me] = offset != 0 ? dest : nullptr;
        continue;
      }
      __atomic_store_n(ch_.counter(me, s, 5), offset, __ATOMIC_RELAXED);
      store_release(ch_.counter(me, s, 4), seq_[s]);
    }
  }

  // Sender side: whether d's reply for this exchange arrived (then rows_to_[d] is set).
  bool has_reply(int d) {
    if (reply_read_[d]) return true;
    if (load_acquire(ch_.counter(d, ch_.rank_, 4)) < seq_[d]) return false;
    const uint64_t offset = __atomic_load_n(ch_.counter(d, ch_.rank_, 5), __ATOMIC_RELAXED);
    rows_to_[d] = offset != 0 ? ch_.maps_[d].base + (offset - 1) : nullptr;
    reply_read_[d] = true;
    return true;
  }

  // Packs records [first, first + n) for d at dst, their rows straight to d's output if d has one.
  void pack(int d, int64_t first, int64_t n, std::byte* dst) {
    if (rows_in_place_to_[d] != 0) {  // d reads the rows where they are: the tails only
      spec_.pack_direct(d, first, n, dst, nullptr);
    } else if (rows_to_[d] != nullptr) {
      spec_.pack_direct(d, first, n, dst,
                        rows_to_[d] + static_cast<size_t>(first) * spec_.direct_row_bytes);
    } else {
      spec_.pack(d, first, n, dst);
    }
  }
  void unpack(int s, int64_t first, int64_t n, const std::byte* src) {
    if (rows_from_[s]) {
      spec_.unpack_direct(s, first, n, src);
    } else {
      spec_.unpack(s, first, n, src);
    }
  }

  // One chunk of this rank's records to itself, through a buffer of this process (in the
  // caches), not the ring. Held chunks keep their buffer; at most a ring's worth are held.
  bool to_self() {
    const int me = ch_.rank_;
    if (sent_[me] == send_total_[me] || held_[me].size() >= slots_) return false;
    if (spec_.hold && spec_.own_record) {  // read where they are: nothing to pack or release
      for (int64_t i = 0; i < spec_.send_records[me]; ++i)
        spec_.hold(me, i, 1, spec_.own_record(i));
      sent_[me] = send_total_[me];
      got_[me] = recv_total_[me];
      return true;
    }
    std::vector<std::byte> buffer;
    if (!ch_.spare_.empty()) {
      buffer = std::move(ch_.spare_.back());
      ch_.spare_.pop_back();
    }
    buffer.resize(slot_bytes_);
    const int64_t first = sent_[me] * per_chunk_;
    const int64_t n = std::min(per_chunk_, spec_.send_records[me] - first);
    // Rows the receiver can read where they are (hold_rows) are not copied.
    const std::byte* rows =
        spec_.hold_rows && spec_.pack_direct ? spec_.contiguous_rows(me, first, n) : nullptr;
    if (rows != nullptr) {
      spec_.pack_direct(me, first, n, buffer.data(), nullptr);
      spec_.hold_rows(me, first, n, buffer.data(), rows);
      held_[me].push_back(first + n);
      self_held_.push_back(std::move(buffer));
    } else if (spec_.hold) {
      pack(me, first, n, buffer.data());
      spec_.hold(me, first, n, buffer.data());
      held_[me].push_back(first + n);
      self_held_.push_back(std::move(buffer));
    } else {
      pack(me, first, n, buffer.data());
      unpack(me, first, n, buffer.data());
      ch_.spare_.push_back(std::move(buffer));
    }
    ++sent_[me];
    ++got_[me];
    return true;
  }

  // Fills free ring slots for receiver d (the receiver copies one while we fill the next).
  bool send(int d) {
    bool moved = false;
    uint64_t& posted = ch_.posted_[d];
    // The ring's geometry is this exchange's: wait until d took the earlier exchanges' chunks.
    if (!ring_free_[d] && sent_[d] < send_total_[d])
      ring_free_[d] = load_acquire(ch_.counter(ch_.rank_, d, 3)) == posted;
    if (sent_[d] < send_total_[d] && !has_reply(d)) return false;
    while (ring_free_[d] && sent_[d] < send_total_[d] &&
           posted - load_acquire(ch_.counter(ch_.rank_, d, 3)) < slots_) {
      const int64_t first = sent_[d] * per_chunk_;
      const int64_t n = std::min(per_chunk_, spec_.send_records[d] - first);
      pack(d, first, n, ch_.slot(ch_.rank_, d, posted, slots_, slot_bytes_));
      store_release(ch_.counter(ch_.rank_, d, 2), ++posted);
      ++sent_[d];
      moved = true;
    }
    return moved;
  }

  bool receive(int s) {
    bool moved = false;
    uint64_t& read = ch_.read_[s];
    while (got_[s] < recv_total_[s] && load_acquire(ch_.counter(s, ch_.rank_, 2)) > read) {
      const int64_t first = got_[s] * per_chunk_;
      const int64_t n = std::min(per_chunk_, spec_.recv_records[s] - first);
      const std::byte* src = ch_.slot(s, ch_.rank_, read++, slots_, slot_bytes_);
      if (rows_in_place_from_[s] != nullptr) {
        spec_.hold_rows(
            s, first, n, src,
            rows_in_place_from_[s] + static_cast<size_t>(first) * spec_.direct_row_bytes);
        held_[s].push_back(first + n);
      } else if (spec_.hold) {
        spec_.hold(s, first, n, src);
        held_[s].push_back(first + n);
      } else {
        unpack(s, first, n, src);
        store_release(ch_.counter(s, ch_.rank_, 3), ++ch_.taken_[s]);
      }
      ++got_[s];
      moved = true;
    }
    return moved;
  }

  // Gives back the held chunks from s that the receiver no longer reads, oldest first.
  bool release(int s) {
    if (held_[s].empty()) return false;
    const int64_t done = spec_.released(s);
    bool moved = false;
    while (!held_[s].empty() && held_[s].front() <= done) {
      held_[s].pop_front();
      if (s == ch_.rank_) {
        ch_.spare_.push_back(std::move(self_held_.front()));
        self_held_.pop_front();
      } else {
        store_release(ch_.counter(s, ch_.rank_, 3), ++ch_.taken_[s]);
      }
      moved = true;
    }
    return moved;
  }

  ShmChannel& ch_;
  ExchangeSpec& spec_;
  int R_;
  int64_t per_chunk_ = 1;       // records per chunk
  size_t slot_bytes_ = 0;       // bytes of a ring slot: per_chunk_ records
  uint64_t slots_ = 2;          // ring slots per receiver in this exchange
  std::vector<uint64_t> seq_;   // per peer: this exchange's number in the pair's sequence
  std::vector<bool> left_out_;  // per peer: masked (shrink mode) or dropped after a timeout
  int headers_to_post_ = R_;
  int headers_left_ = R_;
  bool moved_ = false;
  std::vector<bool> header_posted_, header_read_;
  std::vector<bool> ring_free_;  // per receiver: no earlier exchange's chunk is left in its ring
  // Direct rows: per receiver, where its rows go (null: in the records) and whether its reply
  // was read; per sender, whether its rows land directly.
  std::vector<std::byte*> rows_to_;
  std::vector<bool> reply_read_, rows_from_;
  // Rows read in place: per receiver, the offset + 1 of this rank's rows to it (0: they travel),
  // and per sender, where its rows to this rank lie in its segment (null: they travel).
  std::vector<uint64_t> rows_in_place_to_;
  std::vector<const std::byte*> rows_in_place_from_;
  // Per sender: the end (in records) of each chunk held, oldest first (hold mode).
  std::vector<std::deque<int64_t>> held_;
  std::deque<std::vector<std::byte>> self_held_;  // buffers of the held chunks to this rank
  std::vector<int64_t> sent_, send_total_, got_, recv_total_;
};

std::unique_ptr<Exchange> ShmChannel::start(ExchangeSpec& spec, const char* fn) {
  return std::make_unique<ShmExchange>(*this, spec, fn);
}

}  // namespace

std::unique_ptr<Channel> make_shm_channel(const CommImpl& comm, int64_t num_bytes,
                                          size_t output_block_bytes, double timeout_s) {
  return std::make_unique<ShmChannel>(comm, num_bytes, output_block_bytes, timeout_s);
}

}  // namespace dsk::ep::detail
