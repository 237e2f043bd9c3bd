// Parallel invariance of a hybrid Mamba model with MoE layers (pattern "ME*E": the MoE layers are
// the 'E' ones): data parallelism, expert parallelism (each rank E/EP experts, tokens exchanged
// all-to-all or all-gathered, expert gradients reduced over expert-DP), tensor parallelism with
// sequence parallelism (each rank routes its S/TP tokens, experts split over the expert-TP group),
// TP with EP, pipeline parallelism and context parallelism (the Mamba layers' all-to-alls around the
// scan, each rank routing its sequence chunks, the auxiliary losses over TP×CP; alone, with EP over
// the cp ranks and with TP + SP) reproduce the single-process run: losses, grad norms and the logged
// load-balancing loss within 1e-5 relative, final parameters 1e-3 and gradients 3e-5 relative (an
// expert sums its rows in another order under EP, the TP all-reduces in another order; a wrong split
// or a missing reduction is O(1)).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"dp2", 2, {}},
      {"ep2", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"ep2_allgather", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"ep2_dp4_distopt", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                              "--use-distributed-optimizer"}},
      {"tp2_sp_ep2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size",
                         "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_ep2", 2, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2",
                      "--moe-token-dispatcher-type", "alltoall"}},
      {"tp2_sp_cp2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size", "2"}},
  };
  return all;
}

// Hidden 64: d_inner 128, 8 heads of 16 in 4 groups (d_state 8); 4 SwiGLU experts of FFN 48, top-2,
// a shared expert of FFN 32, load-balancing and z losses on; dropout on.
const std::vector<std::string> kHybridMoe = testing::join(
    {{"--is-hybrid-model", "--hybrid-override-pattern", "ME*E", "--num-layers", "4", "--hidden-size", "64",
      "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4", "--seq-length", "16",
      "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
      "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
      "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
      "0", "--log-interval", "1000", "--clip-grad", "0.5"},
     testing::kTinyLlama,
     {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
      "--moe-shared-expert-intermediate-size", "32", "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01"}});

class HybridMoeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridMoeInvariance, MatchesSingleProcess) {
  const Layout* layout = testing::find_layout(layouts(), GetParam());
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << GetParam() << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t = testing::train_layout_and_reference(kHybridMoe, *layout, 5);
  EXPECT_GT(testing::expect_matches_reference(*t.run, *t.reference, 5, 3e-5, "mlp.router.weight"), 0);
  for (int i = 0; i < 5; ++i) {
    EXPECT_GT(t.reference->load_balancing_losses[i], 0.0);
    EXPECT_NEAR(t.run->load_balancing_losses[i], t.reference->load_balancing_losses[i],
                1e-5 * t.reference->load_balancing_losses[i])
        << "load_balancing_loss of iteration " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridMoeInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
