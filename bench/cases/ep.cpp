// The "ep" module of `dsk bench`: dispatch and combine bandwidth as upstream counts it (the bytes
// of the received rows, BF16 or FP8, per second) at T = 4096, H = 7168, top-8, E = 256 (T = 1024
// with --quick), on the shared-memory transport (peer: memcpy of the same bytes on every rank at
// once) and on the MPI transport (peer: one plain MPI_Alltoallv moving the same bytes), and the
// overlap gain of an asynchronous dispatch with compute between the call and its wait; and the
// low-latency mode at T = 128 (times in µs; bytes counted per (token, expert) message as upstream
// counts them).
//
// Run it under mpirun (as root, with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1):
//   mpirun -np 2 --oversubscribe dsk bench ep
// Outside mpirun every case is listed as unavailable with that command.
//
// NOTES: every call is collective, so all ranks must make exactly the same number of calls. The
// runner decides its call counts from the times a call reports, so each timed call here runs a
// fixed, agreed number of iterations lasting well above the runner's warm-up time and reports the
// slowest rank's seconds per iteration (identical on every rank). Each such call also times the
// peer the same way, right after; the peer callback replays the median of those times, since
// the runner's own loop around it would let the ranks disagree on the call count.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include <dsk/core/timer.hpp>
#include <dsk/ep.hpp>
#include <dsk/ref.hpp>
#include <dsk/tk.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

constexpr int64_t kHidden = 7168;
constexpr int kTopk = 8;
constexpr int kExperts = 256;

std::string needs_mpirun() {
  if (ep::Communicator::launched_by_mpi()) return "";
  return "needs mpirun: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 "
         "--oversubscribe dsk bench|verify ep";
}

// The group; ranks other than 0 stop printing, so one table comes out.
ep::Communicator& comm() {
  static ep::Communicator c = [] {
    ep::Communicator w = ep::Communicator::world();
    if (w.rank() != 0) {
      std::fflush(stdout);
      if (std::FILE* null = std::fopen("/dev/null", "w")) dup2(fileno(null), fileno(stdout));
    }
    return w;
  }();
  return c;
}

// The slowest rank's seconds per call over `iters` calls (the same value on every rank).
double collective_seconds(const std::function<void()>& call, int iters) {
  comm().barrier();
  Timer t;
  for (int i = 0; i < iters; ++i) call();
  return comm().allreduce_max(t.seconds() / iters);
}

// Iterations per timed call: the same on every rank, and long enough that the runner's warm-up
// ends after exactly two calls.
int agreed_iterations(const std::function<void()>& call, bool quick) {
  // Two calls first: low-latency calls alternate between two result blocks, each faulted in on
  // its first use, and a slow first sample would make later calls shorter than the warm-up.
  call();
  call();
  const double one = collective_seconds(call, 2);
  const double target = quick ? 0.03 : 0.15;
  return static_cast<int>(std::clamp(std::ceil(target / std::max(one, 1e-6)), 1.0, 1e5));
}

struct Problem {
  std::unique_ptr<ep::Buffer> buffer;
  Tensor x, topk, weights;
  gemm::Fp8Tensor x_fp8;
  ep::DispatchResult dispatched;
  int64_t recv_bytes = 0;  // bytes of the received BF16 rows on this rank
};

// Uniform routing: distinct experts per token, as upstream's benchmark draws them.
void uniform_routing(int64_t T, int E, uint64_t seed, Tensor& topk, Tensor& weights) {
  std::mt19937_64 rng(seed);
  topk = Tensor::empty({T, kTopk}, DType::i64);
  weights = Tensor::empty({T, kTopk}, DType::f32);
  std::vector<int> experts(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int k = 0; k < kTopk; ++k) {
      std::swap(experts[k], experts[k + rng() % (E - k)]);
      topk.data<int64_t>()[t * kTopk + k] = experts[k];
      weights.data<float>()[t * kTopk + k] = 1.0f / kTopk;
    }
  }
}

