// dsk::ep low-latency mode under mpirun (2 and 4 ranks), the upstream test_low_latency checks
// against a plain reference: every rank gathers every rank's tokens and routing, and recomputes
// each local expert's rows (source ranks ascending, each in token order), counts, layout ranges
// and source indices, the FP8 casts, and the weighted combine (bitwise, in top-k order). Also -1
// ids, the receive hook, async completion, the two-results rule, the wait statistics and bad
// inputs; the LogFMT-10 combine (bitwise against the codec, within upstream's tolerance of the
// plain one) and the zero-copy combine (bitwise equal to the copying one). Instantiated with the
// other EpTest cases (mpi_ep.cpp), so every test runs on every transport.
#include "ep/mpi_ep_test.hpp"

#include <chrono>
#include <thread>

#include <dsk/ref.hpp>
#include <dsk/tk.hpp>

#include "../src/ep/logfmt.hpp"

namespace dsk::ep::test {
namespace {

// Every rank's tokens, gathered (the reference reads them all).
struct World {
  std::vector<int64_t> T;                  // per rank
  std::vector<std::vector<uint16_t>> x;    // per rank [T][H] bf16 bits
  std::vector<std::vector<int64_t>> topk;  // per rank [T][K]
};

template <class V>
std::vector<std::vector<V>> allgather_rows(const V* mine, int64_t n, int64_t per_row,
                                           const std::vector<int64_t>& rows) {
  const int R = world_size();
  std::vector<int> counts(R), displs(R);
  int total = 0;
  for (int r = 0; r < R; ++r) {
    counts[r] = static_cast<int>(rows[r] * per_row * static_cast<int64_t>(sizeof(V)));
    displs[r] = total;
    total += counts[r];
  }
  std::vector<std::byte> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine, static_cast<int>(n * per_row * static_cast<int64_t>(sizeof(V))), MPI_BYTE,
                 all.data(), counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<V>> out(R);
  for (int r = 0; r < R; ++r) {
    out[r].resize(static_cast<size_t>(rows[r] * per_row));
    if (counts[r] > 0)  // an empty vector's data() may be null
      std::memcpy(out[r].data(), all.data() + displs[r], static_cast<size_t>(counts[r]));
  }
  return out;
}

World gather(const Tokens& tk) {
  World w;
  const int R = world_size();
  w.T.resize(R);
  MPI_Allgather(&tk.T, 1, MPI_INT64_T, w.T.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  const int64_t H = tk.x.size(1);
  w.x = allgather_rows(reinterpret_cast<const uint16_t*>(tk.x.data_ptr()), tk.T, H, w.T);
  w.topk = allgather_rows(tk.topk.data<int64_t>(), tk.T, kTopk, w.T);
  return w;
}

// The reference rows of one local expert: (source rank, token) in order, without the sources
// that shrink mode left out (left_out[s] != 0).
std::vector<std::pair<int, int64_t>> expert_rows(const World& w, int64_t global_expert,
                                                 const std::vector<char>& left_out = {}) {
  std::vector<std::pair<int, int64_t>> rows;
  for (int s = 0; s < static_cast<int>(w.T.size()); ++s)
    for (int64_t t = 0; t < w.T[s] && (left_out.empty() || !left_out[s]); ++t)
      for (int k = 0; k < kTopk; ++k)
        if (w.topk[s][t * kTopk + k] == global_expert) rows.emplace_back(s, t);
  return rows;
}

// Checks counts, layout ranges and source indices of a dispatch against the reference; returns
// the reference rows per local expert.
std::vector<std::vector<std::pair<int, int64_t>>> check_layout(
    const World& w, const LowLatencyDispatchResult& d, int me, int El,
    const std::vector<char>& left_out = {}) {
  const int R = static_cast<int>(w.T.size());
  std::vector<std::vector<std::pair<int, int64_t>>> all(El);
  for (int e = 0; e < El; ++e) {
    all[e] = expert_rows(w, me * El + e, left_out);
    const auto& rows = all[e];
    EXPECT_EQ(d.recv_count.data<int32_t>()[e], static_cast<int32_t>(rows.size()));
    int64_t begin = 0;
    for (int s = 0; s < R; ++s) {
      const auto count = static_cast<int64_t>(
          std::count_if(rows.begin(), rows.end(), [&](const auto& p) { return p.first == s; }));
      EXPECT_EQ(d.handle.layout_range.at<int64_t>({e, s}), (begin << 32) | count) << e << "," << s;
      begin += count;
    }
    const int64_t RT = d.handle.src_info.size(1);
    for (int64_t i = 0; i < RT; ++i) {
      const int32_t expected = i < static_cast<int64_t>(rows.size()) ? rows[i].second : -1;
      EXPECT_EQ(d.handle.src_info.at<int32_t>({e, i}), expected) << e << "," << i;
      if (d.handle.src_info.at<int32_t>({e, i}) != expected) break;  // one report per expert
    }
  }
  return all;
}

// Checks a dispatch's rows bitwise against the reference rows check_layout returned.
void expect_reference_rows(const World& w, const LowLatencyDispatchResult& d,
                           const std::vector<std::vector<std::pair<int, int64_t>>>& rows) {
  for (size_t e = 0; e < rows.size(); ++e) {
    for (size_t i = 0; i < rows[e].size(); ++i) {
      const auto [s, t] = rows[e][i];
      ASSERT_EQ(
          std::memcmp(&d.recv_x.at<bf16>({static_cast<int64_t>(e), static_cast<int64_t>(i), 0}),
                      w.x[s].data() + t * kHidden, kHidden * 2),
          0)
          << e << "," << i;
    }
  }
}

// Identity experts: combined[t] = bf16(sum over k in top-k order of w * x[t]) over the slots
// whose expert rank shrink mode did not leave out.
void expect_identity_combine(const Tensor& combined, const Tokens& tk, int El,
                             const std::vector<char>& left_out = {}) {
  for (int64_t t = 0; t < tk.T; ++t) {
    for (int64_t h = 0; h < kHidden; ++h) {
      float acc = 0.0f;
      for (int k = 0; k < kTopk; ++k) {
        const int64_t g = tk.topk.at<int64_t>({t, k});
        if (g >= 0 && (left_out.empty() || !left_out[g / El]))
          acc += tk.weights.at<float>({t, k}) * bf16_to_f32(tk.x.at<bf16>({t, h}));
      }
      ASSERT_EQ(combined.at<bf16>({t, h}).bits, f32_to_bf16(acc).bits) << t << "," << h;
    }
  }
}

// A deterministic expert output for (global expert, global source id, channel).
float expert_value(int64_t expert, int64_t gid, int64_t h) {
  return combine_value(gid, static_cast<int>(expert), h);
}

TEST_P(EpTest, LowLatencyDispatchMatchesTheReference) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  const World w = gather(tk);
  Tensor stats = Tensor::zeros({El()}, DType::i32);
  for (int run = 0; run < 2; ++run) {
    const LowLatencyDispatchResult d = buffer->low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = false, .cumulative_local_expert_recv_stats = stats});
    ASSERT_EQ(d.recv_x.sizes(), (Shape{El(), R() * kTmax, kHidden}));
    EXPECT_FALSE(d.recv_x_sf.has_value());
    const auto rows = check_layout(w, d, me(), El());
    expect_reference_rows(w, d, rows);
    for (int e = 0; e < El(); ++e) {
      EXPECT_EQ(stats.data<int32_t>()[e], (run + 1) * d.recv_count.data<int32_t>()[e]);
    }
  }
}

