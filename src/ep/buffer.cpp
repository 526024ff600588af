// dsk::ep::Buffer: collective construction with the agreement check, sizing, destroy, and the
// (local) dispatch layout.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <dsk/core/check.hpp>
#include <dsk/core/error.hpp>

#include "ep/internal.hpp"
#include "ep/routing.hpp"

namespace dsk::ep {
namespace detail {
namespace {

constexpr const char* kCtor = "ep::Buffer";

// What every rank must agree on, as it travels in the construction all-gather.
struct Agreement {
  int64_t num_bytes;
  int64_t num_max_tokens_per_rank;
  int64_t hidden;
  int32_t num_topk;
  int32_t num_experts;
  int32_t use_fp8_dispatch;
  int32_t transport;
  int32_t allow_multiple_reduction;  // the combine's record format depends on it
  int32_t enable_shrink;  // also makes the struct free of padding, so memcmp compares values
};
static_assert(sizeof(Agreement) == 3 * 8 + 6 * 4, "Agreement must have no padding");

std::string describe(const Agreement& a) {
  return "num_bytes=" + std::to_string(a.num_bytes) +
         " num_max_tokens_per_rank=" + std::to_string(a.num_max_tokens_per_rank) +
         " hidden=" + std::to_string(a.hidden) + " num_topk=" + std::to_string(a.num_topk) +
         " num_experts=" + std::to_string(a.num_experts) +
         " use_fp8_dispatch=" + std::to_string(a.use_fp8_dispatch) +
         " transport=" + transport_name(static_cast<Transport>(a.transport)) +
         " allow_multiple_reduction=" + std::to_string(a.allow_multiple_reduction) +
         " enable_shrink=" + std::to_string(a.enable_shrink);
}

// Identical on every rank (it reads only the gathered values), so all ranks raise together.
void check_agreement(const std::vector<Agreement>& all) {
  for (size_t r = 1; r < all.size(); ++r)
    DSK_CHECK(std::memcmp(&all[r], &all[0], sizeof(Agreement)) == 0, kCtor,
              "ranks disagree on the buffer configuration: rank 0 has " + describe(all[0]) +
                  ", rank " + std::to_string(r) + " has " + describe(all[r]));
}

void check_config(const BufferConfig& c, int num_ranks) {
  DSK_CHECK_ARG(c.num_experts > 0 && c.num_experts % num_ranks == 0, kCtor, "num_experts",
                "a positive multiple of the number of ranks (" + std::to_string(num_ranks) + ")",
                c.num_experts);
  DSK_CHECK_ARG(c.num_experts / num_ranks <= kMaxLocalExperts, kCtor, "num_experts",
                "at most " + std::to_string(kMaxLocalExperts) + " experts per rank", c.num_experts);
  DSK_CHECK_ARG(c.num_bytes >= 0, kCtor, "num_bytes", "0 (size from the MoE sizes) or positive",
                c.num_bytes);
  DSK_CHECK_ARG(c.num_max_tokens_per_rank >= 0, kCtor, "num_max_tokens_per_rank",
                "a non-negative count", c.num_max_tokens_per_rank);
  DSK_CHECK_ARG(c.hidden >= 0, kCtor, "hidden", "a non-negative size", c.hidden);
  DSK_CHECK_ARG(c.num_topk >= 0 && c.num_topk <= kMaxTopk, kCtor, "num_topk",
                "0.." + std::to_string(kMaxTopk), c.num_topk);
  if (c.num_bytes == 0) {
    DSK_CHECK_ARG(c.num_max_tokens_per_rank > 0, kCtor, "num_max_tokens_per_rank",
                  "positive when num_bytes is 0 (the buffer is sized from it)",
                  c.num_max_tokens_per_rank);
    DSK_CHECK_ARG(c.hidden > 0, kCtor, "hidden", "positive when num_bytes is 0", c.hidden);
    DSK_CHECK_ARG(c.num_topk > 0, kCtor, "num_topk", "positive when num_bytes is 0", c.num_topk);
  }
  DSK_CHECK_ARG(c.timeout_s >= 0, kCtor, "timeout_s", "0 (DSK_EP_TIMEOUT_S) or positive",
                c.timeout_s);
}

}  // namespace

size_t shared_output_block_bytes(const BufferConfig& config, int num_ranks) {
  if (config.num_max_tokens_per_rank <= 0 || config.hidden <= 0) return 0;
  return align_up(static_cast<size_t>(num_ranks) *
                      static_cast<size_t>(config.num_max_tokens_per_rank) *
                      static_cast<size_t>(config.hidden) * 2,
                  size_t{2} << 20);
}

std::unique_ptr<Channel> make_channel(Transport transport, const CommImpl& comm, int64_t num_bytes,
                                      size_t output_block_bytes, double timeout_s) {
  switch (transport) {
    case Transport::shared_memory:
      return make_shm_channel(comm, num_bytes, output_block_bytes, timeout_s);
    case Transport::mpi_one_sided:
      return make_mpi_rma_channel(comm, num_bytes, timeout_s);
    default:
      return make_mpi_channel(comm, num_bytes, timeout_s);
  }
}

BufferImpl::~BufferImpl() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // an exchange in flight ends within the timeout
}

void BufferImpl::check_usable(const char* fn) {
  DSK_CHECK(!destroyed, fn, "the buffer was destroyed");
  complete_deferred(fn);  // exchanges run one at a time: an unreceived one finishes first
  wait_idle();
  DSK_CHECK(!broken, fn,
            "an earlier exchange on this buffer failed (timeout or disagreement between ranks); "
            "destroy it and build a new one");
}

void BufferImpl::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return pending_ == nullptr; });
}

