// The dot-tile test bodies, instantiated per ISA with DSK_TILE_DOT_TEST_DEFINE_RUNNERS(isa).
// Everything has internal linkage, so no instantiation can stand in for another ISA's.
#pragma once

#include <utility>

#include <dsk/kernels/tile/dot.hpp>

#include "tile/tile_dot_test.hpp"

namespace dsk::tile_test {
namespace {

template <class I>
struct DotBody {
  template <int S>
  static void steps_case(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t steps,
                         float* c, int64_t ldc) {
    tile::DotTile<I, kDotShapes[S].rows, kDotShapes[S].vecs> t;
    tile::dot_load(t, c, ldc);
    tile::dot_steps(t, a, lda, b, ldb, steps);
    tile::dot_store(t, c, ldc);
  }

  template <int S>
  static void promote_case(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t steps,
                           float* c, int64_t ldc, const float* row_scale, const float* col_scale) {
    tile::DotTile<I, kDotShapes[S].rows, kDotShapes[S].vecs> t;
    tile::dot_zero(t);
    tile::dot_steps(t, a, lda, b, ldb, steps);
    tile::dot_promote(t, c, ldc, row_scale, col_scale);
  }

  template <int... S>
  static DotRunners make(std::integer_sequence<int, S...>) {
    using Steps = void (*)(const bf16*, int64_t, const bf16*, int64_t, int64_t, float*, int64_t);
    using Promote = void (*)(const bf16*, int64_t, const bf16*, int64_t, int64_t, float*, int64_t,
                             const float*, const float*);
    static constexpr Steps kSteps[] = {&steps_case<S>...};
    static constexpr Promote kPromote[] = {&promote_case<S>...};
    DotRunners r{};
    r.steps = [](int shape, const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t n,
                 float* c, int64_t ldc) { kSteps[shape](a, lda, b, ldb, n, c, ldc); };
    r.promote = [](int shape, const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t n,
                   float* c, int64_t ldc, const float* rs,
                   const float* cs) { kPromote[shape](a, lda, b, ldb, n, c, ldc, rs, cs); };
    return r;
  }
};

}  // namespace
}  // namespace dsk::tile_test

// Defines const DotRunners& <isa>_dot_runners() for tile::<isa>_t in the including TU.
#define DSK_TILE_DOT_TEST_DEFINE_RUNNERS(isa)                                                  \
  const ::dsk::tile_test::DotRunners& ::dsk::tile_test::isa##_dot_runners() {                  \
    static const DotRunners runners =                                                          \
        DotBody<::dsk::tile::isa##_t>::make(std::make_integer_sequence<int, kNumDotShapes>{}); \
    return runners;                                                                            \
  }
