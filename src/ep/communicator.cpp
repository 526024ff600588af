// dsk::ep::Communicator (an MPI communicator), the timeout-aware waits every EP operation uses,
// and EventOverlap.
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include <dsk/core/env.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>

#include "ep/internal.hpp"

namespace dsk::ep {
namespace detail {
namespace {

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "ep::Communicator",
              "MPI_Init_thread");
    std::atexit(finalize_mpi_at_exit);
  });
}

std::shared_ptr<CommImpl> make_comm(MPI_Comm user) {
  auto c = std::make_shared<CommImpl>();
  check_mpi(MPI_Comm_dup(user, &c->comm), "ep::Communicator", "MPI_Comm_dup");
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "ep::Communicator", "MPI_Comm_split_type");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  // Every rank must agree, or one would pick shared memory and another MPI.
  int all_local = node_size == c->size ? 1 : 0;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all_local, 1, MPI_INT, MPI_MIN, c->comm),
            "ep::Communicator", "MPI_Allreduce");
  c->single_host = all_local == 1;
  return c;
}

}  // namespace

CommImpl::~CommImpl() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

void check_mpi(int rc, const char* fn, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  DSK_FAIL(fn, std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

double resolve_timeout_s(double configured) {
  if (configured > 0) return configured;
  const double s = env::get_double("", "EP_TIMEOUT_S", 300.0);
  DSK_CHECK_ARG(s > 0, "dsk::ep", "DSK_EP_TIMEOUT_S", "a positive number of seconds", s);
  return s;
}

bool progress_thread_wanted() {
  const std::string v = env::get_string("", "EP_PROGRESS_THREAD", "auto");
  if (v == "auto") return allowed_cpus().size() > 1;
  return env::get_bool("", "EP_PROGRESS_THREAD", true);
}

Waiter::Waiter(double timeout_s, const char* fn, const char* what)
    : timeout_s_(timeout_s), fn_(fn), what_(what), since_(Clock::now()) {}

void Waiter::progressed() {
  idle_polls_ = 0;
  since_ = Clock::now();
}

// NOTES: ranks are often oversubscribed (4 ranks on 2 cores), so a waiting rank yields after a
// short spin instead of burning the core a peer needs, and sleeps once nothing moved for 100 ms (a
// stalled peer, or a communication thread with a long wait ahead). MPI progresses only inside
// MPI_Test, so the sleep must not start while a transfer is merely between fragments.
void Waiter::pause(bool raise_on_timeout) {
  ++idle_polls_;
  if (idle_polls_ < 64) return;
  const double waited = std::chrono::duration<double>(Clock::now() - since_).count();
  if (waited < 0.1) {
    sched_yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(50));
  if (raise_on_timeout && waited > timeout_s_) fail();
}

void Waiter::fail() const {
  DSK_FAIL(fn_, std::string("timed out after ") + std::to_string(timeout_s_) + " s waiting for " +
                    what_ + " (a peer rank died or stalled; DSK_EP_TIMEOUT_S sets the limit)");
}

bool Waiter::expired() const {
  return std::chrono::duration<double>(Clock::now() - since_).count() > timeout_s_;
}

void wait_request(MPI_Request& request, double timeout_s, const char* fn, const char* what) {
  Waiter waiter(timeout_s, fn, what);
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), fn, what);
    if (done) return;
    waiter.pause();
  }
}

void drive(Exchange& exchange, double timeout_s, const char* fn, bool until_headers,
           const std::function<bool()>& on_timeout) {
  Waiter waiter(timeout_s, fn, "peer ranks in an exchange");
  for (;;) {
    const bool done = exchange.poll();
    if (done || (until_headers && exchange.has_headers())) return;
    if (exchange.moved()) {
      waiter.progressed();
    } else if (on_timeout && waiter.expired()) {
      if (!on_timeout()) waiter.fail();
      waiter.progressed();
    } else {
      // With a handler, only the branch above ends a wait: pause() reads the clock again, and
      // raising there when the deadline passed just after expired() said no skipped the handler
      // (a shrink-mode rank descheduled between the two reads raised instead of masking).
      waiter.pause(!on_timeout);
    }
  }
}

