// `gale convert --save-model-type mg` and `gale pretrain --ckpt-convert-format torch` of a model with MTP layers:
// a Gale checkpoint of a 3-iteration --mtp-num-layers 2 run written in Megatron's torch format (TP 1 by
// --ckpt-convert-format, TP 2 x PP 2 by gale convert) and trained on from each (--no-load-optim) gives the
// next iterations' LM and MTP losses bit for bit as training on from the Gale checkpoint itself. (The
// vocabulary, 4095 + NullTokenizer's end-of-document, is 4096: no padding at TP 1 or TP 2.)
#include <gtest/gtest.h>

#include <filesystem>

#include "log_line.h"
#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> pretrain(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--lr", "3e-3", "--mock-data", "--vocab-size", "4095", "--log-interval", "1", "--eval-iters", "0",
      "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
      "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attention-dropout", "0.0",
      "--hidden-dropout", "0.1", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.2"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(MegatronMtpCli, ConvertedCheckpointsTrainOnToTheSameLosses) {
  const auto dir = std::filesystem::temp_directory_path() / ("gale_megatron_mtp_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string gale = (dir / "gale").string(), conv = (dir / "conv").string(), mg = (dir / "mg").string();
  test::RunResult first = test::run_with_timeout(pretrain({"--train-iters", "3", "--save", gale, "--save-interval", "3"}), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  test::RunResult c1 = test::run_with_timeout(
      pretrain({"--train-iters", "3", "--load", gale, "--ckpt-convert-format", "torch", "--ckpt-convert-save", conv}),
      {}, 300);
  ASSERT_EQ(c1.exit_code, 0) << c1.output;
  EXPECT_NE(c1.output.find("> converted checkpoint: gale -> torch (" + conv + "/torch)."), std::string::npos)
      << c1.output;
  test::RunResult c2 = test::run_with_timeout(
      {GALE_BINARY, "convert", "--load-model-type", "gale", "--save-model-type", "mg", "--load-dir", gale, "--save-dir",
       mg, "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"},
      {}, 300);
  ASSERT_EQ(c2.exit_code, 0) << c2.output;
  EXPECT_TRUE(std::filesystem::exists(mg + "/iter_0000003/mp_rank_01_001/model_optim_rng.pt"));
  std::vector<std::vector<double>> lm, m1, m2;
  for (const std::string& load : {gale, conv + "/torch", mg}) {
    SCOPED_TRACE(load);
    test::RunResult r = test::run_with_timeout(pretrain({"--train-iters", "5", "--load", load, "--no-load-optim"}), {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    lm.push_back(testing::logged_values(r.output, "lm loss"));
    m1.push_back(testing::logged_values(r.output, "mtp_1 loss"));
    m2.push_back(testing::logged_values(r.output, "mtp_2 loss"));
    ASSERT_EQ(lm.back().size(), 2u) << r.output;  // iterations 4 and 5
    ASSERT_EQ(m2.back().size(), 2u) << r.output;
  }
  for (size_t i = 1; i < lm.size(); ++i) {
    EXPECT_EQ(lm[i], lm[0]) << i;
    EXPECT_EQ(m1[i], m1[0]) << i;
    EXPECT_EQ(m2[i], m2[0]) << i;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
