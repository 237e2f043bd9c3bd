// The flags of Megatron-LM main's data and output settings: --mid-level-dataset-surplus,
// --per-dataset-sequences-path and --allow-ambiguous-pad-tokens with Megatron's defaults,
// --output-logit-dtype (fp32 and bf16: tests/train/arguments_low_precision_outputs_test.cc).
// (--phase-transition-iterations: tests/train/phase_transitions_test.cc.)
#include <gtest/gtest.h>

#include "pretrain_cli.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

TEST(MegatronMainDataFlags, DefaultsAreMegatrons) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({}).ok());
  EXPECT_EQ(cli.args.data.mid_level_dataset_surplus, 0.005);
  EXPECT_EQ(cli.args.data.per_dataset_sequences_path, "");
  EXPECT_FALSE(cli.args.data.allow_ambiguous_pad_tokens);
  EXPECT_EQ(cli.args.megatron_compat.output_logit_dtype, "");
}

TEST(MegatronMainDataFlags, ValuesAreRead) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--mid-level-dataset-surplus", "0.25", "--allow-ambiguous-pad-tokens",
                                 "--output-logit-dtype", "fp32"})
                  .ok());
  EXPECT_EQ(cli.args.data.mid_level_dataset_surplus, 0.25);
  EXPECT_TRUE(cli.args.data.allow_ambiguous_pad_tokens);
  EXPECT_EQ(cli.args.megatron_compat.output_logit_dtype, "fp32");
}

TEST(MegatronMainDataFlags, RefusedInOneLine) {
  expect_one_line_error({{"--output-logit-dtype", "fp16"}, 1, "--output-logit-dtype"});
  expect_one_line_error({{"--mid-level-dataset-surplus", "-1"}, 1,
                         "--mid-level-dataset-surplus: expected a finite number > -1"});
  // minimal_pretrain_flags() trains on --mock-data, which reads no .idx file.
  expect_one_line_error({{"--per-dataset-sequences-path", "s.json"}, 1,
                         "--per-dataset-sequences-path with --mock-data: not supported"});
}

}  // namespace
}  // namespace gale