const std::byte* ExchangeSpec::contiguous_rows(int peer, int64_t first, int64_t n) const {
  if (direct_row_bytes == 0 || !direct_src || n <= 0) return nullptr;
  return consecutive_rows(peer, first, n) == n ? direct_src(peer, first) : nullptr;
}

int64_t ExchangeSpec::consecutive_rows(int peer, int64_t first, int64_t most) const {
  const std::byte* rows = direct_src(peer, first);
  int64_t n = 1;
  while (n < most &&
         direct_src(peer, first + n) == rows + static_cast<size_t>(n) * direct_row_bytes)
    ++n;
  return n;
}

RecvWaitStats::RecvWaitStats(const std::optional<Tensor>& stats, int num_ranks)
    : stats_(stats),
      received_(num_ranks, 0),
      expected_(num_ranks, 0),
      done_at_(num_ranks),
      done_(num_ranks, false) {}

void RecvWaitStats::track(ExchangeSpec& spec) {
  if (!stats_) return;
  // Each wrapper calls the operation's callback first, then counts what it was handed.
  spec.on_headers = [this, &spec, inner = std::move(spec.on_headers)] {
    if (inner) inner();
    headers(spec.recv_records);
  };
  using Handed = std::function<void(int, int64_t, int64_t, const std::byte*)>;
  for (Handed* callback : {&spec.unpack, &spec.hold, &spec.unpack_direct}) {
    if (!*callback) continue;
    *callback = [this, inner = std::move(*callback)](int peer, int64_t first, int64_t n,
                                                     const std::byte* src) {
      inner(peer, first, n, src);
      arrived(peer, n);
    };
  }
  if (spec.hold_rows)
    spec.hold_rows = [this, inner = std::move(spec.hold_rows)](int peer, int64_t first, int64_t n,
                                                               const std::byte* src,
                                                               const std::byte* rows) {
      inner(peer, first, n, src, rows);
      arrived(peer, n);
    };
}

void RecvWaitStats::start() {
  start_ = Clock::now();
}

void RecvWaitStats::headers(const std::vector<int64_t>& recv_records) {
  have_headers_ = true;
  expected_ = recv_records;
  for (size_t s = 0; s < done_.size(); ++s) arrived(static_cast<int>(s), 0);
}

void RecvWaitStats::arrived(int peer, int64_t n) {
  received_[peer] += n;
  if (!have_headers_ || done_[peer] || received_[peer] < expected_[peer]) return;
  done_[peer] = true;
  done_at_[peer] = Clock::now();
}

void RecvWaitStats::add_to_tensor() {
  if (!stats_) return;
  auto* out = stats_->data<int64_t>();
  for (size_t s = 0; s < done_.size(); ++s) {
    // Every rank's records arrived once the exchange ended, except from a rank that shrink mode
    // dropped after a timeout (waited for until now); a rank whose last record came before the
    // receive started (a late hook) was not waited for.
    const Clock::time_point end = done_[s] ? done_at_[s] : Clock::now();
    const auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start_);
    out[s] += std::max<int64_t>(0, waited.count());
  }
}

void allgather(const CommImpl& comm, const void* in, void* out, size_t bytes, double timeout_s,
               const char* fn) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                           MPI_BYTE, comm.comm, &request),
            fn, "MPI_Iallgather");
  wait_request(request, timeout_s, fn, "the other ranks to join the all-gather");
}

}  // namespace detail

Communicator Communicator::world() {
  detail::ensure_mpi_initialized();
  Communicator c;
  c.impl_ = detail::make_comm(MPI_COMM_WORLD);
  return c;
}

Communicator Communicator::from_fortran_handle(int64_t handle) {
  detail::ensure_mpi_initialized();
  MPI_Comm user = MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
  DSK_CHECK_ARG(user != MPI_COMM_NULL, "ep::Communicator::from_fortran_handle", "handle",
                "the Fortran handle of a valid communicator", handle);
  Communicator c;
  c.impl_ = detail::make_comm(user);
  return c;
}