std::shared_ptr<Problem> make_problem(ep::Transport transport, bool quick, bool fp8) {
  auto p = std::make_shared<Problem>();
  const int64_t T = quick ? 1024 : 4096;
  const int R = comm().size();
  p->buffer =
      std::make_unique<ep::Buffer>(comm(), ep::BufferConfig{.num_max_tokens_per_rank = T,
                                                            .hidden = kHidden,
                                                            .num_topk = kTopk,
                                                            .num_experts = kExperts - kExperts % R,
                                                            .use_fp8_dispatch = fp8,
                                                            .transport = transport});
  const int E = kExperts - kExperts % R;
  p->x = Tensor::empty({T, kHidden}, DType::bf16);
  std::vector<float> row(static_cast<size_t>(T * kHidden));
  fill_uniform(row.data(), row.size(), 7 + static_cast<uint64_t>(comm().rank()));
  convert_f32_to_bf16(row.data(), p->x.data<bf16>(), row.size());
  if (fp8) {
    p->x_fp8.data = Tensor::empty({T, kHidden}, DType::e4m3);
    p->x_fp8.sf = Tensor::empty({T, kHidden / 128}, DType::f32);
    convert_f32_to_e4m3(row.data(), p->x_fp8.data.data<e4m3>(), row.size());
    for (int64_t i = 0; i < p->x_fp8.sf.numel(); ++i) p->x_fp8.sf.data<float>()[i] = 1.0f;
  }
  uniform_routing(T, E, 11 + static_cast<uint64_t>(comm().rank()), p->topk, p->weights);
  p->dispatched = p->buffer->dispatch(p->x, {.topk_idx = p->topk, .topk_weights = p->weights});
  p->recv_bytes = p->dispatched.recv_x.size(0) * kHidden * 2;
  return p;
}

// A buffer of a peer: a tensor, so that it sits in memory as the library's inputs and outputs do
// (2 MiB aligned, huge pages where the kernel gives them), written once so its pages exist.
// NOTES: a std::vector of tens of MB is 4 KB pages 16 bytes past a page boundary; the MPI peer
// then pinned every page in its single-copy path and measured 11-50 ms for the same 117 MB
// (the library's outputs are huge-page blocks), so the ratios measured the peer's allocation.
std::shared_ptr<Tensor> peer_buffer(int64_t bytes, uint8_t fill) {
  auto t = std::make_shared<Tensor>(Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::u8));
  std::memset(t->data_ptr(), fill, static_cast<size_t>(t->numel()));
  return t;
}

// A memcpy of `bytes` on every rank at once: the shared-memory transport's peer.
std::function<void()> memcpy_peer(int64_t bytes) {
  auto src = peer_buffer(bytes, 1);
  auto dst = peer_buffer(bytes, 0);
  return [src, dst, bytes] {
    std::memcpy(dst->data_ptr(), src->data_ptr(), static_cast<size_t>(bytes));
  };
}

// One plain MPI_Alltoallv moving the bytes of a dispatch (or, reversed, of a combine).
std::function<void()> alltoallv_peer(const Problem& p, size_t row_bytes, bool reverse) {
  const int R = comm().size();
  const ep::DispatchHandle& h = p.dispatched.handle;
  std::vector<int64_t> to(R, 0), from(R, 0);
  for (int r = 0; r < R; ++r) {
    for (int64_t t = 0; t < h.is_token_in_rank.size(0); ++t)
      to[r] += h.is_token_in_rank.at<bool>({t, r}) ? static_cast<int64_t>(row_bytes) : 0;
    const int32_t before = r == 0 ? 0 : h.rank_prefix_matrix.at<int32_t>({r - 1, comm().rank()});
    from[r] = (h.rank_prefix_matrix.at<int32_t>({r, comm().rank()}) - before) *
              static_cast<int64_t>(row_bytes);
  }
  if (reverse) std::swap(to, from);
  int64_t send = 0, recv = 0;
  for (int r = 0; r < R; ++r) {
    send += to[r];
    recv += from[r];
  }
  auto sbuf = peer_buffer(send, 1);
  auto rbuf = peer_buffer(recv, 0);
  return [sbuf, rbuf, to, from] { comm().alltoallv(sbuf->data_ptr(), to, rbuf->data_ptr(), from); };
}

// The case and its peer, timed in turns: each timed call of the case is followed by one of the
// peer, and the peer callback replays (by a busy wait, so that every rank makes the runner's
// calls alike) the median of those peer samples. On a shared machine whose speed drifts over
// seconds, both sides of the ratio then see the same moments.
Prepared timed(const std::function<void()>& call, double bytes, const std::function<void()>& peer,
               bool quick) {
  const int iters = agreed_iterations(call, quick);
  const int peer_iters = agreed_iterations(peer, quick);
  auto peer_samples = std::make_shared<std::vector<double>>();
  Prepared prepared;
  prepared.timed_kernel = [call, iters, peer, peer_iters, peer_samples](int) {
    const double seconds = collective_seconds(call, iters);
    peer_samples->push_back(collective_seconds(peer, peer_iters));
    return seconds;
  };
  prepared.peer = [peer_samples](int) {
    std::vector<double> s = *peer_samples;  // the runner times the peer after the case
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    const auto end =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(s[s.size() / 2]);
    while (std::chrono::steady_clock::now() < end) {
    }
  };
  prepared.bytes = bytes;
  return prepared;
}

