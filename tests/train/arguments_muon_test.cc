// --optimizer muon's flags: Megatron's names and defaults, what reaches OptimizerConfig, and the
// one-line refusals (what Megatron refuses with an emerging optimizer, and what Gale lacks yet);
// the layer-wise distributed optimizer's spellings.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(ArgumentsMuon, MegatronDefaults) {
  Cli c;
  ASSERT_TRUE(c.parse_minimal({"--optimizer", "muon"}).ok());
  const OptimizerConfig o = optimizer_config_from_args(c.args);
  EXPECT_EQ(o.type, "muon");
  EXPECT_DOUBLE_EQ(o.muon.momentum, 0.9);
  EXPECT_FALSE(o.muon.nesterov);
  EXPECT_TRUE(o.muon.split_qkv);
  EXPECT_EQ(o.muon.scale_mode, "spectral");
  EXPECT_EQ(o.muon.fp32_matmul_prec, "medium");
  EXPECT_EQ(o.muon.coefficient_type, "quintic");
  EXPECT_EQ(o.muon.num_ns_steps, 5);
  EXPECT_EQ(o.muon.tp_mode, "duplicated");
  EXPECT_DOUBLE_EQ(o.muon.extra_scale_factor, 1.0);
  EXPECT_EQ(c.args.training.muon_scalar_optimizer, "adam");
}

TEST(ArgumentsMuon, FlagsReachTheOptimizerConfig) {
  Cli c;
  ASSERT_TRUE(c.parse_minimal({"--optimizer", "muon", "--muon-momentum", "0.95", "--muon-nesterov",
                               "--muon-no-split-qkv", "--muon-scale-mode", "unit_rms_norm", "--muon-fp32-matmul-prec",
                               "high", "--muon-coefficient-type", "polar_express", "--muon-num-ns-steps", "8",
                               "--muon-tp-mode", "blockwise", "--muon-extra-scale-factor", "0.2", "--muon-use-syrk"})
                  .ok());
  const OptimizerConfig o = optimizer_config_from_args(c.args);
  EXPECT_DOUBLE_EQ(o.muon.momentum, 0.95);
  EXPECT_TRUE(o.muon.nesterov);
  EXPECT_FALSE(o.muon.split_qkv);
  EXPECT_EQ(o.muon.scale_mode, "unit_rms_norm");
  EXPECT_EQ(o.muon.fp32_matmul_prec, "high");
  EXPECT_EQ(o.muon.coefficient_type, "polar_express");
  EXPECT_EQ(o.muon.num_ns_steps, 8);
  EXPECT_EQ(o.muon.tp_mode, "blockwise");
  EXPECT_DOUBLE_EQ(o.muon.extra_scale_factor, 0.2);
  // The Muon flags are inert with another optimizer, as in Megatron (not validated there either).
  Cli adam;
  EXPECT_TRUE(adam.parse_minimal({"--muon-coefficient-type", "nonsense", "--muon-num-ns-steps", "0"}).ok());
}

// Megatron's layer-wise distributed optimizer: --optimizer muon --use-distributed-optimizer, or the
// deprecated --optimizer dist_muon (which becomes exactly that); the TP distributed mode and MoE
// experts are accepted.
TEST(ArgumentsMuon, LayerWiseDistributedOptimizerAndExperts) {
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--optimizer", "dist_muon"},
                                                std::vector<std::string>{"--optimizer", "muon",
                                                                         "--use-distributed-optimizer"}}) {
    Cli c;
    ASSERT_TRUE(c.parse_minimal(flags).ok()) << flags[1];
    EXPECT_EQ(c.args.training.optimizer, "muon");
    EXPECT_TRUE(c.args.parallel.use_distributed_optimizer);
    EXPECT_EQ(optimizer_config_from_args(c.args).type, "muon");
  }
  Cli tp;
  ASSERT_TRUE(tp.parse_minimal({"--optimizer", "muon", "--muon-tp-mode", "distributed"}).ok());
  EXPECT_EQ(optimizer_config_from_args(tp.args).muon.tp_mode, "distributed");
  Cli moe;
  EXPECT_TRUE(moe.parse_minimal({"--optimizer", "muon", "--num-experts", "4"}).ok());
}

class MuonFlagErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(MuonFlagErrors, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Refusals, MuonFlagErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--optimizer", "muon", "--use-distributed-optimizer", "--overlap-grad-reduce",
                                "--overlap-param-gather"},
                               1, "--optimizer muon with --use-distributed-optimizer and --overlap-param-gather: not "
                                  "supported yet"},
        testing::FlagErrorCase{{"--optimizer", "dist_muon", "--quant-grads"}, 1,
                               "--optimizer muon with --use-distributed-optimizer and --quant-grads: not supported yet"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--fp16"}, 1, "--optimizer muon with --fp16"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--ckpt-format", "zarr"}, 1,
                               "--optimizer muon: expected --ckpt-format torch or torch_dist, found zarr"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-scalar-optimizer", "lion", "--lion-beta2", "1"}, 1,
                               "--lion-beta2: expected Lion's beta in [0, 1), found 1"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-tp-mode", "split"}, 1, "--muon-tp-mode"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-fp32-matmul-prec", "low"}, 1,
                               "--muon-fp32-matmul-prec: expected medium or high, found low"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-coefficient-type", "custom"}, 1,
                               "--muon-coefficient-type: expected one of simple, quintic"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-num-ns-steps", "0"}, 1,
                               "--muon-num-ns-steps: expected at least 1, found 0"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-coefficient-type", "cubic5", "--muon-num-ns-steps", "6"},
                               1, "--muon-num-ns-steps: expected 5 with --muon-coefficient-type cubic5, found 6"},
        testing::FlagErrorCase{{"--optimizer", "muon", "--muon-scale-mode", "rms"}, 1, "--muon-scale-mode"}));

}  // namespace
}  // namespace gale