// FP8 with per-128 scales (plain, rounded, UE8M0-packed): the rows and scales are the sender's
// tk::per_token_cast of its tokens, bitwise.
TEST_P(EpTest, LowLatencyFp8CarriesTheSendersCast) {
  constexpr int64_t H = 512;  // UE8M0 packs four 128-channel scales per int32
  auto buffer = make_buffer(false, H);
  const Tokens tk = make_tokens(0.1, H);
  const World w = gather(tk);
  for (const int mode : {0, 1, 2}) {  // plain, round_scale, round_scale + use_ue8m0
    const bool round = mode >= 1, ue8m0 = mode == 2;
    const LowLatencyDispatchResult d = buffer->low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = true, .round_scale = round, .use_ue8m0 = ue8m0});
    EXPECT_EQ(d.recv_x.dtype(), DType::e4m3);
    ASSERT_TRUE(d.recv_x_sf.has_value());
    EXPECT_EQ(d.recv_x_sf->dtype(), ue8m0 ? DType::i32 : DType::f32);
    const auto rows = check_layout(w, d, me(), El());
    for (int e = 0; e < El(); ++e) {
      for (size_t i = 0; i < rows[e].size(); ++i) {
        const auto [s, t] = rows[e][i];
        Tensor row = Tensor::empty({1, H}, DType::bf16);
        std::memcpy(row.data_ptr(), w.x[s].data() + t * H, H * 2);
        const tk::QuantTensor q = tk::per_token_cast(row, "e4m3", 128, false, round, false);
        const auto r = static_cast<int64_t>(i);
        ASSERT_EQ(std::memcmp(&d.recv_x.at<e4m3>({e, r, 0}), q.data.data_ptr(), H), 0);
        if (ue8m0) {
          const auto* bytes =
              reinterpret_cast<const uint8_t*>(&d.recv_x_sf->at<int32_t>({e, r, 0}));
          for (int64_t b = 0; b < H / 128; ++b) {
            const float sf = q.sf.data<float>()[b];
            uint32_t bits;
            std::memcpy(&bits, &sf, 4);
            ASSERT_EQ(bits & 0x7FFFFFu, 0u);  // a power of two
            ASSERT_EQ(bytes[b], bits >> 23);
          }
        } else {
          ASSERT_EQ(std::memcmp(&d.recv_x_sf->at<float>({e, r, 0}), q.sf.data_ptr(), H / 128 * 4),
                    0);
        }
      }
    }
  }
}

// Combine: expert e answers row (s, t) with expert_value(e, gid, h); the owner's result must be
// bf16(sum over k in top-k order of w * value), bitwise; identity experts give x * sum(w).
TEST_P(EpTest, LowLatencyCombineIsTheWeightedSumInTopkOrder) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens(0.2);
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  const int64_t RT = R() * kTmax;
  Tensor y = Tensor::empty({El(), RT, kHidden}, DType::bf16);
  y.fill_bytes_(0xFF);  // rows past recv_count must not be read (NaN would poison the sums)
  for (int e = 0; e < El(); ++e) {
    for (int s = 0; s < R(); ++s) {
      const int64_t range = d.handle.layout_range.at<int64_t>({e, s});
      for (int64_t i = range >> 32; i < (range >> 32) + (range & 0xFFFFFFFF); ++i) {
        const int64_t gid = s * kTmax + d.handle.src_info.at<int32_t>({e, i});
        for (int64_t h = 0; h < kHidden; ++h)
          y.at<bf16>({e, i, h}) = f32_to_bf16(expert_value(me() * El() + e, gid, h));
      }
    }
  }
  const LowLatencyCombineResult c = buffer->low_latency_combine(y, tk.topk, tk.weights, d.handle);
  for (int64_t t = 0; t < tk.T; ++t) {
    for (int64_t h = 0; h < kHidden; ++h) {
      float acc = 0.0f;
      for (int k = 0; k < kTopk; ++k) {
        const int64_t g = tk.topk.at<int64_t>({t, k});
        if (g >= 0) acc += tk.weights.at<float>({t, k}) * expert_value(g, me() * kTmax + t, h);
      }
      ASSERT_EQ(c.combined_x.at<bf16>({t, h}).bits, f32_to_bf16(acc).bits) << t << "," << h;
    }
  }
  // Identity experts, into a caller's tensor: x * sum(w) in the same order.
  Tensor out = Tensor::empty({tk.T, kHidden}, DType::bf16);
  out.fill_bytes_(0xFF);
  const LowLatencyCombineResult id =
      buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle, {.out = out});
  EXPECT_EQ(id.combined_x.data_ptr(), out.data_ptr());
  expect_identity_combine(out, tk, El());
}

