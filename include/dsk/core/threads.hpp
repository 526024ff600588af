// Threading: the number of compute threads (upstream's set_num_sms), a persistent pool with static
// partitioning, and the deterministic-algorithms switch.
//
// parallel_for splits [0, n) into at most get_num_threads() contiguous chunks of near-equal size,
// always the same way for the same (n, threads), so kernels that reduce per chunk are repeatable.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace dsk {

// The CPUs this process may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cpus();

// Default: DSK_NUM_THREADS, else the CPUs this process may run on.
int get_num_threads();
// n >= 1; raises dsk::Error otherwise. Takes effect for the next parallel_for.
void set_num_threads(int n);

// Runs fn(begin, end, thread_index) over a static partition of [0, n) on the pool; the calling
// thread takes chunk 0. Chunks never split a `grain`-aligned block: boundaries are multiples of
// grain (except n). Nested calls run serially on the caller. An exception thrown by fn is
// re-thrown on the caller after all chunks finish.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                  int64_t grain = 1);

// Whether a parallel_for is running on this thread (nested calls go serial).
bool in_parallel_region();

// Upstream's use_deterministic_algorithms: when true, every kernel gives bitwise-identical
// results across runs and across thread counts (reductions use a fixed order).
void use_deterministic_algorithms(bool enabled);
bool get_deterministic_algorithms();

}  // namespace dsk
