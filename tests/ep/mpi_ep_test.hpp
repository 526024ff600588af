// Helpers of the dsk::ep tests that run under mpirun: random routing, a plain MPI_Alltoallv
// reference dispatch (upstream refs.py), and the deterministic combine inputs whose expected sums
// every rank can recompute.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <dsk/core.hpp>
#include <dsk/ep.hpp>
#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::ep::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Fresh randomness per run and per rank.
inline std::mt19937_64 rank_rng() {
  std::random_device rd;
  return std::mt19937_64((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                         (static_cast<uint64_t>(world_rank()) * 0x9E3779B97F4A7C15ull));
}

inline Tensor random_bf16(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  Tensor t = Tensor::empty({rows, cols}, DType::bf16);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bf16>()[i] = f32_to_bf16(d(rng) + 0.01f);
  return t;
}

// Distinct experts per token, about one slot in ten masked to -1.
inline Tensor random_topk(int64_t T, int K, int E, std::mt19937_64& rng, double masked = 0.1) {
  Tensor idx = Tensor::empty({T, K}, DType::i64);
  std::vector<int> experts(E);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int k = 0; k < K; ++k) {
      std::swap(experts[k], experts[k + rng() % (E - k)]);
      idx.data<int64_t>()[t * K + k] = u(rng) < masked ? -1 : experts[k];
    }
  }
  return idx;
}

// Routing whose every token sends all K slots to one rank ((t + rank) % R, each slot a distinct
// one of its El >= K experts): more rows per token and rank than slots of a few rows hold.
inline Tensor crowded_topk(int64_t T, int K, int El, int R, int rank) {
  Tensor idx = Tensor::empty({T, K}, DType::i64);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = (t + rank) % R;
    for (int k = 0; k < K; ++k) idx.data<int64_t>()[t * K + k] = r * El + (t + k) % El;
  }
  return idx;
}

inline Tensor random_weights(int64_t T, int K, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(0.1f, 1.0f);
  Tensor w = Tensor::empty({T, K}, DType::f32);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = d(rng);
  return w;
}

// Deterministic combine input for (global source id, tag, channel): every rank can recompute
// what any other rank sent.
inline float combine_value(int64_t gid, int tag, int64_t h) {
  return bf16_to_f32(
      f32_to_bf16(std::sin(0.37f * static_cast<float>(gid % 4099) + 1.3f * static_cast<float>(tag) +
                           0.01f * static_cast<float>(h))));
}

// The expert outputs of the upstream-order tests: every row a rank received answers with
// combine_value(its global source id, the rank).
inline Tensor answer_rows(const DispatchResult& d, int64_t H, int rank) {
  const int64_t N = d.recv_x.size(0);
  Tensor y = Tensor::empty({N, H}, DType::bf16);
  for (int64_t row = 0; row < N; ++row)
    for (int64_t h = 0; h < H; ++h)
      y.at<bf16>({row, h}) =
          f32_to_bf16(combine_value(d.handle.recv_src_metadata.at<int32_t>({row, 0}), rank, h));
  return y;
}

// refs.py's combine of token t (global id gid) of those answers, channel h: `start` (the bias),
// then each rank's answer at that rank's last top-k slot, in slot order.
inline float upstream_order_sum(const Tensor& topk, int64_t t, int El, int64_t gid, int64_t h,
                                float start) {
  const int64_t K = topk.size(1);
  float acc = start;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t e = topk.at<int64_t>({t, k});
    bool last = e >= 0;
    for (int64_t j = k + 1; j < K && last; ++j) {
      const int64_t f = topk.at<int64_t>({t, j});
      last = !(f >= 0 && f / El == e / El);
    }
    if (last) acc += combine_value(gid, static_cast<int>(e / El), h);
  }
  return acc;
}

// The combined top-k weights: the dispatched weight where the slot was routed, else 0.
inline void expect_combined_weights(const CombineResult& c, const Tensor& topk, const Tensor& w) {
  for (int64_t t = 0; t < topk.size(0); ++t) {
    for (int64_t k = 0; k < topk.size(1); ++k) {
      const float expect = topk.at<int64_t>({t, k}) >= 0 ? w.at<float>({t, k}) : 0.0f;
      ASSERT_EQ(c.combined_topk_weights->at<float>({t, k}), expect) << t << "," << k;
    }
  }
}

