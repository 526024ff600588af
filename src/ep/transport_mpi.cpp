// The MPI transport (ranks on different hosts): counts then Alltoallv. The headers travel in one
// MPI_Ialltoall, the records, packed per destination, in one MPI_Ialltoallv whose element is a
// contiguous datatype of one record (so counts stay small integers). Both are non-blocking and
// polled with the EP timeout, so a dead peer raises dsk::Error instead of hanging.
//
// Direct rows (ExchangeSpec::direct_*): the rows travel in point-to-point messages of their own
// whose send datatypes gather them from the sender's tensor and whose receive datatypes place them
// in the receiver's output (or, without one, at the head of each received record); the records,
// packed without their rows, travel as before with a datatype that skips the row. No row is
// copied by the transport itself: MPI moves it as a plain MPI_Alltoallv moves its bytes.
// Received records are handed over in place (ExchangeSpec::hold) when the operation asks so.
// (docs/ep.md compares it with the one-sided transport, transport_mpi_rma.cpp.)
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include <dsk/core/error.hpp>

#include "ep/internal.hpp"

namespace dsk::ep::detail {
namespace {

class MpiChannel final : public Channel {
 public:
  // A communicator of its own per buffer: a collective a failed exchange left pending can never
  // match another buffer's traffic.
  MpiChannel(const CommImpl& comm, double timeout_s) : size_(comm.size) {
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

  std::unique_ptr<Exchange> start(ExchangeSpec& spec, const char* fn) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_;
  // Packed records and received rows, kept between exchanges (fresh pages cost a fault each).
  std::vector<std::byte> send_scratch_, recv_scratch_, rows_scratch_;
};

// Stage 0: headers in flight (MPI_Ialltoall); stage 1: records in flight (MPI_Ialltoallv);
// stage 2: done.
class MpiExchange final : public Exchange {
 public:
  MpiExchange(MPI_Comm comm, int size, ExchangeSpec& spec, const char* fn,
              std::vector<std::byte>& send_buf, std::vector<std::byte>& recv_buf,
              std::vector<std::byte>& rows_buf)
      : comm_(comm),
        R_(size),
        spec_(spec),
        fn_(fn),
        send_buf_(send_buf),
        recv_buf_(recv_buf),
        rows_buf_(rows_buf) {
    check_mpi(MPI_Ialltoall(spec.send_headers.data(), static_cast<int>(spec.header_bytes), MPI_BYTE,
                            spec.recv_headers.data(), static_cast<int>(spec.header_bytes), MPI_BYTE,
                            comm_, &request_),
              fn, "MPI_Ialltoall");
  }

  // NOTES: an exchange abandoned after a timeout still has a collective pending that a late peer
  // may complete; MPI could then write into the buffers, so they are leaked on purpose.
  ~MpiExchange() override {
    const bool rows_pending = std::any_of(rows_requests_.begin(), rows_requests_.end(),
                                          [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
    if (request_ == MPI_REQUEST_NULL && !rows_pending) {
      if (record_ != MPI_DATATYPE_NULL) MPI_Type_free(&record_);
      for (MPI_Datatype& t : rows_types_) MPI_Type_free(&t);
    } else {
      new std::vector<std::byte>(std::move(send_buf_));
      new std::vector<std::byte>(std::move(recv_buf_));
      new std::vector<std::byte>(std::move(rows_buf_));
      new std::vector<int>(std::move(recv_counts_));
    }
  }

  bool has_headers() const override { return stage_ > 0; }
  bool moved() const override { return moved_; }

  bool poll() override {
    moved_ = false;
    if (stage_ == 2) return true;
    // NOTES: Open MPI moves a non-blocking collective only inside MPI_Test, one fragment at a
    // time, so each poll tests for up to a millisecond before handing back to the back-off.
    int done = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    do {
      check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), fn_, "MPI_Test");
      if (!rows_requests_.empty()) {
        int rows_done = 0;
        check_mpi(MPI_Testall(static_cast<int>(rows_requests_.size()), rows_requests_.data(),
                              &rows_done, MPI_STATUSES_IGNORE),
                  fn_, "MPI_Testall");
        done = done && rows_done;
      }
    } while (!done && std::chrono::steady_clock::now() < until);
    if (!done) return false;
    moved_ = true;
    if (stage_ == 0) {
      spec_.on_headers();
      post_records();
      stage_ = 1;
      return false;
    }
    const size_t rb = spec_.record_bytes;
    for (int r = 0; r < R_; ++r) {
      if (recv_counts_[r] == 0) continue;
      const std::byte* records = recv_buf_.data() + static_cast<size_t>(recv_displs_[r]) * rb;
      if (!rows_to_.empty() && rows_to_[r] != nullptr) {
        spec_.unpack_direct(r, 0, recv_counts_[r], records);
      } else if (!rows_at_.empty() && rows_at_[r] != nullptr) {
        spec_.hold_rows(r, 0, recv_counts_[r], records, rows_at_[r]);
      } else if (spec_.hold) {
        spec_.hold(r, 0, recv_counts_[r], records);  // read before the next exchange reuses them
      } else {
        spec_.unpack(r, 0, recv_counts_[r], records);
      }
    }
    stage_ = 2;
    return true;
  }

