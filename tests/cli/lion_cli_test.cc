// `gale pretrain --optimizer lion` end to end: the feature is listed active, the loss falls, a run
// saved at iteration 3 and resumed continues with the whole run's losses exactly; Lion's run
// differs from AdamW's (it is not silently AdamW); --muon-scalar-optimizer lion resumes exactly too.
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"
#include "cli/resume_check.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1 --weight-decay 0.1";

using testing::logged_values;

TEST(LionCli, TrainsAndResumesExactly) {
  testing::TempDir dir;
  const std::string out = testing::expect_resumes_exactly(kModel + " --optimizer lion", dir.path());
  EXPECT_NE(out.find("active: lion"), std::string::npos) << out;
  const std::vector<double> lion = logged_values(out, "lm loss");
  ASSERT_EQ(lion.size(), 6u);
  EXPECT_LT(lion.back(), lion.front());
  testing::CommandResult adam = testing::run_gale("pretrain " + kModel + " --train-iters 6", dir.path());
  ASSERT_EQ(adam.exit_code, 0) << adam.out << adam.err;
  const std::vector<double> adamw = logged_values(adam.out, "lm loss");
  ASSERT_EQ(adamw.size(), 6u);
  EXPECT_EQ(adamw[0], lion[0]);  // the same model and data
  // AdamW's first step is lr·sign(g) too (m̂/√v̂ = g/|g|), so the runs part from the second update.
  EXPECT_NE(adamw[5], lion[5]);
}

TEST(LionCli, AsMuonsScalarOptimizerResumesExactly) {
  testing::TempDir dir;
  testing::expect_resumes_exactly(kModel + " --optimizer muon --muon-scalar-optimizer lion", dir.path());
}

// The features' refusals (checked when the engine is built), one line each.
TEST(LionCli, RefusesWithOneLine) {
  testing::TempDir dir;
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {" --use-distributed-optimizer --swap-optimizer",
            "--swap-optimizer with --optimizer lion: not supported (its distributed optimizer is the layer-wise one, "
            "not the flat shards the state file follows)"},
           {" --compress-optimizer",
            "--compress-optimizer with --optimizer lion: not supported yet (MindSpeed compresses AdamW's moments)"}}) {
    testing::CommandResult r =
        testing::run_gale("pretrain " + kModel + " --optimizer lion --train-iters 1" + flags, dir.path());
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE((r.out + r.err).find(expected), std::string::npos) << r.out << r.err;
  }
}

}  // namespace
}  // namespace gale
