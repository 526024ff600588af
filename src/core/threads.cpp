#include <dsk/core/threads.hpp>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <dsk/core/env.hpp>
#include <dsk/core/error.hpp>

namespace dsk {
namespace {

thread_local bool t_in_parallel = false;

int default_num_threads() {
  const int64_t n = env::get_int("", "NUM_THREADS", 0);
  if (n > 0) return static_cast<int>(n);
  return static_cast<int>(allowed_cpus().size());
}

std::atomic<int> g_num_threads{0};     // 0 = not yet read from the environment
std::atomic<int> g_deterministic{-1};  // -1 = not yet read from DSK_DETERMINISTIC

// PAUSE instructions a waiting thread spins before it sleeps on a futex (about 65 cycles each on
// Zen 5, so about 0.25 ms). With 4096 (about 60 us) a worker often fell asleep between two calls
// of a loop and the scheduler woke it on the caller's CPU: the 4096-token gate on two threads had
// a median of 1.37 ms in one run of 200 calls and 0.59 ms in another; with 16384 three runs gave
// medians of 0.54-0.58 ms (one thread: 1.12 ms).
constexpr int kSpinPauses = 16384;

// One job at a time: chunk i of a static partition runs on worker i (chunk 0 on the caller).
struct Job {
  const std::function<void(int64_t, int64_t, int)>* fn = nullptr;
  int64_t n = 0, grain = 1, blocks = 0;
  int chunks = 0;
};

// NOTES: workers spin briefly on the generation counter before sleeping in atomic::wait (a futex),
// so back-to-back small kernels (decode) do not pay a wake-up each, while an idle pool costs no
// CPU.
class Pool {
 public:
  ~Pool() { resize(0); }

  void run(const Job& job) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {  // another thread is using the pool: same partition, run inline
      run_inline(job);
      return;
    }
    resize(job.chunks - 1);
    job_ = job;
    error_ = nullptr;
    pending_.store(job.chunks - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    run_chunk(job, 0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < kSpinPauses) {
        __builtin_ia32_pause();
      } else {
        const int p = pending_.load(std::memory_order_acquire);
        if (p != 0) pending_.wait(p, std::memory_order_acquire);
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

  static void run_inline(const Job& job) {
    for (int c = 0; c < job.chunks; ++c) run_chunk_unchecked(job, c);
  }

 private:
  static void run_chunk_unchecked(const Job& job, int c) {
    const int64_t b0 = job.blocks * c / job.chunks, b1 = job.blocks * (c + 1) / job.chunks;
    const int64_t begin = b0 * job.grain, end = std::min(job.n, b1 * job.grain);
    if (begin < end) (*job.fn)(begin, end, c);
  }

  void run_chunk(const Job& job, int c) {
    try {
      run_chunk_unchecked(job, c);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void worker(int index, uint64_t seen) {
    t_in_parallel = true;
    while (true) {
      for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        if (spins < kSpinPauses) {
          __builtin_ia32_pause();
        } else {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire)) return;
      if (index < job_.chunks) {
        run_chunk(job_, index);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
      }
    }
  }

  // Keeps exactly `workers` threads; called with mutex_ held.
  void resize(int workers) {
    if (static_cast<int>(threads_.size()) == workers) return;
    if (static_cast<int>(threads_.size()) > workers) {
      stop_.store(true, std::memory_order_release);
      generation_.fetch_add(1, std::memory_order_release);
      generation_.notify_all();
      for (auto& t : threads_) t.join();
      threads_.clear();
      stop_.store(false, std::memory_order_release);
    }
    // NOTES: workers are not pinned. Pinning worker i to CPU i while the caller (chunk 0) stays
    // where the user put it let the caller sit on CPU 1 for hundreds of calls, so worker 1 and
    // the caller took turns on CPU 1 while CPU 0 idled: the 4096-token gate took 1.15-1.44 ms on
    // two threads, 0.50-0.63 ms with the caller on CPU 0, 1.03-1.09 ms on one. Unpinned, a woken
    // worker is placed on an idle CPU by the scheduler.
    const uint64_t seen = generation_.load(std::memory_order_acquire);
    while (static_cast<int>(threads_.size()) < workers) {
      const int index = static_cast<int>(threads_.size()) + 1;
      threads_.emplace_back([this, index, seen] { worker(index, seen); });
    }
  }

  std::mutex mutex_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  Job job_;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

int get_num_threads() {
  int n = g_num_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = default_num_threads();
    int expected = 0;
    g_num_threads.compare_exchange_strong(expected, n);
    n = g_num_threads.load(std::memory_order_relaxed);
  }
  return n;
}

void set_num_threads(int n) {
  DSK_CHECK_ARG(n >= 1 && n <= 4096, "dsk::set_num_threads", "n", "a thread count in [1, 4096]", n);
  g_num_threads.store(n, std::memory_order_relaxed);
}

bool in_parallel_region() {
  return t_in_parallel;
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  DSK_CHECK_ARG(grain >= 1, "dsk::parallel_for", "grain", "grain >= 1", grain);
  Job job;
  job.fn = &fn;
  job.n = n;
  job.grain = grain;
  job.blocks = (n + grain - 1) / grain;
  job.chunks = static_cast<int>(std::min<int64_t>(get_num_threads(), job.blocks));
  if (job.chunks <= 1 || t_in_parallel) {
    Pool::run_inline(job);
    return;
  }
  t_in_parallel = true;
  try {
    pool().run(job);
  } catch (...) {
    t_in_parallel = false;
    throw;
  }
  t_in_parallel = false;
}

void use_deterministic_algorithms(bool enabled) {
  g_deterministic.store(enabled ? 1 : 0, std::memory_order_relaxed);
}

bool get_deterministic_algorithms() {
  int v = g_deterministic.load(std::memory_order_relaxed);
  if (v < 0) {
    int expected = -1;
    g_deterministic.compare_exchange_strong(expected,
                                            env::get_bool("", "DETERMINISTIC", false) ? 1 : 0);
    v = g_deterministic.load(std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace dsk