// combine: of the dispatch's recv_x itself, as upstream's benchmark does (on shared memory the
// owners then read the rows in place); combine_private: of a copy in private memory, as expert
// outputs in a tensor of their own are, so the rows cross between the ranks as copies.
enum class Op { dispatch, dispatch_fp8, combine, combine_private };

// Case-name suffix of a transport.
std::string suffix(ep::Transport transport) {
  switch (transport) {
    case ep::Transport::shared_memory:
      return "_shm";
    case ep::Transport::mpi_one_sided:
      return "_mpi_rma";
    default:
      return "_mpi";
  }
}

BenchCase transfer_case(Op op, ep::Transport transport) {
  const bool mpi = transport != ep::Transport::shared_memory;
  const bool combine = op == Op::combine || op == Op::combine_private;
  const std::string name = std::string(combine ? "ep_combine_bf16" : "ep_dispatch_") +
                           (op == Op::dispatch          ? "bf16"
                            : op == Op::dispatch_fp8    ? "fp8"
                            : op == Op::combine_private ? "_private"
                                                        : "") +
                           suffix(transport);
  return {.name = name,
          .shape = "T=4096(--quick 1024),H=7168,topk=8,E=256",
          .ceiling = "dram_read",
          .peer = mpi ? "MPI_Alltoallv" : "memcpy",
          .quick = op != Op::dispatch_fp8,
          .unavailable = needs_mpirun,
          .prepare = [=](const CaseContext& ctx) {
            auto p = make_problem(transport, ctx.quick, op == Op::dispatch_fp8);
            const int64_t rows = p->dispatched.recv_x.size(0);
            const double bytes = op == Op::dispatch_fp8
                                     ? static_cast<double>(rows) * (kHidden + kHidden / 32)
                                     : static_cast<double>(p->recv_bytes);
            std::function<void()> call;
            if (op == Op::combine) {
              call = [p] { p->buffer->combine(p->dispatched.recv_x, p->dispatched.handle); };
            } else if (op == Op::combine_private) {
              auto x = std::make_shared<Tensor>(p->dispatched.recv_x.clone());
              call = [p, x] { p->buffer->combine(*x, p->dispatched.handle); };
            } else if (op == Op::dispatch_fp8) {
              call = [p] { p->buffer->dispatch(p->x_fp8, {.topk_idx = p->topk}); };
            } else {
              call = [p] {
                p->buffer->dispatch(p->x, {.topk_idx = p->topk, .topk_weights = p->weights});
              };
            }
            std::function<void()> peer = mpi ? alltoallv_peer(*p, kHidden * 2, combine)
                                             : memcpy_peer(static_cast<int64_t>(bytes));
            return timed(call, bytes, peer, ctx.quick);
          }};
}

// Compute standing in for the shared expert: a dependent floating-point chain of `n` steps.
double shared_expert_work(int64_t n) {
  double v = 1.0;
  for (int64_t i = 0; i < n; ++i) v = v * 0.999999 + 1e-7;
  return v;
}

// Async dispatch, compute about as long as the dispatch, wait; the peer runs them one after the
// other, so speedup_vs_peer is the overlap gain.
BenchCase overlap_case() {
  return {.name = "ep_dispatch_overlap_shm",
          .shape = "T=4096(--quick 1024),H=7168,topk=8,E=256",
          .ceiling = "dram_read",
          .peer = "dispatch then compute",
          .unavailable = needs_mpirun,
          .prepare = [](const CaseContext& ctx) {
            auto p = make_problem(ep::Transport::shared_memory, ctx.quick, false);
            auto dispatch = [p](bool async) {
              return p->buffer->dispatch(p->x, {.topk_idx = p->topk, .async_finish = async});
            };
            // Warm first: the first calls on a fresh buffer fault their outputs in, and a compute
            // sized from them would dwarf the dispatch it is meant to hide.
            for (int i = 0; i < 3; ++i) dispatch(false);
            const double dispatch_s = collective_seconds([&] { dispatch(false); }, 3);
            auto sink = std::make_shared<double>(0);
            Timer t;
            *sink += shared_expert_work(1 << 22);  // used, so the call is not optimised away
            const double per_step = t.seconds() / (1 << 22);
            const auto steps = static_cast<int64_t>(
                std::min(comm().allreduce_max(dispatch_s / std::max(per_step, 1e-10)), 1e10));
            auto overlapped = [=] {
              const ep::DispatchResult d = dispatch(true);
              *sink += shared_expert_work(steps);
              d.event.wait();
            };
            auto serial = [=] {
              dispatch(false);
              *sink += shared_expert_work(steps);
            };
            return timed(overlapped, static_cast<double>(p->recv_bytes), serial, ctx.quick);
          }};
}