// dsk::ref::ep's low-latency dispatch and combine (the reference `dsk verify ep` uses) equal the
// library's bitwise: counts, source positions, layout ranges and the valid rows; the combine of
// wide-range expert outputs (so the order of the sum shows), NaN in the rows past the counts.
TEST_P(EpTest, LowLatencyEqualsTheSharedReference) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens(0.2);
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  const ref::ep::LowLatencyDispatch want =
      ref::ep::low_latency_dispatch(comm(), tk.x, std::nullopt, tk.topk, kTmax, E());
  ASSERT_EQ(std::memcmp(d.recv_count.data_ptr(), want.count.data_ptr(), want.count.nbytes()), 0);
  ASSERT_EQ(
      std::memcmp(d.handle.src_info.data_ptr(), want.src_info.data_ptr(), want.src_info.nbytes()),
      0);
  ASSERT_EQ(std::memcmp(d.handle.layout_range.data_ptr(), want.layout_range.data_ptr(),
                        want.layout_range.nbytes()),
            0);
  Tensor y = Tensor::empty(want.x.sizes(), DType::bf16);
  y.fill_bytes_(0xFF);
  for (int e = 0; e < El(); ++e) {
    const int64_t n = want.count.data<int32_t>()[e];
    ASSERT_EQ(std::memcmp(d.recv_x.select(0, e).data_ptr(), want.x.select(0, e).data_ptr(),
                          static_cast<size_t>(n * kHidden * 2)),
              0)
        << "expert " << e;
    const Tensor rows = ref::rand_wide({n, kHidden}, DType::bf16, rng());
    std::memcpy(y.select(0, e).data_ptr(), rows.data_ptr(), rows.nbytes());
  }
  const LowLatencyCombineResult c = buffer->low_latency_combine(y, tk.topk, tk.weights, d.handle);
  const Tensor expect = ref::ep::low_latency_combine(comm(), y, want, tk.topk, tk.weights, E());
  EXPECT_EQ(std::memcmp(c.combined_x.data_ptr(), expect.data_ptr(), expect.nbytes()), 0);
}

// Every token's 8 slots on one rank, through slots of a few rows: more of a token's rows than the
// owner can hold where they land, so it stages them; identity experts give x * sum(w) bitwise.
TEST_P(EpTest, LowLatencyCombineOfTokensWhoseSlotsCrowdOneRank) {
  BufferConfig cfg = config();
  cfg.num_topk = 8;
  cfg.num_experts = 16 * R();
  cfg.num_bytes = static_cast<int64_t>(R()) * 8 * 1024;  // about 3 rows per slot
  Buffer buffer(comm(), cfg);
  const int64_t T = 24 - 3 * me();
  const Tensor x = random_bf16(T, kHidden, rng);
  const Tensor topk = crowded_topk(T, cfg.num_topk, 16, R(), me());
  const Tensor weights = random_weights(T, cfg.num_topk, rng);
  const LowLatencyDispatchResult d =
      buffer.low_latency_dispatch(x, topk, kTmax, cfg.num_experts, {.use_fp8 = false});
  const LowLatencyCombineResult c = buffer.low_latency_combine(d.recv_x, topk, weights, d.handle);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < kHidden; ++h) {
      float acc = 0.0f;
      for (int k = 0; k < cfg.num_topk; ++k)
        acc += weights.at<float>({t, k}) * bf16_to_f32(x.at<bf16>({t, h}));
      ASSERT_EQ(c.combined_x.at<bf16>({t, h}).bits, f32_to_bf16(acc).bits) << t << "," << h;
    }
  }
}

// A token whose slots are all -1 goes nowhere and combines to zero.
TEST_P(EpTest, LowLatencyMaskedTokensGoNowhere) {
  auto buffer = make_buffer();
  Tokens tk = make_tokens(0.5);
  for (int k = 0; k < kTopk; ++k) tk.topk.at<int64_t>({0, k}) = -1;
  const World w = gather(tk);
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  check_layout(w, d, me(), El());
  const LowLatencyCombineResult c =
      buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
  for (int64_t h = 0; h < kHidden; ++h) ASSERT_EQ(c.combined_x.at<bf16>({0, h}).bits, 0);
}

// A rank without tokens still sends its (empty) share and receives the others' rows; its combine
// returns an empty output, and the others' tokens combine as usual.
TEST_P(EpTest, LowLatencyRankWithoutTokens) {
  auto buffer = make_buffer();
  Tokens tk = make_tokens();
  if (me() == 0) {
    tk.T = 0;
    tk.x = random_bf16(0, kHidden, rng);
    tk.topk = random_topk(0, kTopk, E(), rng);
    tk.weights = random_weights(0, kTopk, rng);
  }
  const World w = gather(tk);
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  const auto rows = check_layout(w, d, me(), El());
  expect_reference_rows(w, d, rows);
  const LowLatencyCombineResult c =
      buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
  ASSERT_EQ(c.combined_x.sizes(), (Shape{tk.T, kHidden}));
  expect_identity_combine(c.combined_x, tk, El());
}

