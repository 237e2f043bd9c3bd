// --calculate-per-token-loss under data, pipeline, context and tensor parallelism, with the
// distributed optimizer and --overlap-grad-reduce: on samples whose loss masks differ, every layout
// reproduces the single-process per-token run (losses and gradient norms of 4 iterations, the
// final parameters and the gradients this rank owns). The gradients are summed over DP and
// divided by the tokens of the whole global batch, counted on the last pipeline stage and shared.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"dp2", 2, {}},
      {"dp2_distopt_overlap", 2, {"--use-distributed-optimizer", "--overlap-grad-reduce"}, 20000},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"pp2_dp2", 4, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_vpp2_dp2_distopt", 4, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                   "1", "--use-distributed-optimizer"}},
      {"cp2_dp2", 4, {"--context-parallel-size", "2"}},
      {"tp2_sp_dp2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
  };
  return all;
}

constexpr int kIters = 4;
constexpr int64_t kSeq = 16;

const std::vector<std::string> kFlags = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
    "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
    "--eval-iters", "0", "--clip-grad", "0.5", "--num-attention-heads", "8", "--calculate-per-token-loss"};

std::unique_ptr<testing::TestRun> masked_run(const std::vector<std::string>& layout_flags, const Comm& world,
                                             int64_t bucket_size) {
  auto run = std::make_unique<testing::TestRun>(testing::join({kFlags, layout_flags}), world, testing::kTinyVocab,
                                                EngineOptions{bucket_size, {}});
  run->set_data(std::make_unique<testing::MaskedSyntheticDataset>(100000, kSeq, testing::kTinyVocab));
  run->train(kIters);
  finish_param_sync(*run->engine);
  return run;
}

class PerTokenLossInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(PerTokenLossInvariance, MatchesSingleProcess) {
  const Layout* layout = testing::find_layout(layouts(), GetParam());
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << GetParam() << " needs " << layout->world << " ranks";
  static std::unique_ptr<testing::TestRun> reference;
  if (!reference) reference = masked_run({}, make_self_communicator("world"), 0);
  std::unique_ptr<testing::TestRun> run = masked_run(layout->flags, test::world(), layout->bucket_size);
  const int named = testing::expect_matches_reference(*run, *reference, kIters, 1e-4, "");
  EXPECT_GT(named, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PerTokenLossInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace gale
