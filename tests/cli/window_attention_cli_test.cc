// gale pretrain / generate with Megatron's --window-size and --window-attn-skip-freq: the same losses
// at levels 0 and 2 (flash attention takes each layer's window), other losses than one window in
// every layer, recorded in checkpoints (a resume with another pattern is refused), restored by
// generate --use-checkpoint-args, and through Megatron's torch format.
#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel =
    testing::kTinyMockGpt + " --position-embedding-type rope";
// Layer 1 sees 4 keys (the query and 3 before it), layer 2 every key before it.
const std::string kWindows = " --window-size 3,0 --window-attn-skip-freq 2";

std::vector<double> losses_of(const std::string& flags, const testing::TempDir& dir) {
  return testing::pretrain_losses(kModel + flags, dir.path());
}

TEST(WindowAttentionCli, PerLayerWindowsTrainTheSameAtEveryLevelAndNotAsOneWindowEverywhere) {
  testing::TempDir dir;
  const std::vector<double> level0 = losses_of(kWindows + " --optimization-level 0", dir);
  const std::vector<double> level2 = losses_of(kWindows + " --optimization-level 2 --use-flash-attn", dir);
  const std::vector<double> uniform = losses_of(" --window-size 3,0 --optimization-level 0", dir);
  const std::vector<double> mindspeed = losses_of(" --sliding-window 4 --window-attn-skip-freq 2 --optimization-level 0", dir);
  ASSERT_EQ(level0.size(), 3u);
  ASSERT_EQ(level2.size(), 3u);
  ASSERT_EQ(uniform.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
  EXPECT_NE(level0[2], uniform[2]);
  EXPECT_EQ(mindspeed, level0);  // --window-size 3,0 is --sliding-window 4
}

TEST(WindowAttentionCli, RecordedInCheckpointsAndRestoredForGenerate) {
  testing::TempDir dir;
  const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
  testing::CommandResult r = testing::run_gale("pretrain " + kModel + kWindows + " --train-iters 2" + save, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_gale("pretrain " + kModel + " --window-size 3,0 --train-iters 4 --load " + dir.file("ckpt"),
                        dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with window_layers = [1,0], this run has "
                                 "(absent)"),
            std::string::npos)
      << r.out << r.err;
  r = testing::run_gale("pretrain " + kModel + kWindows + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
  const std::string generate = "generate --load " + dir.file("ckpt") +
                               " --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3 4 5 6 7 8 9 10 11 12' "
                               "--temperature 1 --top-k 0 --seed 5 --max-new-tokens 8";  // sampled: every logit counts
  testing::CommandResult restored = testing::run_gale(generate + " --use-checkpoint-args", dir.path());
  ASSERT_EQ(restored.exit_code, 0) << restored.err;
  testing::CommandResult explicit_flags = testing::run_gale(
      generate + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
                 "--position-embedding-type rope" + kWindows,
      dir.path());
  ASSERT_EQ(explicit_flags.exit_code, 0) << explicit_flags.err;
  EXPECT_EQ(restored.out, explicit_flags.out);
  testing::CommandResult full = testing::run_gale(
      generate + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
                 "--position-embedding-type rope",
      dir.path());
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.out, explicit_flags.out);  // without the windows the same seed samples other tokens
}

// Through Megatron's torch format (--ckpt-convert-format torch): window_size (3, 0) and the per-layer
// window_attn_skip_freq go out in the args and come back, so training continues as from Gale's checkpoint.
TEST(WindowAttentionCli, MegatronTorchCheckpointRoundTrip) {
  testing::TempDir dir;
  const std::string gale = dir.file("gale"), megatron = dir.file("megatron");
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel + kWindows + " --train-iters 2 --save " + gale + " --save-interval 2", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_gale("pretrain " + kModel + kWindows + " --train-iters 2 --load " + gale +
                            " --ckpt-convert-format torch --ckpt-convert-save " + megatron,
                        dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string more = " --train-iters 4 --no-load-optim --no-load-rng --load ";
  r = testing::run_gale("pretrain " + kModel + kWindows + more + gale, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> from_gale = testing::logged_values(r.out, "lm loss");
  r = testing::run_gale("pretrain " + kModel + kWindows + more + megatron + "/torch", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(testing::logged_values(r.out, "lm loss"), from_gale);
  ASSERT_EQ(from_gale.size(), 2u);
  // generate --use-checkpoint-args reads the windows back from Megatron's args.
  const std::string generate = " --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3 4 5 6 7 8 9 10 11 12' "
                               "--temperature 0 --max-new-tokens 8";
  testing::CommandResult from_megatron =
      testing::run_gale("generate --use-checkpoint-args --load " + megatron + "/torch" + generate, dir.path());
  ASSERT_EQ(from_megatron.exit_code, 0) << from_megatron.err;
  testing::CommandResult from_gale_ckpt =
      testing::run_gale("generate --use-checkpoint-args --load " + gale + generate, dir.path());
  ASSERT_EQ(from_gale_ckpt.exit_code, 0) << from_gale_ckpt.err;
  // The outputs name their checkpoint directories; the rest (the text generated) must agree.
  const auto without = [](std::string out, const std::string& path) {
    for (size_t at; (at = out.find(path)) != std::string::npos;) out.replace(at, path.size(), "DIR");
    return out;
  };
  EXPECT_EQ(without(from_megatron.out, megatron + "/torch"), without(from_gale_ckpt.out, gale));
}

}  // namespace
}  // namespace gale
