// `gale pretrain --check-weight-hash-across-dp-replicas-interval N`: the data-parallel replicas'
// parameter hashes agree before the first iteration and every N iterations, under mpirun with two
// data-parallel ranks (with and without the distributed optimizer and its overlapped all-gather),
// and Megatron's line says so. (tests/train/param_hash_test.cc makes replicas differ.)
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::launch_argv;

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
  EXPECT_EQ(run.output.find("after 1 iterations"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("after 3 iterations"), std::string::npos) << run.output;
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

}  // namespace
}  // namespace gale
