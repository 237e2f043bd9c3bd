// Offline DPO (--stage dpo) of a model with heterogeneous layers: the reference model is a second
// copy of the policy's layers (src/train/pretrain.cc), so a fine-tuned heterogeneous checkpoint
// starts at loss log 2 (reference = policy) and the loss falls; tensor parallelism 2 and data
// parallelism 2 reproduce the one-process losses and accuracies (tests/cli/dpo_cli_util.h).
#include <gtest/gtest.h>

#include "cli/dpo_cli_util.h"

namespace gale {
namespace {

// Layer 0: 2 query groups (the flags say 4) and FFN 128; layer 1: no-op attention, linear MLP.
const char* kBlocks = R"({"block_configs": [
  {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_hidden_size": 128}},
  {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}}]})";

TEST(HeterogeneousDpo, StartsAtLogTwoLowersTheLossAndParallelRunsMatch) {
  testing::expect_dpo_from_sft_checkpoint({"--heterogeneous-layers-config-encoded-json", kBlocks},
                                          {{"--tensor-model-parallel-size", "2"}, {}});
}

}  // namespace
}  // namespace gale
