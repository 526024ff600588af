// The MPI transport (ranks on different hosts): counts then Alltoallv. The headers travel in one
// MPI_Ialltoall, the records, packed per destination, in one MPI_Ialltoallv whose element is a
// contiguous datatype of one record (so counts stay small integers; a rank's records to itself
// are read where they were packed). Everything is non-blocking
// and polled with the EP timeout, so a dead peer raises dsk::Error instead of hanging.
//
// Direct rows (ExchangeSpec::direct_*) do not pass through a packed copy: the records travel
// as their dense tails (ExchangeSpec::tail_bytes), and the rows travel point to point, each
// message a block of rows that are contiguous at both ends:
//   - operations that read rows in place (hold_rows: combine, expand-mode dispatch): messages of
//     a fixed number of rows (chunk_bytes), which both ends cut from the row counts alone,
//     received into a ring of kRingChunks chunk buffers per source, each handed to the operation
//     as soon as it and the records arrived and posted again for a later chunk once the
//     operation released its rows, so the operation reads rows while they sit in the caches
//     (a chunk whose rows are not consecutive at the sender is packed into a send ring first);
//   - the others (dispatch): the sender cuts its rows where they stop being consecutive and at
//     kMessageChunks chunks, and the receiver probes each message for its size and receives it
//     at the next rows of its output (direct_dest), or, without an output (rare), at the head of
//     each record of a buffer of whole records, whose tails are copied in once everything arrived.
// A rank's rows to itself are copied once (dispatch, non-temporal stores where large) or read
// where they are (hold_rows, in runs of consecutive rows).
//
// NOTES: Open MPI's shared-memory transport copies a message whose two ends are contiguous once
// (CMA: the receiver reads the sender's memory), and any other message twice, through its
// fragments, with both ranks inside MPI calls; the rows therefore go contiguously to contiguous
// places, in chunks, so a gathered chunk costs no more than its own copy. Measured in docs/ep.md.
// (docs/ep.md also compares this transport with the one-sided one, transport_mpi_rma.cpp.)
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include <dsk/core/error.hpp>
#include <dsk/core/tensor.hpp>

#include "core/copy.hpp"
#include "ep/internal.hpp"

namespace dsk::ep::detail {

using dsk::detail::copy_row;
using dsk::detail::kStreamCopyBytes;
using dsk::detail::stream_fence;
namespace {

// The most bytes of rows one message carries (whole rows, at least one), and the chunks a combine
// keeps posted per source. A buffer of num_bytes per rank uses chunks of at most
// num_bytes / (R * kRingChunks), so that its rings take no more than the buffer says (and tests
// with small buffers cut an exchange into many chunks).
// NOTES: every message costs a rendezvous (the receiver's request, its single copy, the
// sender's acknowledgement) and the pinning of its pages; T=4096 2 ranks on the AMD Zen 5 VM, a
// driver alternating the combine with MPI_Alltoallv of the same bytes, three rounds: 256 KB
// chunks 0.82-0.89x, 512 KB 0.89-0.93x, 1 MB 0.93-0.98x, 2 MB 0.94-0.99x (a ring of 4 MB per
// source still sits in the last-level cache).
constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr int kRingChunks = 4;
// Probed messages (operations without hold_rows) carry at most this many chunks of rows.
constexpr size_t kMessageChunks = 4;
// A rank's rows to itself are copied between polls in slices of about this many bytes, so this
// rank keeps moving its messages while it copies.
constexpr size_t kSelfSliceBytes = size_t{1} << 20;

// Bytes an exchange works in, grown as needed (the contents are not kept when it grows), in
// Tensor memory: 64-byte aligned, and 2 MiB aligned and advised as huge pages when large.
// NOTES: Open MPI's single copy (CMA) pins every page of a message at both ends, and the rings
// send and receive every row of a combine; in 4 KB pages (std::vector) the single-reduction
// combine (T=4096, 2 ranks, AMD Zen 5 VM, driver alternated) took 63-85 ms against 53-57 ms with
// every heap allocation in huge pages (glibc.malloc.hugetlb=1). Measured in docs/ep.md.
class ScratchBytes {
 public:
  std::byte* reserve(size_t bytes) {
    if (!memory_.defined() || memory_.nbytes() < bytes)
      memory_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8);
    return data();
  }
  std::byte* data() const { return static_cast<std::byte*>(memory_.data_ptr()); }
  // An abandoned exchange may still be written by MPI: the memory is never freed.
  void leak() { new Tensor(std::move(memory_)); }

