// --enable-mhc-connections and the mhc_* flags: Megatron's defaults, the model config they give,
// Megatron's args in checkpoints read back, and the combinations refused (whole messages).
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(MhcArguments, DefaultsAsMegatronAndTheModelConfig) {
  Cli plain;
  ASSERT_TRUE(plain.parse_minimal({}).ok());
  plain.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(plain.args).mhc.enabled);
  EXPECT_FALSE(model_flags_json(plain.args.model).contains("enable_mhc_connections"));  // absent: off
  Cli cli;
  const Status s = cli.parse_minimal({"--enable-mhc-connections"});
  ASSERT_TRUE(s.ok()) << s.to_string();
  cli.args.model.padded_vocab_size = 128;
  const ModelConfig c = model_config_from_args(cli.args);
  EXPECT_TRUE(c.mhc.enabled);
  EXPECT_EQ(c.mhc.streams, 4);
  EXPECT_EQ(c.mhc.sinkhorn_iterations, 20);
  EXPECT_FLOAT_EQ(c.mhc.init_gating_factor, 0.01f);
  Cli set;
  ASSERT_TRUE(set.parse_minimal({"--enable-mhc-connections", "--mhc-num-residual-streams", "2", "--mhc-sinkhorn-iterations",
                                 "7", "--mhc-init-gating-factor", "0.5"})
                  .ok());
  set.args.model.padded_vocab_size = 128;
  const ModelConfig d = model_config_from_args(set.args);
  EXPECT_EQ(d.mhc.streams, 2);
  EXPECT_EQ(d.mhc.sinkhorn_iterations, 7);
  EXPECT_FLOAT_EQ(d.mhc.init_gating_factor, 0.5f);
}

TEST(MhcArguments, CheckpointArgsHoldMegatronsFieldsAndReadBack) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--enable-mhc-connections", "--mhc-num-residual-streams", "2"}).ok());
  const nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["enable_mhc_connections"], true);
  EXPECT_EQ(j["mhc_num_residual_streams"], 2);
  EXPECT_EQ(j["mhc_sinkhorn_iterations"], 20);
  EXPECT_DOUBLE_EQ(j["mhc_init_gating_factor"].get<double>(), 0.01);
  EXPECT_TRUE(j["mhc_recompute_layer_num"].is_null());
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back.value().enable_mhc_connections);
  EXPECT_EQ(back.value().mhc_num_residual_streams, 2);
  EXPECT_EQ(back.value().mhc_sinkhorn_iterations, 20);
}

struct Case {
  std::vector<std::string> flags;
  int64_t world;
  std::string message;  // the whole message
};

class MhcArgumentErrors : public ::testing::TestWithParam<Case> {};

TEST_P(MhcArgumentErrors, WholeMessage) {
  Cli cli;
  const Status s = cli.parse_minimal(GetParam().flags, GetParam().world);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), GetParam().message);
}

const std::string kOn = "--enable-mhc-connections";

INSTANTIATE_TEST_SUITE_P(
    Cases, MhcArgumentErrors,
    ::testing::Values(
        Case{{kOn, "--mhc-num-residual-streams", "0"}, 1,
             "--mhc-num-residual-streams: expected a positive integer, found 0"},
        Case{{kOn, "--mhc-sinkhorn-iterations", "0"}, 1,
             "--mhc-sinkhorn-iterations: expected at least 1 (the Sinkhorn-Knopp backward assumes one row "
             "normalisation), found 0"},
        Case{{kOn, "--mhc-init-gating-factor", "-0.5"}, 1,
             "--mhc-init-gating-factor: expected a non-negative value, found -0.5"},
        Case{{"--recompute-granularity", "selective", "--recompute-modules", "mhc"}, 1,
             "--recompute-modules mhc: expected --enable-mhc-connections, found it off"},
        Case{{kOn, "--recompute-granularity", "selective", "--recompute-modules", "mhc", "mlp"}, 1,
             "--recompute-modules mhc and mlp: expected one of them (Megatron refuses both together)"},
        Case{{kOn, "--recompute-granularity", "selective", "--recompute-modules", "mhc", "--mhc-recompute-layer-num", "0"},
             1, "--mhc-recompute-layer-num: expected a positive integer, found 0"},
        Case{{kOn, "--pipeline-model-parallel-size", "2"}, 2,
             "--enable-mhc-connections with --pipeline-model-parallel-size 2: expected 1 (Megatron does not support "
             "mHC with pipeline parallelism yet)"},
        Case{{kOn, "--mtp-num-layers", "1"}, 1,
             "--enable-mhc-connections with --mtp-num-layers: expected no multi-token prediction (Megatron refuses "
             "it)"},
        Case{{kOn, "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
             1,
             "--enable-mhc-connections with --recompute-granularity full: expected selective or none (Megatron "
             "refuses full recomputation with mHC)"},
        Case{{kOn, "--fp32-residual-connection"}, 1,
             "--enable-mhc-connections with --fp32-residual-connection: expected it off (Megatron refuses it: the "
             "mHC residual is the n-stream tensor)"},
        Case{{kOn, "--num-experts", "4"}, 1,
             "--enable-mhc-connections with --num-experts: expected a dense model (Megatron's "
             "HyperConnectionTransformerLayer refuses MoE MLPs)"},
        Case{{kOn, "--noop-layers", "1"}, 1, "--enable-mhc-connections with --noop-layers: not supported yet"}));

// What Megatron main allows with mHC and Gale does too: --recompute-modules mhc (alone, with other
// modules, with --mhc-recompute-layer-num: RecomputePlan::mhc), context parallelism with each
// algorithm, and multi-latent attention.
TEST(MhcArguments, RecomputeModulesMhcContextParallelismAndMlaAreAccepted) {
  struct Accepted {
    std::vector<std::string> flags;
    int64_t world;
  };
  const std::vector<Accepted> accepted = {
      {{kOn, "--recompute-granularity", "selective", "--recompute-modules", "mhc"}, 1},
      {{kOn, "--recompute-activations", "--recompute-modules", "mhc", "layernorm", "core_attn",
        "--mhc-recompute-layer-num", "2"}, 1},
      {{kOn, "--context-parallel-size", "2"}, 2},
      {{kOn, "--context-parallel-size", "2", "--cp-comm-type", "allgather"}, 2},
      {{kOn, "--context-parallel-size", "2", "--cp-comm-type", "a2a"}, 2},
      {{kOn, "--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}, 2},
      {{kOn, "--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8",
        "--v-head-dim", "16"}, 1},
  };
  for (const Accepted& a : accepted) {
    Cli cli;
    const Status s = cli.parse_minimal(a.flags, a.world);
    EXPECT_TRUE(s.ok()) << ::testing::PrintToString(a.flags) << ": " << s.to_string();
  }
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({kOn, "--recompute-activations", "--recompute-modules", "mhc", "layernorm",
                                 "--mhc-recompute-layer-num", "2"})
                  .ok());
  RecomputePlan plan;
  apply_recompute_modules(cli.args.model, &plan);
  EXPECT_TRUE(plan.mhc);
  EXPECT_EQ(plan.mhc_layer_num, 2);
  EXPECT_EQ(plan.norm_layers, RecomputePlan::kAllLayers);
  Cli whole;
  ASSERT_TRUE(whole.parse_minimal({kOn, "--recompute-granularity", "selective", "--recompute-modules", "mhc"}).ok());
  RecomputePlan one_block;
  apply_recompute_modules(whole.args.model, &one_block);
  EXPECT_TRUE(one_block.mhc);
  EXPECT_EQ(one_block.mhc_layer_num, 0);
}

}  // namespace
}  // namespace gale
