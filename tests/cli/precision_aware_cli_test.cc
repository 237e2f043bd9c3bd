// `gale pretrain --use-precision-aware-optimizer` end to end: the feature is listed active, the
// per-rank state bytes are printed, a run saved at iteration 3 and resumed continues with the whole
// run's losses exactly; --bf16 --grad-reduce-in-bf16 trains; --main-params-dtype fp16 is refused with
// one line saying "not supported yet", and a dtype flag without --use-precision-aware-optimizer with
// Megatron's rule.
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
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1 --use-distributed-optimizer";
const std::string kPa = " --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16";

using testing::logged_values;

TEST(PrecisionAwareCli, TrainsAndResumesExactly) {
  testing::TempDir dir;
  const std::string out = testing::expect_resumes_exactly(kModel + kPa, dir.path());
  EXPECT_NE(out.find("active: precision-aware-optimizer"), std::string::npos) << out;
  EXPECT_NE(out.find(" > --use-precision-aware-optimizer exp_avg:fp8,exp_avg_sq:fp16: optimizer state of rank 0: "),
            std::string::npos)
      << out;
}

TEST(PrecisionAwareCli, GradReduceInBf16Trains) {
  testing::TempDir dir;
  testing::CommandResult r =
      testing::run_gale("pretrain " + kModel + " --bf16 --grad-reduce-in-bf16 --train-iters 3", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("active: precision-aware-optimizer"), std::string::npos) << r.out;
  EXPECT_EQ(logged_values(r.out, "lm loss").size(), 3u) << r.out;
}

TEST(PrecisionAwareCli, RefusesWithOneLine) {
  testing::TempDir dir;
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {kPa + " --main-params-dtype fp16", "--main-params-dtype fp16: not supported yet"},
           {" --exp-avg-dtype fp16", "--exp-avg-dtype fp16: can only be fp32 when not using the precision-aware"}}) {
    testing::CommandResult r = testing::run_gale("pretrain " + kModel + " --train-iters 1" + flags, dir.path());
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE((r.out + r.err).find(expected), std::string::npos) << r.out << r.err;
  }
}

}  // namespace
}  // namespace gale
