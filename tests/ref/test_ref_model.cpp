// dsk::ref::model::Reference: determinism, causality (prefill then decode equals one longer
// prefill), independence of sequences, sane logits, the indexer's selection sizes, bad arguments.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <span>
#include <vector>

#include <dsk/ref.hpp>

#include "common/test_util.hpp"

namespace dsk::ref::model {
namespace {

// v32-tiny cut to two layers (the dense first layer and one MoE layer) to keep the suite fast.
dsk::model::Config test_config() {
  dsk::model::Config c = dsk::model::preset("v32-tiny");
  c.n_layers = 2;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  const Tensor t = randint({n}, DType::i32, seed, 0, vocab);
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + n);
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double scale = 0.0, diff = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(b.data<float>()[i])));
    diff = std::max(diff, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  }
  return diff / scale;
}

class RefModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new dsk::model::Weights(dsk::model::random_weights(test_config(), 7));
    reference_ = new Reference(*weights_);
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete weights_;
    reference_ = nullptr;
    weights_ = nullptr;
  }

  static const dsk::model::Weights& weights() { return *weights_; }

  static Reference& ref() { return *reference_; }
  static int64_t vocab() { return reference_->config().vocab_size; }
  static int64_t topk() { return reference_->config().index_topk; }

  // A fresh sequence holding `tokens` (one prefill); returns its id and the logits.
  static std::pair<int64_t, Tensor> prefill(const std::vector<int32_t>& tokens) {
    const int64_t seq = ref().add_sequence();
    Tensor logits = ref().forward(seq, tokens);
    return {seq, logits};
  }

 private:
  static dsk::model::Weights* weights_;
  static Reference* reference_;
};

dsk::model::Weights* RefModel::weights_ = nullptr;
Reference* RefModel::reference_ = nullptr;

TEST_F(RefModel, LogitsAreFiniteAndSpread) {
  const auto [seq, logits] = prefill(random_tokens(24, vocab(), 1));
  ASSERT_EQ(logits.sizes(), (Shape{vocab()}));
  ASSERT_EQ(logits.dtype(), DType::f32);
  const std::vector<float> v = values(logits);
  double sum = 0.0, sum_sq = 0.0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double mean = sum / static_cast<double>(v.size());
  const double std_dev = std::sqrt(sum_sq / static_cast<double>(v.size()) - mean * mean);
  EXPECT_GT(std_dev, 1e-2);
  EXPECT_LT(std_dev, 1e3);
  EXPECT_GT(std::set<float>(v.begin(), v.end()).size(), v.size() / 2);
  EXPECT_EQ(ref().sequence_length(seq), 24);
}

TEST_F(RefModel, DeterministicAcrossRunsAndThreadCounts) {
  const std::vector<int32_t> tokens = random_tokens(40, vocab(), 2);
  const Tensor first = prefill(tokens).second;
  const Tensor again = prefill(tokens).second;
  EXPECT_EQ(values(first), values(again));
  const int threads = get_num_threads();
  set_num_threads(1);
  const Tensor serial = prefill(tokens).second;
  set_num_threads(threads);
  EXPECT_EQ(values(first), values(serial));
}

// The model is causal: decoding token n after a prefill of n tokens computes exactly what a
// prefill of n + 1 tokens computes for its last token, top-k sets included.
TEST_F(RefModel, PrefillThenDecodeEqualsLongerPrefill) {
  // Decoding from "every visible position selected" (topk of them) to "the top-k of topk + 1".
  const int64_t n = topk() - 1;
  const std::vector<int32_t> tokens = random_tokens(n + 2, vocab(), 100);
  const int64_t stepped = ref().add_sequence();
  ref().forward(stepped, std::span(tokens).first(n));
  for (int64_t i = n; i < n + 2; ++i) {
    const Tensor decoded = ref().forward(stepped, std::span(tokens).subspan(i, 1));
    const auto [whole, expected] = prefill({tokens.begin(), tokens.begin() + i + 1});
    EXPECT_LE(max_rel_diff(decoded, expected), 1e-6) << "decode of position " << i;
    for (int layer = 0; layer < ref().config().n_layers; ++layer)
      EXPECT_EQ(ref().last_selection(stepped, layer), ref().last_selection(whole, layer))
          << "position " << i << ", layer " << layer;
  }
  EXPECT_EQ(ref().sequence_length(stepped), n + 2);
}

TEST_F(RefModel, ChunkedPrefillEqualsOnePrefill) {
  const std::vector<int32_t> tokens = random_tokens(topk() + 16, vocab(), 3);
  const int64_t chunked = ref().add_sequence();
  ref().forward(chunked, std::span(tokens).first(40));
  const Tensor last = ref().forward(chunked, std::span(tokens).subspan(40));
  EXPECT_LE(max_rel_diff(last, prefill(tokens).second), 1e-6);
}

