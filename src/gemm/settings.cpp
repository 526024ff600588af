// dsk::gemm's settings: the M/K alignment of contiguous grouped layouts (upstream
// get/set_mk_alignment_for_contiguous_layout). Grouped GEMMs check segments against it, and the
// routing and EP code that pad expert segments read it, so a value set here holds everywhere.
#include <atomic>

#include <dsk/core/error.hpp>
#include <dsk/gemm.hpp>

namespace dsk::gemm {
namespace {

// The CPU default: one AMX tile height, the smallest value allowed. The kernels compute each group
// over its own rows only (padding rows are never multiplied, and the amx kernel pads its row tiles
// in scratch), so a larger alignment buys no speed and only costs padding: more rows of A to fill
// and of D to zero, more dispatch buffer in dsk::ep. Measured in docs/gemm.md ("Choosing the mk
// alignment"): the same speed at 16, 32, 64 and 128 within the noise, padding growing fast.
constexpr int kDefaultMkAlignment = 16;

std::atomic<int>& mk_alignment() {
  static std::atomic<int> value{kDefaultMkAlignment};
  return value;
}

}  // namespace

int get_mk_alignment_for_contiguous_layout() {
  return mk_alignment().load(std::memory_order_relaxed);
}

void set_mk_alignment_for_contiguous_layout(int alignment) {
  DSK_CHECK_ARG(alignment > 0 && alignment % 16 == 0, "set_mk_alignment_for_contiguous_layout",
                "alignment", "a positive multiple of 16 (the AMX tile height)", alignment);
  mk_alignment().store(alignment, std::memory_order_relaxed);
}

int get_theoretical_mk_alignment_for_contiguous_layout(std::optional<int> expected_m) {
  if (expected_m.has_value())
    DSK_CHECK_ARG(*expected_m > 0, "get_theoretical_mk_alignment_for_contiguous_layout",
                  "expected_m", "a positive number of rows", *expected_m);
  // The CPU kernels block M by tile heights whatever the expected M, so one value fits all.
  return kDefaultMkAlignment;
}

}  // namespace dsk::gemm