int Communicator::rank() const {
  return impl_->rank;
}
int Communicator::size() const {
  return impl_->size;
}
bool Communicator::single_host() const {
  return impl_->single_host;
}

bool Communicator::launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

void Communicator::barrier() const {
  const double timeout_s = detail::resolve_timeout_s(0);
  MPI_Request request = MPI_REQUEST_NULL;
  detail::check_mpi(MPI_Ibarrier(impl_->comm, &request), "ep::Communicator::barrier",
                    "MPI_Ibarrier");
  detail::wait_request(request, timeout_s, "ep::Communicator::barrier", "the other ranks");
}

double Communicator::allreduce_max(double value) const {
  const double timeout_s = detail::resolve_timeout_s(0);
  double out = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  detail::check_mpi(MPI_Iallreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, impl_->comm, &request),
                    "ep::Communicator::allreduce_max", "MPI_Iallreduce");
  detail::wait_request(request, timeout_s, "ep::Communicator::allreduce_max", "the other ranks");
  return out;
}

void Communicator::alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                             const std::vector<int64_t>& recv_bytes) const {
  const char* fn = "ep::Communicator::alltoallv";
  const int R = impl_->size;
  DSK_CHECK_ARG(static_cast<int>(send_bytes.size()) == R, fn, "send_bytes",
                std::to_string(R) + " entries", send_bytes.size());
  DSK_CHECK_ARG(static_cast<int>(recv_bytes.size()) == R, fn, "recv_bytes",
                std::to_string(R) + " entries", recv_bytes.size());
  std::vector<int> sc(R), sd(R), rc(R), rd(R);
  int64_t s_total = 0, r_total = 0;
  for (int r = 0; r < R; ++r) {
    DSK_CHECK(s_total + send_bytes[r] <= INT32_MAX && r_total + recv_bytes[r] <= INT32_MAX, fn,
              "more than 2 GiB in one call");
    sc[r] = static_cast<int>(send_bytes[r]);
    sd[r] = static_cast<int>(s_total);
    rc[r] = static_cast<int>(recv_bytes[r]);
    rd[r] = static_cast<int>(r_total);
    s_total += send_bytes[r];
    r_total += recv_bytes[r];
  }
  MPI_Request request = MPI_REQUEST_NULL;
  detail::check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                                   MPI_BYTE, impl_->comm, &request),
                    fn, "MPI_Ialltoallv");
  detail::wait_request(request, detail::resolve_timeout_s(0), fn, "the other ranks");
}

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::automatic:
      return "automatic";
    case Transport::shared_memory:
      return "shared_memory";
    case Transport::mpi:
      return "mpi";
    case Transport::mpi_alltoallv:
      return "mpi_alltoallv";
    case Transport::mpi_one_sided:
      return "mpi_one_sided";
  }
  return "?";
}

// ---- EventOverlap ----
void detail::EventState::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    error = std::move(e);
    done = true;
  }
  cv.notify_all();
}

bool EventOverlap::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

// Upstream's hook rules: the hook runs once, after the first wait that succeeds; a failed wait
// leaves it registered; a hook that throws is not retried. Later waits return its result again.
std::any EventOverlap::wait() const {
  if (!state_) return {};
  std::function<std::any()> hook;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (state_->error) std::rethrow_exception(state_->error);
    if (state_->hook_ran || !state_->hook) return state_->hook_result;
    state_->hook_ran = true;
    hook = std::move(state_->hook);
    state_->hook = nullptr;
  }
  // Outside the lock: the hook may wait on this event again (which returns the empty result).
  std::any result = hook();
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->hook_result = result;
  return result;
}

void EventOverlap::set_hook(std::function<std::any()> hook) const {
  DSK_CHECK(state_ != nullptr, "EventOverlap::register_hook_after_wait",
            "this event belongs to no operation");
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->hook = std::move(hook);
  state_->hook_ran = false;
  state_->hook_result.reset();
}

}  // namespace dsk::ep
