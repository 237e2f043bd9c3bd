// --optimizer lion's and --muon-scalar-optimizer lion's flags: Megatron's names and defaults, what
// reaches OptimizerConfig, the layer-wise distributed optimizer, and the whole one-line refusals.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(ArgumentsLion, MegatronDefaults) {
  Cli c;
  ASSERT_TRUE(c.parse_minimal({"--optimizer", "lion"}).ok());
  const OptimizerConfig o = optimizer_config_from_args(c.args);
  EXPECT_EQ(o.type, "lion");
  EXPECT_DOUBLE_EQ(o.lion.beta1, 0.95);
  EXPECT_DOUBLE_EQ(o.lion.beta2, 0.98);
  // --optimizer lion's own Lion takes the Adam betas (Megatron's emerging-optimizer kwargs).
  EXPECT_DOUBLE_EQ(o.beta1, 0.9);
  EXPECT_DOUBLE_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.muon.scalar_optimizer, "adam");
}

TEST(ArgumentsLion, FlagsReachTheOptimizerConfig) {
  Cli c;
  ASSERT_TRUE(c.parse_minimal({"--optimizer", "muon", "--muon-scalar-optimizer", "lion", "--lion-beta1", "0.9",
                               "--lion-beta2", "0.99"})
                  .ok());
  const OptimizerConfig o = optimizer_config_from_args(c.args);
  EXPECT_EQ(o.type, "muon");
  EXPECT_EQ(o.muon.scalar_optimizer, "lion");
  EXPECT_DOUBLE_EQ(o.lion.beta1, 0.9);
  EXPECT_DOUBLE_EQ(o.lion.beta2, 0.99);
  Cli l;
  ASSERT_TRUE(l.parse_minimal({"--optimizer", "lion", "--adam-beta1", "0.8", "--adam-beta2", "0.95"}).ok());
  EXPECT_DOUBLE_EQ(optimizer_config_from_args(l.args).beta1, 0.8);
  EXPECT_DOUBLE_EQ(optimizer_config_from_args(l.args).beta2, 0.95);
}

// Megatron turns --use-distributed-optimizer into its layer-wise one for every emerging optimizer.
TEST(ArgumentsLion, LayerWiseDistributedOptimizer) {
  Cli c;
  ASSERT_TRUE(c.parse_minimal({"--optimizer", "lion", "--use-distributed-optimizer"}).ok());
  EXPECT_TRUE(c.args.parallel.use_distributed_optimizer);
  EXPECT_EQ(optimizer_config_from_args(c.args).type, "lion");
}

class LionFlagErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(LionFlagErrors, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Refusals, LionFlagErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--optimizer", "lion", "--fp16"}, 1,
                               "--optimizer lion with --fp16: expected --bf16 or fp32 (Megatron: emerging optimizer "
                               "with fp16 is not supported)"},
        testing::FlagErrorCase{{"--optimizer", "lion", "--ckpt-format", "zarr"}, 1,
                               "--optimizer lion: expected --ckpt-format torch or torch_dist, found zarr (Megatron's "
                               "emerging optimizers support those two)"},
        testing::FlagErrorCase{{"--optimizer", "lion", "--adam-beta1", "1"}, 1,
                               "--adam-beta1: expected a value in [0, 1), found 1"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-scalar-optimizer", "lion", "--lion-beta1", "-0.5"}, 1,
                               "--lion-beta1: expected Lion's beta in [0, 1), found -0.5"},
        testing::FlagErrorCase{{"--optimizer", "lion", "--use-distributed-optimizer", "--overlap-grad-reduce",
                                "--overlap-param-gather"},
                               1,
                               "--optimizer lion with --use-distributed-optimizer and --overlap-param-gather: not "
                               "supported yet (the layer-wise distributed optimizer all-reduces the gradients and "
                               "gathers whole parameters after its step)"},
        testing::FlagErrorCase{{"--optimizer", "lion", "--use-torch-fsdp2", "--untie-embeddings-and-output-weights"}, 2,
                               "--use-torch-fsdp2 with --optimizer lion: not supported yet (Megatron refuses its "
                               "emerging optimizers with FSDP)"},
        testing::FlagErrorCase{{"--optimizer", "lion", "--optimizer", "soap"}, 1, "--optimizer"}));

}  // namespace
}  // namespace gale