 private:
  Tensor memory_;
};

// Memory an exchange works in, kept by the channel between exchanges (fresh pages cost a fault
// each, and held records and rows stay readable until the next exchange starts).
struct Scratch {
  ScratchBytes send, recv;  // packed records (whole, or tails with direct rows)
  ScratchBytes rows;        // the combine rings
  ScratchBytes whole;       // whole records rebuilt from rows and tails
  ScratchBytes gathered;    // the send rings of chunks whose rows are not consecutive
};

class MpiChannel final : public Channel {
 public:
  // A communicator of its own per buffer: a collective a failed exchange left pending can never
  // match another buffer's traffic.
  MpiChannel(const CommImpl& comm, int64_t num_bytes, double timeout_s)
      : rank_(comm.rank),
        size_(comm.size),
        chunk_bytes_(std::clamp<size_t>(static_cast<size_t>(std::max<int64_t>(num_bytes, 0)) /
                                            (static_cast<size_t>(comm.size) * kRingChunks),
                                        1, kChunkBytes)) {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Comm_idup(comm.comm, &comm_, &request), "ep::Buffer (MPI)", "MPI_Comm_idup");
    wait_request(request, timeout_s, "ep::Buffer (MPI)", "the other ranks to create the buffer");
  }

  ~MpiChannel() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  size_t max_header_bytes() const override { return header_capacity(size_); }
  size_t chunk_bytes() const override { return 0; }
  bool holds_records() const override { return true; }
  // Records without direct rows are all held once the exchange's Alltoallv completed; direct
  // rows wait in their source's ring of kRingChunks chunks, a chunk reposted once no unreduced
  // token reads it, so a token's records from one rank fit up to this many (counted in whole
  // records, which take at least a row's room).
  int64_t max_held_records(size_t record_bytes) const override {
    const auto per_chunk = std::max<int64_t>(
        1, static_cast<int64_t>(chunk_bytes_ / std::max<size_t>(record_bytes, 1)));
    return (kRingChunks - 1) * per_chunk + 1;
  }

  std::unique_ptr<Exchange> start(ExchangeSpec& spec, const char* fn) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_, size_;
  size_t chunk_bytes_;  // the most bytes of rows per message
  Scratch scratch_;
};

// What happens to the rows from one source.
enum class RowsTo {
  none,     // no direct rows: they are in the records
  dest,     // the operation's output (direct_dest)
  ring,     // chunk buffers handed over one by one (hold_rows)
  records,  // the head of each received record
};

// The receive side of one source's direct rows.
struct Source {
  RowsTo to = RowsTo::none;
  std::byte* dest = nullptr;       // dest: row 0's place
  std::byte* ring = nullptr;       // ring: kRingChunks chunk buffers
  int64_t chunks = 0;              // ring: messages from this source
  int64_t landed = 0;              // probed: rows whose receive was posted
  int64_t posted = 0;              // ring: chunks whose receive was posted
  int64_t handed = 0;              // ring: chunks handed to the operation
  std::vector<bool> arrived;       // ring: per chunk
  std::vector<MPI_Request> slots;  // ring: the receive posted in each buffer
};

// The send side of one destination's ring chunks (combine rows): chunks go out in order, those
// whose rows are not consecutive in the sender's tensor packed into one of kRingChunks buffers,
// reused once the receiver took the chunk it held.
struct Sink {
  std::vector<const std::byte*> blocks;  // per chunk: its rows where they are, or null (packed)
  int64_t next = 0;                      // chunks [0, next) were sent
  std::byte* ring = nullptr;             // kRingChunks packing buffers, or null if never needed
  std::vector<MPI_Request> slots;        // the send from each buffer
};

