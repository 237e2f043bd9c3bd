// `gale pretrain --moe-router-load-balancing-type quantile_balancing` (Megatron main's QB): trains
// at levels 0 and 2 without a load-balancing loss; the first step routes as plain top-k (qb_beta
// starts at 0) and the later ones do not (the bias moved after step 1); a full-layer recompute adds
// each micro-batch's quantile once; the qb_beta buffers are checkpointed (resume exact); DP 2 with
// one micro-batch per rank trains as one rank with both micro-batches (the quantiles' mean is the
// same), TP 2 + SP and CP 2 as one rank (the quantile is taken over the logits gathered over TP×CP),
// and PP 2 and EP 2 too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

// A tiny Mixtral (4 SwiGLU experts, top 2) with quantile balancing.
std::vector<std::string> mixtral(int mbs, int gbs, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", std::to_string(mbs),
      "--global-batch-size", std::to_string(gbs), "--train-iters", "6", "--lr", "3e-3", "--mock-data",
      "--vocab-size", "4096", "--log-interval", "1", "--eval-iters", "0", "--num-threads", "1", "--swiglu",
      "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
      "--untie-embeddings-and-output-weights", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64", "--moe-aux-loss-coeff", "0",
      "--moe-token-dispatcher-type", "alltoall", "--moe-router-load-balancing-type", "quantile_balancing"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> losses(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  test::RunResult r = test::run_with_timeout(argv, env, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("load_balancing_loss"), std::string::npos) << r.output;
  return testing::logged_values(r.output, "lm loss");
}

TEST(MoeQuantileBalancingCli, TrainsAtLevelsZeroAndTwoAndMovesTheBiasAfterEachStep) {
  const std::vector<double> l0 = losses(mixtral(2, 4, {"--optimization-level", "0"}));
  const std::vector<double> l2 = losses(mixtral(2, 4, {"--optimization-level", "2", "--use-flash-attn",
                                                       "--use-fused-rmsnorm", "--use-fused-swiglu"}));
  ASSERT_EQ(l0.size(), 6u);
  ASSERT_EQ(l2.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(l2[i], l0[i], 1e-4 * l0[i]) << "iteration " << i + 1;
  EXPECT_LT(l0.back(), l0.front());
  // qb_beta starts at 0: step 1 chooses the plain top-k (and weighs with the same softmax) as
  // routing without balancing; after it the bias differs from 0 and so do the losses.
  std::vector<std::string> none = mixtral(2, 4, {"--optimization-level", "0"});
  const auto type = std::find(none.begin(), none.end(), "quantile_balancing");
  ASSERT_NE(type, none.end());
  *type = "none";
  const std::vector<double> plain = losses(none);
  ASSERT_EQ(plain.size(), 6u);
  EXPECT_EQ(plain[0], l0[0]);
  EXPECT_NE(plain[2], l0[2]);
  // A full-layer recompute routes the rerun with the same bias and adds each quantile once.
  const std::vector<double> recomputed = losses(mixtral(2, 4, {"--optimization-level", "0", "--recompute-granularity",
                                                               "full", "--recompute-method", "uniform",
                                                               "--recompute-num-layers", "1"}));
  ASSERT_EQ(recomputed.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(recomputed[i], l0[i], 1e-5 * l0[i]) << "iteration " << i + 1;
}

bool file_holds(const std::filesystem::path& dir, const std::string& text) {
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    std::ifstream in(f.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(MoeQuantileBalancingCli, SaveThenResumeContinuesTheSameRun) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_qb_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> ema = {"--moe-router-quantile-balancing-ema", "0.5"};
  const std::vector<double> whole = losses(mixtral(2, 4, ema));
  std::vector<std::string> save = ema;
  save.insert(save.end(), {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"});
  ASSERT_EQ(losses(mixtral(2, 4, save)).size(), 3u);
  EXPECT_TRUE(file_holds(dir, "decoder.layers.1.mlp.router.qb_beta"));
  std::vector<std::string> load = ema;
  load.insert(load.end(), {"--load", dir.string()});
  const std::vector<double> resumed = losses(mixtral(2, 4, load));
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], whole[3 + i]) << "iteration " << 4 + i;
  std::filesystem::remove_all(dir);
}

TEST(MoeQuantileBalancingCli, ParallelRunsTrainAsOneProcess) {
  const std::vector<double> one = losses(mixtral(1, 2, {"--make-vocab-size-divisible-by", "256"}));
  const std::vector<double> dp2 = losses(testing::launch_argv(2, mixtral(1, 2, {"--make-vocab-size-divisible-by",
                                                                                 "256"}), {}),
                                         testing::kMpiEnv);
  const std::vector<double> tp2 = losses(testing::launch_argv(2, mixtral(1, 2, {"--tensor-model-parallel-size", "2",
                                                                                 "--sequence-parallel"}), {}),
                                         testing::kMpiEnv);
  const std::vector<double> cp2 = losses(testing::launch_argv(2, mixtral(1, 2, {"--context-parallel-size", "2",
                                                                                 "--make-vocab-size-divisible-by",
                                                                                 "256"}), {}),
                                         testing::kMpiEnv);
  // PP 2: each stage updates its own layers' qb_beta; EP 2 (with DP 2): the router stays replicated.
  const std::vector<double> pp2 = losses(testing::launch_argv(2, mixtral(1, 2, {"--pipeline-model-parallel-size", "2",
                                                                                 "--make-vocab-size-divisible-by",
                                                                                 "256"}), {}),
                                         testing::kMpiEnv);
  const std::vector<double> ep2 = losses(testing::launch_argv(2, mixtral(1, 2, {"--expert-model-parallel-size", "2",
                                                                                 "--make-vocab-size-divisible-by",
                                                                                 "256"}), {}),
                                         testing::kMpiEnv);
  ASSERT_EQ(pp2.size(), 6u);
  ASSERT_EQ(ep2.size(), 6u);
  ASSERT_EQ(one.size(), 6u);
  ASSERT_EQ(dp2.size(), 6u);
  ASSERT_EQ(tp2.size(), 6u);
  ASSERT_EQ(cp2.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(dp2[i], one[i], 1e-5 * one[i]) << "iteration " << i + 1;
    EXPECT_NEAR(tp2[i], one[i], 1e-5 * one[i]) << "iteration " << i + 1;
    EXPECT_NEAR(cp2[i], one[i], 1e-5 * one[i]) << "iteration " << i + 1;
    EXPECT_NEAR(pp2[i], one[i], 1e-5 * one[i]) << "iteration " << i + 1;
    EXPECT_NEAR(ep2[i], one[i], 1e-5 * one[i]) << "iteration " << i + 1;
  }
}

}  // namespace
}  // namespace gale
