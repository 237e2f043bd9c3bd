// gale pretrain / generate with --softmax-type (attention sinks): off-by-one and learnable train the
// same at levels 0 and 2 (flash attention starts each row's online softmax at the sink logit) and not
// as vanilla; the type is recorded in checkpoints (a resume without it is refused) and restored by
// generate --use-checkpoint-args (generate without it is refused); Megatron's torch format at TP 2 keeps
// the sink logits.
#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel =
    testing::kTinyMockGpt + " --position-embedding-type rope --group-query-attention --num-query-groups 2";

std::vector<double> losses_of(const std::string& flags, const testing::TempDir& dir) {
  return testing::pretrain_losses(kModel + flags, dir.path());
}

TEST(SoftmaxTypeCli, SinksTrainTheSameAtEveryLevelAndNotAsVanilla) {
  testing::TempDir dir;
  const std::vector<double> vanilla = losses_of(" --optimization-level 0", dir);
  for (const std::string type : {"off-by-one", "learnable"}) {
    SCOPED_TRACE(type);
    const std::vector<double> level0 = losses_of(" --softmax-type " + type + " --optimization-level 0", dir);
    const std::vector<double> level2 =
        losses_of(" --softmax-type " + type + " --optimization-level 2 --use-flash-attn", dir);
    ASSERT_EQ(level0.size(), 3u);
    ASSERT_EQ(level2.size(), 3u);
    ASSERT_EQ(vanilla.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(level2[i], level0[i], 1e-5 * level0[i]) << "iteration " << i + 1;
    EXPECT_NE(level0[2], vanilla[2]);
  }
}

TEST(SoftmaxTypeCli, RecordedInCheckpointsAndRestoredForGenerate) {
  testing::TempDir dir;
  const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
  testing::CommandResult r =
      testing::run_gale("pretrain " + kModel + " --softmax-type learnable --train-iters 2" + save, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string other : {"", " --softmax-type off-by-one"}) {
    r = testing::run_gale("pretrain " + kModel + other + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
    EXPECT_EQ(r.exit_code, 1) << other;
    EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with softmax_type = \"learnable\""),
              std::string::npos)
        << other << "\n" << r.out << r.err;
  }
  r = testing::run_gale("pretrain " + kModel + " --softmax-type learnable --train-iters 4 --load " + dir.file("ckpt"),
                        dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
  const std::string generate = "generate --load " + dir.file("ckpt") +
                               " --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3 4 5 6 7 8 9 10 11 12' "
                               "--temperature 0 --max-new-tokens 8";
  testing::CommandResult restored = testing::run_gale(generate + " --use-checkpoint-args", dir.path());
  ASSERT_EQ(restored.exit_code, 0) << restored.err;
  testing::CommandResult explicit_flags = testing::run_gale(
      generate + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
                 "--position-embedding-type rope --group-query-attention --num-query-groups 2 --softmax-type learnable",
      dir.path());
  ASSERT_EQ(explicit_flags.exit_code, 0) << explicit_flags.err;
  EXPECT_EQ(restored.out, explicit_flags.out);
  testing::CommandResult vanilla = testing::run_gale(
      generate + " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
                 "--position-embedding-type rope --group-query-attention --num-query-groups 2",
      dir.path());
  EXPECT_NE(vanilla.exit_code, 0) << "a learnable model's checkpoint loaded without its sink logits";
  EXPECT_NE((vanilla.out + vanilla.err)
                .find("has attention sink logits (decoder.layers.0.self_attention.core_attention.softmax_offset): "
                      "expected --softmax-type learnable (or --use-checkpoint-args), found --softmax-type vanilla"),
            std::string::npos)
      << vanilla.out << vanilla.err;
}

// Megatron's torch format at TP 2 keeps the sink logits (each rank its heads' [NH/TP], under
// Megatron's name and args.softmax_type): training continues from it as from the Gale checkpoint.
TEST(SoftmaxTypeCli, MegatronTorchFormatAtTp2KeepsTheSinkLogits) {
  testing::TempDir dir;
  // 4095 + eod = 4096 tokens: the same padded vocabulary at TP 1 and TP 2.
  std::string model = kModel + " --softmax-type learnable";
  model.replace(model.find("--vocab-size 4096"), 17, "--vocab-size 4095");
  testing::CommandResult r =
      testing::run_gale("pretrain " + model + " --train-iters 2 --save " + dir.file("g") + " --save-interval 2",
                        dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_gale("convert --load-model-type gale --save-model-type mg --load-dir " + dir.file("g") +
                            " --save-dir " + dir.file("mg") + " --target-tensor-parallel-size 2",
                        dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string cont = "pretrain " + model + " --train-iters 4 --no-load-optim --load ";
  const testing::CommandResult from_gale = testing::run_gale(cont + dir.file("g") + " --no-load-rng", dir.path());
  const testing::CommandResult from_mg = testing::run_gale(cont + dir.file("mg"), dir.path());
  ASSERT_EQ(from_gale.exit_code, 0) << from_gale.err;
  ASSERT_EQ(from_mg.exit_code, 0) << from_mg.out << from_mg.err;
  const std::vector<double> losses = testing::logged_values(from_gale.out, "lm loss");
  EXPECT_EQ(losses.size(), 2u) << from_gale.out;
  EXPECT_EQ(testing::logged_values(from_mg.out, "lm loss"), losses) << from_mg.out;
}

}  // namespace
}  // namespace gale