// Stage 0: headers in flight (MPI_Ialltoall); stage 1: records (MPI_Ialltoallv) and rows in
// flight; stage 2: done.
class MpiExchange final : public Exchange {
 public:
  MpiExchange(MPI_Comm comm, int rank, int size, size_t chunk_bytes, ExchangeSpec& spec,
              const char* fn, Scratch& scratch)
      : comm_(comm),
        me_(rank),
        R_(size),
        chunk_bytes_(chunk_bytes),
        spec_(spec),
        fn_(fn),
        send_buf_(scratch.send),
        recv_buf_(scratch.recv),
        rows_buf_(scratch.rows),
        whole_buf_(scratch.whole),
        gathered_buf_(scratch.gathered) {
    check_mpi(MPI_Ialltoall(spec.send_headers.data(), static_cast<int>(spec.header_bytes), MPI_BYTE,
                            spec.recv_headers.data(), static_cast<int>(spec.header_bytes), MPI_BYTE,
                            comm_, &request_),
              fn, "MPI_Ialltoall");
  }

  // NOTES: an exchange abandoned after a timeout still has requests pending that a late peer may
  // complete; MPI could then write into the buffers, so they are leaked on purpose.
  ~MpiExchange() override {
    bool pending = request_ != MPI_REQUEST_NULL;
    for (MPI_Request r : requests_) pending = pending || r != MPI_REQUEST_NULL;
    for (const Source& s : sources_)
      for (MPI_Request r : s.slots) pending = pending || r != MPI_REQUEST_NULL;
    for (const Sink& s : sinks_)
      for (MPI_Request r : s.slots) pending = pending || r != MPI_REQUEST_NULL;
    if (!pending) {
      for (MPI_Datatype* t : {&record_, &row_type_})
        if (*t != MPI_DATATYPE_NULL) MPI_Type_free(t);
      for (MPI_Datatype& t : types_) MPI_Type_free(&t);
    } else {
      for (ScratchBytes* b : {&send_buf_, &recv_buf_, &rows_buf_, &whole_buf_, &gathered_buf_})
        b->leak();
      new std::vector<int>(std::move(recv_counts_));
      new std::vector<int>(std::move(mpi_send_counts_));
      new std::vector<int>(std::move(mpi_recv_counts_));
    }
  }

  bool has_headers() const override { return stage_ > 0; }
  bool moved() const override { return moved_; }

