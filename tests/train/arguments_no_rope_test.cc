// --no-rope-freq: Megatron's int and list forms, the per-layer pattern they give the model, its
// checkpoint args (Megatron's int or list), and one-line errors naming the flag.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

std::vector<int> pattern_of(const std::vector<std::string>& flags) {
  Cli cli;
  const Status s = cli.parse_minimal(flags);
  EXPECT_TRUE(s.ok()) << s.to_string();
  cli.args.model.padded_vocab_size = 128;
  return model_config_from_args(cli.args).no_rope_layers;
}

TEST(NoRopeArguments, IntAndListForms) {
  // minimal_pretrain_flags(): 2 layers; --num-layers 4 overrides it.
  EXPECT_EQ(pattern_of({"--position-embedding-type", "rope", "--num-layers", "4", "--no-rope-freq", "2"}),
            (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(pattern_of({"--position-embedding-type", "rope", "--num-layers", "4", "--no-rope-freq", "4"}),
            (std::vector<int>{0, 0, 0, 1}));
  EXPECT_EQ(pattern_of({"--position-embedding-type", "yarn", "--num-layers", "4", "--no-rope-freq", "([1]*1+[0]*1)*2"}),
            (std::vector<int>{1, 0, 1, 0}));
  EXPECT_TRUE(pattern_of({"--position-embedding-type", "rope"}).empty());
}

TEST(NoRopeArguments, CheckpointArgsHoldThePatternAndMegatronsIntReadsBack) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--position-embedding-type", "rope", "--num-layers", "4", "--no-rope-freq", "2"}).ok());
  nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["no_rope_freq"], nlohmann::json({0, 1, 0, 1}));
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().no_rope_pattern, (std::vector<int>{0, 1, 0, 1}));
  j["no_rope_freq"] = 4;  // a Megatron checkpoint's args: the flag's int
  back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().no_rope_pattern, (std::vector<int>{0, 0, 0, 1}));
  j["no_rope_freq"] = nlohmann::json({0, 1});
  back = model_args_from_json(j, "args");
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().message(), "args: args 'no_rope_freq' is [0,1], expected an int >= 1 or a list of 4 zeros and ones");
}

class NoRopeArgumentErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(NoRopeArgumentErrors, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, NoRopeArgumentErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--no-rope-freq", "2"}, 1,
                               "--no-rope-freq needs --position-embedding-type rope or yarn, found learned_absolute"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--num-layers", "4", "--no-rope-freq", "3"}, 1,
                               "--no-rope-freq 3: expected a divisor of --num-layers 4"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--no-rope-freq", "[1,0,1]"}, 1,
                               "--no-rope-freq: expected an integer >= 1 or a list of 2 zeros and ones, found '[1,0,1]' "
                               "(3 entries for --num-layers 2)"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--no-rope-freq", "0"}, 1,
                               "--no-rope-freq: expected an integer >= 1 or a list of 2 zeros and ones, found '0' (not "
                               "positive)"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--no-rope-freq", "2", "--multi-latent-attention"},
                               1, "--no-rope-freq with --multi-latent-attention: MLA's rotary part is not skipped"},
        testing::FlagErrorCase{{"--position-embedding-type", "rope", "--no-rope-freq", "2", "--mtp-num-layers", "1"}, 1,
                               "--no-rope-freq with --mtp-num-layers 1: not supported yet"}));

}  // namespace
}  // namespace gale
