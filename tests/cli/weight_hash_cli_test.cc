// `gale pretrain --check-weight-hash-across-dp-replicas-interval N`: the data-parallel replicas'
// parameter hashes agree before the first iteration and every N iterations, under mpirun with two
// data-parallel ranks (with and without the distributed optimizer and its overlapped all-gather),
// and Megatron's line says so. `--test-mode` (the --qk-layernorm parameters compared before every
// iteration) at TP 2 x DP 2 trains exactly as without it. (tests/train/param_hash_test.cc makes
// replicas differ.)
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::launch_argv;
using testing::logged_values;

const std::string kModel =
    "pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 4 --lr 1e-3 --mock-data "
    "--vocab-size 4096 --eval-iters 0 --num-threads 1 --log-interval 1 --train-iters 4 "
    "--check-weight-hash-across-dp-replicas-interval 2";

test::RunResult pretrain(int np, const std::vector<std::string>& extra) {
  std::vector<std::string> program = {GALE_BINARY};
  std::istringstream words(kModel);
  for (std::string w; words >> w;) program.push_back(w);
  return test::run_with_timeout(launch_argv(np, program, extra), kMpiEnv, 300);
}

void expect_checked(const test::RunResult& run) {
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* line : {">>> Weight hashes match after 0 iterations...", ">>> Weight hashes match after 2 iterations...",
                           ">>> Weight hashes match after 4 iterations..."})
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "\n" << run.output;
  EXPECT_EQ(run.output.find("Weight hashes match after 1 iterations"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Weight hashes match after 3 iterations"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Hash not matching"), std::string::npos) << run.output;
}

TEST(WeightHashCli, DataParallelReplicasAgree) {
  expect_checked(pretrain(2, {}));
  expect_checked(pretrain(2, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}));
}

TEST(WeightHashCli, OneProcessAndBadInterval) {
  expect_checked(pretrain(1, {}));
  test::RunResult bad = pretrain(1, {"--check-weight-hash-across-dp-replicas-interval", "0"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--check-weight-hash-across-dp-replicas-interval: expected a positive integer, found 0"),
            std::string::npos)
      << bad.output;
}

TEST(TestModeCli, QkLayernormReplicasCheckedEveryIterationWithoutChangingTraining) {
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2", "--qk-layernorm",
                                           "--normalization", "LayerNorm", "--eval-iters", "1",
                                           "--eval-interval", "2"};
  std::vector<std::string> with_test_mode = layout;
  with_test_mode.push_back("--test-mode");
  const test::RunResult checked = pretrain(4, with_test_mode), plain = pretrain(4, layout);
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(checked.output.find("--test-mode: before every training and evaluation iteration"), std::string::npos)
      << checked.output;
  const std::vector<double> losses = logged_values(checked.output, "lm loss");
  EXPECT_EQ(losses.size(), 4u) << checked.output;
  EXPECT_EQ(losses, logged_values(plain.output, "lm loss"));
  EXPECT_EQ(checked.output.find("discrepancy"), std::string::npos) << checked.output;
}

}  // namespace
}  // namespace gale