 private:
  void post_records() {
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
    const size_t rb = spec_.record_bytes;
    send_buf_.resize(std::max(send_buf_.size(), static_cast<size_t>(send_total) * rb));
    recv_buf_.resize(std::max(recv_buf_.size(), static_cast<size_t>(recv_total) * rb));
    const bool direct = spec_.direct_row_bytes > 0 && spec_.direct_src && spec_.pack_direct;
    for (int r = 0; r < R_; ++r) {
      if (send_counts_[r] == 0) continue;
      std::byte* dst = send_buf_.data() + static_cast<size_t>(send_displs_[r]) * rb;
      if (direct) {
        spec_.pack_direct(r, 0, send_counts_[r], dst, nullptr);
      } else {
        spec_.pack(r, 0, send_counts_[r], dst);
      }
    }
    if (direct) {
      post_rows();
      // The records without their rows: the bytes [row, rb) of each rb-byte record.
      const size_t row = spec_.direct_row_bytes;
      MPI_Datatype tail = MPI_DATATYPE_NULL;
      const MPI_Aint at = static_cast<MPI_Aint>(row);
      check_mpi(MPI_Type_create_hindexed_block(1, static_cast<int>(rb - row), &at, MPI_BYTE, &tail),
                fn_, "MPI_Type_create_hindexed_block");
      check_mpi(MPI_Type_create_resized(tail, 0, static_cast<MPI_Aint>(rb), &record_), fn_,
                "MPI_Type_create_resized");
      MPI_Type_free(&tail);
    } else {
      check_mpi(MPI_Type_contiguous(static_cast<int>(rb), MPI_BYTE, &record_), fn_,
                "MPI_Type_contiguous");
    }
    MPI_Type_commit(&record_);
    check_mpi(MPI_Ialltoallv(send_buf_.data(), send_counts_.data(), send_displs_.data(), record_,
                             recv_buf_.data(), recv_counts_.data(), recv_displs_.data(), record_,
                             comm_, &request_),
              fn_, "MPI_Ialltoallv");
  }

