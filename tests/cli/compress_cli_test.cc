// `gale pretrain --compress-optimizer / --compress-activation / --compress-dense` end to end: each
// feature is listed active, the log lines (losses, gradient norms) are the plain run's exactly, the
// compression report is printed after training; below --optimization-level 2 the flags are off with
// a notice; a conflicting pair is refused with one line.
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1 --train-iters 4";

using testing::logged_values;

TEST(CompressCli, LogsThePlainRunsValuesAndReports) {
  testing::TempDir dir;
  testing::CommandResult plain = testing::run_gale("pretrain " + kModel, dir.path());
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  const std::vector<double> loss = logged_values(plain.out, "lm loss"), norm = logged_values(plain.out, "grad norm");
  ASSERT_EQ(loss.size(), 4u);
  struct Case {
    std::string flags, feature, report;
  };
  const Case cases[] = {
      {"--compress-optimizer", "compress-optimizer", " > --compress-optimizer: optimizer state of rank 0: "},
      {"--compress-activation 0", "compress-activation", " > --compress-activation: rank 0 compressed "},
      {"--compress-activation 2", "compress-activation", " > --compress-activation: rank 0 compressed "},
      {"--compress-dense level0", "compress-dense", " > --compress-dense: rank 0 compressed "},
      {"--compress-dense level1", "compress-dense", " in the file (ratio "},
  };
  for (const Case& c : cases) {
    testing::CommandResult r = testing::run_gale("pretrain " + kModel + " " + c.flags, dir.path());
    ASSERT_EQ(r.exit_code, 0) << c.flags << r.out << r.err;
    EXPECT_NE(r.out.find("active: " + c.feature), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.report), std::string::npos) << r.out;
    EXPECT_EQ(logged_values(r.out, "lm loss"), loss) << c.flags;
    EXPECT_EQ(logged_values(r.out, "grad norm"), norm) << c.flags;
  }
}

TEST(CompressCli, OffBelowLevelTwoAndConflictsRefused) {
  testing::TempDir dir;
  testing::CommandResult low =
      testing::run_gale("pretrain " + kModel + " --optimization-level 1 --compress-optimizer --compress-activation 0",
                        dir.path());
  ASSERT_EQ(low.exit_code, 0) << low.out << low.err;
  EXPECT_NE((low.out + low.err).find("--compress-optimizer is not active"), std::string::npos) << low.out << low.err;
  EXPECT_EQ(low.out.find(" > --compress-"), std::string::npos) << low.out;
  testing::CommandResult both =
      testing::run_gale("pretrain " + kModel + " --compress-activation 1 --compress-dense level0", dir.path());
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE((both.out + both.err).find("--compress-activation: conflicts with --compress-dense level0"),
            std::string::npos)
      << both.out << both.err;
}

}  // namespace
}  // namespace gale
