// `gale pretrain --calculate-per-token-loss --iterations-to-skip` as a user runs it: on mock data
// with --eod-mask-loss (loss masks that differ between micro-batches), two data-parallel ranks
// under mpirun print the single-process losses; the skipped iteration prints no line and the next
// lines count its samples as skipped. (tests/train/per_token_loss_test.cc compares the modes.)
#include <gtest/gtest.h>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::logged_values;

// A tiny GPT for 5 iterations of 4 samples (2 micro-batches per rank at DP 2), a log line each.
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  return testing::tiny_gpt_pretrain(np, 5, {"--log-interval", "1", "--eod-mask-loss", "--iterations-to-skip", "2"}, extra);
}

TEST(PerTokenLossCli, DataParallelRanksPrintTheSingleProcessLosses) {
  const test::RunResult one = test::run_with_timeout(tiny(1, {"--calculate-per-token-loss"}), {}, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const test::RunResult two = test::run_with_timeout(tiny(2, {"--calculate-per-token-loss"}), kMpiEnv, 300);
  ASSERT_EQ(two.exit_code, 0) << two.output;

  const std::vector<double> a = logged_values(one.output, "lm loss"), b = logged_values(two.output, "lm loss");
  ASSERT_EQ(a.size(), 4u) << one.output;  // iteration 3 (counted from 0: 2) is skipped
  ASSERT_EQ(b.size(), 4u) << two.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "log line " << i + 1;

  EXPECT_EQ(one.output.find("iteration        3/"), std::string::npos) << one.output;
  EXPECT_EQ(logged_values(one.output, "consumed samples"), (std::vector<double>{4, 8, 16, 20}));
  EXPECT_EQ(logged_values(one.output, "skipped samples"), (std::vector<double>{4, 4}));
  EXPECT_EQ(logged_values(two.output, "skipped samples"), (std::vector<double>{4, 4}));
}

}  // namespace
}  // namespace gale
