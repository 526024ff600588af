// The MQA-logits kernels' tile-register path ((query, head) x kv products as bf16 tile blocks),
// which the amx backend runs. On the avx512 and generic backends the same code runs on tile units
// that emulate AMX bit for bit: those runs check it against the references on any CPU, and where
// AMX exists the emulation must give exactly the bits of the real tiles.
#include <gtest/gtest.h>

#include "../src/gemm/mqa_kernels.hpp"
#include "gemm/mqa_test_util.hpp"

namespace dsk::gemm_test {
namespace {

// Runs the API on the tile-register path for the scope (the default again afterwards).
struct ScopedMqaTiles : dsk::test::ScopedOverride<gemm::detail::Products> {
  ScopedMqaTiles()
      : ScopedOverride(gemm::detail::set_mqa_products_override,
                       gemm::detail::Products::tile_registers) {}
};

class MqaTilePath : public dsk::test::PerBackend {};

TEST_P(MqaTilePath, MatchesTheReferences) {
  ScopedMqaTiles tiles;
  // Rows per block of 3 queries: 96 and 192 (whole 32-row blocks), 12 and 36 (a 16-row block or
  // a partial 32-row one); D 32, 64, 128; causal and random ranges; a short last block (S = 29,
  // 31).
  check_against_references(64, 1024, 32, 128, true);
  check_against_references(64, 700, 64, 64, false);
  check_against_references(29, 333, 4, 32, true);
  check_against_references(31, 200, 12, 64, false);  // S = 31: see test_mqa_logits.cpp
}

DSK_INSTANTIATE_PER_BACKEND(MqaTilePath);

TEST(MqaTilePathOnAmx, EmulationGivesTheBitsOfRealTiles) {
  DSK_SKIP_UNLESS_BACKEND(Backend::amx);
  SCOPED_TRACE(seed_note());
  ScopedMqaTiles tiles;
  for (int64_t h : {8, 12, 64}) {
    const MqaProblem p = make_problem(20, 300, h, 64, true);
    const auto run = [&](Backend b) {
      dsk::test::ScopedBackend scoped(b);
      return gemm::fp8_mqa_logits(p.q, p.kv, p.weights, p.ks, p.ke);
    };
    const Tensor real = run(Backend::amx);
    EXPECT_TRUE(bitwise_equal(run(Backend::avx512), real)) << "avx512, H=" << h;
    EXPECT_TRUE(bitwise_equal(run(Backend::generic), real)) << "generic, H=" << h;
  }
}

}  // namespace
}  // namespace dsk::gemm_test