Tensor BufferImpl::pooled(const Shape& shape, DType dtype) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const size_t bytes = static_cast<size_t>(numel) * element_size(dtype);
  if (bytes < (size_t{1} << 20)) return Tensor::empty(shape, dtype);  // small: the heap is fine
  std::lock_guard<std::mutex> lock(pool_mutex_);
  for (Block& b : pool_) {
    // use_count 1: only the pool holds it. A block far larger than needed stays for a larger
    // request.
    if (b.memory.use_count() == 1 && b.bytes >= bytes && b.bytes <= 2 * bytes)
      return Tensor::from_blob(b.memory.get(), shape, dtype, {}, b.memory);
  }
  constexpr size_t kAlign = size_t{2} << 20;
  const size_t rounded = align_up(bytes, kAlign);
  auto* raw = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
  DSK_CHECK(raw != nullptr, "ep::Buffer",
            "out of memory allocating " + std::to_string(rounded) + " bytes");
  // NOTES: transparent huge pages are in `madvise` mode on the development machines, where a
  // block would otherwise be 4 KB pages. The MPI transport's single-copy path (CMA) pins every
  // page of the rows it reads from a peer's block: T=4096 2 ranks, AMD Zen 5 VM, MPI combine
  // 18.8-20.4 -> 9.6-10.6 ms and dispatch 10.0-10.2 -> 8.6-9.4 ms with the advice.
  madvise(raw, rounded, MADV_HUGEPAGE);
  Block block{std::shared_ptr<std::byte>(raw, [](std::byte* p) { std::free(p); }), rounded};
  // Keep at most 8 blocks: drop free ones first.
  if (pool_.size() >= 8) {
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (it->memory.use_count() == 1) {
        pool_.erase(it);
        break;
      }
    }
  }
  if (pool_.size() < 8) pool_.push_back(block);
  return Tensor::from_blob(block.memory.get(), shape, dtype, {}, block.memory);
}

void BufferImpl::defer(const std::shared_ptr<Operation>& op, const char* fn) {
  ++outstanding;
  try {
    op->exchange = channel->start(op->spec, fn);
    op->exchange->poll();  // post the headers and the records that fit now
  } catch (...) {
    --outstanding;
    broken = true;
    throw;
  }
  op->event->done = false;
  deferred_ = op;
}

void BufferImpl::complete_deferred(const char* fn) {
  if (!deferred_) return;
  const std::shared_ptr<Operation> op = std::move(deferred_);
  deferred_ = nullptr;
  std::exception_ptr error;
  try {
    op->wait_stats.start();  // the hook receives: what arrived before was not waited for
    drive_op(*op, fn);
  } catch (...) {
    error = std::current_exception();
    broken = true;
  }
  op->exchange.reset();
  --outstanding;
  if (!error) {
    try {
      op->finish();
    } catch (...) {
      error = std::current_exception();
    }
  }
  op->event->complete(error);
  if (error) std::rethrow_exception(error);
}

