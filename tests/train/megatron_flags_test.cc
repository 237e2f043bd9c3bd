// Every flag of Megatron's pretrain_gpt.py parser (core_v0.12.1, tests/data/reference/
// megatron_flags_core_v0.12.1.txt from tools/reference/megatron_flags.py) is known to `gale
// pretrain`: it runs, is accepted with a start-up note, or is refused with a reason naming it; none
// is an unknown flag. And the few that Gale accepts only with some values.
#include <gtest/gtest.h>

#include "flag_inventory.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::FullCli;
using testing::FlagErrorCase;
using testing::PretrainCli;

TEST(MegatronFlags, NoneIsUnknown) {
  const std::vector<std::string> flags = testing::read_flag_list("reference/megatron_flags_core_v0.12.1.txt");
  ASSERT_EQ(flags.size(), 456u);
  testing::expect_none_unknown(flags);
}

// A refused flag is named first in its one-line error, with or without values after it.
TEST(MegatronFlags, RefusedFlagsNameThemselves) {
  for (const char* flag : {"--keep-fp8-transpose-cache-when-using-custom-fsdp", "--init-model-with-meta-device", "--bert-load", "--batch-size", "--enable-cuda-graph",
                           "--moe-enable-deepep", "--output-bert-embeddings"}) {
    for (const std::vector<std::string>& tail : {std::vector<std::string>{}, std::vector<std::string>{"2"}}) {
      PretrainCli cli;
      std::vector<std::string> extra = {flag};
      extra.insert(extra.end(), tail.begin(), tail.end());
      const Status st = cli.parse_minimal(extra);
      ASSERT_FALSE(st.ok()) << flag;
      EXPECT_EQ(st.message().rfind(std::string(flag) + ":", 0), 0u) << st.message();
    }
  }
}

// Megatron main's --num-speculative-tokens (an inference flag in arguments.py): `gale pretrain`
// accepts it with a note naming `gale generate`, where it runs (tests/train/speculative_decoding_test.cc).
TEST(MegatronFlags, NumSpeculativeTokensIsAnInferenceFlag) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--num-speculative-tokens", "2"}).ok());
  const std::vector<std::string> n = cli.parser.compat_notices();
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].rfind("--num-speculative-tokens: a flag of Megatron's inference engine: `gale generate` takes it", 0),
            0u) << n[0];
}

TEST(MegatronFlags, MegatronsOwnErrorsForRemovedFlags) {
  expect_one_line_error({{"--batch-size", "4"}, 1, "--batch-size: no longer valid, use --micro-batch-size instead"});
  expect_one_line_error({{"--warmup", "0.1"}, 1, "--warmup: no longer valid, use --lr-warmup-fraction instead"});
  expect_one_line_error(
      {{"--model-parallel-size", "2"}, 1, "--model-parallel-size: no longer valid, use --tensor-model-parallel-size"});
  expect_one_line_error({{"--checkpoint-activations"}, 1, "use --recompute-activations"});
  expect_one_line_error({{"--no-position-embedding"}, 1, "--no-position-embedding is deprecated, use "
                                                         "--position-embedding-type (found learned_absolute)"});
  PretrainCli rope;
  EXPECT_TRUE(rope.parse_minimal({"--no-position-embedding", "--position-embedding-type", "rope"}).ok());
}

TEST(MegatronFlags, AcceptedValuesOnly) {
  for (const std::vector<std::string>& ok : std::vector<std::vector<std::string>>{
           {"--rerun-mode", "disabled"}, {"--rerun-mode", "validate_results"}, {"--rerun-mode", "report_stats"},
           {"--moe-router-dtype", "fp32"}, {"--manual-gc", "--manual-gc-interval", "10"},
           {"--local-rank", "3"}, {"--cross-entropy-fusion-impl", "te"}, {"--ckpt-step", "5", "--load", "x"},
           {"--pretrained-checkpoint", "x"}, {"--override-opt_param-scheduler"},
           {"--use-checkpoint-opt_param-scheduler"}}) {
    PretrainCli cli;
    const Status st = cli.parse_minimal(ok);
    EXPECT_TRUE(st.ok()) << ok[0] << ": " << st.to_string();
  }
  PretrainCli notes;
  ASSERT_TRUE(notes.parse_minimal({"--manual-gc", "--use-cpu-initialization"}).ok());
  const std::vector<std::string> n = notes.parser.compat_notices();
  ASSERT_EQ(n.size(), 2u);
  EXPECT_EQ(n[0].rfind("--manual-gc: Python's garbage collector", 0), 0u) << n[0];  // registration order
  EXPECT_EQ(n[1].rfind("--use-cpu-initialization: ", 0), 0u) << n[1];
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--rerun-mode", "sometimes"}, 1, "--rerun-mode: sometimes not in {disabled,validate_results,report_stats}"},
           {{"--error-injection-rate", "3"}, 1, "--error-injection-rate 3 needs --rerun-mode validate_results"},
           {{"--rerun-mode", "validate_results", "--error-injection-rate", "-1"}, 1,
            "--error-injection-rate: expected a count >= 0, found -1"},
           {{"--error-injection-type", "correct_result"}, 1, "--error-injection-type needs --error-injection-rate > 0"},
           {{"--rerun-mode", "report_stats", "--moe-router-enable-expert-bias", "--num-experts", "4",
             "--moe-router-score-function", "sigmoid"},
            1, "--rerun-mode report_stats with --moe-router-enable-expert-bias (the bias update after the backward): "
               "not supported yet"},
           {{"--rerun-mode", "validate_results", "--num-experts", "4", "--moe-router-load-balancing-type",
             "quantile_balancing"},
            1, "--rerun-mode validate_results with --moe-router-load-balancing-type quantile_balancing (the qb_beta "
               "update after the backward): not supported yet"},
           {{"--moe-router-dtype", "fp64"}, 1, "--moe-router-dtype fp64: not supported yet"},
           {{"--moe-router-dtype", "bf16"}, 1, "--moe-router-dtype: expected fp32 or fp64, found 'bf16'"},
           {{"--ckpt-step", "2"}, 1, "--ckpt-step needs --load"},
           {{"--ckpt-step", "-2", "--load", "x"}, 1, "--ckpt-step: expected an iteration ≥ 0, found -2"},
           {{"--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"}, 1, "are exclusive"},
       })
    expect_one_line_error(e);
}

}  // namespace
}  // namespace gale
