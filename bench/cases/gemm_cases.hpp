// The "gemm" module's verify cases (bench/cases/gemm_verify.cpp), registered by the module's
// register function in bench/cases/gemm.cpp next to its bench cases.
#pragma once

#include "bench/harness.hpp"

namespace dsk::bench {

// Adds `dsk verify gemm`: the dense, grouped and k-grouped GEMMs against dsk::ref on fresh random
// data.
void register_gemm_verify(Registry& r);

}  // namespace dsk::bench