// return_recv_hook: the call sends, the hook receives (once); the results equal the synchronous
// ones; a later operation completes an unreceived one; destroy() waits for the hooks.
TEST_P(EpTest, LowLatencyHookReceives) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  std::vector<int32_t> counts;
  std::vector<std::byte> rows;
  {
    const LowLatencyDispatchResult sync =
        buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
    counts.assign(sync.recv_count.data<int32_t>(), sync.recv_count.data<int32_t>() + El());
    rows.resize(sync.recv_x.nbytes());
    std::memcpy(rows.data(), sync.recv_x.data_ptr(), rows.size());
  }
  auto same_rows = [&](const LowLatencyDispatchResult& d) {
    for (int e = 0; e < El(); ++e) {
      ASSERT_EQ(d.recv_count.data<int32_t>()[e], counts[e]);
      const size_t row = kHidden * 2, at = static_cast<size_t>(e * R() * kTmax) * row;
      ASSERT_EQ(std::memcmp(static_cast<const std::byte*>(d.recv_x.data_ptr()) + at,
                            rows.data() + at, counts[e] * row),
                0);
    }
  };
  {
    const LowLatencyDispatchResult d = buffer->low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = false, .return_recv_hook = true});
    ASSERT_TRUE(static_cast<bool>(d.hook));
    EXPECT_THROW(buffer->destroy(), Error);  // its receive is outstanding
    d.hook();
    d.hook();  // a no-op
    same_rows(d);
    // The combine's hook, with compute in between.
    const LowLatencyCombineResult c = buffer->low_latency_combine(
        d.recv_x, tk.topk, tk.weights, d.handle, {.return_recv_hook = true});
    volatile double busy = 0;
    for (int i = 0; i < 20000; ++i) busy = busy + std::sqrt(static_cast<double>(i));
    c.hook();
    const LowLatencyCombineResult sync =
        buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle,
                                    {.out = Tensor::empty({tk.T, kHidden}, DType::bf16)});
    EXPECT_EQ(
        std::memcmp(c.combined_x.data_ptr(), sync.combined_x.data_ptr(), sync.combined_x.nbytes()),
        0);
  }
  {
    // Two dispatches before either hook: the second completes the first.
    const LowLatencyDispatchResult first = buffer->low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = false, .return_recv_hook = true});
    const LowLatencyDispatchResult second = buffer->low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = false, .return_recv_hook = true});
    same_rows(first);
    second.hook();
    first.hook();
    same_rows(second);
  }
  {
    const LowLatencyDispatchResult d = buffer->low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = false, .async_finish = true});
    d.event.wait();
    same_rows(d);
  }
  EXPECT_NO_THROW(buffer->destroy());
}

// Two buffers hold the results: a third live one raises (on every rank alike, before any
// exchange), and dropping one frees its buffer.
TEST_P(EpTest, LowLatencyKeepsAtMostTwoResultsAlive) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  auto dispatch = [&] {
    return buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  };
  std::optional<LowLatencyDispatchResult> a = dispatch();
  const LowLatencyDispatchResult b = dispatch();
  EXPECT_THROW(dispatch(), Error);
  EXPECT_THROW(buffer->low_latency_combine(b.recv_x, tk.topk, tk.weights, b.handle), Error);
  // With `out`, a combine needs no buffer.
  EXPECT_NO_THROW(
      buffer->low_latency_combine(b.recv_x, tk.topk, tk.weights, b.handle,
                                  {.out = Tensor::empty({tk.T, kHidden}, DType::bf16)}));
  a.reset();
  const LowLatencyDispatchResult c = dispatch();
  EXPECT_EQ(c.recv_count.data<int32_t>()[0], b.recv_count.data<int32_t>()[0]);
  EXPECT_TRUE(buffer->is_available());
}

TEST_P(EpTest, LowLatencyBadInputsRaise) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  const LowLatencyDispatchArgs bf16{.use_fp8 = false};
  EXPECT_THROW(buffer->low_latency_dispatch(tk.x, tk.topk, tk.T - 1, E(), bf16), Error);
  EXPECT_THROW(buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E() + R(), bf16), Error);
  EXPECT_THROW(
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = true, .use_ue8m0 = true}),
      Error);  // UE8M0 needs round_scale
  EXPECT_THROW(buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(),
                                            {.async_finish = true, .return_recv_hook = true}),
               Error);
  const LowLatencyDispatchResult d = buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), bf16);
  Tensor other_topk = tk.topk.clone();
  other_topk.at<int64_t>({0, 0}) = other_topk.at<int64_t>({0, 0}) == 0 ? 1 : 0;
  EXPECT_THROW(buffer->low_latency_combine(d.recv_x, other_topk, tk.weights, d.handle), Error);
  EXPECT_THROW(
      buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle, {.use_logfmt = true}),
      Error);
  EXPECT_THROW(buffer->low_latency_combine(d.recv_x.slice(1, 0, kTmax).contiguous(), tk.topk,
                                           tk.weights, d.handle),
               Error);
  // Wait statistics are i64 [R].
  EXPECT_THROW(
      buffer->low_latency_dispatch(
          tk.x, tk.topk, kTmax, E(),
          {.use_fp8 = false, .dispatch_wait_recv_cost_stats = Tensor::zeros({R()}, DType::i32)}),
      Error);
  EXPECT_THROW(buffer->low_latency_dispatch(
                   tk.x, tk.topk, kTmax, E(),
                   {.use_fp8 = false,
                    .dispatch_wait_recv_cost_stats = Tensor::zeros({R() + 1}, DType::i64)}),
               Error);
  EXPECT_THROW(buffer->low_latency_combine(
                   d.recv_x, tk.topk, tk.weights, d.handle,
                   {.combine_wait_recv_cost_stats = Tensor::zeros({1, R()}, DType::i64)}),
               Error);
  EXPECT_TRUE(buffer->is_available());
}

