// Parallel invariance of MoE models with a gated shared expert (--moe-shared-expert-intermediate-size,
// --moe-shared-expert-gate; model/moe_shared_expert.h): data, pipeline (also with full
// recomputation), expert (all-to-all, with and without --moe-shared-expert-overlap, and all-gather),
// tensor+sequence (expert TP = TP and 1; also with full recomputation) and context parallelism
// reproduce the single-process run: losses, grad norms, final parameters and gradients (fp32, 1e-5
// relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      // Full recomputation reruns the shared expert's forward (and its TP exchanges) in backward.
      {"pp2_full_recompute", 2, {"--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                                 "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "1"}},
      {"ep2", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"ep2_allgather", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
      // --moe-shared-expert-overlap: the shared expert runs while the all-to-all is in flight.
      {"ep2_overlap", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                          "--moe-shared-expert-overlap"}},
      {"tp2_sp_ep2_overlap", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                 "--moe-shared-expert-overlap"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_sp_etp1", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"tp2_sp_ep2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
                         "--moe-token-dispatcher-type", "alltoall"}},
      {"tp2_sp_cp2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size", "2"}},
      {"ep2_dp4_distopt", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                              "--use-distributed-optimizer"}},
  };
  return all;
}

// The tiny Mixtral of moe_invariance_mpi_test.cc (layers 0, 1 and 3 MoE) with a gated SwiGLU shared
// expert of FFN size 32 in every MoE layer.
const std::vector<std::string> kMoe = testing::join(
    {{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
      "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
      "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
      "--clip-grad", "0.5"},
     testing::kTinyLlama,
     {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-layer-freq", "[1,1,0,1]",
      "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01", "--moe-shared-expert-intermediate-size", "32",
      "--moe-shared-expert-gate"}});

const testing::TestRun& single_process_run() {
  static std::unique_ptr<testing::TestRun> run;
  if (!run) {
    run = std::make_unique<testing::TestRun>(kMoe, make_self_communicator("world"), testing::kTinyVocab);
    run->train(5);
  }
  return *run;
}

class MoeSharedExpertInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeSharedExpertInvariance, MatchesSingleProcess) {
  const Layout* layout = testing::find_layout(layouts(), GetParam());
  ASSERT_NE(layout, nullptr);
  Comm world = test::world();
  if (layout->world != world->size()) GTEST_SKIP() << GetParam() << " needs " << layout->world << " ranks";
  const testing::TestRun& reference = single_process_run();
  testing::TestRun run(testing::join({kMoe, layout->flags}), world, testing::kTinyVocab,
                       EngineOptions{layout->bucket_size, layout->recompute});
  run.train(5);
  finish_param_sync(*run.engine);
  EXPECT_GT(testing::expect_matches_reference(run, reference, 5, 1e-5, "shared_experts"), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeSharedExpertInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