  // The direct rows, point to point: per destination one send whose datatype gathers its rows
  // from the sender's memory; per source one receive that places its rows contiguously in the
  // receiver's output, contiguously in rows_buf_ (hold_rows: combine reads them there), or at the
  // head of each of its records. The datatypes hold absolute addresses (buffers are MPI_BOTTOM)
  // and live until the exchange ends.
  // NOTES: Open MPI's shared-memory transport copies a message whose two ends are contiguous
  // once (CMA: the receiver reads the sender's memory), and any other in two, through its
  // fragments; hence rows to contiguous places, and this rank's rows read where they are.
  // NOTES: MPI_Ialltoallw with these datatypes crashed inside Open MPI 4.1's libnbc (free() of
  // an invalid pointer in MPI_Test); point-to-point messages use the pml's datatype engine.
  void post_rows() {
    const size_t row = spec_.direct_row_bytes;
    const size_t rb = spec_.record_bytes;
    MPI_Datatype row_type = MPI_DATATYPE_NULL;
    check_mpi(MPI_Type_contiguous(static_cast<int>(row), MPI_BYTE, &row_type), fn_,
              "MPI_Type_contiguous");
    MPI_Type_commit(&row_type);
    std::vector<MPI_Datatype> send_types(R_, MPI_BYTE), recv_types(R_, MPI_BYTE);
    std::vector<int> send_n(R_, 0), recv_n(R_, 0);
    std::vector<MPI_Aint> at;
    auto placed = [&](MPI_Datatype inner, const void* where, MPI_Datatype* out) {
      MPI_Aint address = 0;
      MPI_Get_address(where, &address);
      check_mpi(MPI_Type_create_hindexed_block(1, 1, &address, inner, out), fn_,
                "MPI_Type_create_hindexed_block");
      MPI_Type_commit(out);
    };
    rows_to_.assign(R_, nullptr);
    rows_at_.assign(R_, nullptr);
    int me = 0;
    MPI_Comm_rank(comm_, &me);
    // Received rows that have no place of their own go to rows_buf_, one block per source, when
    // the operation reads them there (hold_rows).
    std::vector<size_t> staged_at(R_, 0);
    size_t staged = 0;
    for (int r = 0; r < R_; ++r) {
      const bool own_place = spec_.direct_dest && spec_.direct_dest(r) != nullptr;
      if (r == me || recv_counts_[r] == 0 || own_place || !spec_.hold_rows) continue;
      staged_at[r] = staged;
      staged += static_cast<size_t>(recv_counts_[r]) * row;
    }
    if (staged > 0) rows_buf_.resize(std::max(rows_buf_.size(), staged));
    for (int r = 0; r < R_; ++r) {
      if (r == me) {  // copied below, after the messages are posted
        if (recv_counts_[r] > 0) rows_to_[r] = spec_.direct_dest ? spec_.direct_dest(r) : nullptr;
        continue;
      }
      if (const std::byte* block = spec_.contiguous_rows(r, 0, send_counts_[r])) {
        MPI_Datatype rows = MPI_DATATYPE_NULL;
        check_mpi(MPI_Type_contiguous(send_counts_[r], row_type, &rows), fn_,
                  "MPI_Type_contiguous");
        placed(rows, block, &send_types[r]);
        MPI_Type_free(&rows);
        send_n[r] = 1;
      } else if (send_counts_[r] > 0) {
        at.resize(static_cast<size_t>(send_counts_[r]));
        for (int i = 0; i < send_counts_[r]; ++i) MPI_Get_address(spec_.direct_src(r, i), &at[i]);
        check_mpi(
            MPI_Type_create_hindexed_block(send_counts_[r], 1, at.data(), row_type, &send_types[r]),
            fn_, "MPI_Type_create_hindexed_block");
        MPI_Type_commit(&send_types[r]);
        send_n[r] = 1;
      }
      if (recv_counts_[r] > 0) {
        rows_to_[r] = spec_.direct_dest ? spec_.direct_dest(r) : nullptr;
        MPI_Datatype rows = MPI_DATATYPE_NULL;
        if (rows_to_[r] == nullptr && spec_.hold_rows)
          rows_at_[r] = rows_buf_.data() + staged_at[r];
        if (rows_to_[r] != nullptr || rows_at_[r] != nullptr) {
          check_mpi(MPI_Type_contiguous(recv_counts_[r], row_type, &rows), fn_,
                    "MPI_Type_contiguous");
          placed(rows, rows_to_[r] != nullptr ? rows_to_[r] : rows_at_[r], &recv_types[r]);
        } else {
          check_mpi(MPI_Type_create_hvector(recv_counts_[r], 1, static_cast<MPI_Aint>(rb), row_type,
                                            &rows),
                    fn_, "MPI_Type_create_hvector");
          placed(rows, recv_buf_.data() + static_cast<size_t>(recv_displs_[r]) * rb,
                 &recv_types[r]);
        }
        MPI_Type_free(&rows);
        recv_n[r] = 1;
      }
    }
    for (int r = 0; r < R_; ++r) {
      if (recv_n[r] > 0) {
        rows_requests_.emplace_back();
        check_mpi(
            MPI_Irecv(MPI_BOTTOM, 1, recv_types[r], r, kRowsTag, comm_, &rows_requests_.back()),
            fn_, "MPI_Irecv");
        rows_types_.push_back(recv_types[r]);
      }
    }
    for (int r = 0; r < R_; ++r) {
      if (send_n[r] > 0) {
        rows_requests_.emplace_back();
        check_mpi(
            MPI_Isend(MPI_BOTTOM, 1, send_types[r], r, kRowsTag, comm_, &rows_requests_.back()),
            fn_, "MPI_Isend");
        rows_types_.push_back(send_types[r]);
      }
    }
    rows_types_.push_back(row_type);
    // This rank's rows to itself: read where they are when the operation can (hold_rows), else
    // one copy each, where the peer MPI_Alltoallv also copies once.
    if (rows_to_[me] == nullptr && spec_.hold_rows) {
      rows_at_[me] = spec_.contiguous_rows(me, 0, recv_counts_[me]);
      if (rows_at_[me] != nullptr) return;
    }
    for (int i = 0; i < recv_counts_[me]; ++i) {
      std::byte* dst = rows_to_[me] != nullptr
                           ? rows_to_[me] + static_cast<size_t>(i) * row
                           : recv_buf_.data() + static_cast<size_t>(recv_displs_[me] + i) * rb;
      std::memcpy(dst, spec_.direct_src(me, i), row);
    }
  }

  MPI_Comm comm_;
  int R_;
  ExchangeSpec& spec_;
  const char* fn_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  // The direct rows, when the exchange has them: one receive per source and one send per
  // destination on this channel's own communicator, with the datatypes they use.
  static constexpr int kRowsTag = 7;
  std::vector<MPI_Request> rows_requests_;
  std::vector<MPI_Datatype> rows_types_;
  std::vector<std::byte*> rows_to_;        // per source: where its direct rows landed
  std::vector<const std::byte*> rows_at_;  // per source: its rows apart from the records
                                           // (hold_rows), or null
  MPI_Datatype record_ = MPI_DATATYPE_NULL;
  int stage_ = 0;
  bool moved_ = false;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<std::byte>& send_buf_;
  std::vector<std::byte>& recv_buf_;
  std::vector<std::byte>& rows_buf_;
};

std::unique_ptr<Exchange> MpiChannel::start(ExchangeSpec& spec, const char* fn) {
  return std::make_unique<MpiExchange>(comm_, size_, spec, fn, send_scratch_, recv_scratch_,
                                       rows_scratch_);
}

}  // namespace

std::unique_ptr<Channel> make_mpi_channel(const CommImpl& comm, double timeout_s) {
  return std::make_unique<MpiChannel>(comm, timeout_s);
}

}  // namespace dsk::ep::detail