// dispatch_ / combine_wait_recv_cost_stats: a rank that enters the operation late is the one its
// peers waited for, by about its delay, and it waits for no one that long itself; the entries
// accumulate over calls.
TEST_P(EpTest, LowLatencyWaitStatsNameTheLateRank) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  const int late = R() - 1;
  constexpr int64_t kDelayNs = 300'000'000;
  const auto arrive = [&] {
    MPI_Barrier(MPI_COMM_WORLD);
    if (me() == late) std::this_thread::sleep_for(std::chrono::nanoseconds(kDelayNs));
  };
  Tensor dispatch_wait = Tensor::zeros({R()}, DType::i64);
  Tensor combine_wait = Tensor::zeros({R()}, DType::i64);
  arrive();
  const LowLatencyDispatchResult d = buffer->low_latency_dispatch(
      tk.x, tk.topk, kTmax, E(),
      {.use_fp8 = false, .dispatch_wait_recv_cost_stats = dispatch_wait});
  arrive();
  buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle,
                              {.out = Tensor::empty({tk.T, kHidden}, DType::bf16),
                               .combine_wait_recv_cost_stats = combine_wait});
  for (const Tensor* waited : {&dispatch_wait, &combine_wait}) {
    const int64_t* ns = waited->data<int64_t>();
    // The late rank found its peers waiting (on transports that move records in rounds, such as
    // the small one-sided one, its peers' own rows also wait for it, so they are not compared
    // with it).
    if (me() == late) {
      for (int s = 0; s < R(); ++s) EXPECT_LT(ns[s], kDelayNs / 2) << s;
    }
    // The barrier's exits are not simultaneous: half the delay at least.
    if (me() != late) {
      EXPECT_GE(ns[late], kDelayNs / 2);
    }
  }
  const std::vector<int64_t> before(dispatch_wait.data<int64_t>(),
                                    dispatch_wait.data<int64_t>() + R());
  arrive();
  buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(),
                               {.use_fp8 = false, .dispatch_wait_recv_cost_stats = dispatch_wait});
  for (int s = 0; s < R(); ++s) {
    EXPECT_GE(dispatch_wait.data<int64_t>()[s], before[s]) << s;
    if (me() != late && s == late) {
      EXPECT_GE(dispatch_wait.data<int64_t>()[s] - before[s], kDelayNs / 2);
    }
  }
}

// With the receive hook the wait starts when the hook is called: rows that arrived while the
// caller computed were not waited for.
TEST_P(EpTest, LowLatencyWaitStatsStartAtTheHook) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  constexpr int64_t kComputeNs = 300'000'000;
  Tensor waited = Tensor::zeros({R()}, DType::i64);
  MPI_Barrier(MPI_COMM_WORLD);
  const LowLatencyDispatchResult d = buffer->low_latency_dispatch(
      tk.x, tk.topk, kTmax, E(),
      {.use_fp8 = false, .dispatch_wait_recv_cost_stats = waited, .return_recv_hook = true});
  std::this_thread::sleep_for(std::chrono::nanoseconds(kComputeNs));
  d.hook();
  for (int s = 0; s < R(); ++s) EXPECT_LT(waited.data<int64_t>()[s], kComputeNs / 2) << s;
}

// Ranks that disagree on num_max_dispatch_tokens_per_rank fail together.
TEST_P(EpTest, LowLatencyRanksMustAgreeOnTheCapacity) {
  auto buffer = make_buffer();
  const Tokens tk = make_tokens();
  const int64_t tmax = me() == 0 ? kTmax : kTmax - 8;
  EXPECT_THROW(buffer->low_latency_dispatch(tk.x, tk.topk, tmax, E(), {.use_fp8 = false}), Error);
  EXPECT_FALSE(buffer->is_available());
}

// ---- use_logfmt and zero_copy ----

// Tokens scaled so every |x| < 1: LogFMT encodes every chunk of them (upstream's x_pure_rand).
Tokens small_tokens(Tokens tk) {
  for (int64_t i = 0; i < tk.x.numel(); ++i)
    tk.x.data<bf16>()[i] = f32_to_bf16(0.1f * bf16_to_f32(tk.x.data<bf16>()[i]));
  return tk;
}

