// The model module of `dsk verify`: dsk::model::Model against the fp32 reference model on
// v32-tiny with random weights (issue 8's cross-check: last-position logits within calc_diff 1e-3
// for a prefill and 16 greedy decode steps). `dsk verify --model` runs it.
#include <algorithm>
#include <limits>
#include <vector>

#include <dsk/model.hpp>
#include <dsk/ref.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {

namespace {

// The largest calc_diff over the prefill of `prompt_len` random tokens and `steps` decode steps,
// the reference replaying the model's expert and top-k choices. The choices fail the case
// (infinity) when a layer-0 set differs from the reference's own (identical inputs there) or more
// than 2% of all sets swap elements beyond the tie tolerance.
double model_cross_check(int64_t prompt_len, int steps) {
  const model::Config config = model::preset("v32-tiny");
  const model::Weights weights = model::random_weights(config, 1);
  model::Model m(weights, {});
  ref::model::Reference reference(weights, {.round_p_to_bf16 = true});
  const Tensor prompt = ref::randint({prompt_len}, DType::i32, 2, 0, config.vocab_size);
  const ref::model::CrossCheck c = ref::model::cross_check(
      m, reference, {prompt.data<int32_t>(), static_cast<size_t>(prompt_len)}, steps);
  const bool choices_ok = c.decisions.first_layer_differing == 0 &&
                          c.decisions.beyond_tolerance * 50 <= c.decisions.compared;
  return choices_ok ? c.max_diff() : std::numeric_limits<double>::infinity();
}

}  // namespace

void register_model_cases(Registry& r) {
  r.add(VerifyCase{.name = "Model vs ref::model",
                   .shape = "v32-tiny prefill 100 + 16 decode",
                   .metric = "calc_diff",
                   .tolerance = 1e-3,
                   .quick = false,
                   .run = [](const CaseContext&) { return model_cross_check(100, 16); }});
  r.add(VerifyCase{.name = "Model vs ref::model",
                   .shape = "v32-tiny prefill 40 + 4 decode",
                   .metric = "calc_diff",
                   .tolerance = 1e-3,
                   .run = [](const CaseContext&) { return model_cross_check(40, 4); }});
}

}  // namespace dsk::bench