// ---- The model's path (Model::Impl::moe_expert_parallel): FP8 dispatch in expand mode (one row
// per (token, local expert), blocks aligned for m_grouped_*_contiguous), then the single-reduction
// combine of every slot's row with the shared expert's output as the bias ----

struct ExpandProblem {
  std::unique_ptr<ep::Buffer> buffer;
  gemm::Fp8Tensor x;
  Tensor topk, weights;
  Tensor y, bias;  // the experts' outputs in the expanded layout; the shared expert's output
  ep::DispatchHandle handle;
  std::vector<int64_t> slots_to, slots_from;  // (token, expert) slots per destination / source
  int64_t slots = 0;                          // slots this rank receives (rows without padding)
};

std::shared_ptr<ExpandProblem> make_expand_problem(ep::Transport transport, bool quick) {
  auto p = std::make_shared<ExpandProblem>();
  const int64_t T = quick ? 1024 : 4096;
  const int R = comm().size();
  const int E = kExperts - kExperts % R;
  p->buffer =
      std::make_unique<ep::Buffer>(comm(), ep::BufferConfig{.num_max_tokens_per_rank = T,
                                                            .hidden = kHidden,
                                                            .num_topk = kTopk,
                                                            .num_experts = E,
                                                            .use_fp8_dispatch = true,
                                                            .deterministic = true,
                                                            .allow_multiple_reduction = false,
                                                            .transport = transport});
  std::vector<float> values(static_cast<size_t>(T * kHidden));
  fill_uniform(values.data(), values.size(), 29 + static_cast<uint64_t>(comm().rank()));
  p->x.data = Tensor::empty({T, kHidden}, DType::e4m3);
  p->x.sf = Tensor::empty({T, kHidden / 128}, DType::f32);
  convert_f32_to_e4m3(values.data(), p->x.data.data<e4m3>(), values.size());
  for (int64_t i = 0; i < p->x.sf.numel(); ++i) p->x.sf.data<float>()[i] = 1.0f;
  p->bias = Tensor::empty({T, kHidden}, DType::bf16);
  convert_f32_to_bf16(values.data(), p->bias.data<bf16>(), values.size());
  uniform_routing(T, E, 31 + static_cast<uint64_t>(comm().rank()), p->topk, p->weights);
  p->slots_to.assign(R, 0);
  for (int64_t i = 0; i < T * kTopk; ++i) ++p->slots_to[p->topk.data<int64_t>()[i] / (E / R)];
  p->slots_from.assign(R, 0);
  comm().alltoallv(p->slots_to.data(), std::vector<int64_t>(R, 8), p->slots_from.data(),
                   std::vector<int64_t>(R, 8));
  p->slots = std::accumulate(p->slots_from.begin(), p->slots_from.end(), int64_t{0});
  const ep::DispatchResult d = p->buffer->dispatch(
      p->x, {.topk_idx = p->topk, .topk_weights = p->weights, .do_expand = true});
  p->handle = d.handle;
  p->y = Tensor::empty({d.recv_x.size(0), kHidden}, DType::bf16);
  p->y.fill_bytes_(0x3C);  // finite values, padding rows included
  return p;
}

// Bytes counted: the received slots' rows (FP8 with scales for dispatch, BF16 for combine),
// padding rows not counted. Peers: a memcpy of those bytes, or one MPI_Alltoallv moving them
// between the same ranks.
BenchCase expand_case(bool dispatch, ep::Transport transport) {
  const bool mpi = transport != ep::Transport::shared_memory;
  return {.name = std::string(dispatch ? "ep_dispatch_fp8_expand" : "ep_combine_bf16_single") +
                  suffix(transport),
          .shape = "T=4096(--quick 1024),H=7168,topk=8,E=256,model path",
          .ceiling = "dram_read",
          .peer = mpi ? "MPI_Alltoallv" : "memcpy",
          .quick = false,
          .unavailable = needs_mpirun,
          .prepare = [=](const CaseContext& ctx) {
            auto p = make_expand_problem(transport, ctx.quick);
            const int64_t row_bytes = dispatch ? kHidden + kHidden / 32 : kHidden * 2;
            std::function<void()> call;
            if (dispatch)
              call = [p] {
                p->buffer->dispatch(
                    p->x, {.topk_idx = p->topk, .topk_weights = p->weights, .do_expand = true});
              };
            else
              call = [p] { p->buffer->combine(p->y, p->handle, {.bias = {p->bias}}); };
            // Dispatch moves slots from their owner to the expert ranks, combine back.
            std::vector<int64_t> to = dispatch ? p->slots_to : p->slots_from;
            std::vector<int64_t> from = dispatch ? p->slots_from : p->slots_to;
            for (auto* counts : {&to, &from})
              for (int64_t& c : *counts) c *= row_bytes;
            const int64_t bytes = p->slots * row_bytes;
            std::function<void()> peer;
            if (mpi) {
              auto sbuf = peer_buffer(std::accumulate(to.begin(), to.end(), int64_t{0}), 1);
              auto rbuf = peer_buffer(std::accumulate(from.begin(), from.end(), int64_t{0}), 0);
              peer = [sbuf, rbuf, to, from] {
                comm().alltoallv(sbuf->data_ptr(), to, rbuf->data_ptr(), from);
              };
            } else {
              peer = memcpy_peer(bytes);
            }
            return timed(call, static_cast<double>(bytes), peer, ctx.quick);
          }};
}