std::shared_ptr<std::byte> BufferImpl::low_latency_block(size_t bytes, const char* fn) {
  // use_count 1: only the buffer holds the block, no result (or operation) uses it any more.
  int pick = -1;
  for (int i = 0; i < 2 && pick < 0; ++i) {
    const int candidate = (low_latency_next_ + i) % 2;
    const Block& b = low_latency_blocks_[candidate];
    if (!b.memory || b.memory.use_count() == 1) pick = candidate;
  }
  DSK_CHECK(pick >= 0, fn,
            "two low-latency results are still alive (the buffer keeps two, like upstream's "
            "odd/even buffers): drop the recv_x / combined_x of an earlier low-latency call first");
  low_latency_next_ = (pick + 1) % 2;
  Block& block = low_latency_blocks_[pick];
  if (block.bytes < bytes) {
    constexpr size_t kAlign = size_t{2} << 20;
    const size_t rounded = align_up(std::max<size_t>(bytes, 1), kAlign);
    block.memory.reset();
    auto* raw = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
    DSK_CHECK(raw != nullptr, fn, "out of memory allocating " + std::to_string(rounded) + " bytes");
    block = {std::shared_ptr<std::byte>(raw, [](std::byte* p) { std::free(p); }), rounded};
  }
  return block.memory;
}

void BufferImpl::execute(const std::shared_ptr<Operation>& op, bool async, const char* fn) {
  async = async && progress_thread;  // else the call moves the data; the event is done on return
  ++outstanding;
  try {
    op->wait_stats.start();
    op->exchange = channel->start(op->spec, fn);
    if (!async || op->sized_by_headers) {
      drive_op(*op, fn, async);
    } else {
      op->exchange->poll();  // post what can go now; the communication thread does the rest
    }
  } catch (...) {
    --outstanding;
    broken = true;
    throw;
  }
  if (async) {
    op->event->done = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_ = op;
      if (!thread_.joinable()) thread_ = std::thread([this] { progress_loop(); });
    }
    cv_.notify_all();
    return;
  }
  --outstanding;
  op->exchange.reset();
  op->finish();
}

std::vector<int> BufferImpl::masks() const {
  std::lock_guard<std::mutex> lock(mask_mutex_);
  return mask_.empty() ? std::vector<int>(static_cast<size_t>(num_ranks), 0) : mask_;
}

void BufferImpl::set_mask(int peer, int value) {
  std::lock_guard<std::mutex> lock(mask_mutex_);
  if (mask_.empty()) mask_.assign(static_cast<size_t>(num_ranks), 0);
  mask_[static_cast<size_t>(peer)] = value;
}

// NOTES: a peer that stopped sending is left out at the first timeout. One that only stopped
// taking what this rank sends may itself be waiting for a third rank that stalled: its own wait
// leaves that rank out a timeout after its last progress, which can come up to a timeout after
// ours (it kept sending to us meanwhile). So such a peer is left out only once two more timeouts
// passed without a peer to receive from, which keeps alive ranks from masking each other when
// the scheduler delays one of them (4 ranks on 2 cores, 1 s timeouts in the tests). Upstream
// masks whichever rank a wait timed out on.
void BufferImpl::drive_op(Operation& op, const char* fn, bool until_headers) {
  if (!op.shrink) return drive(*op.exchange, timeout_s, fn, until_headers);
  Exchange& exchange = *op.exchange;
  int quiet_timeouts = 0;  // timeouts in a row with no peer to receive from
  const auto leave_out_stalled = [&] {
    std::vector<int> peers = exchange.stalled_peers(false);
    if (peers.empty()) {
      if (++quiet_timeouts <= 2) return true;  // give the peers more time first
      peers = exchange.stalled_peers(true);
    } else {
      quiet_timeouts = 0;
    }
    if (peers.empty()) return false;
    for (int p : peers) {
      exchange.drop(p);
      set_mask(p, 2);
    }
    return true;
  };
  drive(exchange, timeout_s, fn, until_headers, leave_out_stalled);
}

void BufferImpl::progress_loop() {
  for (;;) {
    std::shared_ptr<Operation> op;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || pending_ != nullptr; });
      if (pending_ == nullptr) return;
      op = pending_;
    }
    std::exception_ptr error;
    try {
      drive_op(*op, "ep (communication thread)");
    } catch (...) {
      error = std::current_exception();
      broken = true;
    }
    op->exchange.reset();
    if (!error) {
      try {
        op->finish();
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_ = nullptr;
      --outstanding;
    }
    cv_.notify_all();
    op->event->complete(error);
  }
}

}  // namespace detail

