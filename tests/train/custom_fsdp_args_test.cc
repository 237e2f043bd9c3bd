// Megatron's custom FSDP flags (--use-custom-fsdp / --use-megatron-fsdp with
// --data-parallel-sharding-strategy): no_shard and optim map onto Gale's data-parallel paths,
// optim_grads and optim_grads_params are refused at start-up with a message naming the strategy.
#include <gtest/gtest.h>

#include "features/registry.h"
#include "pretrain_cli.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

TEST(CustomFsdpArgs, DefaultsAsMegatron) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({}).ok());
  EXPECT_FALSE(cli.args.parallel.use_custom_fsdp);
  EXPECT_EQ(cli.args.parallel.data_parallel_sharding_strategy, "no_shard");
  EXPECT_FALSE(cli.args.parallel.use_distributed_optimizer);
}

TEST(CustomFsdpArgs, NoShardIsPlainDataParallelism) {
  for (const char* flag : {"--use-custom-fsdp", "--use-megatron-fsdp"}) {
    PretrainCli cli;
    const Status st = cli.parse_minimal({flag, "--global-batch-size", "8"}, 4);
    ASSERT_TRUE(st.ok()) << flag << ": " << st.to_string();
    EXPECT_TRUE(cli.args.parallel.use_custom_fsdp) << flag;
    EXPECT_FALSE(cli.args.parallel.use_distributed_optimizer) << flag;
    EXPECT_EQ(cli.args.parallel.data_parallel_size, 4);
  }
}

TEST(CustomFsdpArgs, OptimIsTheDistributedOptimizer) {
  for (const char* flag : {"--use-custom-fsdp", "--use-megatron-fsdp"}) {
    PretrainCli cli;
    const Status st = cli.parse_minimal(
        {flag, "--data-parallel-sharding-strategy", "optim", "--global-batch-size", "8", "--overlap-grad-reduce",
         "--overlap-param-gather"},
        4);
    ASSERT_TRUE(st.ok()) << flag << ": " << st.to_string();
    EXPECT_TRUE(cli.args.parallel.use_distributed_optimizer) << flag;
  }
  // Given together with Megatron-FSDP's recommended --use-distributed-optimizer.
  PretrainCli both;
  EXPECT_TRUE(both.parse_minimal({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim",
                                  "--use-distributed-optimizer", "--global-batch-size", "8"},
                                 2)
                  .ok());
  EXPECT_TRUE(both.args.parallel.use_distributed_optimizer);
}

TEST(CustomFsdpArgs, StrategyWithoutFsdpChangesNothing) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--data-parallel-sharding-strategy", "optim", "--global-batch-size", "8"}, 2).ok());
  EXPECT_FALSE(cli.args.parallel.use_distributed_optimizer);
}

TEST(CustomFsdpArgs, GradientAndParameterShardingRefused) {
  PretrainCli cli;
  const Status st = cli.parse_minimal(
      {"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--global-batch-size", "8"}, 2);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  expect_one_line_error({{"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"},
                         2,
                         "--data-parallel-sharding-strategy optim_grads_params: not supported yet (ZeRO-3"});
  expect_one_line_error({{"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"},
                         2,
                         "--data-parallel-sharding-strategy optim_grads: not supported yet (ZeRO-2"});
  expect_one_line_error({{"--use-custom-fsdp", "--data-parallel-sharding-strategy", "zero3"}, 1,
                         "--data-parallel-sharding-strategy"});
  expect_one_line_error({{"--use-custom-fsdp", "--use-distributed-optimizer"},
                         2,
                         "expected --data-parallel-sharding-strategy optim (ZeRO-1), found no_shard"});
}

TEST(CustomFsdpArgs, RegisteredAsAFeature) {
  auto registry = make_feature_registry();
  PretrainCli cli;
  registry->register_args(cli.parser);
  ASSERT_TRUE(cli.parse_minimal({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim"}).ok());
  FeatureContext ctx = make_feature_context(cli.args, cli.parser, *registry);
  std::vector<std::string> notices;
  ASSERT_TRUE(registry->resolve(ctx, &notices).ok());
  const Feature* f = registry->find("custom-fsdp");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->requested(ctx));
  EXPECT_EQ(f->flag(), "--use-custom-fsdp");
}

}  // namespace
}  // namespace gale
