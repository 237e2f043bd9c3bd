// Model flags recorded in checkpoints only when set (--use-rope-scaling, --openai-gelu): a run that
// resumes with the same flags continues, one without them is refused naming the flag, and
// --use-checkpoint-args restores them.
#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_test_util.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1";

TEST(ModelFlagsCli, RecordedFlagsMustMatchOnResume) {
  for (const std::string flags : {"--position-embedding-type rope --use-rope-scaling --rope-scaling-factor 16",
                                  "--openai-gelu"}) {
    testing::TempDir dir;
    const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
    testing::CommandResult r = testing::run_gale("pretrain " + kModel + " " + flags + " --train-iters 2" + save, dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string base = flags.find("rope") != std::string::npos ? " --position-embedding-type rope" : "";
    r = testing::run_gale("pretrain " + kModel + base + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
    EXPECT_EQ(r.exit_code, 1) << flags;
    const std::string key = flags.find("rope") != std::string::npos ? "rope_scaling_factor = 16.0" : "openai_gelu = true";
    EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with " + key + ", this run has (absent)"),
              std::string::npos)
        << flags << "\n" << r.out << r.err;
    r = testing::run_gale("pretrain " + kModel + " " + flags + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
    EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
    r = testing::run_gale("generate --load " + dir.file("ckpt") +
                              " --use-checkpoint-args --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3' "
                              "--temperature 0 --max-new-tokens 2",
                          dir.path());
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  }
}

}  // namespace
}  // namespace gale
