// gale pretrain with --enable-mhc-connections: the same losses at levels 0 and 2 (with hidden dropout
// on the n-stream merge) and with --recompute-modules mhc, other losses than the model without mHC, a save resumed exactly, a resume
// without mHC refused, and Megatron's mhc_* args recorded in the checkpoint (generate restores them).
#include <gtest/gtest.h>

#include <fstream>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/resume_check.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kMhc = " --enable-mhc-connections --mhc-num-residual-streams 3 --mhc-sinkhorn-iterations 8 "
                         "--mhc-init-gating-factor 0.1";

std::vector<double> losses_of(const std::string& flags, const testing::TempDir& dir) {
  return testing::pretrain_losses(testing::kTinyMockGpt + flags, dir.path());
}

TEST(MhcCli, TrainsTheSameAtLevels0And2AndNotAsWithoutMhc) {
  testing::TempDir dir;
  const std::string dropout = " --hidden-dropout 0.1";
  const std::vector<double> level0 = losses_of(kMhc + dropout + " --optimization-level 0", dir);
  const std::vector<double> level2 = losses_of(kMhc + dropout + " --optimization-level 2", dir);
  const std::vector<double> plain = losses_of(dropout + " --optimization-level 0", dir);
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  ASSERT_EQ(plain.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
  EXPECT_NE(level0[2], plain[2]);
  EXPECT_LT(level0[2], level0[0]);  // it learns
}

// --recompute-modules mhc (one block, and blocks of 2 layers with layernorm) through gale pretrain:
// the same losses as keeping the activations (the rebuilt ones are bit-identical).
TEST(MhcCli, RecomputeModulesMhcTrainsTheSame) {
  testing::TempDir dir;
  const std::string dropout = " --hidden-dropout 0.1";
  const std::vector<double> stored = losses_of(kMhc + dropout, dir);
  const std::vector<double> one_block = losses_of(kMhc + dropout + " --recompute-activations --recompute-modules mhc", dir);
  const std::vector<double> blocks = losses_of(
      kMhc + dropout + " --recompute-activations --recompute-modules mhc layernorm --mhc-recompute-layer-num 2", dir);
  ASSERT_EQ(stored.size(), 3u);
  EXPECT_EQ(one_block, stored);
  EXPECT_EQ(blocks, stored);
}

// Megatron's warning when mHC runs without --recompute-modules mhc (selective), and none with it.
TEST(MhcCli, WarnsAsMegatronWithoutMhcRecompute) {
  testing::TempDir dir;
  const std::string warning = "WARNING: HyperConnections are enabled but 'mhc' is not in recompute_modules with "
                              "selective recompute. Consider adding 'mhc' to recompute_modules with selective "
                              "recompute to reduce activation memory.";
  testing::CommandResult plain = testing::run_gale("pretrain " + testing::kTinyMockGpt + kMhc + " --train-iters 1", dir.path());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find(warning), std::string::npos) << plain.err;
  testing::CommandResult recomputed = testing::run_gale(
      "pretrain " + testing::kTinyMockGpt + kMhc + " --recompute-activations --recompute-modules mhc --train-iters 1",
      dir.path());
  ASSERT_EQ(recomputed.exit_code, 0) << recomputed.err;
  EXPECT_EQ(recomputed.err.find("HyperConnections are enabled"), std::string::npos) << recomputed.err;
  testing::CommandResult without = testing::run_gale("pretrain " + testing::kTinyMockGpt + " --train-iters 1", dir.path());
  ASSERT_EQ(without.exit_code, 0) << without.err;
  EXPECT_EQ(without.err.find("HyperConnections are enabled"), std::string::npos) << without.err;
}

TEST(MhcCli, ResumesExactlyRecordsMegatronsArgsAndRefusesAModelWithoutMhc) {
  testing::TempDir dir;
  testing::expect_resumes_exactly(testing::kTinyMockGpt + kMhc + " --hidden-dropout 0.1", dir.path());
  const std::string ckpt = dir.file("ckpt");
  const testing::CommandResult r =
      testing::run_gale("pretrain " + testing::kTinyMockGpt + " --train-iters 8 --load " + ckpt, dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with mhc = "), std::string::npos)
      << r.out << r.err;
  // --use-checkpoint-args restores mHC and its sizes from Megatron's args for generate: without them the
  // model would not match the checkpoint's (the refusal above).
  const testing::CommandResult g = testing::run_gale(
      "generate --load " + ckpt + " --use-checkpoint-args --tokenizer-type NullTokenizer --vocab-size 4096 "
      "--prompt '1 2 3 4 5' --temperature 0 --max-new-tokens 4",
      dir.path());
  EXPECT_EQ(g.exit_code, 0) << g.out << g.err;
}

}  // namespace
}  // namespace gale
