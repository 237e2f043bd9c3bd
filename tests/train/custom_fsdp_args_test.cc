// Megatron's custom FSDP flags (--use-custom-fsdp / --use-megatron-fsdp with
// --data-parallel-sharding-strategy): no_shard and optim map onto Gale's data-parallel paths,
// optim_grads is ZeRO-2 and optim_grads_params ZeRO-3 (each refused with what it does not support).
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

TEST(CustomFsdpArgs, OptimGradsParamsIsZero3) {
  PretrainCli cli;
  const Status st = cli.parse_minimal({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                                       "--use-distributed-optimizer", "--global-batch-size", "8"},
                                      2);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(cli.args.parallel.zero3());
  PretrainCli plain;
  ASSERT_TRUE(plain.parse_minimal({"--data-parallel-sharding-strategy", "optim_grads_params"}).ok());
  EXPECT_FALSE(plain.args.parallel.zero3());  // the strategy alone changes nothing, as in Megatron
}

TEST(CustomFsdpArgs, OptimGradsIsZero2) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
                                 "--global-batch-size", "8"},
                                2)
                  .ok());
  EXPECT_TRUE(cli.args.parallel.zero2());
  EXPECT_FALSE(cli.args.parallel.zero3());
  expect_one_line_error({{"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--bf16"},
                         2,
                         "--data-parallel-sharding-strategy optim_grads with --bf16: not supported yet"});
  expect_one_line_error({{"--use-custom-fsdp", "--data-parallel-sharding-strategy", "zero3"}, 1,
                         "--data-parallel-sharding-strategy"});
  expect_one_line_error({{"--use-custom-fsdp", "--use-distributed-optimizer"},
                         2,
                         "expected --data-parallel-sharding-strategy optim (ZeRO-1), found no_shard"});
}

// What ZeRO-3 does not run with: each refused at start-up, naming the flag.
TEST(CustomFsdpArgs, Zero3CombinationsRefused) {
  const std::vector<std::string> zero3 = {"--use-custom-fsdp", "--data-parallel-sharding-strategy",
                                          "optim_grads_params"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tensor-model-parallel-size", "2"}, "with --tensor-model-parallel-size 2: not supported yet"},
      {{"--pipeline-model-parallel-size", "2"}, "with --pipeline-model-parallel-size 2: not supported yet"},
      {{"--context-parallel-size", "2"}, "with --context-parallel-size 2: not supported yet"},
      {{"--num-experts", "4"}, "with MoE layers (--num-experts): not supported yet"},
      {{"--bf16"}, "with --bf16: not supported yet"},
      {{"--fp16"}, "with --fp16: not supported yet"},
      {{"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"},
       "with --recompute-granularity full --recompute-method uniform --recompute-num-layers 2: not supported yet"},
      {{"--calculate-per-token-loss"}, "with --calculate-per-token-loss: not supported yet"},
      {{"--check-weight-hash-across-dp-replicas-interval", "2"},
       "with --check-weight-hash-across-dp-replicas-interval: not supported yet"},
      {{"--optimizer", "muon"}, "with --optimizer muon: not supported yet"},
  };
  for (const auto& [flags, expected] : cases) {
    std::vector<std::string> all = zero3;
    all.insert(all.end(), flags.begin(), flags.end());
    expect_one_line_error({all, 4, "--data-parallel-sharding-strategy optim_grads_params " + expected});
  }
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
