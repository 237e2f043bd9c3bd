// --calculate-per-token-loss with MoE and MTP under data, tensor (with sequence parallelism),
// pipeline, expert and context parallelism (CP without MTP, which refuses it): on samples whose loss masks differ, every layout reproduces the
// single-process per-token run (losses, grad norms, the logged load-balancing and MTP losses of 4
// iterations, the final parameters and the gradients this rank owns, 1e-4). The routers' losses are
// multiplied by their tokens T·|TP×CP| (under SP a TP rank's share of the sequence times TP: the
// same as one process), the expert gradients summed over expert-DP like the others, and all divided
// by the global batch's tokens. global_aux_loss (its counts summed over TP×DP×CP and averaged over
// the step's micro-batches: not DP-invariant, as in Megatron) runs the TP, PP and CP layouts, also with
// --recompute-modules moe.
#include <gtest/gtest.h>

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
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"ep2", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"tp2_sp_recompute_moe", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                   "--recompute-granularity", "selective", "--recompute-modules", "moe"}},
  };
  return all;
}

constexpr int kIters = 4;
constexpr int64_t kSeq = 16;

const std::vector<std::string> kFlags = testing::join(
    {{"--num-layers", "2", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
      "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3", "--mock-data",
      "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
      "--eval-iters", "0", "--clip-grad", "0.5", "--calculate-per-token-loss"},
     testing::kTinyLlama,
     {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-z-loss-coeff", "0.01"}});
const std::vector<std::string> kAux = {"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                                       "--moe-aux-loss-coeff", "0.1", "0.05"};
const std::vector<std::string> kMtp = {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"};
const std::vector<std::string> kNone;
const std::vector<std::string> kGlobalAux = {"--moe-router-load-balancing-type", "global_aux_loss",
                                             "--moe-aux-loss-coeff", "0.1"};

std::unique_ptr<testing::TestRun> masked_run(const std::vector<std::string>& flags, const Comm& world) {
  auto run = std::make_unique<testing::TestRun>(flags, world, testing::kTinyVocab, EngineOptions{});
  run->set_data(std::make_unique<testing::MaskedSyntheticDataset>(100000, kSeq, testing::kTinyVocab));
  run->train(kIters);
  finish_param_sync(*run->engine);
  return run;
}

class PerTokenMoeInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(PerTokenMoeInvariance, MatchesSingleProcess) {
  const auto& [name, global] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  if (global && (name == "dp2" || name == "ep2")) GTEST_SKIP() << "global_aux_loss is not DP-invariant";
  // MTP with CP is refused (as Megatron): cp2 runs the losses without it.
  const std::vector<std::string> model =
      global ? testing::join({kFlags, kGlobalAux}) : testing::join({kFlags, kAux, name == "cp2" ? kNone : kMtp});
  std::unique_ptr<testing::TestRun> reference = masked_run(model, make_self_communicator("world"));
  std::unique_ptr<testing::TestRun> run = masked_run(testing::join({model, layout->flags}), test::world());
  // Gradients within 1e-4 relative: under TP2·SP an expert's GEMMs are split over the expert-TP
  // group and sum in another order (3.8e-5 was measured on one masked expert's fc1 weight); a wrong
  // factor or a missing reduction is O(1).
  EXPECT_GT(testing::expect_matches_reference(*run, *reference, kIters, 1e-4, "router"), 0);
  for (int i = 0; i < kIters; ++i) {
    EXPECT_GT(reference->load_balancing_losses[i], 0.0);
    EXPECT_NEAR(run->load_balancing_losses[i], reference->load_balancing_losses[i],
                1e-5 * reference->load_balancing_losses[i])
        << "load-balancing loss of iteration " << i + 1;
    ASSERT_EQ(run->mtp_losses[i].size(), reference->mtp_losses[i].size());
    for (size_t k = 0; k < run->mtp_losses[i].size(); ++k)
      EXPECT_NEAR(run->mtp_losses[i][k], reference->mtp_losses[i][k], 1e-5 * reference->mtp_losses[i][k])
          << "MTP loss " << k + 1 << " of iteration " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PerTokenMoeInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_global_aux" : "_aux_mtp");
                         });

}  // namespace
}  // namespace gale
