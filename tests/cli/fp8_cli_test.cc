// `gale pretrain --fp8-format` end to end: the feature is listed active; with the delayed recipe a
// run saved at iteration 3 and resumed continues with the whole run's losses exactly (the amax
// histories and scales are in the checkpoint); every recipe trains under --bf16 and changes the loss.
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/resume_check.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1 --swiglu --disable-bias-linear";

using testing::logged_values;

// History 4 with the max algorithm and a margin: the resumed run must restore every history row.
TEST(Fp8Cli, DelayedScalingResumesExactly) {
  testing::TempDir dir;
  const std::string out = testing::expect_resumes_exactly(
      kModel + " --bf16 --use-distributed-optimizer --fp8-format hybrid --fp8-recipe delayed "
               "--fp8-amax-history-len 4 --fp8-amax-compute-algo max --fp8-margin 1",
      dir.path());
  EXPECT_NE(out.find("active: fp8"), std::string::npos) << out;
}

// A checkpoint saved without FP8 loads into a delayed-scaling run (its state starts afresh, as TE's
// empty _extra_state); loading it back without FP8 ignores the saved FP8 state.
TEST(Fp8Cli, CheckpointsCrossTheFp8Boundary) {
  testing::TempDir dir;
  const std::string a = dir.path() + "/plain", b = dir.path() + "/fp8";
  testing::CommandResult save =
      testing::run_gale("pretrain " + kModel + " --train-iters 2 --save-interval 2 --save " + a, dir.path());
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  testing::CommandResult fp8 = testing::run_gale(
      "pretrain " + kModel + " --train-iters 4 --fp8-format e4m3 --load " + a + " --save-interval 4 --save " + b,
      dir.path());
  ASSERT_EQ(fp8.exit_code, 0) << fp8.out << fp8.err;
  EXPECT_EQ(logged_values(fp8.out, "lm loss").size(), 2u) << fp8.out;
  testing::CommandResult back = testing::run_gale("pretrain " + kModel + " --train-iters 5 --load " + b, dir.path());
  ASSERT_EQ(back.exit_code, 0) << back.out << back.err;
  EXPECT_EQ(logged_values(back.out, "lm loss").size(), 1u) << back.out;
}

TEST(Fp8Cli, EveryRecipeTrainsAndChangesTheLoss) {
  testing::TempDir dir;
  testing::CommandResult plain = testing::run_gale("pretrain " + kModel + " --bf16 --train-iters 3", dir.path());
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  const std::vector<double> base = logged_values(plain.out, "lm loss");
  ASSERT_EQ(base.size(), 3u);
  for (const char* recipe : {"delayed", "tensorwise", "mxfp8"}) {
    testing::CommandResult r = testing::run_gale(
        "pretrain " + kModel + " --bf16 --train-iters 3 --fp8-format e4m3 --fp8-recipe " + recipe, dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::vector<double> l = logged_values(r.out, "lm loss");
    ASSERT_EQ(l.size(), 3u) << recipe;
    EXPECT_NE(l, base) << recipe;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(l[i], base[i], 0.02 * base[i]) << recipe << " iteration " << i + 1;
  }
}

}  // namespace
}  // namespace gale
