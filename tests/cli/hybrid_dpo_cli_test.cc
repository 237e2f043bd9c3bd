// Offline DPO (--stage dpo) of a hybrid Mamba model (--is-hybrid-model, "M*-M"): the reference model
// is a second copy of the policy's config, its Mamba layers included (src/train/pretrain.cc), so a
// fine-tuned hybrid checkpoint starts at loss log 2 (reference = policy) and the loss falls; tensor,
// data, pipeline and context parallelism 2 (the Mamba layers' all-to-alls) reproduce the
// one-process losses and accuracies (tests/cli/dpo_cli_util.h).
#include <gtest/gtest.h>

#include "cli/dpo_cli_util.h"

namespace gale {
namespace {

// d_inner 128: 8 heads of 16 in 2 groups, d_state 16.
TEST(HybridDpo, StartsAtLogTwoLowersTheLossAndParallelRunsMatch) {
  testing::expect_dpo_from_sft_checkpoint(
      {"--num-layers", "4", "--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--mamba-head-dim", "16",
       "--mamba-num-groups", "2", "--mamba-state-dim", "16"},
      {{"--tensor-model-parallel-size", "2"}, {}, {"--pipeline-model-parallel-size", "2"},
       {"--context-parallel-size", "2"}});
}

}  // namespace
}  // namespace gale