int64_t Buffer::get_buffer_size_hint(int num_ranks, int64_t num_max_tokens_per_rank, int64_t hidden,
                                     int num_topk, bool use_fp8_dispatch) {
  const char* fn = "ep::Buffer::get_buffer_size_hint";
  check::in_range(fn, "num_ranks", num_ranks, 1, 1 << 20);
  check::in_range(fn, "num_max_tokens_per_rank", num_max_tokens_per_rank, 1, int64_t{1} << 31);
  check::in_range(fn, "hidden", hidden, 1, int64_t{1} << 24);
  check::in_range(fn, "num_topk", num_topk, 1, detail::kMaxTopk);
  (void)use_fp8_dispatch;  // an FP8 row (H + H/32 bytes) is never larger than a BF16 row
  // Two slots per peer, each holding half of Tmax rows of the largest record: a whole dispatch
  // or combine of Tmax tokens is in flight without waiting for a slot.
  const size_t record = detail::max_record_bytes(hidden, num_topk);
  const size_t chunk =
      detail::align_up(record * static_cast<size_t>((num_max_tokens_per_rank + 1) / 2), 64);
  const size_t total = detail::control_bytes(num_ranks) +
                       detail::header_capacity(num_ranks) * num_ranks +
                       2 * chunk * static_cast<size_t>(num_ranks);
  return static_cast<int64_t>(detail::align_up(total, size_t{2} << 20));
}

Buffer::Buffer(const Communicator& comm, const BufferConfig& config)
    : impl_(std::make_unique<detail::BufferImpl>()) {
  detail::BufferImpl& b = *impl_;
  b.comm = comm;
  b.config = config;
  b.rank = comm.rank();
  b.num_ranks = comm.size();
  b.timeout_s = detail::resolve_timeout_s(config.timeout_s);
  b.progress_thread = detail::progress_thread_wanted();

  // Agree first, validate after: every rank sees the same gathered values and so raises the
  // same error, instead of one rank raising while the others wait for it.
  const detail::Agreement mine{config.num_bytes,
                               config.num_max_tokens_per_rank,
                               config.hidden,
                               config.num_topk,
                               config.num_experts,
                               config.use_fp8_dispatch ? 1 : 0,
                               static_cast<int32_t>(config.transport),
                               config.allow_multiple_reduction ? 1 : 0,
                               config.enable_shrink ? 1 : 0};
  std::vector<detail::Agreement> all(b.num_ranks);
  detail::allgather(comm.impl(), &mine, all.data(), sizeof mine, b.timeout_s, "ep::Buffer");
  detail::check_agreement(all);
  detail::check_config(config, b.num_ranks);
  b.num_local_experts = config.num_experts / b.num_ranks;

  b.transport = config.transport;
  if (b.transport == Transport::automatic)
    b.transport = comm.single_host() ? Transport::shared_memory : Transport::mpi;
  DSK_CHECK_ARG(b.transport != Transport::shared_memory || comm.single_host(), "ep::Buffer",
                "transport", "mpi or automatic when the ranks span several hosts", "shared_memory");
  b.num_bytes = config.num_bytes > 0
                    ? config.num_bytes
                    : get_buffer_size_hint(b.num_ranks, config.num_max_tokens_per_rank,
                                           config.hidden, config.num_topk, config.use_fp8_dispatch);
  if (b.transport == Transport::mpi) b.transport = detail::kDefaultMpiTransport;
  // NOTES: shrink mode needs a transport that can leave a rank out: an MPI collective cannot, and
  // Open MPI without ULFM ends the whole job when a rank dies. The transport is the same on
  // every rank (agreed above, and single_host is a property of the group), so all raise alike.
  DSK_CHECK_ARG(!config.enable_shrink || b.transport == Transport::shared_memory, "ep::Buffer",
                "enable_shrink", "the shared-memory transport (ranks on one host)",
                std::string("transport ") + transport_name(b.transport));
  b.channel =
      detail::make_channel(b.transport, comm.impl(), b.num_bytes,
                           detail::shared_output_block_bytes(b.config, b.num_ranks), b.timeout_s);
}

// Tearing down is local (each rank unmaps its own view of the segments), so neither the
// destructor nor destroy() waits for the peers.
Buffer::~Buffer() = default;

void Buffer::destroy() {
  DSK_CHECK(impl_->outstanding == 0, "ep::Buffer::destroy",
            std::to_string(impl_->outstanding.load()) +
                " operation(s) are still outstanding: wait for their events first");
  impl_->channel.reset();
  for (Tensor& t : impl_->combine_buffers) t = Tensor{};
  impl_->destroyed = true;
}