// The experts' outputs in the masked layout: expert e answers row (s, t) with
// scale * expert_value(e, gid, h); NaN past each expert's rows (they must not be read).
Tensor expert_outputs(const LowLatencyDispatchResult& d, int me, int El, int R, int64_t H,
                      float scale) {
  const int64_t RT = d.handle.src_info.size(1), tmax = RT / R;
  Tensor y = Tensor::empty({El, RT, H}, DType::bf16);
  y.fill_bytes_(0xFF);
  for (int e = 0; e < El; ++e) {
    for (int s = 0; s < R; ++s) {
      const int64_t range = d.handle.layout_range.at<int64_t>({e, s});
      for (int64_t i = range >> 32; i < (range >> 32) + (range & 0xFFFFFFFF); ++i) {
        const int64_t gid = s * tmax + d.handle.src_info.at<int32_t>({e, i});
        for (int64_t h = 0; h < H; ++h)
          y.at<bf16>({e, i, h}) = f32_to_bf16(scale * expert_value(me * El + e, gid, h));
      }
    }
  }
  return y;
}

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  t.fill_bytes_(0xFF);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// use_logfmt: each expert rank encodes its rows, the owner sums w * decoded value in top-k order,
// bitwise what the codec gives locally; repeatable; within upstream's tolerance (calc_diff < 1e-5
// with BF16 dispatch) of the plain combine and of x * sum(w) for identity experts; rows with
// |x| >= 1 travel raw, so the result is then bitwise the plain combine's.
TEST_P(EpTest, LowLatencyLogfmtCombineSumsTheDecodedRows) {
  constexpr int64_t H = 1024;
  constexpr float kScale = 0.25f;
  auto buffer = make_buffer(false, H);
  const Tokens tk = small_tokens(make_tokens(0.2, H));
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  const Tensor y = expert_outputs(d, me(), El(), R(), H, kScale);
  const LowLatencyCombineArgs args{.use_logfmt = true, .out = poisoned({tk.T, H})};
  const LowLatencyCombineResult c =
      buffer->low_latency_combine(y, tk.topk, tk.weights, d.handle, args);
  std::vector<uint16_t> row(H);
  std::vector<std::byte> msg(detail::logfmt::max_message_bytes(H));
  std::vector<float> acc(H);
  for (int64_t t = 0; t < tk.T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < kTopk; ++k) {
      const int64_t g = tk.topk.at<int64_t>({t, k});
      if (g < 0) continue;
      for (int64_t h = 0; h < H; ++h)
        row[h] = f32_to_bf16(kScale * expert_value(g, me() * kTmax + t, h)).bits;
      detail::logfmt::encode(row.data(), H, msg.data());
      detail::logfmt::decode_accumulate(msg.data(), H, tk.weights.at<float>({t, k}), acc.data());
    }
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(c.combined_x.at<bf16>({t, h}).bits, f32_to_bf16(acc[h]).bits) << t << "," << h;
  }
  const LowLatencyCombineResult again = buffer->low_latency_combine(
      y, tk.topk, tk.weights, d.handle, {.use_logfmt = true, .out = poisoned({tk.T, H})});
  EXPECT_TRUE(same_bytes(again.combined_x, c.combined_x));  // bitwise repeatable
  const LowLatencyCombineResult plain =
      buffer->low_latency_combine(y, tk.topk, tk.weights, d.handle, {.out = poisoned({tk.T, H})});
  EXPECT_LT(ref::calc_diff(c.combined_x, plain.combined_x), 1e-5);

  // Identity experts: x * sum(w), upstream's check.
  const LowLatencyCombineResult id = buffer->low_latency_combine(
      d.recv_x, tk.topk, tk.weights, d.handle, {.use_logfmt = true, .out = poisoned({tk.T, H})});
  Tensor expected = Tensor::empty({tk.T, H}, DType::f32);
  for (int64_t t = 0; t < tk.T; ++t) {
    float sum_w = 0;
    for (int k = 0; k < kTopk; ++k)
      if (tk.topk.at<int64_t>({t, k}) >= 0) sum_w += tk.weights.at<float>({t, k});
    for (int64_t h = 0; h < H; ++h)
      expected.at<float>({t, h}) = sum_w * bf16_to_f32(tk.x.at<bf16>({t, h}));
  }
  EXPECT_LT(ref::calc_diff(id.combined_x, expected), 1e-5);

  // Outputs of magnitude >= 1 cannot be encoded: the same bits as without LogFMT.
  const Tensor large = expert_outputs(d, me(), El(), R(), H, 4.0f);
  const LowLatencyCombineResult raw = buffer->low_latency_combine(
      large, tk.topk, tk.weights, d.handle, {.use_logfmt = true, .out = poisoned({tk.T, H})});
  const LowLatencyCombineResult raw_plain = buffer->low_latency_combine(
      large, tk.topk, tk.weights, d.handle, {.out = poisoned({tk.T, H})});
  EXPECT_TRUE(same_bytes(raw.combined_x, raw_plain.combined_x));
}

// zero_copy: the experts write into get_next_low_latency_combine_buffer(handle) and the combine
// sends from there (x is not read: here it is all NaN), bitwise equal to the copying combine;
// with LogFMT, the receive hook and async completion too. The two buffers alternate, and a
// zero-copy combine without a fresh get_next raises on every rank before any exchange.
TEST_P(EpTest, LowLatencyZeroCopyCombineEqualsTheCopyingOne) {
  constexpr int64_t H = 512;
  auto buffer = make_buffer(false, H);
  const Tokens tk = small_tokens(make_tokens(0.2, H));
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  const Tensor y = expert_outputs(d, me(), El(), R(), H, 0.5f);
  const Tensor nan_x = poisoned(y.sizes());
  const void* previous = nullptr;
  for (const bool use_logfmt : {false, true}) {
    const LowLatencyCombineResult copied = buffer->low_latency_combine(
        y, tk.topk, tk.weights, d.handle, {.use_logfmt = use_logfmt, .out = poisoned({tk.T, H})});
    for (const int mode : {0, 1, 2}) {  // synchronous, return_recv_hook, async_finish
      SCOPED_TRACE(std::to_string(use_logfmt) + " mode " + std::to_string(mode));
      Tensor next = buffer->get_next_low_latency_combine_buffer(d.handle);
      ASSERT_EQ(next.sizes(), y.sizes());
      EXPECT_NE(next.data_ptr(), previous);  // the other of the two buffers
      previous = next.data_ptr();
      std::memcpy(next.data_ptr(), y.data_ptr(), y.nbytes());
      const LowLatencyCombineResult zero =
          buffer->low_latency_combine(nan_x, tk.topk, tk.weights, d.handle,
                                      {.use_logfmt = use_logfmt,
                                       .zero_copy = true,
                                       .async_finish = mode == 2,
                                       .return_recv_hook = mode == 1,
                                       .out = poisoned({tk.T, H})});
      zero.wait();
      EXPECT_TRUE(same_bytes(zero.combined_x, copied.combined_x));
    }
  }
  // Each zero-copy combine consumes its get_next.
  EXPECT_THROW(buffer->low_latency_combine(y, tk.topk, tk.weights, d.handle,
                                           {.zero_copy = true, .out = poisoned({tk.T, H})}),
               Error);
  EXPECT_TRUE(buffer->is_available());
}

