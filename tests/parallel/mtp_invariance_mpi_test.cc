// Parallel invariance of multi-token prediction (--mtp-num-layers 2): tensor parallelism (eh_proj
// column-parallel with its output gathered, the shared vocabulary-parallel embedding and output
// layer), with sequence parallelism (MTP norms' gradients summed over TP), data parallelism with
// the distributed optimizer and overlapped gradient reduction (the MTP parameters join the head's
// bucket group), and full recomputation of the decoder reproduce the single-process run: losses,
// MTP losses and grad norms within 1e-5 relative, final parameters 1e-3 and final gradients 1e-5
// (as tests/parallel/invariance_mpi_test.cc; a missing reduction is off by O(1)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2_distopt_overlap", 2, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "4", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"};

const testing::TestRun& single_process_run(bool llama) {
  static std::map<bool, std::unique_ptr<testing::TestRun>> runs;
  auto& run = runs[llama];
  if (!run) {
    run = std::make_unique<testing::TestRun>(testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt}),
                                             make_self_communicator("world"), testing::kTinyVocab);
    run->train(4);
  }
  return *run;
}

class MtpInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MtpInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  Comm world = test::world();
  if (layout->world != world->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  const testing::TestRun& reference = single_process_run(llama);
  testing::TestRun run(testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt, layout->flags}), world,
                       testing::kTinyVocab, EngineOptions{layout->bucket_size, layout->recompute});
  run.train(4);
  finish_param_sync(*run.engine);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(run.mtp_losses[i].size(), 2u);
    ASSERT_EQ(reference.mtp_losses[i].size(), 2u);
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(run.mtp_losses[i][k], reference.mtp_losses[i][k], 1e-5 * reference.mtp_losses[i][k])
          << "mtp_" << k + 1 << " loss of iteration " << i + 1;
  }
  EXPECT_GT(testing::expect_matches_reference(run, reference, 4, 1e-5, "mtp.layers.1.eh_proj"), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MtpInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
