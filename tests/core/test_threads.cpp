#include <atomic>
#include <mutex>
#include <set>

#include "common/test_util.hpp"

namespace dsk {
namespace {

class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(get_num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(Threads, CoversRangeOnceWithGrainAlignedChunks) {
  for (int threads : {1, 2, 3, 7}) {
    ThreadCount tc(threads);
    for (int64_t n : {1, 5, 64, 1000, 4097}) {
      for (int64_t grain : {1, 16}) {
        std::vector<std::atomic<int>> hits(n);
        std::mutex m;
        std::set<int> ids;
        parallel_for(
            n,
            [&](int64_t b, int64_t e, int id) {
              EXPECT_EQ(b % grain, 0);
              EXPECT_TRUE(e == n || e % grain == 0);
              for (int64_t i = b; i < e; ++i) hits[i]++;
              std::lock_guard lock(m);
              EXPECT_TRUE(ids.insert(id).second);
            },
            grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
        EXPECT_LE(static_cast<int>(ids.size()), threads);
      }
    }
  }
}

TEST(Threads, PartitionIsStatic) {
  ThreadCount tc(2);
  auto record = [] {
    std::vector<std::pair<int64_t, int64_t>> chunks(2, {-1, -1});
    parallel_for(1000, [&](int64_t b, int64_t e, int id) { chunks[id] = {b, e}; });
    return chunks;
  };
  const auto first = record();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(record(), first);
}

TEST(Threads, NestedCallsRunSeriallyAndExceptionsPropagate) {
  ThreadCount tc(2);
  std::atomic<int> total{0};
  parallel_for(4, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      EXPECT_TRUE(in_parallel_region());
      parallel_for(10, [&](int64_t b2, int64_t e2, int) { total += static_cast<int>(e2 - b2); });
    }
  });
  EXPECT_EQ(total.load(), 40);
  EXPECT_FALSE(in_parallel_region());
  EXPECT_THROW(parallel_for(100,
                            [](int64_t b, int64_t, int) {
                              if (b > 0) throw Error("boom");
                            }),
               Error);
  // The pool still works after an exception.
  std::atomic<int> after{0};
  parallel_for(100, [&](int64_t b, int64_t e, int) { after += static_cast<int>(e - b); });
  EXPECT_EQ(after.load(), 100);
}

TEST(Threads, ConcurrentCallersAllComplete) {
  ThreadCount tc(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r)
        parallel_for(333, [&](int64_t b, int64_t e, int) { total += e - b; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 333);
}

TEST(Threads, SettingsAreValidated) {
  EXPECT_THROW(set_num_threads(0), Error);
  const bool saved = get_deterministic_algorithms();
  use_deterministic_algorithms(true);
  EXPECT_TRUE(get_deterministic_algorithms());
  use_deterministic_algorithms(saved);
}

}  // namespace
}  // namespace dsk
