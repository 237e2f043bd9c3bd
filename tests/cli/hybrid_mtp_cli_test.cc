// `gale pretrain --is-hybrid-model --hybrid-layer-pattern 'M*-M/*M/*M'` (Megatron main's hybrid MTP):
// the run logs "mtp_1 loss" and "mtp_2 loss" after lm loss, falling; save and resume continue the
// same run exactly (the MTP block's parameters and optimizer state are in the checkpoint); pipeline
// parallelism 2 with the pattern's '|' (the MTP block on the last stage) gives the one-process
// losses; `gale generate` loads the checkpoint (without its MTP block).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <regex>

#include "log_line.h"
#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

// A tiny hybrid model: hidden 64 (d_inner 128: 8 heads of 16, 2 groups, d_state 16), RMSNorm, no
// position embedding, then `extra`.
std::vector<std::string> hybrid(int np, int iters, std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--is-hybrid-model", "--mamba-state-dim", "16", "--mamba-head-dim", "16", "--mamba-num-groups", "2",
      "--normalization", "RMSNorm", "--position-embedding-type", "none", "--hidden-dropout", "0.1",
      "--lr", "1e-2", "--lr-decay-style", "constant", "--log-interval", "1", "--mtp-loss-scaling-factor", "0.3"};
  return testing::tiny_gpt_pretrain(np, iters, flags, extra);
}

test::RunResult run(const std::vector<std::string>& argv, int np = 1) {
  return test::run_with_timeout(argv, np > 1 ? testing::kMpiEnv : std::vector<std::string>{}, 600);
}

TEST(GalePretrainHybridMtp, LogsTheMtpLossesResumesExactlyAndGenerates) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_hybrid_mtp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> pattern = {"--hybrid-layer-pattern", "M*-M/*M/*M"};
  test::RunResult whole = run(hybrid(1, 12, pattern));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<double> lm = testing::logged_values(whole.output, "lm loss");
  const std::vector<double> m1 = testing::logged_values(whole.output, "mtp_1 loss");
  const std::vector<double> m2 = testing::logged_values(whole.output, "mtp_2 loss");
  ASSERT_EQ(lm.size(), 12u);
  ASSERT_EQ(m1.size(), 12u);
  ASSERT_EQ(m2.size(), 12u);
  EXPECT_LT((m1[9] + m1[10] + m1[11]) / 3, (m1[0] + m1[1] + m1[2]) / 3 - 0.05) << whole.output;
  EXPECT_LT((m2[9] + m2[10] + m2[11]) / 3, (m2[0] + m2[1] + m2[2]) / 3 - 0.05) << whole.output;

  std::vector<std::string> save = pattern;
  save.insert(save.end(), {"--save", dir.string(), "--save-interval", "6", "--exit-interval", "6"});
  test::RunResult first = run(hybrid(1, 12, save));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::vector<std::string> load = pattern;
  load.insert(load.end(), {"--load", dir.string()});
  test::RunResult second = run(hybrid(1, 12, load));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> lm_b = testing::logged_values(second.output, "lm loss");
  const std::vector<double> m2_b = testing::logged_values(second.output, "mtp_2 loss");
  ASSERT_EQ(lm_b.size(), 6u);
  ASSERT_EQ(m2_b.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lm_b[i], lm[6 + i]) << "iteration " << 7 + i;
    EXPECT_EQ(m2_b[i], m2[6 + i]) << "iteration " << 7 + i;
  }
  test::RunResult gen = run({GALE_BINARY, "generate", "--load", dir.string(), "--use-checkpoint-args",
                             "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096", "--prompt", "5 17",
                             "--max-new-tokens", "2"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(std::regex_search(gen.output, std::regex("\n5 17 \\d+ \\d+\n"))) << gen.output;
  std::filesystem::remove_all(dir);
}

// PP 2 with the stages in the pattern ("M*" and "-M", the MTP block "*M" twice on the last stage,
// beside its copy of the embedding): the one-process losses and MTP losses.
TEST(GalePretrainHybridMtp, PipelineStagesMatchOneProcess) {
  test::RunResult one = run(hybrid(1, 6, {"--hybrid-layer-pattern", "M*-M/*M/*M"}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  test::RunResult staged =
      run(hybrid(2, 6, {"--hybrid-layer-pattern", "M*|-M/*M/*M", "--pipeline-model-parallel-size", "2"}), 2);
  ASSERT_EQ(staged.exit_code, 0) << staged.output;
  for (const char* what : {"lm loss", "mtp_1 loss", "mtp_2 loss"}) {
    const std::vector<double> a = testing::logged_values(one.output, what), b = testing::logged_values(staged.output, what);
    ASSERT_EQ(a.size(), 6u) << what;
    ASSERT_EQ(b.size(), 6u) << what << "\n" << staged.output;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << what << " of iteration " << i + 1;
  }
}

}  // namespace
}  // namespace gale
