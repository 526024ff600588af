// Private to src/model: the streaming random-weight generator shared by random_weights
// (weights.cpp) and write_random_checkpoint (checkpoint.cpp).
#pragma once

#include <cstdint>
#include <functional>

#include <dsk/model.hpp>

namespace dsk::model {

// Makes every tensor of checkpoint_tensors(config) in order, each equal to random_tensor(config,
// spec, seed), and hands it to sink before making the next (an FP8 weight and its scales are made
// together), so memory holds about one tensor at a time.
void for_each_random_tensor_in_order(const Config& config, uint64_t seed,
                                     const std::function<void(const TensorSpec&, Tensor)>& sink);

}  // namespace dsk::model
