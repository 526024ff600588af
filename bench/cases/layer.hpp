// The layer module's settings outside the case filter (bench/cases/layer.cpp).
#pragma once

#include <cstdint>
#include <filesystem>

namespace dsk::bench {

// The preset whose one-MoE-layer shapes match the checkpoint in `dir` (`dsk make-checkpoint
// --preset v32 --layers 1 DIR`) reads its weights from it, memory-mapped, instead of generating
// random ones. Raises dsk::Error naming --checkpoint when the checkpoint is not such a layer.
void set_layer_checkpoint(const std::filesystem::path& dir);

// The prefill cases run their tokens in steps of `tokens` (at most the whole prefill) instead of
// the preset's default (v32: all 2048 in one step). Call before the cases are listed or run.
// Raises dsk::Error naming --prefill-chunk unless tokens >= 1.
void set_layer_prefill_chunk(int64_t tokens);

}  // namespace dsk::bench
