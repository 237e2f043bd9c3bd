// The multi-token prediction flags: Megatron's names and defaults, the model config they give, the
// MTP layers in the FLOPs formula, pipeline parallelism (with VPP) accepted, and one-line errors
// naming the flag for what MTP does not compose with (context parallelism, as in Megatron).
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/model_setup.h"
#include "train/training_log.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(MtpArguments, MegatronDefaultsAndTheModelConfig) {
  Cli off;
  ASSERT_TRUE(off.parse_minimal({}).ok());
  off.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(off.args).mtp_num_layers, 0);
  EXPECT_EQ(off.args.model.mtp_loss_scaling_factor, 0.1);
  Cli on;
  ASSERT_TRUE(on.parse_minimal({"--mtp-num-layers", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2).ok());
  on.args.model.padded_vocab_size = 128;
  const ModelConfig c = model_config_from_args(on.args);
  EXPECT_EQ(c.mtp_num_layers, 2);
  EXPECT_EQ(c.mtp_loss_scaling_factor, 0.1);
  Cli factor;
  ASSERT_TRUE(factor.parse_minimal({"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"}).ok());
  factor.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(factor.args).mtp_loss_scaling_factor, 0.3);
}

TEST(MtpArguments, PipelineParallelismIsAccepted) {
  Cli pp;
  EXPECT_TRUE(pp.parse_minimal({"--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2"}, 2).ok());
  Cli vpp;
  const Status vs = vpp.parse_minimal({"--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2", "--num-layers",
                                       "4", "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "4"},
                                      2);
  EXPECT_TRUE(vs.ok()) << vs.message();
  EXPECT_EQ(vpp.args.parallel.virtual_pipeline_model_parallel_size, 2);
}

// The MTP layers follow the last decoder layer's kind (Megatron builds them from its spec).
TEST(MtpArguments, MtpLayersTakeTheLastLayersMoeKind) {
  MoeConfig m;
  m.num_experts = 4;
  m.pattern = {1, 0};
  EXPECT_FALSE(m.is_moe_layer(2));
  m.pattern = {0, 1};
  EXPECT_TRUE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));
  ModelConfig c;
  c.num_layers = 2;
  c.moe = m;
  c.mtp_num_layers = 2;
  EXPECT_EQ(c.num_moe_layers(), 3);
}

// Megatron's num_floating_point_operations with MTP: each MTP layer is one more decoder layer, plus
// 6·(3h + 2h²) per token for its norms and eh_proj, plus one more output-layer product.
TEST(MtpArguments, FlopsCountTheMtpLayers) {
  FlopsModel m;
  m.seq_length = 16;
  m.num_layers = 2;
  m.hidden = 32;
  m.heads = 4;
  m.query_groups = 4;
  m.kv_channels = 8;
  m.ffn = 128;
  m.padded_vocab = 256;
  FlopsModel with = m;
  with.num_layers = 3;
  with.mtp_num_layers = 1;
  const double h = 32, tokens = 2.0 * 16;
  const double per_layer = (num_floating_point_operations(m, 2) - 6.0 * tokens * h * 256) / 2.0;
  const double expected = num_floating_point_operations(m, 2) + per_layer + 6.0 * tokens * (3 * h + 2 * h * h) +
                          6.0 * tokens * h * 256;
  EXPECT_NEAR(num_floating_point_operations(with, 2), expected, 1e-9 * expected);
}

class MtpArgumentErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(MtpArgumentErrors, OneLineNamingTheFlag) {
  testing::expect_one_line_error(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MtpArgumentErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--mtp-num-layers", "0"}, 1, "--mtp-num-layers: expected at least 1, found 0"},
        testing::FlagErrorCase{{"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "-1"}, 1,
                  "--mtp-loss-scaling-factor: expected a number ≥ 0, found -1"},
        testing::FlagErrorCase{{"--mtp-num-layers", "1", "--context-parallel-size", "2"}, 2,
                  "--mtp-num-layers with --context-parallel-size 2: Megatron does not support multi-token "
                  "prediction with context parallelism (expected --context-parallel-size 1)"}));

}  // namespace
}  // namespace gale
