// `gale pretrain --moe-router-load-balancing-type global_aux_loss`: logged as Megatron's
// global_load_balancing_loss; one micro-batch per step on one rank is aux_loss exactly; its counts
// are summed over TP x DP x CP (TP 2 + SP trains as TP 1; DP 2 with one sequence per rank logs what
// one rank with both sequences in one micro-batch logs); a full-layer recompute counts each
// micro-batch once; --recompute-modules moe reruns with its forward's counts (logs as without).
#include <gtest/gtest.h>

#include <cmath>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

// A tiny Mixtral (4 experts, top 2) with `mbs` sequences per micro-batch and `gbs` per step.
std::vector<std::string> mixtral(int np, int mbs, int gbs, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", std::to_string(mbs),
      "--global-batch-size", std::to_string(gbs), "--train-iters", "4", "--lr", "3e-3", "--mock-data",
      "--vocab-size", "4096", "--log-interval", "1", "--eval-iters", "0", "--num-threads", "1", "--swiglu",
      "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
      "--untie-embeddings-and-output-weights", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64", "--moe-aux-loss-coeff", "1e-1",
      "--moe-token-dispatcher-type", "alltoall"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing::launch_argv(np, argv, {});
}

struct Logged {
  std::vector<double> lm, balancing;
};

Logged run(int np, int mbs, int gbs, std::vector<std::string> extra, const char* name = "global_load_balancing_loss") {
  test::RunResult r = test::run_with_timeout(mixtral(np, mbs, gbs, std::move(extra)), testing::kMpiEnv, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  Logged l{testing::logged_values(r.output, "lm loss"), testing::logged_values(r.output, name)};
  EXPECT_EQ(l.lm.size(), 4u) << r.output;
  EXPECT_EQ(l.balancing.size(), 4u) << r.output;
  return l;
}

const std::vector<std::string> kGlobal = {"--moe-router-load-balancing-type", "global_aux_loss"};

TEST(MoeGlobalAuxCli, OneMicroBatchOnOneRankIsAuxLossAndMoreAverageTheCounts) {
  const Logged global = run(1, 2, 2, kGlobal);
  const Logged aux = run(1, 2, 2, {}, "load_balancing_loss");
  ASSERT_EQ(global.lm.size(), 4u);
  ASSERT_EQ(aux.lm.size(), 4u);
  EXPECT_EQ(global.lm, aux.lm);
  EXPECT_EQ(global.balancing, aux.balancing);
  // Two micro-batches a step: the first step's forwards see the same weights, so lm loss agrees, but
  // the second micro-batch's counts are the mean of both, so the balancing loss does not.
  const Logged global2 = run(1, 1, 2, kGlobal);
  const Logged aux2 = run(1, 1, 2, {}, "load_balancing_loss");
  ASSERT_EQ(global2.lm.size(), 4u);
  ASSERT_EQ(aux2.lm.size(), 4u);
  EXPECT_EQ(global2.lm[0], aux2.lm[0]);
  EXPECT_NE(global2.balancing[0], aux2.balancing[0]);
  // A full-layer recompute reruns every layer in backward: still counted once per micro-batch.
  const Logged recompute = run(1, 1, 2, {"--moe-router-load-balancing-type", "global_aux_loss",
                                         "--recompute-granularity", "full", "--recompute-method", "uniform",
                                         "--recompute-num-layers", "1"});
  EXPECT_EQ(recompute.lm, global2.lm);
  EXPECT_EQ(recompute.balancing, global2.balancing);
}

TEST(MoeGlobalAuxCli, CountsSumOverTensorAndDataParallelRanks) {
  // TP 2 + SP: each TP rank routes half the tokens; the counts and the loss sum over both, and the
  // router's partial gradients over TP: the run is TP 1's.
  // (the vocabulary padded to 256 as TP 2 pads it)
  const Logged tp1 = run(1, 1, 2, {"--moe-router-load-balancing-type", "global_aux_loss", "--make-vocab-size-divisible-by",
                                   "256"});
  const Logged tp2 = run(2, 1, 2, {"--moe-router-load-balancing-type", "global_aux_loss",
                                   "--tensor-model-parallel-size", "2", "--sequence-parallel"});
  ASSERT_EQ(tp2.lm.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(tp2.lm[i], tp1.lm[i], 1e-5 * tp1.lm[i]) << "iteration " << i + 1;
    EXPECT_NEAR(tp2.balancing[i], tp1.balancing[i], 1e-5 * tp1.balancing[i]) << "iteration " << i + 1;
  }
  // DP 2, one sequence per rank: counts over both ranks (N = 2T), each rank's share of the loss
  // summed over DP = one rank's loss over both sequences in one micro-batch (the first step's,
  // before the two runs' updates differ: Megatron averages the shares' gradients over DP).
  const Logged dp2 = run(2, 1, 2, kGlobal);
  const Logged one = run(1, 2, 2, kGlobal);
  ASSERT_EQ(dp2.lm.size(), 4u);
  ASSERT_EQ(one.lm.size(), 4u);
  EXPECT_NEAR(dp2.lm[0], one.lm[0], 1e-5 * one.lm[0]);
  EXPECT_NEAR(dp2.balancing[0], one.balancing[0], 1e-5 * one.balancing[0]);
  const Logged dp2_aux = run(2, 1, 2, {}, "load_balancing_loss");  // aux_loss: each rank's own counts
  ASSERT_EQ(dp2_aux.balancing.size(), 4u);
  EXPECT_GT(std::fabs(dp2_aux.balancing[0] - one.balancing[0]), 1e-4 * one.balancing[0]);
}

// --recompute-modules moe: the rerun in backward takes the counts its forward used, so two
// micro-batches a step (n̄ moving between them) log the same values, to the bit, as no recompute.
TEST(MoeGlobalAuxCli, RecomputeModulesMoeLogsAsNoRecompute) {
  const Logged plain = run(1, 1, 2, kGlobal);
  std::vector<std::string> flags = kGlobal;
  flags.insert(flags.end(), {"--recompute-granularity", "selective", "--recompute-modules", "moe"});
  const Logged recompute = run(1, 1, 2, flags);
  ASSERT_EQ(recompute.lm.size(), 4u);
  EXPECT_EQ(recompute.lm, plain.lm);
  EXPECT_EQ(recompute.balancing, plain.balancing);
}

}  // namespace
}  // namespace gale
