// dsk::ep expand-mode combine with BufferConfig::allow_multiple_reduction = false under mpirun
// (2 and 4 ranks): every slot's row travels back and the owner reduces once, so the result is the
// single-reduction formula bf16(bias sum + Σ_k f32(row_k)), bitwise, for any number of ranks. The
// experts' outputs are a function of (global source id, global expert id, channel, run seed), so
// each rank computes the expected value of its own tokens without communication, from a formula
// with no term that depends on the rank count or the expert placement. Instantiated with the other
// EpTest cases (mpi_ep.cpp), so every test runs on every transport.
#include "ep/mpi_ep_test.hpp"

namespace dsk::ep::test {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One run's seed, the same on every rank.
uint64_t shared_seed() {
  uint64_t seed = rank_rng()();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return seed;
}

// Expert `expert`'s output for the token with global source id `gid`: random-looking, never zero,
// already a BF16 value.
float expert_value(uint64_t seed, int64_t gid, int64_t expert, int64_t h) {
  const uint64_t bits =
      mix(seed ^ mix(static_cast<uint64_t>(gid) * 0x9E3779B97F4A7C15ull ^
                     static_cast<uint64_t>(expert) << 40 ^ static_cast<uint64_t>(h)));
  const float u = static_cast<float>(bits >> 40) / static_cast<float>(1 << 24);  // [0, 1)
  const float magnitude = 0.05f + 2.0f * u;
  return bf16_to_f32(f32_to_bf16((bits & 1) ? -magnitude : magnitude));
}

// The local expert whose block holds expanded row `row`.
int local_expert_of_row(const DispatchHandle& h, int64_t row) {
  const int32_t* psum = h.psum_num_recv_tokens_per_expert.data<int32_t>();
  const int64_t El = h.psum_num_recv_tokens_per_expert.size(0), A = h.expert_alignment;
  for (int64_t e = 0; e < El; ++e) {
    const int64_t start = e == 0 ? 0 : (psum[e - 1] + A - 1) / A * A;
    if (row >= start && row < psum[e]) return static_cast<int>(e);
  }
  return -1;
}

// The experts' outputs in the dispatch's expanded layout; padding rows stay NaN (never read).
Tensor expert_outputs(const DispatchResult& d, uint64_t seed, int rank, int El) {
  const int64_t H = d.recv_x.size(1);
  const int K = static_cast<int>(d.handle.recv_src_metadata.size(1)) - 2;
  Tensor y = Tensor::empty({d.recv_x.size(0), H}, DType::bf16);
  y.fill_bytes_(0xFF);
  const Tensor& meta = d.handle.recv_src_metadata;
  for (int64_t i = 0; i < meta.size(0); ++i) {
    for (int k = 0; k < K; ++k) {
      const int32_t erow = meta.at<int32_t>({i, 2 + k});
      if (erow < 0) continue;
      const int64_t expert = static_cast<int64_t>(rank) * El + local_expert_of_row(d.handle, erow);
      bf16* out = &y.at<bf16>({erow, 0});
      for (int64_t h = 0; h < H; ++h)
        out[h] = f32_to_bf16(expert_value(seed, meta.at<int32_t>({i, 0}), expert, h));
    }
  }
  return y;
}

// Checks this rank's combined tokens against the single-reduction formula, computed locally.
void expect_single_reduction(const CombineResult& c, const Tensor& topk, const Tensor* weights,
                             const std::vector<Tensor>& bias, uint64_t seed, int64_t tmax) {
  const int64_t T = topk.size(0), H = c.combined_x.size(1);
  const int K = static_cast<int>(topk.size(1));
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t gid = world_rank() * tmax + t;
    for (int64_t h = 0; h < H; ++h) {
      acc[h] = bias.empty() ? 0.0f : bf16_to_f32(bias[0].at<bf16>({t, h}));
      if (bias.size() == 2) acc[h] += bf16_to_f32(bias[1].at<bf16>({t, h}));
    }
    for (int k = 0; k < K; ++k) {
      const int64_t e = topk.at<int64_t>({t, k});
      if (e < 0) continue;
      for (int64_t h = 0; h < H; ++h) acc[h] += expert_value(seed, gid, e, h);
    }
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(c.combined_x.at<bf16>({t, h}).bits, f32_to_bf16(acc[h]).bits)
          << "token " << t << " channel " << h << " biases " << bias.size();
    if (!weights) continue;
    ASSERT_TRUE(c.combined_topk_weights.has_value());
    for (int k = 0; k < K; ++k) {
      const float expect = topk.at<int64_t>({t, k}) >= 0 ? weights->at<float>({t, k}) : 0.0f;
      ASSERT_EQ(c.combined_topk_weights->at<float>({t, k}), expect) << "token " << t;
    }
  }
}

// Every sixth token selects no expert at all: it goes nowhere and combines to its bias sum.
Tensor with_unrouted_tokens(Tensor topk) {
  for (int64_t t = 0; t < topk.size(0); t += 6)
    for (int64_t k = 0; k < topk.size(1); ++k) topk.at<int64_t>({t, k}) = -1;
  return topk;
}

