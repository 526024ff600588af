// The wait loop every exchange runs (src/ep/communicator.cpp: Waiter, drive) in one process: a
// timeout raises dsk::Error, and a timeout handler (shrink mode's, which leaves stalled peers out)
// is the only way a wait with one ends. Each rank runs these alone; they need no peer.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include <dsk/core.hpp>

#include "../src/ep/internal.hpp"

namespace dsk::ep::detail {
namespace {

constexpr double kTimeout = 0.1;  // Waiter::pause only raises once 0.1 s passed

// An exchange that never moves and is done once `drops_needed` peers were dropped.
class StuckExchange final : public Exchange {
 public:
  explicit StuckExchange(int drops_needed) : drops_needed_(drops_needed) {}
  bool poll() override { return drops_ >= drops_needed_; }
  bool has_headers() const override { return false; }
  bool moved() const override { return false; }
  std::vector<int> stalled_peers(bool) const override { return {1}; }
  void drop(int) override { ++drops_; }
  int drops() const { return drops_; }

 private:
  int drops_needed_;
  int drops_ = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void expect_timeout_error(const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "no dsk::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after"), std::string::npos) << e.what();
  }
}

// The caller that checks expired() itself must be the one to end the wait: a pause past the
// deadline returns (it used to raise there, skipping shrink mode's handler when the deadline
// passed between the caller's check and the pause).
TEST(EpWaiter, PauseLeavesTheTimeoutToACallerThatHandlesIt) {
  Waiter waiter(kTimeout, "test", "nothing");
  std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * kTimeout));
  EXPECT_TRUE(waiter.expired());
  for (int i = 0; i < 200; ++i) waiter.pause(false);
  expect_timeout_error([&] { waiter.pause(true); });
  expect_timeout_error([&] { waiter.fail(); });
  waiter.progressed();
  EXPECT_FALSE(waiter.expired());
}

TEST(EpDrive, CallsTheHandlerAtEachTimeoutUntilTheExchangeEnds) {
  StuckExchange exchange(3);
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  drive(exchange, kTimeout, "test", false, [&] {
    ++calls;
    for (int p : exchange.stalled_peers(false)) exchange.drop(p);
    return true;
  });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(exchange.drops(), 3);
  EXPECT_GE(seconds_since(start), 3 * kTimeout);  // one full timeout before each call
}

TEST(EpDrive, RaisesWhenTheHandlerDeclines) {
  StuckExchange exchange(1);
  int calls = 0;
  expect_timeout_error([&] {
    drive(exchange, kTimeout, "test", false, [&] {
      ++calls;
      return false;
    });
  });
  EXPECT_EQ(calls, 1);
}

TEST(EpDrive, RaisesAtTheTimeoutWithoutAHandler) {
  StuckExchange exchange(1);
  const auto start = std::chrono::steady_clock::now();
  expect_timeout_error([&] { drive(exchange, kTimeout, "test"); });
  EXPECT_GE(seconds_since(start), kTimeout);
}

}  // namespace
}  // namespace dsk::ep::detail
