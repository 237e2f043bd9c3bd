// `gale pretrain --use-custom-fsdp` (Megatron-FSDP) under mpirun with two data-parallel ranks:
// --data-parallel-sharding-strategy optim trains exactly as --use-distributed-optimizer (the same
// losses and grad norms, to the last printed digit), no_shard exactly as plain data parallelism,
// and optim_grads_params stops at start-up with its "not supported yet" line.
#include <gtest/gtest.h>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::logged_values;

// 4 iterations of 4 samples, 2 micro-batches per rank at DP 2 (gradient accumulation).
test::RunResult tiny(std::vector<std::string> extra) {
  return test::run_with_timeout(testing::tiny_gpt_pretrain(2, 4, {"--log-interval", "1"}, extra), kMpiEnv, 300);
}

void expect_same_training(const test::RunResult& a, const test::RunResult& b) {
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_EQ(logged_values(a.output, "lm loss").size(), 4u) << a.output;
  EXPECT_EQ(logged_values(a.output, "lm loss"), logged_values(b.output, "lm loss"));
  EXPECT_EQ(logged_values(a.output, "grad norm"), logged_values(b.output, "grad norm"));
}

TEST(CustomFsdpCli, OptimTrainsAsTheDistributedOptimizer) {
  const test::RunResult fsdp =
      tiny({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim", "--overlap-grad-reduce"});
  expect_same_training(fsdp, tiny({"--use-distributed-optimizer", "--overlap-grad-reduce"}));
  for (const char* line : {"active: custom-fsdp (", "active: distributed-optimizer ("})
    EXPECT_NE(fsdp.output.find(line), std::string::npos) << line << "\n" << fsdp.output;
}

TEST(CustomFsdpCli, NoShardTrainsAsPlainDataParallelism) {
  expect_same_training(tiny({"--use-megatron-fsdp"}), tiny({}));
}

TEST(CustomFsdpCli, ParameterShardingRefusedAtStartUp) {
  const test::RunResult run = tiny({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("--data-parallel-sharding-strategy optim_grads_params: not supported yet"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace gale
