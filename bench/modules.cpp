// The module table: the one place a module's bench and verify cases are plugged in.
//
// To add a module, write bench/cases/<module>.cpp defining
//   void dsk::bench::register_<module>_cases(Registry& r)
// and add X(<module>) below. That line declares the function, gives its cases their module name
// and makes `dsk bench <module>` and `dsk verify <module>` exist. "ceilings" stays first: every
// bench run measures the ceilings before the cases that are compared with them.
#include <mutex>

#include "bench/harness.hpp"

#define DSK_BENCH_MODULES(X) \
  X(ceilings)                \
  X(core)                    \
  X(gemm)                    \
  X(indexer)                 \
  X(mla)                     \
  X(tk)                      \
  X(topk)                    \
  X(ep)                      \
  X(model)                   \
  X(layer)

namespace dsk::bench {

#define DSK_DECLARE_MODULE(module) void register_##module##_cases(Registry& r);
DSK_BENCH_MODULES(DSK_DECLARE_MODULE)
#undef DSK_DECLARE_MODULE

namespace {

Registry build_registry() {
  Registry r;
#define DSK_REGISTER_MODULE(module) \
  r.begin_module(#module);          \
  register_##module##_cases(r);
  DSK_BENCH_MODULES(DSK_REGISTER_MODULE)
#undef DSK_REGISTER_MODULE
  return r;
}

}  // namespace

const Registry& registry() {
  static const Registry r = build_registry();
  return r;
}

}  // namespace dsk::bench