TEST_P(EpTest, LowLatencyLogfmtNeedsAMultipleOf512Channels) {
  auto buffer = make_buffer();  // H = 256
  const Tokens tk = make_tokens();
  const LowLatencyDispatchResult d =
      buffer->low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  try {
    buffer->low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle, {.use_logfmt = true});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_logfmt"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(buffer->is_available());
}

// ---- Shrink mode (enable_shrink: masked ranks are left out of low-latency exchanges) ----

bool shrinks(Transport t) {
  return t == Transport::shared_memory;
}

// A shrink-mode configuration of `c`: timeouts of timeout_s (the failure tests wait for them),
// and with few_row_slots, slots of about 3 rows.
constexpr bool kFewRowSlots = true;
BufferConfig shrink_config(BufferConfig c, int R, bool few_row_slots = false,
                           double timeout_s = 2) {
  c.enable_shrink = true;
  c.timeout_s = timeout_s;
  if (few_row_slots) c.num_bytes = static_cast<int64_t>(R) * 8 * 1024;
  return c;
}

std::vector<int> queried_masks(const Buffer& buffer, int R) {
  Tensor status = Tensor::empty({R}, DType::i32);
  status.fill_bytes_(0x7F);
  buffer.low_latency_query_mask_buffer(status);
  return std::vector<int>(status.data<int32_t>(), status.data<int32_t>() + R);
}