// ---- Low-latency mode: T = 128 (upstream's decode benchmark), FP8 dispatch, BF16 combine ----
constexpr int64_t kLowLatencyTokens = 128;

struct LowLatencyProblem {
  std::unique_ptr<ep::Buffer> buffer;
  Tensor x, topk, weights, y;  // y: the experts' outputs in the masked layout
  ep::LowLatencyHandle handle;
  std::vector<int64_t> dispatch_bytes, combine_bytes;  // per destination rank, as sent
};

std::shared_ptr<LowLatencyProblem> make_low_latency_problem(ep::Transport transport) {
  auto p = std::make_shared<LowLatencyProblem>();
  const int R = comm().size();
  const int E = kExperts - kExperts % R, El = E / R;
  const int64_t T = kLowLatencyTokens;
  p->buffer = std::make_unique<ep::Buffer>(comm(), ep::BufferConfig{.num_max_tokens_per_rank = T,
                                                                    .hidden = kHidden,
                                                                    .num_topk = kTopk,
                                                                    .num_experts = E,
                                                                    .transport = transport});
  p->x = Tensor::empty({T, kHidden}, DType::bf16);
  std::vector<float> row(static_cast<size_t>(T * kHidden));
  fill_uniform(row.data(), row.size(), 17 + static_cast<uint64_t>(comm().rank()));
  convert_f32_to_bf16(row.data(), p->x.data<bf16>(), row.size());
  uniform_routing(T, E, 23 + static_cast<uint64_t>(comm().rank()), p->topk, p->weights);
  p->dispatch_bytes.assign(R, 0);
  p->combine_bytes.assign(R, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<bool> hit(R, false);
    for (int k = 0; k < kTopk; ++k) {
      const int64_t rank = p->topk.data<int64_t>()[t * kTopk + k] / El;
      p->combine_bytes[rank] += kHidden * 2;
      if (!hit[rank]) p->dispatch_bytes[rank] += kHidden + kHidden / 32;
      hit[rank] = true;
    }
  }
  const ep::LowLatencyDispatchResult d = p->buffer->low_latency_dispatch(p->x, p->topk, T, E);
  p->handle = d.handle;
  p->y = Tensor::empty({El, R * T, kHidden}, DType::bf16);
  p->y.fill_bytes_(0x3C);  // the rows combine reads hold finite values
  return p;
}

// Upstream's count: FP8 bytes (with scales) per (token, expert) message for dispatch, BF16 bytes
// per message for combine.
double low_latency_bytes(bool dispatch) {
  const double per_message = dispatch ? kHidden + kHidden / 32.0 : kHidden * 2.0;
  return per_message * static_cast<double>(kLowLatencyTokens * kTopk);
}

// The peer: a memcpy of the counted bytes (shared memory), or one MPI_Alltoallv of the bytes this
// rank sends (MPI: a token crosses to a rank once).
std::function<void()> low_latency_peer(const std::vector<int64_t>& to, bool mpi, bool dispatch) {
  if (!mpi) return memcpy_peer(static_cast<int64_t>(low_latency_bytes(dispatch)));
  std::vector<int64_t> from(to.size());
  comm().alltoallv(to.data(), std::vector<int64_t>(to.size(), 8), from.data(),
                   std::vector<int64_t>(to.size(), 8));
  const int64_t send = std::accumulate(to.begin(), to.end(), int64_t{0});
  const int64_t recv = std::accumulate(from.begin(), from.end(), int64_t{0});
  auto sbuf = peer_buffer(send, 1);
  auto rbuf = peer_buffer(recv, 0);
  return [sbuf, rbuf, to, from] { comm().alltoallv(sbuf->data_ptr(), to, rbuf->data_ptr(), from); };
}

