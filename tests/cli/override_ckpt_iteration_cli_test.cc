// `gale pretrain --load ... --override-ckpt-iteration N` (Megatron main): a checkpoint saved at
// iteration 3 resumed as iteration 1 trains iterations 2..6 with consumed samples counted from
// 1 x the global batch size (the data loader replays from there), and prints Megatron's line;
// refused with --finetune.
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1 --train-iters 6";

TEST(OverrideCkptIterationCli, ReplaysFromTheGivenIteration) {
  testing::TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  testing::CommandResult whole = testing::run_gale("pretrain " + kModel, dir.path());
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  testing::CommandResult first =
      testing::run_gale("pretrain " + kModel + " --exit-interval 3 --save-interval 100 --save " + ckpt, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  testing::CommandResult resumed =
      testing::run_gale("pretrain " + kModel + " --load " + ckpt + " --override-ckpt-iteration 1", dir.path());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("--override-ckpt-iteration: start at iteration 1 (consumed_train_samples 4)"),
            std::string::npos)
      << resumed.out;
  const std::vector<double> consumed = testing::logged_values(resumed.out, "consumed samples");
  EXPECT_EQ(consumed, (std::vector<double>{8, 12, 16, 20, 24}));
  const std::vector<double> iterations = testing::regex_values(resumed.out, "iteration +([0-9]+)/ +6 \\|");
  EXPECT_EQ(iterations, (std::vector<double>{2, 3, 4, 5, 6}));
  // Iteration 2 reads the whole run's iteration-2 samples with the weights of iteration 3: a loss
  // of its own (neither the whole run's iteration 2 nor 4).
  const std::vector<double> a = testing::logged_values(whole.out, "lm loss"), b = testing::logged_values(resumed.out, "lm loss");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 5u);
  EXPECT_NE(b[0], a[1]);
  EXPECT_NE(b[0], a[3]);
}

TEST(OverrideCkptIterationCli, RefusedWithFinetune) {
  testing::TempDir dir;
  testing::CommandResult r =
      testing::run_gale("pretrain " + kModel + " --finetune --override-ckpt-iteration 2", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("--override-ckpt-iteration with --finetune: cannot override checkpoint iteration "
                                 "together with finetune flag"),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace gale
