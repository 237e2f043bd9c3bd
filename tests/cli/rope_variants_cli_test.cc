// gale pretrain / generate with --position-embedding-type yarn: the same losses at levels 0 and 2
// (the fused RoPE kernel on YaRN's tables), other losses than plain RoPE, recorded in checkpoints
// (a resume with other YaRN flags is refused), and restored by generate --use-checkpoint-args; and
// --no-rope-freq, whose layers skip the reference and the fused RoPE alike; --attention-output-gate
// at levels 0 and 2; and all three through Megatron's torch format.
#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel = testing::kTinyMockGpt;
// A context of 8 positions stretched 4 times: most of the 4 frequencies of each 8-wide head blend.
const std::string kYarn =
    " --position-embedding-type yarn --rotary-scaling-factor 4 --yarn-original-max-position-embeddings 8 "
    "--mscale 1 --mscale-all-dim 0";

std::vector<double> losses_of(const std::string& flags, const testing::TempDir& dir) {
  return testing::pretrain_losses(kModel + flags, dir.path());
}

TEST(RopeVariantsCli, YarnTrainsTheSameAtEveryLevelAndNotAsPlainRope) {
  testing::TempDir dir;
  const std::vector<double> level0 = losses_of(kYarn + " --optimization-level 0", dir);
  const std::vector<double> level2 = losses_of(kYarn + " --optimization-level 2 --use-fused-rotary-pos-emb", dir);
  const std::vector<double> rope = losses_of(" --position-embedding-type rope --optimization-level 0", dir);
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  ASSERT_EQ(rope.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
  EXPECT_NE(level0[2], rope[2]);  // the first losses may agree to the printed digits; the third does not
}

TEST(RopeVariantsCli, YarnRecordedInCheckpointsAndRestoredForGenerate) {
  testing::TempDir dir;
  const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
  testing::CommandResult r = testing::run_gale("pretrain " + kModel + kYarn + " --train-iters 2" + save, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& other : {std::string(" --position-embedding-type rope"), kYarn + " --yarn-beta-fast 16"}) {
    r = testing::run_gale("pretrain " + kModel + other + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
    EXPECT_EQ(r.exit_code, 1) << other;
    EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with yarn"), std::string::npos)
        << other << "\n" << r.out << r.err;
  }
  r = testing::run_gale("pretrain " + kModel + kYarn + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
  const std::string generate = "generate --load " + dir.file("ckpt") +
                               " --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3 4 5 6 7 8 9 10 11 12' "
                               "--temperature 0 --max-new-tokens 8";
  testing::CommandResult restored = testing::run_gale(generate + " --use-checkpoint-args", dir.path());
  ASSERT_EQ(restored.exit_code, 0) << restored.err;
  testing::CommandResult explicit_flags = testing::run_gale(
      generate + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32" +
          kYarn,
      dir.path());
  ASSERT_EQ(explicit_flags.exit_code, 0) << explicit_flags.err;
  EXPECT_EQ(restored.out, explicit_flags.out);
}

TEST(RopeVariantsCli, NoRopeLayersTrainTheSameAtEveryLevelAndNotAsRopeEverywhere) {
  testing::TempDir dir;
  const std::string no_rope = " --position-embedding-type rope --no-rope-freq 2";
  const std::vector<double> level0 = losses_of(no_rope + " --optimization-level 0", dir);
  const std::vector<double> level2 = losses_of(no_rope + " --optimization-level 2 --use-fused-rotary-pos-emb", dir);
  const std::vector<double> rope = losses_of(" --position-embedding-type rope --optimization-level 0", dir);
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  ASSERT_EQ(rope.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
  EXPECT_NE(level0[2], rope[2]);
}

// --attention-output-gate: the gate is outside the attention kernels, so the fused level-2 path
// (flash attention, fused RoPE) trains as level 0 does.
TEST(RopeVariantsCli, AttentionOutputGateTrainsTheSameAtEveryLevel) {
  testing::TempDir dir;
  const std::string gate = " --position-embedding-type rope --attention-output-gate";
  const std::vector<double> level0 = losses_of(gate + " --optimization-level 0", dir);
  const std::vector<double> level2 = losses_of(gate + " --optimization-level 2 --use-flash-attn", dir);
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
}

// YaRN, NoPE layers and the gate through Megatron's torch format (--ckpt-convert-format torch): linear_qkv's
// [q | gate | k | v] rows and the args that record the three go out and come back, so the Megatron
// checkpoint continues training as the Gale checkpoint it came from; a run without the gate is refused.
TEST(RopeVariantsCli, MegatronTorchCheckpointRoundTrip) {
  testing::TempDir dir;
  const std::string model = kYarn + " --no-rope-freq 2 --attention-output-gate --num-query-groups 2";
  const std::string gale = dir.file("gale"), megatron = dir.file("megatron");
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel + model + " --train-iters 2 --save " + gale + " --save-interval 2", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_gale("pretrain " + kModel + model + " --train-iters 2 --load " + gale +
                            " --ckpt-convert-format torch --ckpt-convert-save " + megatron,
                        dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string more = " --train-iters 4 --no-load-optim --no-load-rng --load ";
  r = testing::run_gale("pretrain " + kModel + model + more + gale, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> from_gale = testing::logged_values(r.out, "lm loss");
  r = testing::run_gale("pretrain " + kModel + model + more + megatron + "/torch", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> from_megatron = testing::logged_values(r.out, "lm loss");
  ASSERT_EQ(from_gale.size(), 2u);
  EXPECT_EQ(from_megatron, from_gale);
  const std::string ungated = kYarn + " --no-rope-freq 2 --num-query-groups 2";
  r = testing::run_gale("pretrain " + kModel + ungated + more + megatron + "/torch", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE((r.out + r.err).find("attention_output_gate"), std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace gale