BenchCase low_latency_case(bool dispatch, ep::Transport transport) {
  const bool mpi = transport != ep::Transport::shared_memory;
  return {
      .name =
          std::string(dispatch ? "ep_ll_dispatch_fp8" : "ep_ll_combine_bf16") + suffix(transport),
      .shape = "T=128,H=7168,topk=8,E=256",
      .ceiling = "dram_read",
      .peer = mpi ? "MPI_Alltoallv" : "memcpy",
      .unavailable = needs_mpirun,
      .prepare = [=](const CaseContext& ctx) {
        auto p = make_low_latency_problem(transport);
        const int E = kExperts - kExperts % comm().size();
        std::function<void()> call;
        if (dispatch) {
          call = [p, E] { p->buffer->low_latency_dispatch(p->x, p->topk, kLowLatencyTokens, E); };
        } else {
          call = [p] { p->buffer->low_latency_combine(p->y, p->topk, p->weights, p->handle); };
        }
        const auto& to = dispatch ? p->dispatch_bytes : p->combine_bytes;
        return timed(call, low_latency_bytes(dispatch), low_latency_peer(to, mpi, dispatch),
                     ctx.quick);
      }};
}

// ---- verify: dispatch and combine, normal and low-latency, against dsk::ref::ep (upstream's
// refs.py over plain MPI_Alltoallv), bitwise, on every transport ----

// One rank's tokens for a verify case: fresh random rows, Tmax less `fewer` per rank before it
// (uneven counts), distinct experts per token with about one slot in ten masked to -1, random
// weights.
struct VerifyTokens {
  int64_t Tmax = 0;
  int E = 0;
  Tensor x, topk, weights;
};

VerifyTokens verify_tokens(int64_t Tmax, int64_t fewer) {
  VerifyTokens v;
  v.Tmax = Tmax;
  v.E = kExperts - kExperts % comm().size();
  const int64_t T = Tmax - (fewer * comm().rank()) % (Tmax / 2);
  std::mt19937_64 rng = fresh_rng();
  v.x = ref::randn({T, kHidden}, DType::bf16, rng());
  uniform_routing(T, v.E, rng(), v.topk, v.weights);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t i = 0; i < v.topk.numel(); ++i) {
    if (u(rng) < 0.1f) v.topk.data<int64_t>()[i] = -1;
    v.weights.data<float>()[i] = 0.1f + u(rng);
  }
  return v;
}

ep::Buffer verify_buffer(const VerifyTokens& v, ep::Transport transport, bool fp8) {
  return ep::Buffer(comm(), {.num_max_tokens_per_rank = v.Tmax,
                             .hidden = kHidden,
                             .num_topk = kTopk,
                             .num_experts = v.E,
                             .use_fp8_dispatch = fp8,
                             .transport = transport});
}

// Why a verify case cannot run here: outside mpirun, or shared memory across hosts.
std::string verify_unavailable(ep::Transport transport) {
  std::string why = needs_mpirun();
  if (why.empty() && transport == ep::Transport::shared_memory && !comm().single_host())
    why = "the ranks are on several hosts";
  return why;
}

// Every received field against the reference's: rows (and scales), local ids, weights, source
// positions, rows per local expert.
double dispatch_mismatches(const ep::DispatchResult& got, const ref::ep::Dispatch& want) {
  constexpr double kMissing = 1e30;
  double bad = mismatches(got.recv_x, want.x) + mismatches(got.handle.recv_src_idx, want.src_idx);
  bad += got.recv_topk_idx ? mismatches(*got.recv_topk_idx, want.topk_idx) : kMissing;
  if (want.x_sf) bad += got.recv_x_sf ? mismatches(*got.recv_x_sf, *want.x_sf) : kMissing;
  if (want.topk_weights)
    bad +=
        got.recv_topk_weights ? mismatches(*got.recv_topk_weights, *want.topk_weights) : kMissing;
  if (got.num_recv_tokens_per_expert_list.size() != want.rows_per_expert.size()) return kMissing;
  for (size_t e = 0; e < want.rows_per_expert.size(); ++e)
    bad += got.num_recv_tokens_per_expert_list[e] != want.rows_per_expert[e];
  return bad;
}

enum class VerifyOp { dispatch_bf16, dispatch_fp8, combine, combine_in_place };