void Buffer::resize(int64_t num_bytes) {
  const char* fn = "ep::Buffer::resize";
  detail::BufferImpl& b = *impl_;
  DSK_CHECK(!b.destroyed, fn, "the buffer was destroyed");
  DSK_CHECK_ARG(num_bytes >= 0, fn, "num_bytes", "0 (size from the MoE sizes) or positive",
                num_bytes);
  if (num_bytes == 0) {
    const BufferConfig& c = b.config;
    DSK_CHECK_ARG(c.num_max_tokens_per_rank > 0 && c.hidden > 0 && c.num_topk > 0, fn, "num_bytes",
                  "positive for a buffer built without the MoE sizes", num_bytes);
    num_bytes = get_buffer_size_hint(b.num_ranks, c.num_max_tokens_per_rank, c.hidden, c.num_topk,
                                     c.use_fp8_dispatch);
  }
  // Agree first: every rank learns whether any rank still has an operation outstanding (an
  // asynchronous one, or a low-latency receive waiting for its hook) and raises alike.
  struct Vote {
    int64_t num_bytes;
    int64_t outstanding;
  };
  const Vote mine{num_bytes, b.outstanding.load()};
  std::vector<Vote> all(b.num_ranks);
  detail::allgather(b.comm.impl(), &mine, all.data(), sizeof mine, b.timeout_s, fn);
  for (int r = 0; r < b.num_ranks; ++r) {
    DSK_CHECK(all[r].outstanding == 0, fn,
              "rank " + std::to_string(r) + " has " + std::to_string(all[r].outstanding) +
                  " operation(s) outstanding: wait for their events (or call their hooks) first");
    DSK_CHECK(all[r].num_bytes == num_bytes, fn,
              "ranks disagree on the size: rank " + std::to_string(b.rank) + " asks for " +
                  std::to_string(num_bytes) + ", rank " + std::to_string(r) + " for " +
                  std::to_string(all[r].num_bytes));
  }
  b.channel.reset();  // unmaps this rank's view first, so old and new never coexist
  b.num_bytes = num_bytes;
  b.config.num_bytes = num_bytes;
  b.channel =
      detail::make_channel(b.transport, b.comm.impl(), num_bytes,
                           detail::shared_output_block_bytes(b.config, b.num_ranks), b.timeout_s);
  b.broken = false;  // a fresh channel: no exchange is left half done
  // Every pair starts over, so ranks masked after a timeout may be unmasked now.
  std::vector<int> masks = b.masks();
  for (int r = 0; r < b.num_ranks; ++r)
    if (masks[r] == 2) b.set_mask(r, 1);
}

bool Buffer::is_available() const {
  return !impl_->destroyed && !impl_->broken;
}
int Buffer::rank() const {
  return impl_->rank;
}
int Buffer::num_ranks() const {
  return impl_->num_ranks;
}
int64_t Buffer::num_bytes() const {
  return impl_->num_bytes;
}
int64_t Buffer::output_bytes() const {
  return impl_->channel ? static_cast<int64_t>(impl_->channel->shared_output_bytes()) : 0;
}
Transport Buffer::transport() const {
  return impl_->transport;
}
const BufferConfig& Buffer::config() const {
  return impl_->config;
}

DispatchLayout Buffer::get_dispatch_layout(const Tensor& topk_idx, int num_experts,
                                           std::optional<EventOverlap> previous_event,
                                           bool /*async_finish*/,
                                           bool /*allocate_on_comm_stream*/) const {
  const char* fn = "ep::Buffer::get_dispatch_layout";
  DSK_CHECK(!impl_->destroyed, fn, "the buffer was destroyed");
  if (previous_event) previous_event->wait();
  const int R = impl_->num_ranks;
  DSK_CHECK_ARG(num_experts > 0 && num_experts % R == 0, fn, "num_experts",
                "a positive multiple of the number of ranks (" + std::to_string(R) + ")",
                num_experts);
  const std::vector<int32_t> ids = detail::read_topk_idx(fn, "topk_idx", topk_idx, num_experts);
  const int64_t T = topk_idx.size(0);
  const int K = static_cast<int>(topk_idx.size(1));
  const int per_rank = num_experts / R;

  DispatchLayout out;
  out.num_tokens_per_rank = Tensor::zeros({R}, DType::i32);
  out.num_tokens_per_expert = Tensor::zeros({num_experts}, DType::i32);
  out.is_token_in_rank = Tensor::zeros({T, R}, DType::boolean);
  int32_t* per_rank_count = out.num_tokens_per_rank.data<int32_t>();
  int32_t* per_expert = out.num_tokens_per_expert.data<int32_t>();
  bool* in_rank = out.is_token_in_rank.data<bool>();
  for (int64_t t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t e = ids[t * K + k];
      if (e < 0) continue;
      ++per_expert[e];
      bool& flag = in_rank[t * R + e / per_rank];
      if (!flag) ++per_rank_count[e / per_rank];
      flag = true;
    }
  }
  return out;
}

