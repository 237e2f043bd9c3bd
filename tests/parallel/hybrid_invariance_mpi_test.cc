// Parallel invariance of the hybrid Mamba model (--is-hybrid-model, pattern "M*-M"): tensor
// parallelism (in_proj column-parallel with its z|x|B|C|dt parts split each on its own, conv1d,
// A_log, D, dt_bias and the gated norm split by head and group, out_proj row-parallel), with
// sequence parallelism, TP 4, TP with data and with pipeline parallelism, and recomputation; and
// context parallelism (the Mamba layers' all-to-alls around the convolution and the scan, the
// attention layer on the CP algorithm: ring, all-gather, Ulysses, hybrid Ulysses x ring, MindSpeed's
// adaptive ring and hybrid adaptive CP, with TP and SP, with data parallelism), also with fewer groups than TP x CP ranks (a group's heads spread over
// several cp ranks, its B and C repeated) reproduce the single-process run: losses and grad norms
// within 1e-5 relative, final parameters 1e-3 and final gradients 3e-5 relative (the TP all-reduces,
// the pre-norm's SP gradient reduction and the DP x CP gradient reduction sum in another order; a
// wrong split, a chunk in the wrong order or a missing reduction is off by O(1)).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_dp2_sp_distopt", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--use-distributed-optimizer"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"cp4", 4, {"--context-parallel-size", "4"}},
      {"cp4_hybrid_u2", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                            "--ulysses-degree-in-cp", "2"}},
      // MindSpeed's adaptive CP: the attention layer's ring on the layout chosen from the mask, the
      // Mamba layers' all-to-alls placing each position by it (in order: not Megatron's split).
      {"cp2_adaptive", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}},
      {"cp2_adaptive_in_order", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo",
                                    "--adaptive-cp-only-reschedule"}},
      {"cp4_hybrid_adaptive_u2", 4, {"--context-parallel-size", "4", "--context-parallel-algo",
                                     "hybrid_adaptive_cp_algo", "--ulysses-degree-in-cp", "2"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"cp2_dp2_distopt", 4, {"--context-parallel-size", "2", "--use-distributed-optimizer"}},
  };
  return all;
}

// Hidden 64: d_inner 128, 8 heads of 16 in 4 groups (d_state 8), so TP 4 leaves one group of two
// heads per rank. LayerNorm (with the pre-norm's bias) and RMSNorm; dropout on.
const std::vector<std::string> kHybrid = {
    "--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--num-layers", "4", "--hidden-size", "64",
    "--num-attention-heads", "8", "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--position-embedding-type", "rope"};

class HybridInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HybridInvariance, MatchesSingleProcess) {
  const auto& [name, rms] = GetParam();
  std::vector<std::string> model = kHybrid;
  if (rms) model.insert(model.end(), {"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear"});
  testing::expect_layout_matches_single_process(layouts(), name, model, 3e-5, "mixer.in_proj.weight");
}

// Context parallelism with fewer groups than TP x CP ranks: each group's heads spread over CP/G
// consecutive cp ranks, which all receive its B and C and sum their gradients.
struct SharedGroups {
  std::string layout;
  std::string groups;
};

class HybridSharedGroupsInvariance : public ::testing::TestWithParam<SharedGroups> {};

TEST_P(HybridSharedGroupsInvariance, MatchesSingleProcess) {
  const SharedGroups& c = GetParam();
  std::vector<std::string> model = kHybrid;
  model.insert(model.end(), {"--mamba-num-groups", c.groups});  // the last value counts
  testing::expect_layout_matches_single_process(layouts(), c.layout, model, 3e-5, "mixer.conv1d.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridSharedGroupsInvariance,
                         ::testing::Values(SharedGroups{"cp2", "1"}, SharedGroups{"cp4", "2"},
                                           SharedGroups{"tp2_cp2_sp", "2"}),
                         [](const auto& info) { return info.param.layout + "_groups" + info.param.groups; });

// Adaptive CP on documents (--reset-attention-mask, a layout per micro-batch): the planner moves
// units of the sequence between ranks, so a rank's positions are not Megatron's two chunks and the
// Mamba layers' all-to-alls must place every position by the layout (the causal layouts above are
// whole chunks). CP 2 and CP 4 against the single-process run of the same documents.
const std::vector<Layout>& document_layouts() {
  static const std::vector<Layout> all = {
      {"cp2_adaptive_documents", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo",
                                     "--adaptive-cp-dynamic-attn-mask"}},
      {"cp4_adaptive_documents", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "adaptive_cp_algo",
                                     "--adaptive-cp-dynamic-attn-mask"}},
  };
  return all;
}

class HybridAdaptiveDocumentsInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridAdaptiveDocumentsInvariance, MatchesSingleProcess) {
  std::vector<std::string> model = kHybrid;
  model.push_back("--reset-attention-mask");
  testing::expect_layout_matches_single_process(document_layouts(), GetParam(), model, 3e-5, "mixer.in_proj.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridAdaptiveDocumentsInvariance,
                         ::testing::ValuesIn(testing::layout_names(document_layouts())),
                         [](const auto& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Layouts, HybridInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_rms" : "_ln");
                         });

}  // namespace
}  // namespace gale
