// Context-parallel invariance of a hybrid model with Gated DeltaNet layers ('G', pattern "MG*G"):
// the 'G' layers' all-to-alls to a head split and CP-local conv1d / A_log / dt_bias slices
// (model/gdn_context_parallel.h) beside the Mamba layer's all-to-alls and the attention layer's CP
// algorithm — ring, all-gather, Ulysses, with TP 2 and SP (TP·CP = 4 = the key heads), with data
// parallelism, MindSpeed's adaptive CP on documents — reproduce the single-process run: losses and grad norms within 1e-5 relative, final
// parameters 1e-3 and final gradients 3e-5 relative (a wrong head split or a missing slice reduction
// is off by O(1)).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"cp2_dp2_distopt", 4, {"--context-parallel-size", "2", "--use-distributed-optimizer"}},
  };
  return all;
}

// Hidden 64: the Mamba mixer's 8 heads of 16 in 4 groups (d_state 8); the GDN layers' 4 key heads of
// 8 and 8 value heads of 6, a convolution of width 3; SwiGLU, RMSNorm, dropout on.
const std::vector<std::string> kHybridGdn = {
    "--is-hybrid-model", "--hybrid-override-pattern", "MG*G", "--num-layers", "4", "--hidden-size", "64",
    "--num-attention-heads", "8", "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4",
    "--linear-num-key-heads", "4", "--linear-num-value-heads", "8", "--linear-key-head-dim", "8",
    "--linear-value-head-dim", "6", "--linear-conv-kernel-dim", "3", "--swiglu", "--normalization", "RMSNorm",
    "--disable-bias-linear", "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
    "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style",
    "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000", "--clip-grad", "0.5",
    "--position-embedding-type", "rope"};

class HybridGdnInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridGdnInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kHybridGdn, 3e-5,
                                                "self_attention.in_proj.weight");
}

// MindSpeed's adaptive CP on documents (--reset-attention-mask): the 'G' and 'M' layers' all-to-alls
// place each position by the planner's layout, which is not Megatron's two chunks per rank.
class HybridGdnAdaptiveInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridGdnAdaptiveInvariance, MatchesSingleProcess) {
  static const std::vector<Layout> adaptive = {
      {"cp2_adaptive_documents", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo",
                                     "--adaptive-cp-dynamic-attn-mask"}}};
  std::vector<std::string> model = kHybridGdn;
  model.push_back("--reset-attention-mask");
  testing::expect_layout_matches_single_process(adaptive, GetParam(), model, 3e-5, "self_attention.in_proj.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridGdnAdaptiveInvariance, ::testing::Values("cp2_adaptive_documents"),
                         [](const auto& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Layouts, HybridGdnInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
