// --window-size and --window-attn-skip-freq: Megatron's (left, right) pair mapped onto the sliding
// window (left + 1 keys), Transformer Engine's causal cases, the skip pattern's int and list forms,
// their checkpoint args (Gale's and Megatron's), and one-line errors naming the flag.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

ModelConfig config_of(const std::vector<std::string>& flags) {
  Cli cli;
  const Status s = cli.parse_minimal(flags);
  EXPECT_TRUE(s.ok()) << s.to_string();
  cli.args.model.padded_vocab_size = 128;
  return model_config_from_args(cli.args);
}

TEST(WindowArguments, WindowSizeIsLeftPlusOneKeys) {
  EXPECT_EQ(config_of({"--window-size", "4,0"}).sliding_window, 5);
  EXPECT_EQ(config_of({"--window-size", "(4, 0)"}).sliding_window, 5);
  EXPECT_EQ(config_of({"--window-size", "0,0"}).sliding_window, 1);  // each query sees itself only
  // Transformer Engine runs (left, right) as (left, 0) under the causal mask.
  EXPECT_EQ(config_of({"--window-size", "4,-1"}).sliding_window, 5);
  EXPECT_EQ(config_of({"--window-size", "4,3"}).sliding_window, 5);
  // left -1: unbounded, full causal attention.
  EXPECT_EQ(config_of({"--window-size", "-1,0"}).sliding_window, 0);
  EXPECT_EQ(config_of({"--window-size", "(-1,-1)"}).sliding_window, 0);
  EXPECT_EQ(config_of({"--window-size", "4,0", "--sliding-window", "5"}).sliding_window, 5);  // the same window
  EXPECT_EQ(config_of({}).sliding_window, 0);
}

TEST(WindowArguments, SkipFrequencyIntAndListForms) {
  // Megatron's is_layer_window_attention: layer number n (1-based) is windowed iff n % N != 0.
  EXPECT_EQ(config_of({"--num-layers", "4", "--window-size", "4,0", "--window-attn-skip-freq", "2"}).window_layers,
            (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(config_of({"--num-layers", "5", "--window-size", "4,0", "--window-attn-skip-freq", "3"}).window_layers,
            (std::vector<int>{1, 1, 0, 1, 1}));
  EXPECT_EQ(config_of({"--num-layers", "4", "--window-size", "4,0", "--window-attn-skip-freq", "([1]*1+[0]*1)*2"})
                .window_layers,
            (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(config_of({"--num-layers", "4", "--sliding-window", "5", "--window-attn-skip-freq", "[0,0,1,1]"})
                .window_layers,
            (std::vector<int>{0, 0, 1, 1}));
  // Without a window Megatron ignores the skip frequency; so does Gale.
  const ModelConfig none = config_of({"--num-layers", "4", "--window-attn-skip-freq", "2"});
  EXPECT_TRUE(none.window_layers.empty());
  EXPECT_EQ(none.sliding_window, 0);
}

TEST(WindowArguments, CheckpointArgsHoldThePatternAndMegatronsFormsReadBack) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--num-layers", "4", "--window-size", "4,0", "--window-attn-skip-freq", "2"}).ok());
  nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["sliding_window"], 5);
  EXPECT_EQ(j["window_attn_skip_freq"], nlohmann::json({1, 0, 1, 0}));
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().sliding_window, 5);
  EXPECT_EQ(back.value().window_attn_pattern, (std::vector<int>{1, 0, 1, 0}));
  // A Megatron checkpoint's args: window_size (left, right) and the flag's int.
  j.erase("sliding_window");
  j["window_size"] = nlohmann::json({7, 0});
  j["window_attn_skip_freq"] = 4;
  back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().sliding_window, 8);
  EXPECT_EQ(back.value().window_attn_pattern, (std::vector<int>{1, 1, 1, 0}));
  j["window_attn_skip_freq"] = nlohmann::json({0, 1});
  back = model_args_from_json(j, "args");
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().message(),
            "args: args: --window-attn-skip-freq: expected an integer >= 1 or a list of 4 zeros and ones, found "
            "'[0,1]' (2 entries for --num-layers 4)");
  j["window_size"] = 7;
  back = model_args_from_json(j, "args");
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().message(), "args: args 'window_size' is 7, expected a pair of ints (left, right)");
}

class WindowArgumentErrors : public ::testing::TestWithParam<testing::FlagErrorCase> {};

TEST_P(WindowArgumentErrors, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, WindowArgumentErrors,
    ::testing::Values(
        testing::FlagErrorCase{{"--window-size", "4"}, 1,
                               "--window-size: expected two integers left,right such as 4095,0 or (4095,0), found '4'"},
        testing::FlagErrorCase{{"--window-size", "4,0,1"}, 1,
                               "--window-size: expected two integers left,right such as 4095,0 or (4095,0), found "
                               "'4,0,1'"},
        testing::FlagErrorCase{{"--window-size", "a,0"}, 1,
                               "--window-size: expected two integers left,right such as 4095,0 or (4095,0), found "
                               "'a,0'"},
        testing::FlagErrorCase{{"--window-size", "-1,3"}, 1,
                               "--window-size -1,3: expected left >= 0, or -1 (unbounded) with right -1 or 0, found "
                               "left -1 and right 3"},
        testing::FlagErrorCase{{"--window-size", "-2,0"}, 1,
                               "--window-size -2,0: expected left >= 0, or -1 (unbounded) with right -1 or 0, found "
                               "left -2 and right 0"},
        testing::FlagErrorCase{{"--window-size", "4,0", "--sliding-window", "4"}, 1,
                               "--window-size 4,0 means --sliding-window 5, but --sliding-window 4 is given"},
        testing::FlagErrorCase{{"--window-size", "-1,0", "--sliding-window", "4"}, 1,
                               "--window-size -1,0 means --sliding-window unset (no window), but --sliding-window 4 is "
                               "given"},
        testing::FlagErrorCase{{"--window-size", "4,0", "--window-attn-skip-freq", "0"}, 1,
                               "--window-attn-skip-freq: expected an integer >= 1 or a list of 2 zeros and ones, found "
                               "'0' (not positive)"},
        testing::FlagErrorCase{{"--window-size", "4,0", "--window-attn-skip-freq", "[1,0,1]"}, 1,
                               "--window-attn-skip-freq: expected an integer >= 1 or a list of 2 zeros and ones, found "
                               "'[1,0,1]' (3 entries for --num-layers 2)"},
        testing::FlagErrorCase{{"--window-size", "4,0", "--window-attn-skip-freq", "2", "--mtp-num-layers", "1"}, 1,
                               "--window-attn-skip-freq with --mtp-num-layers 1: not supported yet (the MTP layers' "
                               "place in the pattern)"}));

}  // namespace
}  // namespace gale