  bool poll() override {
    moved_ = false;
    if (stage_ == 2) return true;
    // NOTES: Open MPI moves a non-blocking operation only inside MPI calls, one fragment at a
    // time, so each poll keeps testing for up to a millisecond before handing back to the
    // back-off.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    do {
      if (stage_ == 0) {
        int done = 0;
        check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
        if (!done) continue;
        moved_ = true;
        spec_.on_headers();
        post();
        stage_ = 1;
        return false;  // the caller may stop at the headers (asynchronous operations)
      }
      if (advance()) {
        finish();
        stage_ = 2;
        return true;
      }
    } while (std::chrono::steady_clock::now() < until);
    return false;
  }

 private:
  size_t row_bytes() const { return spec_.direct_row_bytes; }
  bool direct() const {
    return spec_.direct_row_bytes > 0 && spec_.direct_src && spec_.pack_direct;
  }
  // Rows per message, and the rows of chunk c of n rows.
  int64_t chunk_rows() const {
    return std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes_ / row_bytes()));
  }
  int64_t chunk_first(int64_t c) const { return c * chunk_rows(); }
  int64_t chunk_size(int64_t n, int64_t c) const {
    return std::min(chunk_rows(), n - chunk_first(c));
  }
  int64_t chunks_of(int64_t n) const { return (n + chunk_rows() - 1) / chunk_rows(); }
  // Whether rows travel in probed messages (see the file comment): the same on every rank.
  bool probed() const { return !spec_.hold_rows; }
  // A ring slot: one chunk, rounded up to whole cache lines.
  static constexpr size_t kAlign = 64;
  size_t slot_bytes() const {
    return align_up(static_cast<size_t>(chunk_rows()) * row_bytes(), kAlign);
  }
  // Bytes per record in the record messages: a tail with direct rows, else a whole record.
  size_t stride() const { return direct() ? spec_.tail_bytes() : spec_.record_bytes; }
  // Records to this rank itself read where they already are (ExchangeSpec::own_record).
  // With direct rows only when a record is its row (no tail to read beside it).
  bool own_records() const {
    return spec_.hold && spec_.own_record && (!direct() || spec_.tail_bytes() == 0);
  }
  // This rank's records to itself are read where post() packed them.
  const std::byte* records_of(int r) const {
    if (r == me_) return send_buf_.data() + static_cast<size_t>(send_displs_[r]) * stride();
    return recv_buf_.data() + static_cast<size_t>(recv_displs_[r]) * stride();
  }
  // Whole records of source r rebuilt from rows and tails (RowsTo::records).
  std::byte* whole_records_of(int r) {
    return whole_buf_.data() + static_cast<size_t>(recv_displs_[r]) * spec_.record_bytes;
  }

  void post() {
    send_counts_.assign(R_, 0);
    send_displs_.assign(R_, 0);
    recv_counts_.assign(R_, 0);
    recv_displs_.assign(R_, 0);
    int64_t send_total = 0, recv_total = 0;
    for (int r = 0; r < R_; ++r) {
      DSK_CHECK(send_total + spec_.send_records[r] <= INT_MAX &&
                    recv_total + spec_.recv_records[r] <= INT_MAX,
                fn_, "more than 2^31 rows in one exchange");
      send_counts_[r] = static_cast<int>(spec_.send_records[r]);
      send_displs_[r] = static_cast<int>(send_total);
      recv_counts_[r] = static_cast<int>(spec_.recv_records[r]);
      recv_displs_[r] = static_cast<int>(recv_total);
      send_total += spec_.send_records[r];
      recv_total += spec_.recv_records[r];
    }
    const size_t rb = stride();
    // At least a byte each, so that data() is never null for MPI.
    send_buf_.reserve(static_cast<size_t>(send_total) * rb + 1);
    recv_buf_.reserve(static_cast<size_t>(recv_total) * rb + 1);
    for (int r = 0; r < R_; ++r) {
      if (send_counts_[r] == 0 || (r == me_ && own_records())) continue;
      std::byte* dst = send_buf_.data() + static_cast<size_t>(send_displs_[r]) * rb;
      if (direct()) {
        spec_.pack_direct(r, 0, send_counts_[r], dst, nullptr);
      } else {
        spec_.pack(r, 0, send_counts_[r], dst);
      }
    }
    // Contiguous records on both ends: Open MPI moves them in one copy. A rank's records to
    // itself stay where they were packed (records_of): Alltoallv would copy them once more.
    DSK_CHECK(send_counts_[me_] == recv_counts_[me_], fn_,
              "internal: this rank sends itself " + std::to_string(send_counts_[me_]) +
                  " records but expects " + std::to_string(recv_counts_[me_]));
    mpi_send_counts_ = send_counts_;
    mpi_recv_counts_ = recv_counts_;
    mpi_send_counts_[me_] = mpi_recv_counts_[me_] = 0;
    check_mpi(MPI_Type_contiguous(static_cast<int>(rb), MPI_BYTE, &record_), fn_,
              "MPI_Type_contiguous");
    MPI_Type_commit(&record_);
    check_mpi(MPI_Ialltoallv(send_buf_.data(), mpi_send_counts_.data(), send_displs_.data(),
                             record_, recv_buf_.data(), mpi_recv_counts_.data(),
                             recv_displs_.data(), record_, comm_, &request_),
              fn_, "MPI_Ialltoallv");
    sources_.assign(R_, {});
    if (direct()) post_rows();
  }

  // The direct rows: every receive that has a place now, then every send.
  void post_rows() {
    check_mpi(MPI_Type_contiguous(static_cast<int>(row_bytes()), MPI_BYTE, &row_type_), fn_,
              "MPI_Type_contiguous");
    MPI_Type_commit(&row_type_);
    size_t ring_bytes = 0;
    const size_t chunk_bytes = slot_bytes();
    for (int r = 0; r < R_; ++r) {
      Source& s = sources_[r];
      if (recv_counts_[r] == 0) continue;
      s.dest = spec_.direct_dest ? spec_.direct_dest(r) : nullptr;
      s.to = s.dest != nullptr ? RowsTo::dest : spec_.hold_rows ? RowsTo::ring : RowsTo::records;
      if (r == me_) continue;
      s.chunks = chunks_of(recv_counts_[r]);
      if (s.to == RowsTo::ring) ring_bytes += kRingChunks * chunk_bytes;
    }
    if (ring_bytes > 0) rows_buf_.reserve(ring_bytes);
    bool whole = false;
    for (const Source& s : sources_) whole = whole || s.to == RowsTo::records;
    if (whole) {
      int64_t recv_total = 0;
      for (int r = 0; r < R_; ++r) recv_total += recv_counts_[r];
      whole_buf_.reserve(static_cast<size_t>(recv_total) * spec_.record_bytes);
    }
    // NOTES: the kernel's copy behind CMA ran 2.5x slower into a destination 16 bytes off a
    // 64-byte line than into an aligned one (58 MB: 46 against 18 ms, source aligned), so every
    // ring slot starts on a line (the scratch does, and slot_bytes() is whole lines).
    size_t ring_at = 0;
    for (int r = 0; r < R_; ++r) {
      Source& s = sources_[r];
      if (r == me_ || recv_counts_[r] == 0) continue;
      if (probed()) {
        receive_probed(r);  // what has arrived; advance() receives the rest
      } else if (s.to == RowsTo::ring) {
        s.ring = rows_buf_.data() + ring_at;
        ring_at += kRingChunks * chunk_bytes;
        s.arrived.assign(static_cast<size_t>(s.chunks), false);
        s.slots.assign(kRingChunks, MPI_REQUEST_NULL);
        while (s.posted < std::min<int64_t>(s.chunks, kRingChunks)) post_ring_chunk(r);
      } else {
        DSK_CHECK(false, fn_, "internal: rows held in place travel in probed messages");
      }
    }
    if (!probed()) reserve_sinks();
    for (int r = 0; r < R_; ++r) {
      if (r == me_) continue;
      if (probed()) {
        send_runs(r);
      } else {  // the receiver cuts the same chunks from the same counts
        send_chunks(r);
      }
    }
    self_rows_ = sources_[me_].to == RowsTo::dest ? recv_counts_[me_] : 0;
  }

  void irecv(void* at, int64_t count, MPI_Datatype type, int source, MPI_Request* request) {
    check_mpi(MPI_Irecv(at, static_cast<int>(count), type, source, kRowsTag, comm_, request), fn_,
              "MPI_Irecv");
  }

  // The sinks of the ring chunks, and kRingChunks packing buffers (on lines) for each
  // destination with a chunk whose rows are not consecutive in the sender's tensor (the slot
  // rows of a single-reduction combine).
  void reserve_sinks() {
    sinks_.assign(R_, {});
    std::vector<bool> packs(R_, false);
    size_t bytes = 0;
    for (int r = 0; r < R_; ++r) {
      if (r == me_) continue;
      std::vector<const std::byte*>& blocks = sinks_[r].blocks;
      blocks.resize(static_cast<size_t>(chunks_of(send_counts_[r])));
      for (size_t c = 0; c < blocks.size(); ++c) {
        const auto chunk = static_cast<int64_t>(c);
        blocks[c] =
            spec_.contiguous_rows(r, chunk_first(chunk), chunk_size(send_counts_[r], chunk));
        packs[r] = packs[r] || blocks[c] == nullptr;
      }
      if (packs[r]) bytes += kRingChunks * slot_bytes();
    }
    if (bytes == 0) return;
    std::byte* at = gathered_buf_.reserve(bytes);
    for (int r = 0; r < R_; ++r) {
      if (!packs[r]) continue;
      sinks_[r].ring = at;
      sinks_[r].slots.assign(kRingChunks, MPI_REQUEST_NULL);
      at += kRingChunks * slot_bytes();
    }
  }

  // Sends r's next chunks, in order (the receiver's ring matches them in order): from where the
  // rows are when they are consecutive there, else packed into a free buffer of r's ring (the
  // chunk waits until one is free). True if one went out. NOTES: a datatype gathering the rows
  // where they are (hindexed) made Open MPI copy them twice, through its fragments, which move
  // only while both ranks are inside MPI calls; packed, the receiver reads them in one copy
  // (CMA), and a ring of buffers keeps the packed chunks in the caches until it does.
  bool send_chunks(int r) {
    Sink& sink = sinks_[r];
    bool sent = false;
    const auto chunks = static_cast<int64_t>(sink.blocks.size());
    for (; sink.next < chunks; ++sink.next, sent = true) {
      const int64_t first = chunk_first(sink.next);
      const int64_t n = chunk_size(send_counts_[r], sink.next);
      MPI_Request* request = nullptr;
      const std::byte* block = sink.blocks[static_cast<size_t>(sink.next)];
      if (block != nullptr) {
        request = &requests_.emplace_back();
      } else {
        const size_t slot = static_cast<size_t>(sink.next % kRingChunks);
        request = &sink.slots[slot];
        if (*request != MPI_REQUEST_NULL) {
          int done = 0;
          check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
          if (!done) break;
        }
        std::byte* packed = sink.ring + slot * slot_bytes();
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(packed + static_cast<size_t>(i) * row_bytes(), spec_.direct_src(r, first + i),
                      row_bytes());
        block = packed;
      }
      check_mpi(MPI_Isend(block, static_cast<int>(n), row_type_, r, kRowsTag, comm_, request), fn_,
                "MPI_Isend");
    }
    return sent;
  }

  // Whether every ring chunk to r went out and its packing buffers are free again.
  bool sink_done(int r) {
    Sink& sink = sinks_[r];
    if (sink.next < static_cast<int64_t>(sink.blocks.size())) return false;
    for (MPI_Request& request : sink.slots) {
      if (request == MPI_REQUEST_NULL) continue;
      int done = 0;
      check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
      if (!done) return false;
    }
    return true;
  }

  // Probed messages to r: runs of rows consecutive in the sender's tensor, each at most
  // kMessageChunks chunks, so that both ends of every message are contiguous.
  void send_runs(int r) {
    const int64_t most = chunk_rows() * static_cast<int64_t>(kMessageChunks);
    for (int64_t first = 0; first < send_counts_[r];) {
      const int64_t n = spec_.consecutive_rows(r, first, std::min(most, send_counts_[r] - first));
      check_mpi(MPI_Isend(spec_.direct_src(r, first), static_cast<int>(n), row_type_, r, kRowsTag,
                          comm_, &requests_.emplace_back()),
                fn_, "MPI_Isend");
      first += n;
    }
  }

  // Probed messages from r: receives each message that arrived at r's next rows, in order. The
  // rows go to the output (RowsTo::dest) or to the head of each whole record (RowsTo::records).
  bool receive_probed(int r) {
    Source& s = sources_[r];
    bool moved = false;
    while (s.landed < recv_counts_[r]) {
      int found = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      check_mpi(MPI_Improbe(r, kRowsTag, comm_, &found, &message, &status), fn_, "MPI_Improbe");
      if (!found) break;
      int n = 0;
      check_mpi(MPI_Get_count(&status, row_type_, &n), fn_, "MPI_Get_count");
      DSK_CHECK(n > 0 && s.landed + n <= recv_counts_[r], fn_,
                "rank " + std::to_string(r) + " sent " + std::to_string(n) + " rows after " +
                    std::to_string(s.landed) + " of " + std::to_string(recv_counts_[r]));
      if (s.to == RowsTo::dest) {
        check_mpi(MPI_Imrecv(s.dest + static_cast<size_t>(s.landed) * row_bytes(), n, row_type_,
                             &message, &requests_.emplace_back()),
                  fn_, "MPI_Imrecv");
      } else {
        MPI_Datatype rows = MPI_DATATYPE_NULL;
        check_mpi(MPI_Type_create_hvector(n, 1, static_cast<MPI_Aint>(spec_.record_bytes),
                                          row_type_, &rows),
                  fn_, "MPI_Type_create_hvector");
        MPI_Type_commit(&rows);
        types_.push_back(rows);
        check_mpi(
            MPI_Imrecv(whole_records_of(r) + static_cast<size_t>(s.landed) * spec_.record_bytes, 1,
                       rows, &message, &requests_.emplace_back()),
            fn_, "MPI_Imrecv");
      }
      s.landed += n;
      moved = true;
    }
    return moved;
  }

  // Ring: posts the receive of source r's next chunk into its buffer.
  void post_ring_chunk(int r) {
    Source& s = sources_[r];
    const int64_t c = s.posted++;
    irecv(s.ring + static_cast<size_t>(c % kRingChunks) * slot_bytes(),
          chunk_size(recv_counts_[r], c), row_type_, r, &s.slots[c % kRingChunks]);
  }

  // Moves what can move; returns true once everything arrived and was handed over.
  bool advance() {
    if (request_ != MPI_REQUEST_NULL) {
      int done = 0;
      check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
      if (done) moved_ = true;
    }
    const bool records = request_ == MPI_REQUEST_NULL;
    bool finished = records;
    for (int r = 0; r < R_ && probed() && direct(); ++r) {
      if (r == me_ || recv_counts_[r] == 0) continue;
      if (receive_probed(r)) moved_ = true;
      finished = finished && sources_[r].landed == recv_counts_[r];
    }
    // The oldest pending request first; testing it also moves every other one.
    while (front_ < requests_.size()) {
      int done = 0;
      check_mpi(MPI_Test(&requests_[front_], &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
      if (!done) break;
      ++front_;
      moved_ = true;
    }
    finished = finished && front_ == requests_.size();
    for (int r = 0; r < R_; ++r)
      if (sources_[r].to == RowsTo::ring && !advance_ring(r, records)) finished = false;
    for (int r = 0; r < static_cast<int>(sinks_.size()); ++r) {
      if (r == me_) continue;
      if (send_chunks(r)) moved_ = true;
      if (!sink_done(r)) finished = false;
    }
    if (self_copied_ < self_rows_) {
      copy_self_slice();
      finished = false;
    }
    return finished;
  }

  // Ring of source r: notes arrived chunks and, once the records are in, hands them over in
  // order and posts the chunks after those the operation released. True once all were handed.
  bool advance_ring(int r, bool records) {
    Source& s = sources_[r];
    if (r == me_) {  // this rank's rows, read where they are
      if (records && s.handed == 0 && recv_counts_[r] > 0 && own_records()) {
        for (int64_t i = 0; i < recv_counts_[r]; ++i) spec_.hold(r, i, 1, spec_.own_record(i));
        s.handed = 1;
        moved_ = true;
      } else if (records && s.handed == 0 && recv_counts_[r] > 0) {
        // In runs of rows consecutive in this rank's tensor, none copied.
        for (int64_t first = 0, n = 0; first < recv_counts_[r]; first += n) {
          n = spec_.consecutive_rows(r, first, recv_counts_[r] - first);
          spec_.hold_rows(r, first, n, records_of(r) + static_cast<size_t>(first) * stride(),
                          spec_.direct_src(r, first));
        }
        s.handed = 1;
        moved_ = true;
      }
      return records && s.handed == 1;
    }
    for (int64_t c = s.handed; c < s.posted; ++c) {
      MPI_Request& slot = s.slots[c % kRingChunks];
      if (s.arrived[c] || slot == MPI_REQUEST_NULL) continue;
      int done = 0;
      check_mpi(MPI_Test(&slot, &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
      if (done) {
        s.arrived[c] = true;
        moved_ = true;
      }
    }
    while (records && s.handed < s.chunks && s.arrived[s.handed]) {
      const int64_t c = s.handed++;
      const int64_t first = chunk_first(c);
      spec_.hold_rows(r, first, chunk_size(recv_counts_[r], c),
                      records_of(r) + static_cast<size_t>(first) * stride(),
                      s.ring + static_cast<size_t>(c % kRingChunks) * slot_bytes());
      moved_ = true;
    }
    // A buffer is free once the operation released every row of the chunk it held.
    const int64_t released = spec_.released ? spec_.released(r) : 0;
    while (s.posted < s.chunks && s.posted - kRingChunks < s.handed &&
           chunk_first(s.posted - kRingChunks + 1) <= released) {
      post_ring_chunk(r);
      moved_ = true;
    }
    return s.handed == s.chunks;
  }

  // This rank's rows to its own output, a slice per poll.
  void copy_self_slice() {
    const int64_t rows_per_slice =
        std::max<int64_t>(1, static_cast<int64_t>(kSelfSliceBytes / row_bytes()));
    const int64_t end = std::min(self_rows_, self_copied_ + rows_per_slice);
    std::byte* dest = sources_[me_].dest;
    // Large outputs are written around the caches: nothing reads them before the exchange ends.
    const bool stream = static_cast<size_t>(self_rows_) * row_bytes() >= kStreamCopyBytes;
    for (int64_t i = self_copied_; i < end; ++i)
      copy_row(dest + static_cast<size_t>(i) * row_bytes(), spec_.direct_src(me_, i), row_bytes(),
               stream);
    if (stream && end == self_rows_) stream_fence();
    self_copied_ = end;
    moved_ = true;
  }

  // RowsTo::records: completes source r's whole records with their tails (and, for this rank,
  // its rows) and returns them.
  const std::byte* whole_records(int r) {
    std::byte* whole = whole_records_of(r);
    const size_t rb = spec_.record_bytes, tail = spec_.tail_bytes();
    for (int64_t i = 0; i < recv_counts_[r]; ++i) {
      std::byte* record = whole + static_cast<size_t>(i) * rb;
      if (r == me_) std::memcpy(record, spec_.direct_src(r, i), row_bytes());
      if (tail > 0) std::memcpy(record + row_bytes(), records_of(r) + i * tail, tail);
    }
    return whole;
  }

  // Everything arrived: the records whose rows were not handed over chunk by chunk.
  void finish() {
    for (int r = 0; r < R_; ++r) {
      if (recv_counts_[r] == 0) continue;
      const Source& s = sources_[r];
      switch (s.to) {
        case RowsTo::ring:
          break;  // handed over in advance_ring
        case RowsTo::dest:
          spec_.unpack_direct(r, 0, recv_counts_[r], records_of(r));
          break;
        case RowsTo::records:
        case RowsTo::none: {
          if (r == me_ && own_records()) {
            for (int64_t i = 0; i < recv_counts_[r]; ++i) spec_.hold(r, i, 1, spec_.own_record(i));
            break;
          }
          const std::byte* records = s.to == RowsTo::records ? whole_records(r) : records_of(r);
          if (spec_.hold) {
            spec_.hold(r, 0, recv_counts_[r], records);  // read before the next exchange
          } else {
            spec_.unpack(r, 0, recv_counts_[r], records);
          }
          break;
        }
      }
    }
  }

  static constexpr int kRowsTag = 7;
  MPI_Comm comm_;
  int me_, R_;
  size_t chunk_bytes_;
  ExchangeSpec& spec_;
  const char* fn_;
  MPI_Request request_ = MPI_REQUEST_NULL;  // the headers, then the records
  std::vector<MPI_Request> requests_;       // the rows: sends, and receives other than the rings'
  size_t front_ = 0;                        // requests_[0, front_) completed
  std::vector<MPI_Datatype> types_;         // the rows' datatypes, freed with the exchange
  std::vector<Source> sources_;
  std::vector<Sink> sinks_;  // ring chunks: per destination
  MPI_Datatype record_ = MPI_DATATYPE_NULL, row_type_ = MPI_DATATYPE_NULL;
  int64_t self_rows_ = 0, self_copied_ = 0;  // this rank's rows to its own output
  int stage_ = 0;
  bool moved_ = false;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<int> mpi_send_counts_, mpi_recv_counts_;  // the counts without this rank's own
  ScratchBytes& send_buf_;
  ScratchBytes& recv_buf_;
  ScratchBytes& rows_buf_;
  ScratchBytes& whole_buf_;
  ScratchBytes& gathered_buf_;
};

std::unique_ptr<Exchange> MpiChannel::start(ExchangeSpec& spec, const char* fn) {
  return std::make_unique<MpiExchange>(comm_, rank_, size_, chunk_bytes_, spec, fn, scratch_);
}

}  // namespace

std::unique_ptr<Channel> make_mpi_channel(const CommImpl& comm, int64_t num_bytes,
                                          double timeout_s) {
  return std::make_unique<MpiChannel>(comm, num_bytes, timeout_s);
}

}  // namespace dsk::ep::detail
