// Parallel invariance of Megatron's --output-logit-dtype bf16 (the logits and their gradient rounded
// to bf16: each tensor-parallel rank rounds its vocabulary slice, the cross entropy merges the
// slices' statistics as without the flag) and --mamba-training-ssm-states-dtype bf16 (the states
// entering each 128-position chunk rounded: tensor parallelism splits the heads, context parallelism
// hands each rank whole sequences of its heads): TP 2 (with SP) and CP 2 reproduce the single-process
// run with the flag, within the tolerances of tests/parallel/hybrid_invariance_mpi_test.cc.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
  };
  return all;
}

std::vector<std::string> common(const std::string& seq) {
  return {"--seq-length", seq, "--max-position-embeddings", seq, "--micro-batch-size", "2", "--global-batch-size",
          "8", "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine",
          "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout",
          "0.1", "--eval-iters", "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type",
          "rope", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8"};
}

TEST(LowPrecisionOutputsInvariance, Bf16LogitsVocabParallel) {
  std::vector<std::string> model = common("16");
  model.insert(model.end(), {"--output-logit-dtype", "bf16", "--untie-embeddings-and-output-weights"});
  for (const char* layout : {"tp2", "tp2_sp"}) {
    SCOPED_TRACE(layout);
    testing::expect_layout_matches_single_process(layouts(), layout, model, 3e-5, "output_layer.weight");
  }
}

// 160 positions: the scan's second chunk starts at 128 (under CP 2 inside rank 1's first half).
TEST(LowPrecisionOutputsInvariance, Bf16MambaStatesTensorAndContextParallel) {
  std::vector<std::string> model = common("160");
  model.insert(model.end(), {"--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--mamba-state-dim", "8",
                             "--mamba-head-dim", "16", "--mamba-num-groups", "4", "--mamba-training-ssm-states-dtype",
                             "bf16"});
  for (const char* layout : {"tp2_sp", "cp2"}) {
    SCOPED_TRACE(layout);
    testing::expect_layout_matches_single_process(layouts(), layout, model, 3e-5, "mixer.in_proj.weight");
  }
}

}  // namespace
}  // namespace gale
