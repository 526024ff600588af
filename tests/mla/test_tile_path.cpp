// The attention kernels' tile-register path (Q . K^T and P . V as bf16 tile products), which the
// amx backend runs. On the avx512 and generic backends the same code runs on tile units that
// emulate AMX bit for bit: those runs check it against dsk::ref::mla on any CPU, and where AMX
// exists, the emulation must give exactly the bits of the real tiles.
#include "../src/mla/kernels.hpp"
#include "mla/mla_test_util.hpp"

namespace dsk::mla_test {
namespace {

using mla::detail::Products;

// Runs the API on the tile-register path for the scope (the default again afterwards).
struct ScopedTilePath : dsk::test::ScopedOverride<Products> {
  ScopedTilePath() : ScopedOverride(mla::detail::set_products_override, Products::tile_registers) {}
};

class TilePath : public dsk::test::PerBackend {};

TEST_P(TilePath, SparsePrefillMatchesTheReference) {
  ScopedTilePath tiles;
  // (s_q, s_kv, h_q, d_qk, topk): query rows 32-wide, 16-wide at the end (h_q 48, 20, 3), keys
  // filling 1, 6 and 7 chunks with partial 32-key steps, all-invalid rows, sinks, topk_length.
  check_sparse_fwd(make_sparse_fwd(2, 1840, 128, 512, 256));
  check_sparse_fwd(make_sparse_fwd(3, 700, 48, 576, 1100));
  check_sparse_fwd(make_sparse_fwd(5, 150, 20, 576, 100, {.sinks = true}));
  check_sparse_fwd(make_sparse_fwd(4, 90, 3, 512, 97, {.all_invalid_rows = true}));
  check_sparse_fwd(make_sparse_fwd(6, 300, 64, 576, 256, {.topk_length = true}));
}

TEST_P(TilePath, SparseFp8DecodeMatchesTheReference) {
  ScopedTilePath tiles;
  check_sparse_decode(make_sparse_decode(4, 3, 64, 576, 61, 1024, {.sinks = true}));
  check_sparse_decode(make_sparse_decode(3, 2, 3, 100, 64, 150, {.all_invalid_rows = true}));
  // One request: the keys split over threads, then merged.
  check_sparse_decode(make_sparse_decode(1, 1, 64, 2048, 64, 4096, {.topk_length = true}));
}

TEST_P(TilePath, DenseDecodeMatchesTheReference) {
  ScopedTilePath tiles;
  for (bool causal : {false, true}) {
    // (b, s_q, h_q, h_kv, s_k, page): 16 and 32 query rows per KV head, short and split lists.
    check_dense_decode(make_dense_decode(6, 2, 16, 2, 140, 64, causal, true));
    check_dense_decode(make_dense_decode(1, 4, 64, 2, 1500, 61, causal));
    check_dense_decode(make_dense_decode(2, 4, 16, 1, 2, 64, causal));
  }
}

// Both results of every kind, bit for bit.
void expect_same_bits(const mla::SparseFwdResult& a, const mla::SparseFwdResult& b) {
  EXPECT_TRUE(bitwise_equal(a.out, b.out)) << "out";
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(a.max_logits, b.max_logits)) << "max_logits";
}
void expect_same_bits(const mla::KvcacheResult& a, const mla::KvcacheResult& b) {
  EXPECT_TRUE(bitwise_equal(a.out, b.out)) << "out";
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse)) << "lse";
}

// `run()` on the amx backend and on every emulating backend, tile-register path throughout.
template <class Run>
void expect_emulation_matches_amx(const Run& run) {
  ScopedTilePath tiles;
  const auto real = [&] {
    dsk::test::ScopedBackend amx(Backend::amx);
    return run();
  }();
  for (Backend emulating : {Backend::avx512, Backend::generic}) {
    SCOPED_TRACE(backend_name(emulating));
    dsk::test::ScopedBackend scoped(emulating);
    expect_same_bits(run(), real);
  }
}

TEST(TilePathOnAmx, EmulationGivesTheBitsOfRealTiles) {
  DSK_SKIP_UNLESS_BACKEND(Backend::amx);
  const SparseFwdProblem prefill = make_sparse_fwd(3, 700, 48, 576, 300, {.sinks = true});
  expect_emulation_matches_amx([&] { return run_sparse_fwd(prefill); });
  const SparseDecodeProblem sparse = make_sparse_decode(3, 2, 20, 200, 61, 400);
  expect_emulation_matches_amx([&] {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    return run_sparse_decode(sparse, meta);
  });
  const DenseDecodeProblem dense = make_dense_decode(2, 2, 16, 1, 300, 64, true);
  expect_emulation_matches_amx([&] {
    mla::FlashMLASchedMeta meta = mla::get_mla_metadata();
    return run_dense_decode(dense, meta);
  });
}

// The default form is the tile registers on amx and the dot tiles elsewhere: the default run has
// the bits of the explicit run of that form, and not those of the other form (the two round
// differently, so the check can tell them apart).
TEST_P(TilePath, DefaultIsTileRegistersOnAmxOnly) {
  const SparseFwdProblem p = make_sparse_fwd(2, 400, 32, 576, 200);
  const mla::SparseFwdResult by_default = run_sparse_fwd(p);
  const auto run_with = [&](Products products) {
    const dsk::test::ScopedOverride<Products> form(mla::detail::set_products_override, products);
    return run_sparse_fwd(p);
  };
  const mla::SparseFwdResult tiles = run_with(Products::tile_registers);
  const mla::SparseFwdResult dots = run_with(Products::dot_tiles);
  const bool amx = GetParam() == Backend::amx;
  expect_same_bits(by_default, amx ? tiles : dots);
  EXPECT_FALSE(bitwise_equal(tiles.out, dots.out)) << "the forms should round differently";
}

TEST(AttentionScratch, BuffersStartOnCacheLinesAndFitTheirAllocation) {
  namespace k = kernels::mla;
  for (int64_t rows : {1, 16, 20, 128}) {
    for (int64_t d_qk : {512, 576}) {
      k::Problem p;
      p.rows = rows;
      p.rows_pad = k::round_up(rows, k::kRowAlign);
      p.d_qk = d_qk;
      p.d_v = 512;
      // Bases deliberately off the line, by one element.
      std::vector<bf16> bf16s(static_cast<size_t>(k::scratch_bf16s(p) + 1));
      std::vector<float> floats(static_cast<size_t>(k::scratch_floats(p) + 1));
      bf16* b0 = bf16s.data() + 1;
      float* f0 = floats.data() + 1;
      k::Scratch s = k::carve_scratch(p, b0, f0);
      // scratch_buffers hands over each field of s with its size: the carved pointer.
      k::scratch_buffers(p, s, [&]<class T>(T*& buffer, int64_t n) {
        SCOPED_TRACE(fmt::format("rows {} d_qk {}", rows, d_qk));
        EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer) % k::kScratchAlign, 0u);
        const T* base;
        int64_t size;
        if constexpr (std::is_same_v<T, bf16>) {
          base = b0;
          size = k::scratch_bf16s(p);
        } else {
          base = f0;
          size = k::scratch_floats(p);
        }
        EXPECT_GE(buffer, base);
        EXPECT_LE(buffer + n, base + size);
      });
    }
  }
}

DSK_INSTANTIATE_PER_BACKEND(TilePath);

}  // namespace
}  // namespace dsk::mla_test
