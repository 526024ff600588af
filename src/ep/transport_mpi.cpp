// The MPI transport (ranks on different hosts): counts then Alltoallv. The headers travel in one
// MPI_Ialltoall, the records, packed per destination, in one MPI_Ialltoallv whose element is a
// contiguous datatype of one record (so counts stay small integers). Both are non-blocking and
// polled with the EP timeout, so a dead peer raises dsk::Error instead of hanging.
// (docs/ep.md compares it with the one-sided transport, transport_mpi_rma.cpp.)
#include <algorithm>
#include <chrono>
#include <climits>

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

  std::unique_ptr<Exchange> start(ExchangeSpec& spec, const char* fn) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_;
  // Packed records, kept between exchanges (fresh pages cost a fault each).
  std::vector<std::byte> send_scratch_, recv_scratch_;
};

// Stage 0: headers in flight (MPI_Ialltoall); stage 1: records in flight (MPI_Ialltoallv);
// stage 2: done.
class MpiExchange final : public Exchange {
 public:
  MpiExchange(MPI_Comm comm, int size, ExchangeSpec& spec, const char* fn,
              std::vector<std::byte>& send_buf, std::vector<std::byte>& recv_buf)
      : comm_(comm), R_(size), spec_(spec), fn_(fn), send_buf_(send_buf), recv_buf_(recv_buf) {
    check_mpi(MPI_Ialltoall(spec.send_headers.data(), static_cast<int>(spec.header_bytes), MPI_BYTE,
                            spec.recv_headers.data(), static_cast<int>(spec.header_bytes), MPI_BYTE,
                            comm_, &request_),
              fn, "MPI_Ialltoall");
  }

  // NOTES: an exchange abandoned after a timeout still has a collective pending that a late peer
  // may complete; MPI could then write into the buffers, so they are leaked on purpose.
  ~MpiExchange() override {
    if (record_ != MPI_DATATYPE_NULL) MPI_Type_free(&record_);
    if (request_ != MPI_REQUEST_NULL) {
      new std::vector<std::byte>(std::move(send_buf_));
      new std::vector<std::byte>(std::move(recv_buf_));
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
    for (int r = 0; r < R_; ++r)
      if (recv_counts_[r] > 0)
        spec_.unpack(r, 0, recv_counts_[r],
                     recv_buf_.data() + static_cast<size_t>(recv_displs_[r]) * rb);
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
    for (int r = 0; r < R_; ++r)
      if (send_counts_[r] > 0)
        spec_.pack(r, 0, send_counts_[r],
                   send_buf_.data() + static_cast<size_t>(send_displs_[r]) * rb);
    check_mpi(MPI_Type_contiguous(static_cast<int>(rb), MPI_BYTE, &record_), fn_,
              "MPI_Type_contiguous");
    MPI_Type_commit(&record_);
    check_mpi(MPI_Ialltoallv(send_buf_.data(), send_counts_.data(), send_displs_.data(), record_,
                             recv_buf_.data(), recv_counts_.data(), recv_displs_.data(), record_,
                             comm_, &request_),
              fn_, "MPI_Ialltoallv");
  }

  MPI_Comm comm_;
  int R_;
  ExchangeSpec& spec_;
  const char* fn_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  MPI_Datatype record_ = MPI_DATATYPE_NULL;
  int stage_ = 0;
  bool moved_ = false;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<std::byte>& send_buf_;
  std::vector<std::byte>& recv_buf_;
};

std::unique_ptr<Exchange> MpiChannel::start(ExchangeSpec& spec, const char* fn) {
  return std::make_unique<MpiExchange>(comm_, size_, spec, fn, send_scratch_, recv_scratch_);
}

}  // namespace

std::unique_ptr<Channel> make_mpi_channel(const CommImpl& comm, double timeout_s) {
  return std::make_unique<MpiChannel>(comm, timeout_s);
}

}  // namespace dsk::ep::detail