// The largest count over the ranks, so that every rank reports (and prints) the same.
double verify_transfer(VerifyOp op, ep::Transport transport, bool quick) {
  const VerifyTokens v = verify_tokens(quick ? 128 : 512, 17);
  const bool fp8 = op == VerifyOp::dispatch_fp8;
  ep::Buffer buffer = verify_buffer(v, transport, fp8);
  std::mt19937_64 rng = fresh_rng();
  if (fp8) {
    const int64_t T = v.x.size(0);
    gemm::Fp8Tensor x{Tensor::empty({T, kHidden}, DType::e4m3),
                      ref::rand_uniform({T, kHidden / 128}, DType::f32, rng(), 0.5f, 2.0f)};
    const Tensor values = ref::randn({T, kHidden}, DType::f32, rng(), 0.0f, 100.0f);
    convert_f32_to_e4m3(values.data<float>(), x.data.data<e4m3>(),
                        static_cast<size_t>(T * kHidden));
    const ep::DispatchResult got =
        buffer.dispatch(x, {.topk_idx = v.topk, .topk_weights = v.weights});
    const ref::ep::Dispatch want = ref::ep::dispatch(comm(), x.data, x.sf, v.topk, v.weights, v.E);
    return comm().allreduce_max(dispatch_mismatches(got, want));
  }
  const ep::DispatchResult got =
      buffer.dispatch(v.x, {.topk_idx = v.topk, .topk_weights = v.weights});
  const ref::ep::Dispatch want =
      ref::ep::dispatch(comm(), v.x, std::nullopt, v.topk, v.weights, v.E);
  if (op == VerifyOp::dispatch_bf16) return comm().allreduce_max(dispatch_mismatches(got, want));
  // The experts' outputs: fresh rows of a wide range, in a tensor of their own or written over
  // recv_x (whose rows the transports may read where they are); one bias (the shared expert), or
  // two (the residual).
  const Tensor y = ref::rand_wide({want.x.size(0), kHidden}, DType::bf16, rng());
  std::vector<Tensor> bias{ref::rand_wide({v.x.size(0), kHidden}, DType::bf16, rng())};
  Tensor experts_out = y;
  if (op == VerifyOp::combine_in_place) {
    bias.push_back(ref::rand_wide({v.x.size(0), kHidden}, DType::bf16, rng()));
    if (got.recv_x.sizes() == y.sizes())
      std::memcpy(got.recv_x.data_ptr(), y.data_ptr(), y.nbytes());
    experts_out = got.recv_x;
  }
  const ep::CombineResult c = buffer.combine(
      experts_out, got.handle, {.topk_weights = *got.recv_topk_weights, .bias = bias});
  const ref::ep::Combine expect = ref::ep::combine(comm(), y, want, v.topk, bias, v.E);
  double bad = mismatches(c.combined_x, expect.x);
  bad +=
      c.combined_topk_weights ? mismatches(*c.combined_topk_weights, *expect.topk_weights) : 1e30;
  return comm().allreduce_max(bad);
}

// ---- verify, low-latency mode: T = 128 - 5r tokens per rank at most (--quick 32 - 5r) ----

enum class LowLatencyOp { dispatch_bf16, dispatch_fp8, combine };

// The rows of expert e that a dispatch says are valid: [0, count[e]) of [E_local, R * Tmax, ...].
double valid_row_mismatches(const Tensor& got, const Tensor& want, const Tensor& count) {
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) return 1e30;
  double bad = 0;
  for (int64_t e = 0; e < count.numel(); ++e) {
    const int64_t n = std::min<int64_t>(count.data<int32_t>()[e], got.size(1));
    bad += mismatches(got.select(0, e).slice(0, 0, n), want.select(0, e).slice(0, 0, n));
  }
  return bad;
}

double low_latency_dispatch_mismatches(const ep::LowLatencyDispatchResult& got,
                                       const ref::ep::LowLatencyDispatch& want) {
  double bad = mismatches(got.recv_count, want.count) +
               mismatches(got.handle.src_info, want.src_info) +
               mismatches(got.handle.layout_range, want.layout_range);
  if (bad != 0) return bad;  // the rows below are read by the reference's counts
  bad += valid_row_mismatches(got.recv_x, want.x, want.count);
  if (want.x_sf)
    bad += got.recv_x_sf ? valid_row_mismatches(*got.recv_x_sf, *want.x_sf, want.count) : 1e30;
  return bad;
}

