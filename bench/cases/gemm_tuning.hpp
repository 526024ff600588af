// The GEMM benchmark shapes outside `dsk bench`: `dsk jit warmup --autotune` runs each once with
// DSK_AUTOTUNE=1, so that the engine measures and caches its blocking for every shape the bench
// times (and the JIT compiles their kernels) before a benchmark or a serving process needs them.
#pragma once

#include <functional>
#include <string>

namespace dsk::bench {

// One call of each shape of `dsk bench gemm` (--quick: the quick subset of the large-M ones),
// calling on_shape(description) before each.
void warm_up_gemm_shapes(bool quick, const std::function<void(const std::string&)>& on_shape);

}  // namespace dsk::bench
