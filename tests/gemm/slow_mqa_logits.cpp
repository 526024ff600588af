// The MQA-logits grid at the scaled size (label "slow"): S = 512 queries against
// Skv = 8192 keys, causal with and without two context-parallel chunks, on the fastest backend,
// against the dequantised and the BF16 references (test_mqa_logits.cpp runs S = 64, Skv = 1024).
#include <gtest/gtest.h>

#include "gemm/mqa_test_util.hpp"

namespace dsk::gemm_test {
namespace {

TEST(SlowMqaLogits, S512Skv8192) {
  check_against_references(512, 8192, 32, 64, true);
  check_against_references(512, 8192, 32, 64, true, true);
  check_against_references(64, 8192, 64, 128, true);
}

}  // namespace
}  // namespace dsk::gemm_test
