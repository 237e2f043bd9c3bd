// --position-embedding-type yarn: Megatron's yarn_* flags and defaults, the model config they give,
// the checkpoint args they are recorded as, and one-line errors naming the flag.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

ModelConfig config_of(Cli& cli) {
  cli.args.model.padded_vocab_size = 128;
  return model_config_from_args(cli.args);
}

TEST(YarnArguments, MegatronDefaultsWhenTheYarnFlagsAreUnset) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--position-embedding-type", "yarn", "--rotary-scaling-factor", "4"}).ok());
  const ModelConfig c = config_of(cli);
  EXPECT_EQ(c.position, PositionEmbedding::kRope);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.scaling_factor, 4.0);
  EXPECT_EQ(c.yarn.original_max_positions, 4096);
  EXPECT_EQ(c.yarn.beta_fast, 32.0);
  EXPECT_EQ(c.yarn.beta_slow, 1.0);
  EXPECT_EQ(c.yarn.mscale, 1.0);
  EXPECT_EQ(c.yarn.mscale_all_dim, 0.0);
  EXPECT_TRUE(c.yarn.round_to_int);
  EXPECT_FLOAT_EQ(c.softmax_scale(), 1.0f / std::sqrt(static_cast<float>(c.head_dim)));  // unchanged outside MLA
  Cli rope;
  ASSERT_TRUE(rope.parse_minimal({"--position-embedding-type", "rope"}).ok());
  EXPECT_FALSE(config_of(rope).yarn.enabled);
}

TEST(YarnArguments, EveryFlagReachesTheConfigAndTheCheckpointArgs) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--position-embedding-type", "yarn", "--rotary-scaling-factor", "8",
                                 "--yarn-original-max-position-embeddings", "256", "--yarn-beta-fast", "16",
                                 "--yarn-beta-slow", "2", "--mscale", "0.707", "--mscale-all-dim", "0.3",
                                 "--no-yarn-correction-range-round-to-int"})
                  .ok());
  const ModelConfig c = config_of(cli);
  EXPECT_EQ(c.yarn.scaling_factor, 8.0);
  EXPECT_EQ(c.yarn.original_max_positions, 256);
  EXPECT_EQ(c.yarn.beta_fast, 16.0);
  EXPECT_EQ(c.yarn.beta_slow, 2.0);
  EXPECT_EQ(c.yarn.mscale, 0.707);
  EXPECT_EQ(c.yarn.mscale_all_dim, 0.3);
  EXPECT_FALSE(c.yarn.round_to_int);
  // Recorded as Megatron's args, and read back to the same model (generate --use-checkpoint-args).
  const nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["position_embedding_type"], "yarn");
  EXPECT_EQ(j["yarn_original_max_position_embeddings"], 256);
  EXPECT_EQ(j["yarn_correction_range_round_to_int"], false);
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  Cli again;
  again.args.model = back.value();
  const ModelConfig r = config_of(again);
  EXPECT_TRUE(r.yarn.enabled);
  EXPECT_EQ(r.yarn.original_max_positions, 256);
  EXPECT_EQ(r.yarn.beta_fast, 16.0);
  EXPECT_EQ(r.yarn.beta_slow, 2.0);
  EXPECT_EQ(r.yarn.scaling_factor, 8.0);
  EXPECT_EQ(r.yarn.mscale_all_dim, 0.3);
  EXPECT_FALSE(r.yarn.round_to_int);
  // Megatron's None for the unset yarn_* flags reads back as the defaults.
  nlohmann::json unset_flags = j;
  for (const char* k : {"yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
                        "yarn_correction_range_round_to_int"})
    unset_flags[k] = nullptr;
  StatusOr<ModelArgs> defaults = model_args_from_json(unset_flags, "args");
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  again.args.model = defaults.value();
  EXPECT_EQ(config_of(again).yarn.original_max_positions, 4096);
  EXPECT_TRUE(config_of(again).yarn.round_to_int);
  // The checkpoint's model section tells YaRN from RoPE and one YaRN from another.
  EXPECT_TRUE(checkpoint_model_section(c).contains("yarn"));
  ModelConfig other = c;
  other.yarn.beta_fast = 32.0;
  EXPECT_NE(checkpoint_model_section(other), checkpoint_model_section(c));
}

class YarnArgumentErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(YarnArgumentErrors, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, YarnArgumentErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--yarn-beta-fast", "16"}, 1,
                               "--yarn-beta-fast needs --position-embedding-type yarn, found learned_absolute"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--no-yarn-correction-range-round-to-int"}, 1,
                               "--no-yarn-correction-range-round-to-int needs --position-embedding-type yarn, found rope"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--multi-latent-attention"}, 1,
                               "--position-embedding-type yarn with --multi-latent-attention: MLA's YaRN is --rope-type "
                               "yarn (its default), found both"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--rotary-scaling-factor", "0.5"}, 1,
                               "--rotary-scaling-factor: expected at least 1 (YaRN's context extension), found 0.5"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--rotary-percent", "0.5"}, 1,
                               "--rotary-percent: expected 1 with --position-embedding-type yarn"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--rotary-interleaved"}, 1,
                               "--rotary-interleaved with --position-embedding-type yarn: YaRN rotates halves"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--yarn-beta-slow", "0"}, 1,
                               "--yarn-beta-slow: expected a positive number of rotations, found 0"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--yarn-original-max-position-embeddings", "-4"},
                               1, "--yarn-original-max-position-embeddings: expected a positive integer, found -4"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--rotary-scaling-factor", "4", "--mscale-all-dim",
                                "-20"},
                               1, "--mscale-all-dim: expected 0.1 x --mscale-all-dim x ln(--rotary-scaling-factor) + 1 > 0"},
        testing::FlagErrorCase{{"--position-embedding-type", "yarn", "--use-rope-scaling"}, 1,
                               "--use-rope-scaling needs --position-embedding-type rope, found yarn"}));

}  // namespace
}  // namespace gale