inline uint64_t hash_bytes(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Whether `cond` holds on every rank (so all ranks take the same branch after a check).
inline bool all_ranks(bool cond) {
  int v = cond ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

// ---- The fixture every test under mpirun uses ----
inline constexpr int64_t kHidden = 256;
inline constexpr int kTopk = 4;

struct Param {
  Transport transport;
  bool small_buffer;  // slots hold a few rows: exchanges run over many chunks
};

inline std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(transport_name(info.param.transport)) +
         (info.param.small_buffer ? "_small" : "");
}

// One rank's tokens: uneven counts per rank, random rows, routing with -1 masks, weights.
struct Tokens {
  int64_t T = 0;
  Tensor x, topk, weights;
};

// Parameterised over the transports (instantiated once, in mpi_ep.cpp).
class EpTest : public ::testing::TestWithParam<Param> {
 protected:
  // async_finish moves the data on the communication thread even though mpirun binds each rank
  // to one core (where the default moves it in the call): the tests of outstanding operations
  // need it. AsyncFinishWithoutTheThreadMovesTheDataInTheCall checks the other mode.
  dsk::test::ScopedEnv progress_thread_{"DSK_EP_PROGRESS_THREAD", "1"};

  static Communicator& comm() {
    static Communicator c = Communicator::world();
    return c;
  }
  int R() const { return comm().size(); }
  int me() const { return comm().rank(); }
  int E() const { return 4 * R(); }
  int El() const { return E() / R(); }
  // Uneven token counts per rank.
  int64_t tokens() const { return 96 - 17 * me(); }
  static constexpr int64_t kTmax = 128;

  BufferConfig config(bool fp8 = false, int64_t hidden = kHidden) const {
    BufferConfig c{.num_max_tokens_per_rank = kTmax,
                   .hidden = hidden,
                   .num_topk = kTopk,
                   .num_experts = E(),
                   .use_fp8_dispatch = fp8,
                   .transport = GetParam().transport,
                   .timeout_s = 20};
    if (GetParam().small_buffer) {
      // Room for about 3 rows per slot.
      c.num_bytes = static_cast<int64_t>(R()) * 8 * 1024 * (hidden / kHidden);
    }
    return c;
  }
  // dsk::ref::ep::dispatch of these tokens over the group (upstream's refs.py).
  ref::ep::Dispatch ref_dispatch(const Tensor& x, const Tensor* sf, const Tensor& topk,
                                 const Tensor* weights) const {
    return ref::ep::dispatch(comm(), x, sf ? std::optional(*sf) : std::nullopt, topk,
                             weights ? std::optional(*weights) : std::nullopt, E());
  }
  std::unique_ptr<Buffer> make_buffer(bool fp8 = false, int64_t hidden = kHidden) {
    return std::make_unique<Buffer>(comm(), config(fp8, hidden));
  }
  // Fresh tokens of this rank; `masked` is the share of -1 slots.
  Tokens make_tokens(double masked = 0.1, int64_t hidden = kHidden) {
    Tokens tk;
    tk.T = tokens();
    tk.x = random_bf16(tk.T, hidden, rng);
    tk.topk = random_topk(tk.T, kTopk, E(), rng, masked);
    tk.weights = random_weights(tk.T, kTopk, rng);
    return tk;
  }

  // Rows of the model's width for up to kModelTokens tokens (17 fewer per later rank): exchanges
  // of several MB per peer, through many ring rounds, and outputs of tens of MB.
  static constexpr int64_t kModelHidden = 7168, kModelTokens = 640;
  BufferConfig model_sized_config() const {
    BufferConfig c = config(false, kModelHidden);
    c.num_max_tokens_per_rank = kModelTokens;
    return c;
  }
  Tokens make_model_sized_tokens() {
    Tokens tk;
    tk.T = kModelTokens - 17 * me();
    tk.x = random_bf16(tk.T, kModelHidden, rng);
    tk.topk = random_topk(tk.T, kTopk, E(), rng, 0.1);
    tk.weights = random_weights(tk.T, kTopk, rng);
    return tk;
  }

  std::mt19937_64 rng = rank_rng();
};

}  // namespace dsk::ep::test
