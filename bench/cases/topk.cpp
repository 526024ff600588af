// The "topk" module of `dsk bench` / `dsk verify`: dsk::select::topk on rows that stream from
// DRAM (cold copies), against the DRAM read roof and against a std::nth_element baseline run on
// the same threads; verify cases against dsk::ref::select on fresh random data.
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include <dsk/core/threads.hpp>
#include <dsk/ref.hpp>
#include <dsk/select.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

uint64_t fresh_seed() {
  static std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// Scores [rows, cols]: uniform f32 (distinct values, as logits mostly are), or their bf16.
Tensor scores(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
  Tensor f = Tensor::empty({rows, cols}, DType::f32);
  fill_uniform(f.data<float>(), static_cast<size_t>(f.numel()), seed);
  if (dtype == DType::f32) return f;
  Tensor b = Tensor::empty({rows, cols}, DType::bf16);
  convert_f32_to_bf16(f.data<float>(), b.data<bf16>(), static_cast<size_t>(f.numel()));
  return b;
}

// The baseline a user without dsk writes: per row, (value, position) pairs, std::nth_element
// with a greater-than comparator, the first k positions; rows spread over the same threads.
void nth_element_topk(const Tensor& x, int64_t k, int32_t* out) {
  const int64_t cols = x.size(1);
  parallel_for(x.size(0), [&](int64_t r0, int64_t r1, int) {
    std::vector<std::pair<float, int32_t>> row(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < cols; ++j)
        row[static_cast<size_t>(j)] = {x.dtype() == DType::f32
                                           ? x.data<float>()[r * cols + j]
                                           : numeric::bf16_to_f32(x.data<bf16>()[r * cols + j]),
                                       static_cast<int32_t>(j)};
      std::nth_element(row.begin(), row.begin() + (k - 1), row.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (int64_t i = 0; i < k; ++i) out[r * k + i] = row[static_cast<size_t>(i)].second;
    }
  });
}

BenchCase topk_case(int64_t rows, int64_t cols, int64_t k, DType dtype, bool quick) {
  const double bytes = static_cast<double>(rows * cols) * static_cast<double>(element_size(dtype)) +
                       4.0 * static_cast<double>(rows * k);
  return {.name = "topk",
          .shape = fmt::format("b={} n={} k={} {}", rows, cols, k, dtype_name(dtype)),
          .ceiling = "dram_read",
          .peer = "std::nth_element",
          .residency = Residency::cold,
          .working_set_bytes = static_cast<size_t>(bytes),
          .quick = quick,
          .prepare = [=](const CaseContext& ctx) {
            auto inputs = std::make_shared<std::vector<Tensor>>();
            for (int c = 0; c < ctx.copies; ++c)
              inputs->push_back(scores(rows, cols, dtype, fresh_seed()));
            auto out = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(rows * k));
            Prepared p;
            p.kernel = [=](int c) { select::topk((*inputs)[static_cast<size_t>(c)], k); };
            p.peer = [=](int c) {
              nth_element_topk((*inputs)[static_cast<size_t>(c)], k, out->data());
            };
            p.bytes = bytes;
            return p;
          }};
}

VerifyCase verify_case(int64_t rows, int64_t cols, int64_t k, DType dtype) {
  return {.name = "topk",
          .shape = fmt::format("b={} n={} k={} {}", rows, cols, k, dtype_name(dtype)),
          .metric = "bad rows",
          .tolerance = 0,
          .run = [=](const CaseContext&) {
            const Tensor x = ref::randn({rows, cols}, dtype, fresh_seed());
            const ref::TopkCompareResult r = ref::compare_topk_sets(
                select::topk(x, k).indices, ref::select::topk(x, k).indices, x);
            return static_cast<double>(r.num_bad_rows);
          }};
}

}  // namespace

void register_topk_cases(Registry& r) {
  r.add(topk_case(64, 65536, 2048, DType::f32, true));
  r.add(topk_case(1, 131072, 2048, DType::f32, true));
  r.add(topk_case(64, 65536, 2048, DType::bf16, false));
  r.add(topk_case(64, 65536, 512, DType::f32, false));
  r.add(topk_case(1, 262144, 2048, DType::f32, false));
  r.add(verify_case(64, 65536, 2048, DType::f32));
  r.add(verify_case(4, 131072, 4096, DType::bf16));
  r.add(verify_case(16, 3000, 2048, DType::f32));
}

}  // namespace dsk::bench
