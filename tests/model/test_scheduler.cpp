// dsk::model::Scheduler and sample_token (issue 8): a burst of mixed requests against a small
// cache never exceeds it and loses or duplicates nothing; each request's tokens equal the same
// request served alone; requests that can never fit are refused; the sampling rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <dsk/core.hpp>
#include <dsk/model.hpp>
#include <dsk/ref.hpp>

namespace dsk::model {
namespace {

const Weights& tiny_weights() {
  static const Weights w = random_weights(preset("v32-tiny"), 11);
  return w;
}

Request make_request(int64_t id, int64_t prompt_len, int64_t max_new) {
  const Tensor t = ref::randint({prompt_len}, DType::i32, 100 + static_cast<uint64_t>(id), 0,
                                preset("v32-tiny").vocab_size);
  Request r;
  r.id = id;
  r.prompt.assign(t.data<int32_t>(), t.data<int32_t>() + prompt_len);
  r.max_new_tokens = max_new;
  return r;
}

// Mixed lengths: short and long prompts (up to three pages), one to eight new tokens.
std::vector<Request> burst() {
  const int64_t lens[] = {1, 150, 7, 64, 65, 30, 129, 3, 90, 12};
  const int64_t news[] = {8, 3, 1, 5, 2, 8, 4, 6, 1, 7};
  std::vector<Request> rs;
  for (int64_t i = 0; i < 10; ++i) rs.push_back(make_request(i, lens[i], news[i]));
  return rs;
}

TEST(Scheduler, BurstStaysInBudgetAndServesEveryRequestOnce) {
  use_deterministic_algorithms(true);
  Model model(tiny_weights(), {.kv_cache_pages = 6, .max_batch_tokens = 96});
  Scheduler s(model);
  for (const Request& r : burst()) s.submit(r);
  std::map<int64_t, Completion> done;
  int steps = 0;
  while (!s.idle()) {
    for (Completion& c : s.step()) {
      EXPECT_FALSE(done.count(c.id)) << "request " << c.id << " finished twice";
      done[c.id] = std::move(c);
    }
    EXPECT_LE(s.reserved_pages(), model.total_pages());
    EXPECT_GE(model.free_pages(), 0);
    ASSERT_LT(++steps, 1000) << "no progress";
  }
  ASSERT_EQ(done.size(), 10u);
  for (const Request& r : burst()) {
    ASSERT_TRUE(done.count(r.id));
    EXPECT_EQ(static_cast<int64_t>(done[r.id].tokens.size()), r.max_new_tokens);
    EXPECT_EQ(done[r.id].token_seconds.size(), done[r.id].tokens.size() - 1);
  }
  EXPECT_EQ(model.free_pages(), model.total_pages());
  EXPECT_EQ(s.reserved_pages(), 0);

  // Every request alone gives the same tokens (greedy, deterministic mode).
  for (const Request& r : burst()) {
    Model alone(tiny_weights(), {.kv_cache_pages = 6, .max_batch_tokens = 96});
    Scheduler one(alone);
    one.submit(r);
    const std::vector<Completion> c = one.run();
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].tokens, done[r.id].tokens) << "request " << r.id;
  }
  use_deterministic_algorithms(false);
}

TEST(Scheduler, RefusesWhatCanNeverFit) {
  Model model(tiny_weights(), {.kv_cache_pages = 2});
  Scheduler s(model);
  try {
    s.submit(make_request(7, 120, 9));  // 129 tokens: three pages
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request 7"), std::string::npos) << e.what();
  }
  s.submit(make_request(8, 100, 28));                    // exactly two pages
  EXPECT_THROW(s.submit(make_request(8, 5, 1)), Error);  // the id is taken
  EXPECT_THROW(s.submit(make_request(9, 0, 1)), Error);  // no prompt
  EXPECT_THROW(s.submit(make_request(9, 5, 0)), Error);  // nothing to generate
  Request bad = make_request(9, 5, 1);
  bad.prompt[2] = -3;
  EXPECT_THROW(s.submit(bad), Error);
  EXPECT_EQ(s.run().size(), 1u);
}

TEST(Scheduler, MemoryLimitSizesTheCache) {
  Model probe(tiny_weights(), {.kv_cache_pages = 1});
  const MemoryBudget b = probe.memory_budget();
  EXPECT_GT(b.weights, 0);
  EXPECT_GT(b.workspace, 0);
  const int64_t page = b.kv_cache;  // one page
  Model sized(tiny_weights(), {.memory_limit = b.total() + 9 * page});
  EXPECT_EQ(sized.total_pages(), 10);
  EXPECT_LE(sized.memory_budget().total(), b.total() + 9 * page);
  EXPECT_THROW(Model(tiny_weights(), {.memory_limit = b.total() - page - 1}), Error);
}

// The budget's workspace is the public estimate (which dsk bench layer also reads), it grows with
// the step size, and a step of no tokens is refused.
TEST(Scheduler, WorkspaceIsTheStepEstimate) {
  const Weights& w = tiny_weights();
  Model small(w, {.kv_cache_pages = 1, .max_batch_tokens = 64});
  Model large(w, {.kv_cache_pages = 1, .max_batch_tokens = 256});
  EXPECT_EQ(small.memory_budget().workspace, step_workspace_bytes(w.config(), 64));
  EXPECT_EQ(large.memory_budget().workspace, step_workspace_bytes(w.config(), 256));
  EXPECT_GT(large.memory_budget().workspace, small.memory_budget().workspace);
  EXPECT_THROW(step_workspace_bytes(w.config(), 0), Error);
}

TEST(Sampling, Rules) {
  const Tensor logits = ref::randn({300}, DType::f32, 5, 0.0f, 3.0f);
  const float* v = logits.data<float>();
  const int32_t best = static_cast<int32_t>(std::max_element(v, v + 300) - v);
  EXPECT_EQ(sample_token(logits, {}, 0), best);                                 // greedy
  EXPECT_EQ(sample_token(logits, {.temperature = 5, .top_k = 1}, 3), best);     // top-1
  EXPECT_EQ(sample_token(logits, {.temperature = 1, .top_p = 1e-9}, 4), best);  // nucleus of 1
  // Deterministic in (seed, stream); only the top k are ever drawn.
  const Tensor top = ref::select::topk(logits.view({1, 300}), 5).indices;
  const std::set<int32_t> top5(top.data<int32_t>(), top.data<int32_t>() + 5);
  std::set<int32_t> seen;
  for (uint64_t i = 0; i < 400; ++i) {
    const Sampling s{.temperature = 2, .top_k = 5, .seed = 9};
    const int32_t t = sample_token(logits, s, i);
    EXPECT_EQ(t, sample_token(logits, s, i));
    EXPECT_TRUE(top5.count(t)) << t;
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 2u);
  // Frequencies follow softmax(x / T) (two logits, 20000 draws: within 2%).
  const Tensor two = Tensor::empty({2}, DType::f32);
  two.data<float>()[0] = 0.0f;
  two.data<float>()[1] = 1.0f;
  int ones = 0;
  for (uint64_t i = 0; i < 20000; ++i) ones += sample_token(two, {.temperature = 1}, i);
  EXPECT_NEAR(ones / 20000.0, 1.0 / (1.0 + std::exp(-1.0)), 0.02);
  EXPECT_THROW(sample_token(logits, {.temperature = -1}, 0), Error);
  EXPECT_THROW(sample_token(logits, {.temperature = 1, .top_p = 0}, 0), Error);
  EXPECT_THROW(sample_token(logits, {.temperature = 1, .top_k = -2}, 0), Error);
}

}  // namespace
}  // namespace dsk::model
