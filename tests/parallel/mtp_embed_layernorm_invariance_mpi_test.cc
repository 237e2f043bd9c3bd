// Parallel invariance of --embed-layernorm with multi-token prediction (--mtp-num-layers 2): the MTP layers'
// embedding goes through the embedding norm at every layout. Under TP2 with sequence parallelism (the norm's
// gradient summed over TP), DP2 with the distributed optimizer and overlapped reduction, and pipeline
// parallelism (PP2, TP2 x PP2: the MTP stage holds a copy of the first stage's embedding.norm beside the
// embedding, its gradient summed with the first stage's over the embedding group) the run reproduces the
// single-process one: losses, MTP losses and grad norms within 1e-5 relative, final parameters 1e-3 and
// final gradients 1e-5 (tests/parallel/layout_invariance.h), embedding.norm among the compared tensors.
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2_distopt_overlap", 2, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
      {"pp2_dp2_distopt_overlap", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer",
                                      "--overlap-grad-reduce", "--overlap-param-gather"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "4", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3", "--embed-layernorm"};

class MtpEmbedLayernormInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MtpEmbedLayernormInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t = testing::train_layout_and_reference(
      testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt}), *layout, 4);
  const testing::TestRun &run = *t.run, &reference = *t.reference;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(run.mtp_losses[i].size(), 2u);
    ASSERT_EQ(reference.mtp_losses[i].size(), 2u);
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(run.mtp_losses[i][k], reference.mtp_losses[i][k], 1e-5 * reference.mtp_losses[i][k])
          << "mtp_" << k + 1 << " loss of iteration " << i + 1;
  }
  // Every stage holds embedding.norm: the first its own, the MTP stage its copy.
  EXPECT_GT(testing::expect_matches_reference(run, reference, 4, 1e-5, "embedding.norm.weight"), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MtpEmbedLayernormInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
