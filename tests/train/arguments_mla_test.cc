// The multi-latent attention flags: Megatron's names and defaults, the model config they give, and
// one-line errors naming the flag for what MLA does not compose with.
#include <gtest/gtest.h>

#include <cmath>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(MlaArguments, ComposesWithContextParallelism) {
  Cli cli;
  EXPECT_TRUE(cli.parse_minimal({"--multi-latent-attention", "--context-parallel-size", "2"}, 2).ok());
}

// Without MLA --qk-layernorm is standard attention's per-head q/k norms (Megatron-Core's
// q_layernorm/k_layernorm); with MLA it is the latents' norms only.
TEST(MlaArguments, QkLayerNormWithoutMlaIsThePerHeadNorm) {
  Cli off;
  ASSERT_TRUE(off.parse_minimal({}).ok());
  off.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(off.args).qk_layernorm);
  Cli on;
  ASSERT_TRUE(on.parse_minimal({"--qk-layernorm", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "8",
                        "--tensor-model-parallel-size", "2", "--sequence-parallel"},
                       2)
                  .ok());
  on.args.model.padded_vocab_size = 128;
  const ModelConfig c = model_config_from_args(on.args);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_FALSE(c.mla.qk_layernorm);
  EXPECT_EQ(c.head_dim, 8);
  Cli mla;
  ASSERT_TRUE(mla.parse_minimal({"--multi-latent-attention", "--qk-layernorm"}).ok());
  mla.args.model.padded_vocab_size = 128;
  const ModelConfig m = model_config_from_args(mla.args);
  EXPECT_FALSE(m.qk_layernorm);
  EXPECT_TRUE(m.mla.qk_layernorm);
}

TEST(MlaArguments, MegatronDefaultsAndTheModelConfig) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--multi-latent-attention"}).ok());
  cli.args.model.padded_vocab_size = 128;
  const ModelConfig c = model_config_from_args(cli.args);
  EXPECT_TRUE(c.mla.enabled);
  EXPECT_EQ(c.mla.q_lora_rank, 0);  // Megatron's None: linear_q_proj
  EXPECT_EQ(c.mla.kv_lora_rank, 32);
  EXPECT_EQ(c.mla.qk_head_dim, 128);
  EXPECT_EQ(c.mla.qk_pos_emb_head_dim, 64);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_FALSE(c.mla.qk_layernorm);
  EXPECT_TRUE(c.mla.yarn);  // Megatron's MLA default rope type
  EXPECT_EQ(c.mla.rotary_scaling_factor, 1.0);
  EXPECT_EQ(c.attention_head_dim(), 192);
  EXPECT_EQ(c.attention_kv_heads(), 4);
  EXPECT_FLOAT_EQ(c.softmax_scale(), 1.0f / std::sqrt(192.0f));

  Cli sized;
  ASSERT_TRUE(sized.parse_minimal({"--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16", "--qk-head-dim",
                           "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "16", "--qk-layernorm", "--rope-type",
                           "yarn", "--mscale", "0.7", "--mscale-all-dim", "0.7"})
                  .ok());
  sized.args.model.padded_vocab_size = 128;
  const ModelConfig s = model_config_from_args(sized.args);
  EXPECT_EQ(s.mla.q_lora_rank, 24);
  EXPECT_TRUE(s.mla.qk_layernorm);
  EXPECT_EQ(s.attention_head_dim(), 16);  // max(8 + 4, 16)
  EXPECT_TRUE(s.mla.yarn);
  EXPECT_EQ(s.mla.mscale_all_dim, 0.7);

  Cli yarn;  // DeepSeek-V3's YaRN: s 40, mscale = mscale_all_dim = 1: softmax scale m(40, 1)² / sqrt(Dq)
  ASSERT_TRUE(yarn.parse_minimal({"--multi-latent-attention", "--rotary-scaling-factor", "40", "--mscale", "1",
                          "--mscale-all-dim", "1"})
                  .ok());
  yarn.args.model.padded_vocab_size = 128;
  const ModelConfig y = model_config_from_args(yarn.args);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(y.softmax_scale(), m * m / std::sqrt(192.0), 1e-7);

  Cli rope;
  ASSERT_TRUE(rope.parse_minimal({"--multi-latent-attention", "--rope-type", "rope"}).ok());
  rope.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(rope.args).mla.yarn);

  Cli off;
  ASSERT_TRUE(off.parse_minimal({}).ok());
  off.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(off.args).mla.enabled);
}

class MlaArgumentErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(MlaArgumentErrors, OneLineNamingTheFlag) {
  testing::expect_one_line_error(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MlaArgumentErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--multi-latent-attention", "--group-query-attention", "--num-query-groups", "2"}, 1,
                  "--group-query-attention: not applicable"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--kv-lora-rank", "0"}, 1, "--kv-lora-rank: expected a positive"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--v-head-dim", "-3"}, 1, "--v-head-dim: expected a positive"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--q-lora-rank", "0"}, 1, "--q-lora-rank: expected a positive"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--qk-pos-emb-head-dim", "5"}, 1, "--qk-pos-emb-head-dim: expected an even"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--rotary-scaling-factor", "0.5"}, 1,
                  "--rotary-scaling-factor: expected at least 1"},
        testing::FlagErrorCase{{"--rotary-scaling-factor", "40"}, 1,
                               "--rotary-scaling-factor needs --multi-latent-attention or --position-embedding-type yarn, "
                               "found --position-embedding-type learned_absolute"},
        testing::FlagErrorCase{{"--rope-type", "yarn"}, 1, "--rope-type yarn needs --multi-latent-attention"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--rotary-percent", "0.5"}, 1, "--rotary-percent"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--lora-target-modules", "linear_qkv"}, 1,
                  "--lora-target-modules linear_qkv"},
        testing::FlagErrorCase{{"--multi-latent-attention", "--cache-mla-latents"}, 1, "--cache-mla-latents: not supported yet"},
        testing::FlagErrorCase{{"--q-lora-rank", "16"}, 1, "--q-lora-rank needs --multi-latent-attention"}));

}  // namespace
}  // namespace gale
