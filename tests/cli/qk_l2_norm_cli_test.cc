// gale pretrain --qk-l2-norm (Megatron main; Llama 4's weightless q/k norm): the same losses at
// levels 0 and 2 (flash attention) and not those of the plain model; recorded in checkpoints (a
// resume without the flag is refused, one with it or with --use-checkpoint-args continues); Hugging
// Face export refuses it.
#include <gtest/gtest.h>

#include <regex>

#include "checkpoint_inference.h"
#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel = testing::kTinyMockGpt +
                           " --position-embedding-type rope --group-query-attention --num-query-groups 2 "
                           "--normalization RMSNorm --swiglu --disable-bias-linear";

std::vector<double> losses_of(const std::string& flags, const testing::TempDir& dir) {
  return testing::pretrain_losses(kModel + flags, dir.path());
}

TEST(QkL2NormCli, SameLossesAtLevels0And2AndNotThePlainModels) {
  testing::TempDir dir;
  const std::vector<double> plain = losses_of(" --optimization-level 0", dir);
  const std::vector<double> level0 = losses_of(" --qk-l2-norm --optimization-level 0", dir);
  const std::vector<double> level2 = losses_of(" --qk-l2-norm --optimization-level 2 --use-flash-attn", dir);
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
  EXPECT_NE(level0[0], plain[0]);
  // --qk-layernorm with it changes nothing (Megatron's spec picks L2Norm for both norms).
  const std::vector<double> both = losses_of(" --qk-l2-norm --qk-layernorm --optimization-level 0", dir);
  EXPECT_EQ(both, level0);
}

TEST(QkL2NormCli, RecordedInCheckpoints) {
  testing::TempDir dir;
  const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
  testing::CommandResult r = testing::run_gale("pretrain " + kModel + " --qk-l2-norm --train-iters 2" + save, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_gale("pretrain " + kModel + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with qk_l2_norm = true, this run has "
                                 "(absent)"),
            std::string::npos)
      << r.out << r.err;
  r = testing::run_gale("pretrain " + kModel + " --qk-l2-norm --train-iters 4 --load " + dir.file("ckpt"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
  // --use-checkpoint-args takes it from the checkpoint.
  r = testing::run_gale("pretrain " + kModel + " --use-checkpoint-args --train-iters 4 --load " + dir.file("ckpt"),
                        dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("Setting qk_l2_norm to True from checkpoint"), std::string::npos) << r.out << r.err;
  testing::expect_hf_conversion_refused(dir.file("ckpt"), dir.file("hf"),
                                        "the model has --qk-l2-norm, which Gale does not write to Hugging Face yet "
                                        "(Llama4ForCausalLM's use_qk_norm: not supported yet)");
}

}  // namespace
}  // namespace gale
