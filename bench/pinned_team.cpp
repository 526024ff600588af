// PinnedTeam: threads pinned one per allowed CPU, woken per run() by a condition variable (the
// wake-up costs microseconds; the loops they run last milliseconds).
#include "bench/pinned_team.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

#include <dsk/core/threads.hpp>

namespace dsk::bench {

PinnedTeam::PinnedTeam(int threads) {
  const std::vector<int> cpus = allowed_cpus();
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i] { work(i); });
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[static_cast<size_t>(i) % cpus.size()], &set);
    pthread_setaffinity_np(threads_.back().native_handle(), sizeof(set), &set);
  }
}

PinnedTeam::~PinnedTeam() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    ++generation_;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

double PinnedTeam::run(const std::function<void(int)>& fn) {
  std::unique_lock lock(mutex_);
  fn_ = &fn;
  error_ = nullptr;
  running_ = size();
  arrived_.store(0, std::memory_order_relaxed);
  finished_ = {};
  ++generation_;
  start_.notify_all();
  done_.wait(lock, [this] { return running_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(finished_ - released_).count();
}

void PinnedTeam::work(int index) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* fn = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      fn = fn_;
    }
    // NOTES: the last thread to arrive releases the others, which spin meanwhile: a woken thread
    // may start milliseconds after the first on a loaded machine, and that delay must not count.
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size()) {
      released_ = std::chrono::steady_clock::now();
      arrived_.store(-1, std::memory_order_release);
    }
    for (int spins = 0; arrived_.load(std::memory_order_acquire) != -1; ++spins) {
      if (spins < 100000)
        __builtin_ia32_pause();
      else
        std::this_thread::yield();  // more threads than CPUs: let the late one run
    }
    std::exception_ptr error;
    try {
      (*fn)(index);
    } catch (...) {
      error = std::current_exception();
    }
    const auto end = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex_);
    finished_ = std::max(finished_, end);
    if (error && !error_) error_ = error;
    if (--running_ == 0) done_.notify_one();
  }
}

}  // namespace dsk::bench
