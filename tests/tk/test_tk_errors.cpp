// dsk::tk argument checks: bad dtypes, shapes, ranges and options raise dsk::Error naming the
// function and the argument, before anything is written.
#include "tk/tk_test.hpp"

namespace dsk::tk {
namespace {

// Runs `call`, expecting a dsk::Error whose function and argument are the given ones.
template <class Call>
void expect_error(Call call, const std::string& function, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no error from " << function << " (" << argument << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.function(), function) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(TkErrors, Routing) {
  const Tensor logits = ref::randn({4, 64}, DType::f32, 1);
  const Tensor bias = ref::randn({64}, DType::f32, 2);
  expect_error([&] { topk_gate(logits, 0); }, "tk::topk_gate", "num_topk");
  expect_error([&] { topk_gate(logits, 33); }, "tk::topk_gate", "num_topk");
  expect_error(
      [&] {
        topk_gate(logits.view({4, 64}).reinterpret(DType::i32), 2);
      },
      "tk::topk_gate", "scores");
  expect_error(
      [&] {
        topk_gate(ref::randn({2, 2000}, DType::f32, 3), 2);
      },
      "tk::topk_gate", "scores");
  expect_error([&] { topk_gate(logits.transpose(0, 1), 2); }, "tk::topk_gate", "scores");
  expect_error([&] { noaux_tc_gate(logits, bias, 8, 3, 1); }, "tk::noaux_tc_gate", "n_group");
  expect_error([&] { noaux_tc_gate(logits, bias, 17, 8, 2); }, "tk::noaux_tc_gate", "num_topk");
  expect_error([&] { noaux_tc_gate(logits, bias, 4, 8, 2, 1.0f, "relu"); }, "tk::noaux_tc_gate",
               "scoring_func");
  expect_error([&] { noaux_tc_gate(logits, ref::randn({63}, DType::f32, 4), 4, 8, 2); },
               "tk::noaux_tc_gate", "e_score_correction_bias");
  expect_error([&] { top2_sum_gate(logits, bias, 4, 2, 0, false, 0, 1.0f, 0, 1, 0, 1, "sigmoid"); },
               "tk::top2_sum_gate", "num_topk_groups");
  expect_error([&] { top2_sum_gate(logits, bias, 4, 2, 8, false, 0, 1.0f, 0, 3, 0, 1, "sigmoid"); },
               "tk::top2_sum_gate", "num_ep_ranks");
  expect_error([&] { top2_sum_gate(logits, bias, 4, 2, 8, false, 0, 1.0f, 0, 1, 2, 2, "sigmoid"); },
               "tk::top2_sum_gate", "tp_rank");
  expect_error([&] { top2_sum_gate(logits, bias, 4, 2, 8, true, 1, 1.0f, 0, 1, 0, 1, "sigmoid"); },
               "tk::top2_sum_gate", "to_physical_map");
  const Tensor fix = test::bool_rows(4, [](int64_t) { return true; });
  expect_error(
      [&] {
        top2_sum_gate(logits, bias, 4, 2, 8, false, 0, 1.0f, 0, 1, 0, 1, "sigmoid", std::nullopt,
                      fix);
      },
      "tk::top2_sum_gate", "fix_routing_mask");
  Tensor unmapped = ref::randint({4, 4}, DType::i64, 5, 0, 64);
  unmapped.at<int64_t>({2, 1}) = 64;
  expect_error(
      [&] {
        top2_sum_gate(logits, bias, 4, 2, 8, false, 0, 1.0f, 0, 1, 0, 1, "sigmoid", std::nullopt,
                      fix, std::nullopt, std::nullopt, unmapped);
      },
      "tk::top2_sum_gate", "unmapped_topk_idx");
  expect_error(
      [&] {
        topk_sum_and_topk_group_idx(ref::randn({2, 4, 8}, DType::f32, 6), 3, 2);
      },
      "tk::topk_sum_and_topk_group_idx", "num_topk_sum");
  expect_error(
      [&] {
        group_count(ref::randn({2, 4}, DType::f32, 7), 8);
      },
      "tk::group_count", "group_idx");
  expect_error(
      [&] {
        mask_indices_by_tp(ref::randint({2, 4}, DType::i64, 8, 0, 8), 10, 4, 0, 2);
      },
      "tk::mask_indices_by_tp", "n");
}

TEST(TkErrors, Quantisation) {
  const Tensor x = ref::randn({4, 256}, DType::bf16, 1);
  expect_error([&] { per_token_cast(x, "e5m2", 128); }, "tk::per_token_cast", "fmt");
  expect_error([&] { per_token_cast(x, "e4m3", 100); }, "tk::per_token_cast", "num_per_channels");
  expect_error([&] { per_token_cast(x, "e4m3", 128, false, false, true); }, "tk::per_token_cast",
               "use_packed_ue8m0");
  expect_error(
      [&] {
        per_token_cast(ref::randn({4, 255}, DType::bf16, 2), "e2m1", 255);
      },
      "tk::per_token_cast", "x");
  expect_error(
      [&] {
        per_token_cast(ref::randn({4, 256}, DType::f16, 3), "e4m3", 128);
      },
      "tk::per_token_cast", "x");
  expect_error(
      [&] {
        per_block_cast(x, "e4m3", {0, 128});
      },
      "tk::per_block_cast", "block_size.first");
  expect_error(
      [&] {
        swiglu_forward(ref::randn({4, 255}, DType::bf16, 4));
      },
      "tk::swiglu_forward", "x");
  expect_error([&] { swiglu_forward(x, std::nullopt, -1.0f); }, "tk::swiglu_forward",
               "swiglu_clamp_value");
  expect_error(
      [&] {
        swiglu_forward(x, std::nullopt, std::nullopt, std::nullopt,
                       ref::randn({4, 2}, DType::f32, 5));
      },
      "tk::swiglu_forward", "topk_weights");
  expect_error(
      [&] {
        rmsnorm_forward_and_per_token_cast(x, ref::randn({255}, DType::f32, 6), 1e-6f, "e4m3", 128);
      },
      "tk::rmsnorm_forward_and_per_token_cast", "weight");
  const QuantTensor q = per_token_cast(x, "e4m3", 128);
  expect_error([&] { cast_back(q, "fp16", {1, 128}); }, "tk::cast_back", "fmt");
  expect_error([&] { cast_back(q, "fp32", {1, 64}); }, "tk::cast_back", "x.sf");
}

TEST(TkErrors, NormsAndPositions) {
  const Tensor x = ref::randn({4, 64}, DType::bf16, 1);
  expect_error([&] { rms_norm(x, ref::randn({63}, DType::f32, 2)); }, "tk::rms_norm", "weight");
  expect_error([&] { rms_norm(x, ref::randn({64}, DType::f32, 3), 1e-6f, DType::e4m3); },
               "tk::rms_norm", "out_dtype");
  expect_error(
      [&] { layer_norm(x, ref::randn({64}, DType::f32, 2), ref::randn({64}, DType::bf16, 3)); },
      "tk::layer_norm", "bias");
  const Tensor cache = yarn_cos_sin_cache();
  Tensor q = ref::randn({3, 2, 64}, DType::bf16, 4);
  Tensor pos = Tensor::empty({3}, DType::i32);
  pos.at<int32_t>({0}) = 0;
  pos.at<int32_t>({1}) = 16384;  // past the table
  pos.at<int32_t>({2}) = 5;
  expect_error([&] { apply_rotary(q, cache, std::nullopt, pos); }, "tk::apply_rotary", "positions");
  expect_error([&] { apply_rotary(q, cache, std::nullopt, std::nullopt, false, false, -1); },
               "tk::apply_rotary", "seqlen_offset");
  expect_error(
      [&] {
        apply_rotary(ref::randn({3, 2, 32}, DType::bf16, 5), cache);
      },
      "tk::apply_rotary", "query");
  expect_error(
      [&] {
        hadamard_transform(ref::randn({2, 96}, DType::f32, 6));
      },
      "tk::hadamard_transform", "x");
  RopeConfig bad;
  bad.rot_dim = 63;
  expect_error([&] { yarn_cos_sin_cache(bad); }, "tk::rope_frequencies", "config.rot_dim");
}

TEST(TkErrors, EmptyInputsAreFine) {
  EXPECT_EQ(topk_gate(Tensor::empty({0, 64}, DType::f32), 4).size(0), 0);
  EXPECT_EQ(
      noaux_tc_gate(Tensor::empty({0, 64}, DType::f32), std::nullopt, 4, 8, 2).topk_idx.size(0), 0);
  const FusedMapping m = get_fused_mapping(Tensor::empty({0, 8}, DType::i64), 16, 0, 32);
  EXPECT_EQ(m.pos_to_expert.size(0), 0);
  EXPECT_EQ(per_token_cast(Tensor::empty({0, 128}, DType::bf16), "e4m3", 128).data.size(0), 0);
  EXPECT_EQ(
      rms_norm(Tensor::empty({0, 128}, DType::bf16), Tensor::empty({128}, DType::f32)).size(0), 0);
}

// Rows of width 0: the casts with a fixed block size return empty codes and a scale per row; a
// block as wide as the row (num_per_channels = hidden = 0) is an error, not a division by zero
// (it used to end the process with SIGFPE).
TEST(TkErrors, RowsOfWidthZero) {
  const Tensor x = Tensor::empty({4, 0}, DType::bf16);
  const QuantTensor q = per_token_cast(x, "e4m3", 128);
  EXPECT_EQ(q.data.sizes(), (Shape{4, 0}));
  expect_error([&] { per_token_cast(x, "e4m3", 0); }, "tk::per_token_cast", "num_per_channels");
  expect_error([&] { swiglu_forward_and_per_token_cast(x, "e4m3", 0); },
               "tk::swiglu_forward_and_per_token_cast", "num_per_channels");
  expect_error(
      [&] {
        rmsnorm_forward_and_per_token_cast(x, Tensor::empty({0}, DType::f32), 1e-6f, "e4m3", 0);
      },
      "tk::rmsnorm_forward_and_per_token_cast", "num_per_channels");
  EXPECT_EQ(rms_norm(x, Tensor::empty({0}, DType::f32)).sizes(), (Shape{4, 0}));
}

}  // namespace
}  // namespace dsk::tk
