// dsk::model with expert parallelism under mpirun (2 and 4 ranks, issue 8): every rank serves its
// own sequences with a quarter or half of the routed experts, the MoE layers exchanging rows
// through ep::Buffer; each rank's logits equal, bit for bit, those of a single-rank Model running
// the whole workload (deterministic mode), including steps where a rank has nothing of its own to
// run; the scheduler serves every rank's requests to the same tokens as a single-rank scheduler.
#include <mpi.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include <dsk/core.hpp>
#include <dsk/ep.hpp>
#include <dsk/model.hpp>
#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::model {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

const Weights& tiny_weights() {
  static const Weights w = random_weights(preset("v32-tiny"), 21);
  return w;
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  const Tensor t = ref::randint({n}, DType::i32, seed, 0, preset("v32-tiny").vocab_size);
  return {t.data<int32_t>(), t.data<int32_t>() + n};
}

// The whole workload: six prompts of mixed lengths (one longer than index_topk); sequence i
// belongs to rank i % R.
constexpr int kSequences = 6;
const int64_t kPromptLengths[kSequences] = {90, 5, 33, 1, 64, 17};

// Forward steps over `mine` (indices into the workload) on `model`: step 0 prefills all of them
// but the last, step 1 prefills the last and decodes the rest, then three greedy decode steps. A
// rank whose share is one sequence has no item in step 0. Returns each sequence's logits, one
// row per step it ran in.
std::map<int, std::vector<Tensor>> run_schedule(Model& model, const std::vector<int>& mine) {
  std::map<int, int64_t> seq;
  std::map<int, std::vector<int32_t>> next;  // the greedy token each sequence feeds next
  for (int i : mine) seq[i] = model.add_sequence();
  std::map<int, std::vector<Tensor>> logits;
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int> who;
    for (size_t j = 0; j < mine.size(); ++j) {
      const int i = mine[j];
      const bool last = j + 1 == mine.size();
      if (step == 0 && last) continue;
      if (step == 0 || (step == 1 && last)) {
        tokens.push_back(random_tokens(kPromptLengths[i], 500 + static_cast<uint64_t>(i)));
      } else {
        tokens.push_back(next[i]);
      }
      who.push_back(i);
    }
    std::vector<StepItem> items;
    for (size_t j = 0; j < who.size(); ++j) items.push_back({seq[who[j]], tokens[j]});
    const Tensor out = model.forward(items);
    for (size_t j = 0; j < who.size(); ++j) {
      const Tensor row = out.select(0, static_cast<int64_t>(j)).clone();
      const float* p = row.data<float>();
      next[who[j]] = {static_cast<int32_t>(std::max_element(p, p + row.numel()) - p)};
      logits[who[j]].push_back(row);
    }
  }
  return logits;
}

class ExpertParallel : public ::testing::Test {
 protected:
  void SetUp() override { use_deterministic_algorithms(true); }
  void TearDown() override { use_deterministic_algorithms(false); }
};

TEST_F(ExpertParallel, LogitsEqualTheSingleRankRunBitwise) {
  const int R = world_size(), me = world_rank();
  const ep::Communicator world = ep::Communicator::world();
  std::vector<int> mine, everyone;
  for (int i = 0; i < kSequences; ++i) {
    if (i % R == me) mine.push_back(i);
    everyone.push_back(i);
  }
  Model ep_model(tiny_weights(), {.max_batch_tokens = 256, .expert_parallel = &world});
  ASSERT_NE(ep_model.expert_parallel_group(), nullptr);
  EXPECT_GT(ep_model.memory_budget().communication, 0);
  const auto got = run_schedule(ep_model, mine);
  // The whole workload on one rank, all six sequences batched together.
  Model alone(tiny_weights(), {.max_batch_tokens = 256});
  EXPECT_EQ(alone.expert_parallel_group(), nullptr);
  EXPECT_LT(ep_model.memory_budget().weights, alone.memory_budget().weights)
      << "a rank keeps only its experts";
  const auto want = run_schedule(alone, everyone);
  ASSERT_EQ(got.size(), mine.size());
  for (const auto& [i, rows] : got) {
    // A sequence prefilled one step later here than in the single-rank run decodes once less.
    ASSERT_GE(rows.size(), 4u);
    for (size_t s = 0; s < std::min(rows.size(), want.at(i).size()); ++s)
      EXPECT_TRUE(test::bitwise_equal(rows[s], want.at(i)[s]))
          << "rank " << me << " sequence " << i << " logits " << s;
  }
  const auto ops = ep_model.op_seconds();
  EXPECT_GT(ops.count("moe.dispatch"), 0u);
  EXPECT_GT(ops.count("moe.combine"), 0u);
}

Request make_request(int64_t id) {
  const int64_t lens[] = {40, 3, 77, 12, 25};
  const int64_t news[] = {4, 6, 2, 5, 3};
  Request r;
  r.id = id;
  r.prompt = random_tokens(lens[id], 900 + static_cast<uint64_t>(id));
  r.max_new_tokens = news[id];
  return r;
}

// Five requests dealt round-robin: with four ranks, rank 0 serves two and the others one, so ranks
// go idle at different steps and keep stepping until the whole group is done.
TEST_F(ExpertParallel, SchedulerServesEveryRanksRequestsLikeOneRank) {
  const int R = world_size(), me = world_rank();
  const ep::Communicator world = ep::Communicator::world();
  Model ep_model(tiny_weights(),
                 {.kv_cache_pages = 8, .max_batch_tokens = 64, .expert_parallel = &world});
  Scheduler ep_scheduler(ep_model);
  Model alone(tiny_weights(), {.kv_cache_pages = 8, .max_batch_tokens = 64});
  Scheduler one(alone);
  int mine = 0;
  for (int64_t id = 0; id < 5; ++id) {
    if (id % R != me) continue;
    ep_scheduler.submit(make_request(id));
    one.submit(make_request(id));
    ++mine;
  }
  std::map<int64_t, Completion> got, want;
  for (Completion& c : ep_scheduler.run()) got[c.id] = std::move(c);
  for (Completion& c : one.run()) want[c.id] = std::move(c);
  EXPECT_TRUE(ep_scheduler.idle());
  ASSERT_EQ(static_cast<int>(got.size()), mine);
  for (const auto& [id, c] : want) EXPECT_EQ(got.at(id).tokens, c.tokens) << "request " << id;
  EXPECT_EQ(ep_model.free_pages(), ep_model.total_pages());
}

}  // namespace
}  // namespace dsk::model