double verify_low_latency(LowLatencyOp op, ep::Transport transport, bool quick) {
  const VerifyTokens v = verify_tokens(quick ? 32 : 128, 5);
  const int64_t Tmax = v.Tmax;
  ep::Buffer buffer = verify_buffer(v, transport, false);
  const bool fp8 = op == LowLatencyOp::dispatch_fp8;
  const ep::LowLatencyDispatchResult got =
      buffer.low_latency_dispatch(v.x, v.topk, Tmax, v.E, {.use_fp8 = fp8});
  if (fp8) {  // the rows the sender's cast gives
    const tk::QuantTensor cast = ref::tk::per_token_cast(v.x, "e4m3", 128);
    const ref::ep::LowLatencyDispatch want =
        ref::ep::low_latency_dispatch(comm(), cast.data, cast.sf, v.topk, Tmax, v.E);
    return comm().allreduce_max(low_latency_dispatch_mismatches(got, want));
  }
  const ref::ep::LowLatencyDispatch want =
      ref::ep::low_latency_dispatch(comm(), v.x, std::nullopt, v.topk, Tmax, v.E);
  const double bad = comm().allreduce_max(low_latency_dispatch_mismatches(got, want));
  if (op == LowLatencyOp::dispatch_bf16 || bad != 0) return bad;
  // The experts' outputs: wide-range values in the valid rows, NaN in the rest (never read).
  Tensor y = Tensor::empty(want.x.sizes(), DType::bf16);
  y.fill_bytes_(0xFF);
  std::mt19937_64 rng = fresh_rng();
  for (int64_t e = 0; e < y.size(0); ++e) {
    const Tensor rows =
        ref::rand_wide({want.count.data<int32_t>()[e], kHidden}, DType::bf16, rng());
    std::memcpy(y.select(0, e).data_ptr(), rows.data_ptr(), rows.nbytes());
  }
  const ep::LowLatencyCombineResult c =
      buffer.low_latency_combine(y, v.topk, v.weights, got.handle);
  const Tensor expect = ref::ep::low_latency_combine(comm(), y, want, v.topk, v.weights, v.E);
  return comm().allreduce_max(mismatches(c.combined_x, expect));
}

VerifyCase low_latency_verify(LowLatencyOp op, ep::Transport transport) {
  const std::string name = op == LowLatencyOp::dispatch_bf16  ? "ep_ll_dispatch_bf16"
                           : op == LowLatencyOp::dispatch_fp8 ? "ep_ll_dispatch_fp8"
                                                              : "ep_ll_combine_bf16";
  return {
      .name = name + suffix(transport),
      .shape = "T=128-5r(--quick 32-5r),H=7168,topk=8,E=256,10% -1",
      .metric = "mismatches",
      .tolerance = 0,
      .unavailable = [transport] { return verify_unavailable(transport); },
      .run = [=](const CaseContext& ctx) { return verify_low_latency(op, transport, ctx.quick); }};
}

VerifyCase transfer_verify(VerifyOp op, ep::Transport transport) {
  const std::string name = op == VerifyOp::dispatch_bf16  ? "ep_dispatch_bf16"
                           : op == VerifyOp::dispatch_fp8 ? "ep_dispatch_fp8"
                           : op == VerifyOp::combine      ? "ep_combine_bf16"
                                                          : "ep_combine_bf16_in_place";
  return {.name = name + suffix(transport),
          .shape = "T=512-17r(--quick 128-17r),H=7168,topk=8,E=256,10% -1",
          .metric = "mismatches",
          .tolerance = 0,
          .unavailable = [transport] { return verify_unavailable(transport); },
          .run = [=](const CaseContext& ctx) { return verify_transfer(op, transport, ctx.quick); }};
}

}  // namespace

void register_ep_cases(Registry& r) {
  for (ep::Transport transport :
       {ep::Transport::shared_memory, ep::Transport::mpi_alltoallv, ep::Transport::mpi_one_sided}) {
    r.add(transfer_case(Op::dispatch, transport));
    r.add(transfer_case(Op::combine, transport));
    if (transport == ep::Transport::shared_memory)
      r.add(transfer_case(Op::combine_private, transport));
  }
  r.add(transfer_case(Op::dispatch_fp8, ep::Transport::shared_memory));
  r.add(overlap_case());
  for (ep::Transport transport : {ep::Transport::shared_memory, ep::Transport::mpi_alltoallv}) {
    r.add(expand_case(true, transport));
    r.add(expand_case(false, transport));
  }
  for (ep::Transport transport :
       {ep::Transport::shared_memory, ep::Transport::mpi_alltoallv, ep::Transport::mpi_one_sided}) {
    r.add(low_latency_case(true, transport));
    r.add(low_latency_case(false, transport));
  }
  for (ep::Transport transport :
       {ep::Transport::shared_memory, ep::Transport::mpi_alltoallv, ep::Transport::mpi_one_sided})
    for (VerifyOp op : {VerifyOp::dispatch_bf16, VerifyOp::dispatch_fp8, VerifyOp::combine,
                        VerifyOp::combine_in_place})
      r.add(transfer_verify(op, transport));
  for (ep::Transport transport :
       {ep::Transport::shared_memory, ep::Transport::mpi_alltoallv, ep::Transport::mpi_one_sided})
    for (LowLatencyOp op :
         {LowLatencyOp::dispatch_bf16, LowLatencyOp::dispatch_fp8, LowLatencyOp::combine})
      r.add(low_latency_verify(op, transport));
}

}  // namespace dsk::bench
