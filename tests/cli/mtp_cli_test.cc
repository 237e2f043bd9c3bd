// `gale pretrain --mtp-num-layers`: the mock-data run logs Megatron's "mtp_1 loss" (and
// "mtp_2 loss") after lm loss, both falling; save and resume continue the same run exactly (the MTP
// parameters and their optimizer state are in the checkpoint); with factor 0 the LM losses are
// those of the model without MTP; pipeline parallelism is refused in one line.
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
      "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096", "--log-interval", "1",
      "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(GalePretrainMtp, LogsTheMtpLossesAndResumesExactly) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_mtp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> mtp = {"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.2"};
  test::RunResult whole = test::run_with_timeout(pretrain(mtp), {}, 300);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> lm = testing::logged_values(whole.output, "lm loss");
  const std::vector<double> m1 = testing::logged_values(whole.output, "mtp_1 loss");
  const std::vector<double> m2 = testing::logged_values(whole.output, "mtp_2 loss");
  ASSERT_EQ(lm.size(), 6u);
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(m2.size(), 6u);
  EXPECT_LT(m1.back(), m1.front() - 0.05);
  EXPECT_NE(whole.output.find(" | mtp_1 loss: "), std::string::npos);
  EXPECT_LT(whole.output.find(" | lm loss: "), whole.output.find(" | mtp_1 loss: "));
  EXPECT_LT(whole.output.find(" | mtp_1 loss: "), whole.output.find(" | mtp_2 loss: "));

  std::vector<std::string> save = mtp;
  save.insert(save.end(), {"--save", dir.string(), "--save-interval", "3", "--exit-interval", "3"});
  test::RunResult first = test::run_with_timeout(pretrain(save), {}, 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<std::string> load = mtp;
  load.insert(load.end(), {"--load", dir.string()});
  test::RunResult second = test::run_with_timeout(pretrain(load), {}, 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> lm_b = testing::logged_values(second.output, "lm loss");
  const std::vector<double> m1_b = testing::logged_values(second.output, "mtp_1 loss");
  const std::vector<double> m2_b = testing::logged_values(second.output, "mtp_2 loss");
  ASSERT_EQ(lm_b.size(), 3u);
  ASSERT_EQ(m1_b.size(), 3u);
  ASSERT_EQ(m2_b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lm[3 + i], lm_b[i]) << "iteration " << 4 + i;
    EXPECT_EQ(m1[3 + i], m1_b[i]) << "iteration " << 4 + i;
    EXPECT_EQ(m2[3 + i], m2_b[i]) << "iteration " << 4 + i;
  }
  std::filesystem::remove_all(dir);
}

TEST(GalePretrainMtp, ZeroFactorKeepsTheLmLossesOfTheModelWithoutMtp) {
  test::RunResult plain = test::run_with_timeout(pretrain({}), {}, 300);
  test::RunResult zero = test::run_with_timeout(pretrain({"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0"}), {}, 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(testing::logged_values(plain.output, "lm loss"), testing::logged_values(zero.output, "lm loss"));
  EXPECT_TRUE(testing::logged_values(plain.output, "mtp_1 loss").empty());
  EXPECT_EQ(testing::logged_values(zero.output, "mtp_1 loss").size(), 6u);
}

TEST(GalePretrainMtp, BadValuesAreOneLineErrors) {
  test::RunResult r = test::run_with_timeout(pretrain({"--mtp-num-layers", "0"}), {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--mtp-num-layers: expected at least 1, found 0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gale
