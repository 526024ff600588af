// The "ceilings" module: this machine's roofline, measured in-process (DESIGN §7). Per core
// (1 pinned thread) and in total (every thread, each pinned to its own CPU): AMX BF16 and INT8
// peaks, the AVX-512 FP32 FMA and BF16 dot-product peaks, L2-resident read bandwidth, DRAM read
// and write bandwidth; and, with two threads or more, the core-to-core bandwidth of a
// shared-memory ring.
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include <dsk/core/cpu.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/threads.hpp>

#include "bench/cases/ceiling_loops.hpp"
#include "bench/harness.hpp"
#include "bench/pinned_team.hpp"

namespace dsk::bench {

uint64_t read_sum_generic(const void* data, size_t bytes) {
  const uint64_t* p = static_cast<const uint64_t*>(data);
  const size_t words = bytes / 8;
  uint64_t s[8] = {};
  for (size_t i = 0; i + 8 <= words; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + j];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

void stream_write_generic(void* data, size_t bytes, uint64_t value) {
#if defined(__SSE2__)
  auto* p = static_cast<__m128i*>(data);
  const __m128i v = _mm_set1_epi64x(static_cast<long long>(value));
  for (size_t i = 0; i < bytes / 16; ++i) _mm_stream_si128(p + i, v);
  _mm_sfence();
#else
  std::memset(data, static_cast<int>(value & 0xFF), bytes);
#endif
}

namespace {

constexpr size_t kDramBytes = size_t{1} << 30;  // far beyond any L3 a core sees
constexpr size_t kHugePage = size_t{2} << 20;

// Results of the loops land here so the compiler keeps them; atomic so threads may all write.
std::atomic<uint64_t> g_sink{0};

double seconds_per_call(const CaseContext& ctx) {
  return ctx.quick ? 0.01 : 0.05;
}

std::string thread_text(int threads) {
  return threads == 1 ? "1 thread" : fmt::format("{} threads", threads);
}

std::string no_amx(bool int8) {
  const CpuFeatures& f = cpu_features();
  const bool ok = f.amx_tile && f.amx_permitted && (int8 ? f.amx_int8 : f.amx_bf16);
  if (ok) return "";
  return f.amx_tile && !f.amx_permitted ? "AMX not permitted by the kernel" : "no AMX";
}

std::string no_avx512() {
  return cpu_features().avx512f ? "" : "no AVX-512";
}

std::string no_avx512_bf16() {
  return cpu_features().avx512f && cpu_features().avx512_bf16 ? "" : "no AVX512-BF16";
}

using ReadFn = uint64_t (*)(const void*, size_t);
ReadFn best_read() {
  return cpu_features().avx512f && cpu_features().avx512bw ? read_sum_avx512 : read_sum_generic;
}

using WriteFn = void (*)(void*, size_t, uint64_t);
WriteFn best_write() {
  return cpu_features().avx512f ? stream_write_avx512 : stream_write_generic;
}

// The shortest of three team runs of fn: one run can be stretched by a preempted thread.
double shortest_run(PinnedTeam& team, const std::function<void(int)>& fn) {
  double best = team.run(fn);
  for (int i = 0; i < 2; ++i) best = std::min(best, team.run(fn));
  return std::max(best, 1e-9);
}

// Finds how many units of `work` make one team call last about `seconds`.
int64_t calibrate(PinnedTeam& team, const std::function<void(int64_t)>& work, double seconds) {
  int64_t units = 256;
  while (true) {
    const double took = shortest_run(team, [&](int) { work(units); });
    if (took >= seconds / 16 || units >= (int64_t{1} << 40))
      return std::max<int64_t>(1,
                               static_cast<int64_t>(static_cast<double>(units) * seconds / took));
    units *= 8;
  }
}

// Page-aligned anonymous memory on transparent huge pages where the kernel allows them.
class HugeBuffer {
 public:
  explicit HugeBuffer(size_t bytes) : mapped_(bytes + kHugePage) {
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    DSK_CHECK(p != MAP_FAILED, "bench ceilings",
              fmt::format("cannot map {} MiB for the bandwidth buffer", mapped_ >> 20));
    base_ = static_cast<char*>(p);
    const uintptr_t aligned =
        (reinterpret_cast<uintptr_t>(base_) + kHugePage - 1) & ~(kHugePage - 1);
    data_ = reinterpret_cast<char*>(aligned);
    madvise(data_, bytes, MADV_HUGEPAGE);  // a hint: failing leaves 4 KiB pages
  }
  ~HugeBuffer() { munmap(base_, mapped_); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  char* data() const { return data_; }

 private:
  size_t mapped_;
  char* base_ = nullptr;
  char* data_ = nullptr;
};

// Thread i's part of `bytes`, cut at 4 KiB boundaries.
std::pair<size_t, size_t> slice(size_t bytes, int threads, int i) {
  const size_t pages = bytes / 4096;
  return {pages * i / threads * 4096, pages * (i + 1) / threads * 4096};
}

struct ComputePeak {
  const char* name;
  const char* term;
  const char* shape;
  double ops_per_iteration;
  void (*loop)(int64_t iterations);
  std::function<std::string()> unavailable;
};

void fp32_loop(int64_t iterations) {
  const float lane = fp32_fma_peak_avx512(iterations);
  g_sink.fetch_add(static_cast<uint64_t>(lane), std::memory_order_relaxed);
}

void bf16_dot_loop(int64_t iterations) {
  const float lane = bf16_dot_peak_avx512(iterations);
  g_sink.fetch_add(static_cast<uint64_t>(lane), std::memory_order_relaxed);
}

Prepared prepare_compute(const ComputePeak& peak, int threads, const CaseContext& ctx) {
  auto team = std::make_shared<PinnedTeam>(threads);
  const auto loop = peak.loop;
  const int64_t iterations = calibrate(*team, loop, seconds_per_call(ctx));
  Prepared p;
  p.timed_kernel = [team, loop, iterations](int) {
    return team->run([&](int) { loop(iterations); });
  };
  p.flops = peak.ops_per_iteration * static_cast<double>(iterations) * threads;
  return p;
}

// Every thread reads its own buffer of half an L2 `passes` times per call.
Prepared prepare_l2_read(int threads, const CaseContext& ctx) {
  const size_t bytes = std::max<size_t>(64 << 10, l2_cache_bytes() / 2) & ~size_t{4095};
  auto team = std::make_shared<PinnedTeam>(threads);
  auto buffers = std::make_shared<std::vector<std::unique_ptr<HugeBuffer>>>(threads);
  team->run([&](int i) {  // first touch by the thread that reads it
    (*buffers)[i] = std::make_unique<HugeBuffer>(bytes);
    std::memset((*buffers)[i]->data(), 0x5A, bytes);
  });
  const ReadFn read = best_read();
  auto pass = [buffers, read, bytes](int i, int64_t passes) {
    uint64_t sum = 0;
    for (int64_t k = 0; k < passes; ++k) sum += read((*buffers)[i]->data(), bytes);
    g_sink.fetch_add(sum, std::memory_order_relaxed);
  };
  const double sixteen_passes_s = shortest_run(*team, [&](int i) { pass(i, 16); });
  const int64_t passes =
      std::max<int64_t>(1, static_cast<int64_t>(16 * seconds_per_call(ctx) / sixteen_passes_s));
  Prepared p;
  p.timed_kernel = [team, pass, passes](int) { return team->run([&](int i) { pass(i, passes); }); };
  p.bytes = static_cast<double>(bytes) * static_cast<double>(passes) * threads;
  return p;
}

// The threads share one 1 GiB buffer, each first touching its own slice; each timed call runs
// pass(data, bytes) over every thread's slice.
template <class Pass>
Prepared prepare_dram(int threads, Pass pass) {
  auto team = std::make_shared<PinnedTeam>(threads);
  auto buffer = std::make_shared<HugeBuffer>(kDramBytes);
  team->run([&](int i) {
    const auto [begin, end] = slice(kDramBytes, threads, i);
    std::memset(buffer->data() + begin, 0x5A, end - begin);
  });
  Prepared p;
  p.timed_kernel = [team, buffer, pass, threads](int) {
    return team->run([&](int i) {
      const auto [begin, end] = slice(kDramBytes, threads, i);
      pass(buffer->data() + begin, end - begin);
    });
  };
  p.bytes = static_cast<double>(kDramBytes);
  return p;
}

Prepared prepare_dram_read(int threads) {
  return prepare_dram(threads, [read = best_read()](const char* data, size_t bytes) {
    g_sink.fetch_add(read(data, bytes), std::memory_order_relaxed);
  });
}

// Non-temporal stores because a plain store first reads the line it writes on most CPUs (the
// Xeon), so plain stores would measure a copy; on the AMD Zen 5 VM plain 64-byte stores of whole
// lines were no slower (42-53 GB/s against 37-40 on two threads), a rate this term does not claim.
Prepared prepare_dram_write(int threads) {
  return prepare_dram(threads,
                      [write = best_write()](char* data, size_t bytes) { write(data, bytes, 1); });
}

// Core to core: threads 2p and 2p + 1 pass chunks to each other through two rings (one each
// way) of kRingSlots slots in memory they share, as the shared-memory EP transport does: the
// sender copies a chunk from an L2-resident source into a free slot and publishes it with a
// release store; the receiver sums the slot and hands it back. Every byte read crosses from one
// core's caches to the other's, and the rings stay in the caches, so DRAM plays no part.
// NOTES: the cost of moving rows between ranks on one host. On the AMD Zen 5 VM (2 vCPUs) a
// 64 KiB chunk moved at about 15.5 GB/s each way while one core copies 35 GB/s from DRAM into
// its own ring, which is why the EP shared-memory combine, whose rows all travel this way, sits
// further from its memcpy peer than the dispatch, which writes straight to its destination.
constexpr size_t kRingChunk = size_t{64} << 10;
constexpr int kRingSlots = 8;
constexpr int kRingSources = 4;  // the sender cycles over this many chunks of its own

struct alignas(64) RingCounter {
  std::atomic<uint64_t> value{0};
};

// One direction of a pair: the slots, the chunks published, the chunks handed back.
struct Ring {
  char* slots = nullptr;
  RingCounter posted, taken;
};

std::string needs_two_threads() {
  return get_num_threads() >= 2 ? "" : "needs 2 threads, one per CPU";
}

Prepared prepare_core_to_core(int threads, const CaseContext& ctx) {
  const int pairs = threads / 2;
  auto team = std::make_shared<PinnedTeam>(2 * pairs);
  const size_t ring_bytes = kRingChunk * kRingSlots;
  auto memory = std::make_shared<HugeBuffer>(2 * pairs * (ring_bytes + kRingSources * kRingChunk));
  auto rings = std::make_shared<std::vector<Ring>>(2 * pairs);  // ring i: thread i sends
  for (int i = 0; i < 2 * pairs; ++i) (*rings)[i].slots = memory->data() + i * ring_bytes;
  char* sources = memory->data() + 2 * pairs * ring_bytes;
  team->run([&](int i) {  // first touch by the thread that writes them
    std::memset((*rings)[i].slots, 0, ring_bytes);
    std::memset(sources + i * kRingSources * kRingChunk, 0x5A, kRingSources * kRingChunk);
  });
  const ReadFn read = best_read();
  auto pass = [rings, sources, read](int i, int64_t chunks) {
    Ring& out = (*rings)[i];
    Ring& in = (*rings)[i ^ 1];
    const char* source = sources + i * kRingSources * kRingChunk;
    // Only this thread writes out.posted and in.taken, so they are where the last call left them.
    uint64_t sent = out.posted.value.load(std::memory_order_relaxed);
    uint64_t got = in.taken.value.load(std::memory_order_relaxed);
    const uint64_t sent_end = sent + chunks, got_end = got + chunks;
    uint64_t sum = 0;
    while (sent < sent_end || got < got_end) {
      if (sent < sent_end && sent - out.taken.value.load(std::memory_order_acquire) < kRingSlots) {
        std::memcpy(out.slots + sent % kRingSlots * kRingChunk,
                    source + sent % kRingSources * kRingChunk, kRingChunk);
        out.posted.value.store(++sent, std::memory_order_release);
      }
      if (got < got_end && in.posted.value.load(std::memory_order_acquire) > got) {
        sum += read(in.slots + got % kRingSlots * kRingChunk, kRingChunk);
        in.taken.value.store(++got, std::memory_order_release);
      }
    }
    g_sink.fetch_add(sum, std::memory_order_relaxed);
  };
  const double sixty_four_s = shortest_run(*team, [&](int i) { pass(i, 64); });
  const int64_t chunks =
      std::max<int64_t>(64, static_cast<int64_t>(64 * seconds_per_call(ctx) / sixty_four_s));
  Prepared p;
  p.timed_kernel = [team, memory, pass, chunks](int) {
    return team->run([&](int i) { pass(i, chunks); });
  };
  p.bytes = static_cast<double>(kRingChunk) * static_cast<double>(chunks) * 2 * pairs;
  return p;
}

// The per-core case (1 thread) and, on more than one thread, the whole-machine case.
template <class Add>
void for_each_scope(Add add) {
  add(1, true);
  if (get_num_threads() > 1) add(get_num_threads(), false);
}

}  // namespace

void register_ceilings_cases(Registry& r) {
  const ComputePeak peaks[] = {
      {"amx_bf16_peak", "amx_bf16", "tdpbf16ps 2x2 tiles in registers", kAmxBf16FlopPerIteration,
       amx_bf16_peak, [] { return no_amx(false); }},
      {"amx_int8_peak", "amx_int8", "tdpbssd 2x2 tiles in registers", kAmxInt8OpPerIteration,
       amx_int8_peak, [] { return no_amx(true); }},
      {"fp32_fma_peak", "fp32", "24 zmm accumulators", kFp32FlopPerIteration, fp32_loop, no_avx512},
      {"avx512_bf16_peak", "avx512_bf16", "vdpbf16ps, 24 zmm accumulators",
       kBf16DotFlopPerIteration, bf16_dot_loop, no_avx512_bf16},
  };
  for (const ComputePeak& peak : peaks) {
    for_each_scope([&](int threads, bool per_core) {
      r.add(BenchCase{.name = peak.name,
                      .shape = fmt::format("{}, {}", peak.shape, thread_text(threads)),
                      .ceiling = peak.term,
                      .measures = peak.term,
                      .per_core = per_core,
                      .unavailable = peak.unavailable,
                      .prepare = [peak, threads](const CaseContext& ctx) {
                        return prepare_compute(peak, threads, ctx);
                      }});
    });
  }
  for_each_scope([&](int threads, bool per_core) {
    r.add(BenchCase{
        .name = "l2_read",
        .shape =
            fmt::format("{} KiB per thread, {}", l2_cache_bytes() / 2 >> 10, thread_text(threads)),
        .ceiling = "l2_read",
        .measures = "l2_read",
        .per_core = per_core,
        .prepare = [threads](const CaseContext& ctx) { return prepare_l2_read(threads, ctx); }});
  });
  struct DramTerm {
    const char* name;
    const char* how;  // what the shape adds to "1 GiB"
    Prepared (*prepare)(int threads);
  };
  for (const DramTerm& term : {DramTerm{"dram_read", "", prepare_dram_read},
                               DramTerm{"dram_write", ", non-temporal stores", prepare_dram_write}})
    for_each_scope([&](int threads, bool per_core) {
      r.add(BenchCase{.name = term.name,
                      .shape = fmt::format("1 GiB{}, {}", term.how, thread_text(threads)),
                      .ceiling = term.name,
                      .residency = Residency::cold,
                      .working_set_bytes = kDramBytes,
                      .measures = term.name,
                      .per_core = per_core,
                      .prepare = [prepare = term.prepare, threads](const CaseContext&) {
                        return prepare(threads);
                      }});
    });
  // Two cores at least, so only the whole-machine case.
  const int threads = get_num_threads();
  r.add(BenchCase{
      .name = "core_to_core",
      .shape = fmt::format("{} KiB chunks, rings of {}, {}", kRingChunk >> 10, kRingSlots,
                           thread_text(threads / 2 * 2)),
      .ceiling = "core_to_core",
      .measures = "core_to_core",
      .per_core = false,
      .unavailable = needs_two_threads,
      .prepare = [](const CaseContext& ctx) { return prepare_core_to_core(ctx.threads, ctx); }});
}

}  // namespace dsk::bench
