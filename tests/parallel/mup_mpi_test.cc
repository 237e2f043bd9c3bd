// --use-mup at TP2 and at DP2 with the distributed optimizer (and Lion's layer-wise one) on two
// ranks reproduces the single-process µP run: losses and gradient norms of 5 iterations within
// 1e-5 relative, every parameter and owned gradient slice (testing::expect_matches_reference). The
// µP multipliers, softmax scale, width-scaled init and per-parameter learning-rate / eps groups
// (m = 4: the matrices' Adam rate and eps /4) all act on each rank's shards.
#include <gtest/gtest.h>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

const std::vector<std::string> kMup = {"--use-mup", "--mup-base-hidden-size", "16", "--mup-embedding-mult", "2",
                                       "--mup-base-head-dim", "4", "--adam-eps", "1e-4"};

std::vector<std::string> flags_of(const std::vector<std::string>& model, const std::vector<std::string>& extra) {
  return testing::join({testing::kPipelineTestFlags, model, kMup, extra});
}

void expect_layout_matches_single_process(const std::vector<std::string>& model, const std::vector<std::string>& extra,
                                          const std::vector<std::string>& layout) {
  const Comm world = test::world();
  testing::TestRun reference(flags_of(model, extra), make_self_communicator("world"), testing::kTinyVocab);
  reference.train(5);
  testing::TestRun run(testing::join({flags_of(model, extra), layout}), world, testing::kTinyVocab);
  run.train(5);
  finish_param_sync(*run.engine);
  testing::expect_matches_reference(run, reference, 5, 1e-4, "");
}

const std::vector<std::string> kTp2 = {"--tensor-model-parallel-size", "2"};
const std::vector<std::string> kDistOpt = {"--use-distributed-optimizer"};

TEST(MupInvariance, Tp2GptMatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches_single_process(testing::kTinyGpt, {}, kTp2);
}

TEST(MupInvariance, Tp2SequenceParallelLlamaMatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches_single_process(testing::kTinyLlama, {}, {"--tensor-model-parallel-size", "2",
                                                                 "--sequence-parallel"});
}

TEST(MupInvariance, Dp2DistributedOptimizerMatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches_single_process(testing::kTinyLlama, {}, kDistOpt);
}

TEST(MupInvariance, Dp2DistributedSgdMatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches_single_process(testing::kTinyGpt, {"--optimizer", "sgd", "--lr", "0.05"}, kDistOpt);
}

TEST(MupInvariance, Dp2LayerWiseLionMatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_layout_matches_single_process(testing::kTinyLlama, {"--optimizer", "lion", "--lr", "2e-4"}, kDistOpt);
}

}  // namespace
}  // namespace gale