std::vector<int> as_masks(const std::vector<char>& left_out) {
  return std::vector<int>(left_out.begin(), left_out.end());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every rank but the last masks the last one, which sits out: dispatch receives nothing from it
// and sends it nothing, combine sums only the other ranks' experts (upstream test_low_latency's
// shrink checks); twice, then the last rank is unmasked and every rank exchanges with every rank
// again, bitwise as without shrink mode (the pairs' sequences stayed in step).
TEST_P(EpTest, ShrinkLeavesMaskedRanksOut) {
  if (!shrinks(GetParam().transport)) GTEST_SKIP() << "shrink mode needs shared memory";
  Buffer buffer(comm(), shrink_config(config(), R(), false, config().timeout_s));
  const Tokens tk = make_tokens(0.1);
  const World w = gather(tk);
  const int out = R() - 1;
  std::vector<char> left_out(R(), 0);
  left_out[out] = 1;
  EXPECT_EQ(queried_masks(buffer, R()), std::vector<int>(R(), 0));
  if (me() != out) {
    buffer.low_latency_update_mask_buffer(out, true);
    EXPECT_EQ(queried_masks(buffer, R()), as_masks(left_out));
    for (int run = 0; run < 2; ++run) {
      const LowLatencyDispatchResult d =
          buffer.low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
      expect_reference_rows(w, d, check_layout(w, d, me(), El(), left_out));
      const LowLatencyCombineResult c =
          buffer.low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
      expect_identity_combine(c.combined_x, tk, El(), left_out);
    }
    buffer.low_latency_update_mask_buffer(out, false);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const LowLatencyDispatchResult d =
      buffer.low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  expect_reference_rows(w, d, check_layout(w, d, me(), El()));
  const LowLatencyCombineResult c =
      buffer.low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
  expect_identity_combine(c.combined_x, tk, El());
}

// upstream's failure simulation (2 s timeout): the last rank stops before a dispatch (and, with 4
// ranks, the one before it before the combine). The others' call waits for it for the timeout,
// masks it and completes without it; a later call does not wait for it; it cannot be unmasked.
TEST_P(EpTest, ShrinkMasksARankThatStopsAtTheTimeout) {
  if (!shrinks(GetParam().transport)) GTEST_SKIP() << "shrink mode needs shared memory";
  Buffer buffer(comm(), shrink_config(config(), R()));
  const Tokens tk = make_tokens(0.1);
  const World w = gather(tk);
  const int stops_at_dispatch = R() - 1, stops_at_combine = R() >= 4 ? R() - 2 : -1;
  std::vector<char> left_out(R(), 0);
  left_out[stops_at_dispatch] = 1;
  bool survivor = me() != stops_at_dispatch;
  if (survivor) {
    const auto start = std::chrono::steady_clock::now();
    const LowLatencyDispatchResult d =
        buffer.low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
    EXPECT_GE(seconds_since(start), 1.9);  // it waited for the stopped rank
    EXPECT_EQ(queried_masks(buffer, R()), as_masks(left_out));
    expect_reference_rows(w, d, check_layout(w, d, me(), El(), left_out));
    survivor = me() != stops_at_combine;
    if (stops_at_combine >= 0) left_out[stops_at_combine] = 1;
    if (survivor) {
      const LowLatencyCombineResult c =
          buffer.low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
      EXPECT_EQ(queried_masks(buffer, R()), as_masks(left_out));
      expect_identity_combine(c.combined_x, tk, El(), left_out);
    }
  }
  if (survivor) {
    EXPECT_THROW(buffer.low_latency_update_mask_buffer(stops_at_dispatch, false), Error);
    EXPECT_THROW(buffer.low_latency_clean_mask_buffer(), Error);
    EXPECT_EQ(queried_masks(buffer, R()), as_masks(left_out));  // the refused clean kept them
    // The survivors go on without waiting.
    const auto start = std::chrono::steady_clock::now();
    const LowLatencyDispatchResult d2 =
        buffer.low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
    const LowLatencyCombineResult c2 =
        buffer.low_latency_combine(d2.recv_x, tk.topk, tk.weights, d2.handle);
    EXPECT_LT(seconds_since(start), 1.9);
    expect_reference_rows(w, d2, check_layout(w, d2, me(), El(), left_out));
    expect_identity_combine(c2.combined_x, tk, El(), left_out);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The last rank posts its dispatch and stops while its records are still streaming (slots of a
// few rows; its tokens go to every rank, so its records to each outgrow its ring): the others
// received its header and part of its rows when they time out. They drop what they got from it,
// and their results are those of a dispatch that left it out (rows moved down, counts, layout
// ranges, source info, and the combine's rows back).
TEST_P(EpTest, ShrinkDropsARankThatStopsMidStream) {
  if (!shrinks(GetParam().transport) || GetParam().small_buffer)
    GTEST_SKIP() << "shrink mode needs shared memory; the test sets its own slots";
  Buffer buffer(comm(), shrink_config(config(), R(), kFewRowSlots));
  Tokens tk = make_tokens(0.1);
  const int out = R() - 1;
  if (me() == out)  // slot k on rank k % R: every token goes to every rank
    for (int64_t t = 0; t < tk.T; ++t)
      for (int k = 0; k < kTopk; ++k)
        tk.topk.at<int64_t>({t, k}) = (k % R()) * El() + static_cast<int64_t>(t + k / R()) % El();
  const World w = gather(tk);
  std::vector<char> left_out(R(), 0);
  left_out[out] = 1;
  if (me() == out) {
    // Send what fits, never receive (the hook is not called).
    const LowLatencyDispatchResult d = buffer.low_latency_dispatch(
        tk.x, tk.topk, kTmax, E(), {.use_fp8 = false, .return_recv_hook = true});
  } else {
    const LowLatencyDispatchResult d =
        buffer.low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
    EXPECT_EQ(queried_masks(buffer, R()), as_masks(left_out));
    expect_reference_rows(w, d, check_layout(w, d, me(), El(), left_out));
    const LowLatencyCombineResult c =
        buffer.low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
    expect_identity_combine(c.combined_x, tk, El(), left_out);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The same in the combine: the last rank posts its combine with the receive hook and stops, its
// rows back outgrowing the slots. The others drop it after its header and part of its rows
// arrived: tokens they had summed keep its experts' rows, the tokens still open are summed
// without them. So each result is one of the two identity sums, and once a token is summed
// without them, no later token is summed with them.
TEST_P(EpTest, ShrinkDropsARankThatStopsMidCombine) {
  if (!shrinks(GetParam().transport) || GetParam().small_buffer)
    GTEST_SKIP() << "shrink mode needs shared memory; the test sets its own slots";
  Buffer buffer(comm(), shrink_config(config(), R(), kFewRowSlots));
  const Tokens tk = make_tokens(0.0);
  const int out = R() - 1;
  std::vector<char> left_out(R(), 0);
  left_out[out] = 1;
  const LowLatencyDispatchResult d =
      buffer.low_latency_dispatch(tk.x, tk.topk, kTmax, E(), {.use_fp8 = false});
  if (me() == out) {
    const LowLatencyCombineResult c = buffer.low_latency_combine(
        d.recv_x, tk.topk, tk.weights, d.handle, {.return_recv_hook = true});
  } else {
    const LowLatencyCombineResult c =
        buffer.low_latency_combine(d.recv_x, tk.topk, tk.weights, d.handle);
    EXPECT_EQ(queried_masks(buffer, R()), as_masks(left_out));
    const auto sum = [&](int64_t t, int64_t h, bool with_out) {
      float acc = 0.0f;
      for (int k = 0; k < kTopk; ++k) {
        const int64_t g = tk.topk.at<int64_t>({t, k});
        if (g >= 0 && (with_out || g / El() != out))
          acc += tk.weights.at<float>({t, k}) * bf16_to_f32(tk.x.at<bf16>({t, h}));
      }
      return f32_to_bf16(acc).bits;
    };
    bool summed_without = false;
    for (int64_t t = 0; t < tk.T; ++t) {
      bool with = true, without = true;
      for (int64_t h = 0; h < kHidden; ++h) {
        const uint16_t got = c.combined_x.at<bf16>({t, h}).bits;
        with = with && got == sum(t, h, true);
        without = without && got == sum(t, h, false);
      }
      ASSERT_TRUE(without || (with && !summed_without)) << "token " << t;
      summed_without = summed_without || (without && !with);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_P(EpTest, ShrinkBadInputsRaise) {
  BufferConfig cfg = config();
  cfg.enable_shrink = true;
  if (!shrinks(GetParam().transport)) {
    EXPECT_THROW(Buffer(comm(), cfg), Error);  // on every rank alike
    return;
  }
  Buffer buffer(comm(), cfg);
  EXPECT_THROW(buffer.low_latency_update_mask_buffer(me(), true), Error);  // itself
  EXPECT_THROW(buffer.low_latency_update_mask_buffer(R(), true), Error);
  EXPECT_THROW(buffer.low_latency_update_mask_buffer(-1, true), Error);
  EXPECT_THROW(buffer.low_latency_query_mask_buffer(Tensor::empty({R()}, DType::i64)), Error);
  EXPECT_THROW(buffer.low_latency_query_mask_buffer(Tensor::empty({R() + 1}, DType::i32)), Error);
  buffer.low_latency_update_mask_buffer(me(), false);  // unmasking an active rank changes nothing
  buffer.low_latency_update_mask_buffer((me() + 1) % R(), true);
  buffer.low_latency_clean_mask_buffer();
  EXPECT_EQ(queried_masks(buffer, R()), std::vector<int>(R(), 0));
  cfg.enable_shrink = false;
  Buffer plain(comm(), cfg);
  EXPECT_THROW(plain.low_latency_update_mask_buffer((me() + 1) % R(), true), Error);
  EXPECT_THROW(plain.low_latency_query_mask_buffer(Tensor::empty({R()}, DType::i32)), Error);
  EXPECT_THROW(plain.low_latency_clean_mask_buffer(), Error);
}

}  // namespace
}  // namespace dsk::ep::test
