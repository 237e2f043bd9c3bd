// --qk-clip, --qk-clip-alpha, --qk-clip-threshold, --log-max-attention-logit: Megatron's defaults, the
// model flag they set, the checkpoint args that record them, and the values and combinations refused
// (whole messages).
#include <gtest/gtest.h>

#include <cmath>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(QkClipArguments, DefaultsAsMegatronAndTheModelTracksTheLogit) {
  Cli plain;
  ASSERT_TRUE(plain.parse_minimal({}).ok());
  EXPECT_FALSE(plain.args.model.qk_clip);
  EXPECT_EQ(plain.args.model.qk_clip_alpha, 0.5);
  EXPECT_EQ(plain.args.model.qk_clip_threshold, 100.0);
  EXPECT_FALSE(plain.args.model.log_max_attention_logit);
  plain.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(plain.args).track_max_attention_logit);
  EXPECT_FALSE(model_flags_json(plain.args.model).contains("qk_clip"));  // absent: off
  for (const std::string flag : {"--qk-clip", "--log-max-attention-logit"}) {
    Cli cli;
    const Status s = cli.parse_minimal({flag});
    ASSERT_TRUE(s.ok()) << s.to_string();
    cli.args.model.padded_vocab_size = 128;
    EXPECT_TRUE(model_config_from_args(cli.args).track_max_attention_logit) << flag;
  }
  // Every context-parallel layout with a Ulysses split of whole query groups.
  for (const std::vector<std::string>& cp :
       {std::vector<std::string>{"--context-parallel-size", "2"},  // the ring (p2p)
        std::vector<std::string>{"--context-parallel-size", "2", "--cp-comm-type", "allgather"},
        std::vector<std::string>{"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"},
        std::vector<std::string>{"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                 "--ulysses-degree-in-cp", "2"},
        std::vector<std::string>{"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}}) {
    Cli cli;
    std::vector<std::string> flags = {"--qk-clip"};
    flags.insert(flags.end(), cp.begin(), cp.end());
    const Status s = cli.parse_minimal(flags, cp[1] == "4" ? 4 : 2);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

TEST(QkClipArguments, CheckpointArgsRecordThemAndReadBack) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--qk-clip", "--qk-clip-alpha", "0.25", "--qk-clip-threshold", "30"}).ok());
  const nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["qk_clip"], true);
  EXPECT_EQ(j["qk_clip_alpha"], 0.25);
  EXPECT_EQ(j["qk_clip_threshold"], 30.0);
  EXPECT_EQ(j["log_max_attention_logit"], false);
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back.value().qk_clip);
  EXPECT_EQ(back.value().qk_clip_alpha, 0.25);
  EXPECT_EQ(back.value().qk_clip_threshold, 30.0);
  EXPECT_FALSE(back.value().log_max_attention_logit);
}

struct Case {
  std::vector<std::string> flags;
  int64_t world;
  std::string message;  // the whole message
};

class QkClipArgumentErrors : public ::testing::TestWithParam<Case> {};

TEST_P(QkClipArgumentErrors, WholeMessage) {
  Cli cli;
  const Status s = cli.parse_minimal(GetParam().flags, GetParam().world);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, QkClipArgumentErrors,
    ::testing::Values(
        Case{{"--qk-clip", "--qk-clip-alpha", "1.0"}, 1,
             "--qk-clip-alpha: expected a value between 0.0 and 1.0 (exclusive) with --qk-clip, found 1"},
        Case{{"--qk-clip", "--qk-clip-alpha", "0"}, 1,
             "--qk-clip-alpha: expected a value between 0.0 and 1.0 (exclusive) with --qk-clip, found 0"},
        Case{{"--qk-clip", "--qk-clip-threshold", "0"}, 1,
             "--qk-clip-threshold: expected a value greater than 0 with --qk-clip, found 0"},
        Case{{"--log-max-attention-logit", "--context-parallel-size", "2", "--context-parallel-algo",
              "ulysses_cp_algo", "--use-ulysses-allgather-kv", "--group-query-attention", "--num-query-groups", "1"},
             2,
             "--log-max-attention-logit with --use-ulysses-allgather-kv: not supported yet (keys and values gathered "
             "beside the query heads' split)"},
        Case{{"--qk-clip", "--context-parallel-size", "4", "--context-parallel-algo", "ulysses_cp_algo",
              "--group-query-attention", "--num-query-groups", "2"},
             4,
             "--qk-clip with --context-parallel-algo ulysses_cp_algo: not supported yet when the query groups per "
             "tensor-parallel rank (2) are not a multiple of the Ulysses degree 4"},
        Case{{"--qk-clip", "--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
              "--ulysses-degree-in-cp", "2", "--group-query-attention", "--num-query-groups", "1"},
             4,
             "--qk-clip with --context-parallel-algo hybrid_cp_algo: not supported yet when the query groups per "
             "tensor-parallel rank (1) are not a multiple of the Ulysses degree 2"},
        Case{{"--qk-clip", "--num-layers", "4", "--use-distributed-optimizer", "--overlap-grad-reduce",
              "--overlap-param-gather", "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
              "2", "--global-batch-size", "16", "--overlap-param-gather-with-optimizer-step"},
             4,
             "--qk-clip with --overlap-param-gather-with-optimizer-step: not supported yet (the parameter all-gather "
             "starts inside the step, before the clip)"},
        Case{{"--qk-clip", "--tp-2d", "--tp-x", "2", "--tp-y", "2", "--tensor-model-parallel-size", "4"}, 4,
             "--qk-clip with --tp-2d: not supported yet (the 2-D attention layer)"},
        Case{{"--qk-clip", "--bf16", "--reuse-fp32-param"}, 1,
             "--qk-clip with --reuse-fp32-param: not supported yet (the split bf16 weights)"},
        Case{{"--qk-clip", "--attention-output-gate"}, 1,
             "--qk-clip with --attention-output-gate: not supported yet (Megatron's clip_qk assumes linear_qkv "
             "without gate rows)"},
        Case{{"--qk-clip", "--experimental-attention-variant", "gdn", "--linear-attention-freq", "2",
              "--normalization", "RMSNorm", "--swiglu"},
             1, "--qk-clip with --experimental-attention-variant gdn: not supported yet"},
        Case{{"--log-max-attention-logit", "--is-hybrid-model", "--hybrid-override-pattern", "M*",
              "--mamba-head-dim", "16", "--mamba-num-groups", "1"},
             1, "--log-max-attention-logit with --is-hybrid-model: not supported yet"}));

// Megatron reads the --mup-* flags only with --use-mup: alone they parse (with Megatron's defaults).
// (--use-mup itself: tests/train/mup_test.cc.)
TEST(MupArguments, FlagsParseWithMegatronsDefaults) {
  Cli plain;
  ASSERT_TRUE(plain.parse_minimal({}).ok());
  EXPECT_FALSE(plain.args.model.use_mup);
  EXPECT_EQ(plain.args.model.mup_base_hidden_size, kUnset);
  EXPECT_EQ(plain.args.model.mup_embedding_mult, 1.0);
  EXPECT_EQ(plain.args.model.mup_output_mult, 1.0);
  EXPECT_TRUE(std::isnan(plain.args.model.mup_base_head_dim));
  EXPECT_EQ(plain.args.model.mup_attn_scale_power, 1.0);
  Cli cli;
  const Status s = cli.parse_minimal({"--mup-base-hidden-size", "32", "--mup-embedding-mult", "10", "--mup-output-mult",
                                      "0.5", "--mup-base-head-dim", "64", "--mup-attn-scale-power", "0.5"});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cli.args.model.mup_base_hidden_size, 32);
  EXPECT_EQ(cli.args.model.mup_embedding_mult, 10.0);
  EXPECT_EQ(cli.args.model.mup_output_mult, 0.5);
  EXPECT_EQ(cli.args.model.mup_base_head_dim, 64.0);
  EXPECT_EQ(cli.args.model.mup_attn_scale_power, 0.5);
}

}  // namespace
}  // namespace gale
