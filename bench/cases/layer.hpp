// The layer module's one setting outside the case filter (bench/cases/layer.cpp).
#pragma once

#include <filesystem>

namespace dsk::bench {

// The preset whose one-MoE-layer shapes match the checkpoint in `dir` (`dsk make-checkpoint
// --preset v32 --layers 1 DIR`) reads its weights from it, memory-mapped, instead of generating
// random ones. Raises dsk::Error naming --checkpoint when the checkpoint is not such a layer.
void set_layer_checkpoint(const std::filesystem::path& dir);

}  // namespace dsk::bench
