// PinnedTeam: a fixed set of threads, thread i pinned (pthread_setaffinity_np) to the i-th CPU
// this process may use, that run one function together per run() call. The ceilings use it so
// "per core" and "all threads" mean exactly that, and thread start-up is not timed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsk::bench {

class PinnedTeam {
 public:
  explicit PinnedTeam(int threads);
  ~PinnedTeam();
  PinnedTeam(const PinnedTeam&) = delete;
  PinnedTeam& operator=(const PinnedTeam&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Runs fn(thread_index) on every thread of the team and returns when all have finished; an
  // exception thrown by fn is re-thrown here. Returns the seconds from the moment every thread
  // was awake and released together (a spin barrier) until the last one finished, so the time
  // it takes to wake sleeping threads is not part of it.
  double run(const std::function<void(int)>& fn);

 private:
  void work(int index);

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  std::atomic<int> arrived_{0};  // the start barrier of the current run
  std::chrono::steady_clock::time_point released_, finished_;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace dsk::bench
