// Host side of the JIT's sample kernels: the row sum of dsk/kernels/jit_test/rowsum.hpp (its
// KernelSource and the ahead-of-time instantiations compiled into libdsk), and the tile layer's
// worked example dsk/kernels/examples/scaled_rowsum.hpp. The row sum names its instantiation with
// one function for the JIT and the AOT registry, so both find exactly the same kernel.
#include <utility>

#include <fmt/core.h>

#include <dsk/jit.hpp>
#include <dsk/kernels/jit_test/rowsum.hpp>

namespace dsk::jit {
namespace {

using kernels::jit_test::RowsumArgs;
using kernels::jit_test::RowsumConfig;

std::string instantiation_of(RowsumConfig c) {
  return fmt::format(
      "dsk::kernels::jit_test::rowsum<dsk::kernels::jit_test::RowsumConfig{{.cols = {}, "
      ".rows_per_step = {}}}>",
      c.cols, c.rows_per_step);
}

constexpr RowsumConfig kAheadOfTime[] = {{.cols = 64, .rows_per_step = 4},
                                         {.cols = 256, .rows_per_step = 2}};

template <size_t... I>
bool register_ahead_of_time(std::index_sequence<I...>) {
  (register_aot(instantiation_of(kAheadOfTime[I]),
                &aot_entry<RowsumArgs, &kernels::jit_test::rowsum<kAheadOfTime[I]>>),
   ...);
  return true;
}

[[maybe_unused]] const bool kRegistered =
    register_ahead_of_time(std::make_index_sequence<std::size(kAheadOfTime)>());

}  // namespace

KernelSource sample_kernel(int cols, int rows_per_step) {
  DSK_CHECK_ARG(cols >= 0, "dsk::jit::sample_kernel", "cols", "cols >= 0 (0: runtime shape)", cols);
  DSK_CHECK_ARG(rows_per_step >= 1 && rows_per_step <= 16, "dsk::jit::sample_kernel",
                "rows_per_step", "1 <= rows_per_step <= 16", rows_per_step);
  const RowsumConfig config{.cols = cols, .rows_per_step = rows_per_step};
  return KernelSource{.name = fmt::format("rowsum_f32_c{}r{}_generic", cols, rows_per_step),
                      .module = "",
                      .header = "dsk/kernels/jit_test/rowsum.hpp",
                      .instantiation = instantiation_of(config),
                      .args_type = "dsk::kernels::jit_test::RowsumArgs",
                      .isa = Backend::generic,
                      .dependency_signature = ""};
}

KernelSource tile_example_kernel(Backend isa, int cols) {
  DSK_CHECK_ARG(cols >= 0, "dsk::jit::tile_example_kernel", "cols", "cols >= 0 (0: runtime shape)",
                cols);
  return KernelSource{
      .name = fmt::format("scaled_rowsum_bf16_f32_c{}_{}", cols, backend_name(isa)),
      .module = "",
      .header = "dsk/kernels/examples/scaled_rowsum.hpp",
      .instantiation = fmt::format("dsk::kernels::examples::scaled_rowsum<dsk::tile::{}_t, "
                                   "dsk::kernels::examples::ScaledRowsumConfig{{.cols = {}}}>",
                                   backend_name(isa), cols),
      .args_type = "dsk::kernels::examples::ScaledRowsumArgs",
      .isa = isa,
      .dependency_signature = ""};
}

}  // namespace dsk::jit