LowLatencyDispatchResult Buffer::low_latency_dispatch(const Tensor& x, const Tensor& topk_idx,
                                                      int64_t num_max_dispatch_tokens_per_rank,
                                                      int num_experts,
                                                      const LowLatencyDispatchArgs& args) {
  return detail::run_low_latency_dispatch(*impl_, x, topk_idx, num_max_dispatch_tokens_per_rank,
                                          num_experts, args);
}

namespace {
constexpr const char* kUpdateMask = "ep::Buffer::low_latency_update_mask_buffer";
constexpr const char* kQueryMask = "ep::Buffer::low_latency_query_mask_buffer";
constexpr const char* kCleanMask = "ep::Buffer::low_latency_clean_mask_buffer";

void check_shrink(const detail::BufferImpl& b, const char* fn) {
  DSK_CHECK(!b.destroyed, fn, "the buffer was destroyed");
  DSK_CHECK_ARG(b.config.enable_shrink, fn, "the buffer",
                "one built with BufferConfig::enable_shrink = true", "enable_shrink = false");
}

// A rank masked after a timeout keeps its channel state unknown until a resize.
void check_unmaskable(const char* fn, int r, int mask) {
  DSK_CHECK(
      mask != 2, fn,
      "rank " + std::to_string(r) +
          " was masked after a low-latency exchange waited for it past the timeout; its "
          "channel state is unknown, so it can be unmasked only after a resize() (collective, "
          "with that rank) or in a new buffer");
}
}  // namespace

void Buffer::low_latency_update_mask_buffer(int rank_to_mask, bool mask) {
  detail::BufferImpl& b = *impl_;
  check_shrink(b, kUpdateMask);
  check::in_range(kUpdateMask, "rank_to_mask", rank_to_mask, 0, b.num_ranks - 1);
  DSK_CHECK_ARG(!mask || rank_to_mask != b.rank, kUpdateMask, "rank_to_mask",
                "another rank than this one (a rank cannot mask itself)", rank_to_mask);
  b.complete_deferred(kUpdateMask);  // a hooked receive runs with the masks it started with
  b.wait_idle();
  const int current = b.masks()[rank_to_mask];
  if (mask) {
    if (current == 0) b.set_mask(rank_to_mask, 1);
    return;
  }
  check_unmaskable(kUpdateMask, rank_to_mask, current);
  b.set_mask(rank_to_mask, 0);
}

void Buffer::low_latency_query_mask_buffer(const Tensor& mask_status) const {
  const detail::BufferImpl& b = *impl_;
  check_shrink(b, kQueryMask);
  check::dtype(kQueryMask, "mask_status", mask_status, DType::i32);
  check::shape(kQueryMask, "mask_status", mask_status, {b.num_ranks});
  check::contiguous(kQueryMask, "mask_status", mask_status);
  const std::vector<int> masks = b.masks();
  for (int r = 0; r < b.num_ranks; ++r) mask_status.data<int32_t>()[r] = masks[r] != 0 ? 1 : 0;
}

void Buffer::low_latency_clean_mask_buffer() {
  detail::BufferImpl& b = *impl_;
  check_shrink(b, kCleanMask);
  b.complete_deferred(kCleanMask);
  b.wait_idle();
  const std::vector<int> masks = b.masks();
  for (int r = 0; r < b.num_ranks; ++r) check_unmaskable(kCleanMask, r, masks[r]);
  for (int r = 0; r < b.num_ranks; ++r) b.set_mask(r, 0);
}

Tensor Buffer::get_next_low_latency_combine_buffer(const LowLatencyHandle& handle) {
  return detail::next_low_latency_combine_buffer(*impl_, handle);
}

LowLatencyCombineResult Buffer::low_latency_combine(const Tensor& x, const Tensor& topk_idx,
                                                    const Tensor& topk_weights,
                                                    const LowLatencyHandle& handle,
                                                    const LowLatencyCombineArgs& args) {
  return detail::run_low_latency_combine(*impl_, x, topk_idx, topk_weights, handle, args);
}

}  // namespace dsk::ep
