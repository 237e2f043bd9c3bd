// `gale layout` prints the rank layout of the flags, and refuses an impossible layout with one
// line naming the flags and exit code 2.
#include <gtest/gtest.h>

#include "subprocess.h"

namespace gale {
namespace {

TEST(GaleLayout, PrintsTheWorkedExample) {
  test::RunResult r =
      test::run_with_timeout({GALE_BINARY, "layout", "--world-size", "8", "--tensor-model-parallel-size", "2",
                              "--pipeline-model-parallel-size", "2"},
                             {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank = tp + 2*dp + 4*pp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  dp                  [0,2] [1,3] [4,6] [5,7]\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  pp                  [0,4] [1,5] [2,6] [3,7]\n"), std::string::npos) << r.output;
}

TEST(GaleLayout, TpPpDpMapping) {
  test::RunResult r =
      test::run_with_timeout({GALE_BINARY, "layout", "--world-size", "8", "--tensor-model-parallel-size", "2",
                              "--pipeline-model-parallel-size", "2", "--use-tp-pp-dp-mapping"},
                             {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("order tp-cp-ep-pp-dp: rank = tp + 2*pp + 4*dp"), std::string::npos) << r.output;
}

// --tp-2d --tp-x X: the X and Y groups of every TP group (the docs/parallelism.md §15 example).
TEST(GaleLayout, Tp2dGroups) {
  test::RunResult r = test::run_with_timeout(
      {GALE_BINARY, "layout", "--world-size", "8", "--tensor-model-parallel-size", "4", "--tp-2d", "--tp-x", "2"}, {},
      60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp-2d: TP 4 = X 2 x Y 2, tp rank = x + 2*y\n"
                          "  tp-x                [0,1] [2,3] [4,5] [6,7]\n"
                          "  tp-y                [0,2] [1,3] [4,6] [5,7]\n"),
            std::string::npos)
      << r.output;
  test::RunResult bad = test::run_with_timeout(
      {GALE_BINARY, "layout", "--world-size", "8", "--tensor-model-parallel-size", "4", "--tp-2d", "--tp-x", "3"}, {},
      60);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.output, "gale layout: --tp-2d: --tp-x 3 must divide --tensor-model-parallel-size 4\n");
}

TEST(GaleLayout, ImpossibleLayoutIsOneLineAndExitCode2) {
  test::RunResult r =
      test::run_with_timeout({GALE_BINARY, "layout", "--world-size", "6", "--tensor-model-parallel-size", "4"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "gale layout: world size 6 is not divisible by --tensor-model-parallel-size 4 x "
            "--pipeline-model-parallel-size 1 x --context-parallel-size 1 = 4\n");
  test::RunResult missing = test::run_with_timeout({GALE_BINARY, "layout"}, {}, 60);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.output, "gale layout: --world-size is required (a positive integer)\n");
}

}  // namespace
}  // namespace gale
