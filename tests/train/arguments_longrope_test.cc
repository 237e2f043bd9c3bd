// --rope-scaling-type longrope: MindSpeed-LLM's LongRoPE flags, the model config they give (factors, mscales,
// the --seq-length choice), the checkpoint args they are recorded as, and one-line errors naming the flag.
#include <gtest/gtest.h>

#include <cmath>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

// head dim 64 / 4 = 16: 8 rotary pairs.
const std::string kShort = "1.0,1.0199999809265137,1.1,1.25,1.5,2.0,2.75,3.5";
const std::string kLong = "1.0800000429153442,1.15,1.4,2.0,3.0,5.5,9.0,14.0";

std::vector<std::string> longrope(std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {"--position-embedding-type", "rope", "--rope-scaling-type", "longrope",
                                "--rope-scaling-original-max-position-embeddings", "8", "--short-factor", kShort,
                                "--long-factor", kLong};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

ModelConfig config_of(Cli& cli) {
  cli.args.model.padded_vocab_size = 128;
  return model_config_from_args(cli.args);
}

TEST(LongRopeArguments, FlagsReachTheConfigWithTheDefaultAttentionFactor) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal(longrope()).ok());
  const ModelConfig c = config_of(cli);
  EXPECT_EQ(c.position, PositionEmbedding::kRope);
  ASSERT_TRUE(c.longrope.enabled);
  EXPECT_EQ(c.longrope.original_max_positions, 8);
  EXPECT_EQ(c.longrope.short_factor, (std::vector<double>{1.0, 1.0199999809265137, 1.1, 1.25, 1.5, 2.0, 2.75, 3.5}));
  EXPECT_EQ(c.longrope.long_factor.back(), 14.0);
  // sqrt(1 + ln(32 / 8) / ln 8) for both tables; --seq-length 16 > 8: the long table in training.
  EXPECT_DOUBLE_EQ(c.longrope.short_mscale, std::sqrt(1.0 + std::log(4.0) / std::log(8.0)));
  EXPECT_EQ(c.longrope.long_mscale, c.longrope.short_mscale);
  EXPECT_TRUE(c.longrope.long_without_cache);
  EXPECT_FLOAT_EQ(c.softmax_scale(), 1.0f / 4.0f);  // the softmax is unchanged
  Cli within;
  ASSERT_TRUE(within.parse_minimal(longrope({"--rope-scaling-original-max-position-embeddings", "16"})).ok());
  EXPECT_FALSE(config_of(within).longrope.long_without_cache);  // --seq-length 16 <= 16: the short table
  Cli plain;
  ASSERT_TRUE(plain.parse_minimal({"--position-embedding-type", "rope"}).ok());
  EXPECT_FALSE(config_of(plain).longrope.enabled);
}

TEST(LongRopeArguments, ExplicitMscalesAndTheCheckpointArgsRoundTrip) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal(longrope({"--short-mscale", "1.1", "--long-mscale", "1.243", "--longrope-freqs-type",
                                          "outer"}))
                  .ok());
  const ModelConfig c = config_of(cli);
  EXPECT_EQ(c.longrope.short_mscale, 1.1);
  EXPECT_EQ(c.longrope.long_mscale, 1.243);
  const nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["rope_scaling_type"], "longrope");
  EXPECT_EQ(j["rope_scaling_original_max_position_embeddings"], 8);
  EXPECT_EQ(j["long_factor"].size(), 8u);
  EXPECT_EQ(j["long_mscale"], 1.243);
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->short_factor, kShort);  // the flag text again, digit for digit
  EXPECT_EQ(back->long_factor, kLong);
  Cli again;
  again.args.model = back.value();
  const ModelConfig r = config_of(again);
  EXPECT_TRUE(r.longrope.enabled);
  EXPECT_EQ(r.longrope.short_factor, c.longrope.short_factor);
  EXPECT_EQ(r.longrope.long_factor, c.longrope.long_factor);
  EXPECT_EQ(r.longrope.short_mscale, 1.1);
  EXPECT_EQ(r.longrope.long_mscale, 1.243);
  // The checkpoint's model section tells LongRoPE from RoPE and one factor list from another.
  EXPECT_TRUE(checkpoint_model_section(c).contains("longrope"));
  ModelConfig other = c;
  other.longrope.long_factor[3] = 2.5;
  EXPECT_NE(checkpoint_model_section(other), checkpoint_model_section(c));
  nlohmann::json broken = j;
  broken["short_factor"] = "1,2";
  EXPECT_EQ(model_args_from_json(broken, "args").status().message(),
            "args: args 'short_factor' is \"1,2\", expected a list of numbers with rope_scaling_type longrope");
}

class LongRopeArgumentErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(LongRopeArgumentErrors, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, LongRopeArgumentErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--long-factor", "1,2"}, 1, "--long-factor needs --rope-scaling-type longrope, found it unset"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--rope-scaling-type", "llama3"}, 1,
                               "--rope-scaling-type llama3: Gale's Llama 3.1 RoPE scaling is --use-rope-scaling"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--rope-scaling-type", "yarn"}, 1,
                               "--rope-scaling-type yarn: Gale's YaRN is --position-embedding-type yarn"},
        testing::FlagErrorCase{{"--rope-scaling-type", "longrope"}, 1,
                               "--rope-scaling-type longrope needs --position-embedding-type rope, found learned_absolute"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--rope-scaling-type", "longrope", "--short-factor",
                                kShort, "--long-factor", kLong},
                               1, "--rope-scaling-original-max-position-embeddings: expected the original context"},
        testing::FlagErrorCase{longrope({"--rope-scaling-original-max-position-embeddings", "1"}), 1,
                               "--rope-scaling-original-max-position-embeddings: expected an integer > 1"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--rope-scaling-type", "longrope",
                                "--rope-scaling-original-max-position-embeddings", "8", "--short-factor", kShort},
                               1, "--long-factor: expected one factor per rotary pair with --rope-scaling-type longrope, "
                                  "found it unset"},
        testing::FlagErrorCase{longrope({"--long-factor", "1,2,3,4,5,6,7"}), 1,
                               "--long-factor: expected 8 factors (one per rotary pair: head dim 16 x --rotary-percent 1 "
                               "/ 2), found 7"},
        testing::FlagErrorCase{longrope({"--short-factor", "1,2,3,x,5,6,7,8"}), 1,
                               "--short-factor: expected comma-separated numbers, found \"x\""},
        testing::FlagErrorCase{longrope({"--short-factor", "1,2,3,0,5,6,7,8"}), 1,
                               "--short-factor: expected positive factors (each divides a rotary frequency), found 0"},
        testing::FlagErrorCase{longrope({"--long-mscale", "1.2"}), 1,
                               "--long-mscale and --short-mscale: expected both or neither (MindSpeed-LLM), found only "
                               "--long-mscale"},
        testing::FlagErrorCase{longrope({"--long-mscale", "1.2", "--short-mscale", "-1"}), 1,
                               "--short-mscale: expected a positive cos/sin scale, found -1"},
        testing::FlagErrorCase{longrope({"--use-rope-scaling"}), 1,
                               "--rope-scaling-type longrope with --use-rope-scaling: expected one RoPE scaling"},
        testing::FlagErrorCase{longrope({"--rotary-seq-len-interpolation-factor", "2"}), 1,
                               "--rope-scaling-type longrope with --rotary-seq-len-interpolation-factor"},
        testing::FlagErrorCase{longrope({"--rotary-percent", "0.5"}), 1,
                               "--long-factor: expected 4 factors (one per rotary pair: head dim 16 x --rotary-percent "
                               "0.5 / 2), found 8"}));

}  // namespace
}  // namespace gale