// Per-128-channel FP8 cast (amax / 448 scales), as a dispatch's caller would do it.
gemm::Fp8Tensor to_fp8(const Tensor& x) {
  const int64_t T = x.size(0), H = x.size(1);
  gemm::Fp8Tensor out{Tensor::empty({T, H}, DType::e4m3), Tensor::empty({T, H / 128}, DType::f32)};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < H / 128; ++b) {
      float amax = 1e-4f;
      for (int64_t h = b * 128; h < (b + 1) * 128; ++h)
        amax = std::max(amax, std::fabs(bf16_to_f32(x.at<bf16>({t, h}))));
      const float scale = amax / 448.0f;
      out.sf.at<float>({t, b}) = scale;
      for (int64_t h = b * 128; h < (b + 1) * 128; ++h)
        out.data.at<e4m3>({t, h}) = f32_to_e4m3(bf16_to_f32(x.at<bf16>({t, h})) / scale);
    }
  }
  return out;
}

std::unique_ptr<Buffer> single_reduction_buffer(const Communicator& comm, BufferConfig c) {
  c.allow_multiple_reduction = false;
  return std::make_unique<Buffer>(comm, c);
}

TEST_P(EpTest, SingleReductionCombineIsTheOneSumInSlotOrder) {
  for (const bool fp8 : {false, true}) {
    auto buffer = single_reduction_buffer(comm(), config(fp8));
    const uint64_t seed = shared_seed();
    const int64_t T = tokens();
    const Tensor x = random_bf16(T, kHidden, rng);
    const Tensor topk = with_unrouted_tokens(random_topk(T, kTopk, E(), rng, 0.2));
    const Tensor w = random_weights(T, kTopk, rng);
    const DispatchArgs args{.topk_idx = topk, .topk_weights = w, .do_expand = true};
    const DispatchResult d = fp8 ? buffer->dispatch(to_fp8(x), args) : buffer->dispatch(x, args);
    const Tensor y = expert_outputs(d, seed, me(), El());
    for (int nbias = 0; nbias <= 2; ++nbias) {
      std::vector<Tensor> bias;
      for (int i = 0; i < nbias; ++i) bias.push_back(random_bf16(T, kHidden, rng));
      const CombineResult c =
          buffer->combine(y, d.handle, {.topk_weights = *d.recv_topk_weights, .bias = bias});
      expect_single_reduction(c, topk, &w, bias, seed, kTmax);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(EpTest, SingleReductionCombineAsyncCachedAndWorstTokens) {
  auto buffer = single_reduction_buffer(comm(), config());
  const uint64_t seed = shared_seed();
  const auto [T, x, topk0, w] = make_tokens(0.2);
  const Tensor topk = with_unrouted_tokens(topk0.clone());
  const DispatchResult d = buffer->dispatch(x, {.topk_idx = topk, .do_expand = true});
  const std::vector<Tensor> bias{random_bf16(T, kHidden, rng)};
  const CombineResult c = buffer->combine(expert_outputs(d, seed, me(), El()), d.handle,
                                          {.bias = bias, .async_finish = true});
  c.event.wait();
  expect_single_reduction(c, topk, nullptr, bias, seed, kTmax);
  // A cached dispatch replays the routing; worst-case sizing adds a tail no record writes.
  const DispatchResult cached = buffer->dispatch(x, {.handle = d.handle, .do_expand = true});
  const CombineResult cc =
      buffer->combine(expert_outputs(cached, seed, me(), El()), cached.handle, {.bias = bias});
  expect_single_reduction(cc, topk, nullptr, bias, seed, kTmax);
  const DispatchResult worst = buffer->dispatch(
      x, {.topk_idx = topk, .num_worst_tokens = d.recv_x.size(0) + 64, .do_expand = true});
  const CombineResult cw =
      buffer->combine(expert_outputs(worst, seed, me(), El()), worst.handle, {.bias = bias});
  expect_single_reduction(cw, topk, nullptr, bias, seed, kTmax);
}

// Model-sized rows (H = 7168, K = 8) through the smallest buffer get_buffer_size_hint gives for
// them (Tmax = 32): a slot holds 36 (2 ranks) or 18 (4 ranks) slot records, and each peer sends
// about 32 * 8 / ranks of them, so every combine streams in several rounds per peer.
TEST_P(EpTest, SingleReductionCombineStreamsThroughTheHintedBuffer) {
  if (GetParam().small_buffer || GetParam().transport == Transport::mpi_alltoallv)
    GTEST_SKIP() << "slots sized by the hint: shared memory and one-sided only";
  constexpr int64_t kBigHidden = 7168;
  constexpr int kBigTopk = 8;
  constexpr int64_t tmax = 32;
  BufferConfig cfg = config(false, kBigHidden);
  cfg.num_bytes = 0;
  cfg.num_max_tokens_per_rank = tmax;
  cfg.num_topk = kBigTopk;
  cfg.num_experts = 16 * R();
  auto buffer = single_reduction_buffer(comm(), cfg);
  EXPECT_EQ(buffer->num_bytes(), Buffer::get_buffer_size_hint(R(), tmax, kBigHidden, kBigTopk,
                                                              /*use_fp8_dispatch=*/false));
  const uint64_t seed = shared_seed();
  const int64_t T = tmax - 5 * me();
  const Tensor x = random_bf16(T, kBigHidden, rng);
  const Tensor topk = random_topk(T, kBigTopk, cfg.num_experts, rng, 0.05);
  const Tensor w = random_weights(T, kBigTopk, rng);
  const DispatchResult d =
      buffer->dispatch(x, {.topk_idx = topk, .topk_weights = w, .do_expand = true});
  const CombineResult c = buffer->combine(expert_outputs(d, seed, me(), cfg.num_experts / R()),
                                          d.handle, {.topk_weights = *d.recv_topk_weights});
  expect_single_reduction(c, topk, &w, {}, seed, tmax);
}

// Model-sized slot rows (14 KB) and 640 tokens: several MB of slot records per peer through many
// ring rounds, packed in chunks on MPI; without weights a rank's own slot rows are read where they
// are in x.
TEST_P(EpTest, SingleReductionCombineOfModelSizedRows) {
  auto buffer = single_reduction_buffer(comm(), model_sized_config());
  const uint64_t seed = shared_seed();
  const auto [T, x, topk, w] = make_model_sized_tokens();
  const DispatchResult d =
      buffer->dispatch(x, {.topk_idx = topk, .topk_weights = w, .do_expand = true});
  const Tensor y = expert_outputs(d, seed, me(), El());
  const std::vector<Tensor> bias{random_bf16(T, kModelHidden, rng)};
  expect_single_reduction(buffer->combine(y, d.handle, {.bias = bias}), topk, nullptr, bias, seed,
                          kModelTokens);
  if (HasFatalFailure()) return;
  expect_single_reduction(
      buffer->combine(y, d.handle, {.topk_weights = *d.recv_topk_weights, .bias = bias}), topk, &w,
      bias, seed, kModelTokens);
}

// Non-expand rows were already reduced over the local experts: the flag changes nothing.
// Every token's 8 slots on one rank, through slots of a few rows: the owner cannot hold all of a
// token's rows where they land (it would wait for rows that cannot be posted), so it stages them.
TEST_P(EpTest, SingleReductionCombineOfTokensWhoseSlotsCrowdOneRank) {
  BufferConfig cfg = config();
  cfg.num_topk = 8;
  cfg.num_experts = 16 * R();
  cfg.num_bytes = static_cast<int64_t>(R()) * 8 * 1024;  // about 3 rows per slot
  auto buffer = single_reduction_buffer(comm(), cfg);
  const uint64_t seed = shared_seed();
  const int64_t T = 24 - 3 * me();
  const Tensor x = random_bf16(T, kHidden, rng);
  const Tensor topk = crowded_topk(T, cfg.num_topk, 16, R(), me());
  const DispatchResult d = buffer->dispatch(x, {.topk_idx = topk, .do_expand = true});
  const CombineResult c = buffer->combine(expert_outputs(d, seed, me(), 16), d.handle, {});
  expect_single_reduction(c, topk, nullptr, {}, seed, cfg.num_max_tokens_per_rank);
}

TEST_P(EpTest, SingleReductionLeavesNonExpandCombineUnchanged) {
  auto single = single_reduction_buffer(comm(), config());
  auto multiple = make_buffer();
  const auto [T, x, topk, w] = make_tokens();
  const std::vector<Tensor> bias{random_bf16(T, kHidden, rng), random_bf16(T, kHidden, rng)};
  const DispatchResult ds = single->dispatch(x, {.topk_idx = topk, .topk_weights = w});
  const DispatchResult dm = multiple->dispatch(x, {.topk_idx = topk, .topk_weights = w});
  const Tensor y = random_bf16(ds.recv_x.size(0), kHidden, rng);
  const CombineResult cs = single->combine(y, ds.handle, {.bias = bias});
  const CombineResult cm = multiple->combine(y, dm.handle, {.bias = bias});
  EXPECT_EQ(std::memcmp(cs.combined_x.data_ptr(), cm.combined_x.data_ptr(), cm.combined_x.nbytes()),
            0);
}

TEST_P(EpTest, RanksThatDisagreeOnAllowMultipleReductionFailTogether) {
  BufferConfig c = config();
  c.allow_multiple_reduction = me() != R() - 1;
  try {
    Buffer buffer(comm(), c);
    ADD_FAILURE() << "the buffer was built although the ranks disagree";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("allow_multiple_reduction"), std::string::npos)
        << e.what();
  }
  // The group still works afterwards.
  c.allow_multiple_reduction = false;
  EXPECT_NO_THROW(Buffer(comm(), c));
}

}  // namespace
}  // namespace dsk::ep::test