TEST_F(RefModel, SequencesAreIndependent) {
  const std::vector<int32_t> a = random_tokens(30, vocab(), 4), b = random_tokens(40, vocab(), 5);
  // Alone: a's prefill then two decodes.
  const int64_t alone = ref().add_sequence();
  ref().forward(alone, std::span(a).first(28));
  ref().forward(alone, std::span(a).subspan(28, 1));
  const Tensor expected = ref().forward(alone, std::span(a).subspan(29, 1));
  // Interleaved with b's steps.
  const int64_t sa = ref().add_sequence(), sb = ref().add_sequence();
  ref().forward(sb, std::span(b).first(20));
  ref().forward(sa, std::span(a).first(28));
  ref().forward(sb, std::span(b).subspan(20));
  ref().forward(sa, std::span(a).subspan(28, 1));
  ref().forward(sb, std::span(a).first(1));
  EXPECT_EQ(values(ref().forward(sa, std::span(a).subspan(29, 1))), values(expected));
  EXPECT_EQ(ref().sequence_length(sb), 41);
}

TEST_F(RefModel, IndexerSelectsAllVisibleTokensUpToTopk) {
  const std::vector<int32_t> tokens = random_tokens(topk() + 10, vocab(), 6);
  const int64_t seq = ref().add_sequence();
  ref().forward(seq, std::span(tokens).first(topk()));
  std::vector<int64_t> all(static_cast<size_t>(topk()));
  std::iota(all.begin(), all.end(), 0);
  for (int layer = 0; layer < ref().config().n_layers; ++layer)
    EXPECT_EQ(ref().last_selection(seq, layer), all) << "layer " << layer;

  ref().forward(seq, std::span(tokens).subspan(topk()));  // context topk + 10 > topk
  bool some_layer_drops_a_token = false;
  for (int layer = 0; layer < ref().config().n_layers; ++layer) {
    const std::vector<int64_t> sel = ref().last_selection(seq, layer);
    ASSERT_EQ(static_cast<int64_t>(sel.size()), topk()) << "layer " << layer;
    EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    EXPECT_EQ(std::adjacent_find(sel.begin(), sel.end()), sel.end()) << "duplicates";
    EXPECT_GE(sel.front(), 0);
    EXPECT_LE(sel.back(), topk() + 9);
    some_layer_drops_a_token |= sel.back() - sel.front() + 1 > topk();
  }
  EXPECT_TRUE(some_layer_drops_a_token);  // strict subsets of the topk + 10 visible positions
}

// FlashMLA's bf16 P is a small perturbation of the fp64 softmax, and keeps the model causal.
TEST_F(RefModel, RoundedProbabilitiesStayClose) {
  Reference rounded(weights(), {.round_p_to_bf16 = true});
  const std::vector<int32_t> tokens = random_tokens(24, vocab(), 8);
  const int64_t seq = rounded.add_sequence();
  rounded.forward(seq, std::span(tokens).first(23));
  const Tensor decoded = rounded.forward(seq, std::span(tokens).subspan(23));
  const Tensor whole = rounded.forward(rounded.add_sequence(), tokens);
  EXPECT_LE(max_rel_diff(decoded, whole), 1e-6);
  const Tensor exact = prefill(tokens).second;
  const double diff = calc_diff(whole, exact);
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 1e-2);
}

TEST_F(RefModel, BadArgumentsRaiseAndChangeNothing) {
  const int64_t seq = ref().add_sequence();
  const std::vector<int32_t> ok = {1, 2, 3};
  EXPECT_THROW(ref().forward(-1, ok), Error);
  EXPECT_THROW(ref().forward(seq + 1, ok), Error);
  EXPECT_THROW(ref().forward(seq, {}), Error);
  const std::vector<int32_t> negative = {1, -1}, too_big = {static_cast<int32_t>(vocab())};
  EXPECT_THROW(ref().forward(seq, negative), Error);
  EXPECT_THROW(ref().forward(seq, too_big), Error);
  const std::vector<int32_t> too_long(static_cast<size_t>(ref().config().rope.max_seq_len + 1), 0);
  try {
    ref().forward(seq, too_long);
    FAIL() << "no error for a sequence past max_seq_len";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seq_len"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ref().sequence_length(seq), 0);
  EXPECT_THROW(ref().sequence_length(seq + 1), Error);
  EXPECT_THROW(ref().last_selection(seq, ref().config().n_layers), Error);
  ref().forward(seq, ok);  // still usable
  EXPECT_EQ(ref().sequence_length(seq), 3);
}

TEST(RefModelWeights, MissingTensorRaises) {
  dsk::model::Weights weights = dsk::model::random_weights(test_config(), 3);
  dsk::model::Weights partial(weights.config());
  for (const auto& [name, tensor] : weights.tensors())
    if (name != "model.layers.1.mlp.experts.5.up_proj.weight") partial.set(name, tensor);
  try {
    Reference r(partial);
    FAIL() << "no error for a missing expert weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.5.up_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsk::ref::model
