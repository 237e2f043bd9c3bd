// Parallel invariance of Gated DeltaNet-2 (--experimental-attention-variant gdn2, layers 0 and 2 GDN2,
// 1 and 3 full attention): tensor parallelism (in_proj's seven q|k|v|z|f|b|w sections split each on
// its own, dt_bias by key channel and A_log by key head), with and without sequence parallelism, at
// TP 2 and 4, context parallelism (CP 2, TP 2 × CP 2 with SP: the all-to-alls of the seven sections
// and the CP-local dt_bias / A_log slices), and a hybrid model's 'G' layers made GDN2 at TP 2 and CP 2,
// reproduce the single-process run: losses and grad norms within 1e-5 relative, final parameters 1e-3
// and final gradients 3e-5 relative (as tests/parallel/gdn_invariance_mpi_test.cc).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
  };
  return all;
}

// 4 key heads of 8 and 8 value heads of 6 (TP 4: one key head and two value heads per rank), a
// convolution of width 3; dropout on.
const std::vector<std::string> kSizes = {
    "--linear-num-key-heads", "4", "--linear-num-value-heads", "8", "--linear-key-head-dim", "8",
    "--linear-value-head-dim", "6", "--linear-conv-kernel-dim", "3"};
const std::vector<std::string> kTraining = {
    "--hidden-size", "32", "--num-attention-heads", "4", "--swiglu", "--normalization", "RMSNorm",
    "--disable-bias-linear", "--position-embedding-type", "rope", "--seq-length", "16", "--max-position-embeddings",
    "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5"};
const std::vector<std::string> kGdn2 = testing::join(
    {{"--experimental-attention-variant", "gdn2", "--linear-attention-freq", "2", "--num-layers", "4"}, kSizes,
     kTraining});

class Gdn2Invariance : public ::testing::TestWithParam<std::string> {};

TEST_P(Gdn2Invariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kGdn2, 3e-5, "self_attention.in_proj.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Gdn2Invariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

// A hybrid model whose 'G' layers gdn2 makes Gated DeltaNet-2 (Megatron's hybrid_block.py).
const std::vector<std::string> kHybridGdn2 = testing::join(
    {{"--is-hybrid-model", "--hybrid-override-pattern", "G*G-", "--num-layers", "4",
      "--experimental-attention-variant", "gdn2", "--mamba-head-dim", "16", "--mamba-num-groups", "2",
      "--mamba-state-dim", "8"},
     kSizes, kTraining});

class HybridGdn2Invariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridGdn2Invariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kHybridGdn2, 3e-5,
                                                "self_attention.in_proj.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridGdn2Invariance, ::testing::Values("tp2_sp", "cp2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
