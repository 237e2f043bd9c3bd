// Megatron-LM main's --output-logit-dtype and --mamba-training-ssm-states-dtype: their choices,
// defaults (Megatron's None) and what they set in the model (model/config.h bf16_logits,
// HybridConfig::training_ssm_states), and Megatron's refusal of other values.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

ModelConfig config_of(std::vector<std::string> flags) {
  PretrainCli cli;
  const Status s = cli.parse_minimal(flags);
  EXPECT_TRUE(s.ok()) << s.message();
  cli.args.model.padded_vocab_size = 128;  // what data setup sets from the tokenizer
  return model_config_from_args(cli.args);
}

std::vector<std::string> hybrid(std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-override-pattern", "M*", "--mamba-head-dim", "16",
                                    "--mamba-num-groups", "2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(LowPrecisionOutputs, OutputLogitDtype) {
  EXPECT_FALSE(config_of({}).bf16_logits);  // None: the output layer's input dtype, f32 in Gale
  EXPECT_FALSE(config_of({"--bf16"}).bf16_logits);
  EXPECT_FALSE(config_of({"--output-logit-dtype", "fp32"}).bf16_logits);
  EXPECT_TRUE(config_of({"--output-logit-dtype", "bf16"}).bf16_logits);
  EXPECT_TRUE(config_of({"--output-logit-dtype", "bf16", "--bf16"}).bf16_logits);
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--output-logit-dtype", "bf16"}).ok());
  EXPECT_EQ(cli.args.megatron_compat.output_logit_dtype, "bf16");
}

// None: Megatron's MambaMixer takes the parameters' dtype (config.params_dtype); hybrid models with
// --fp16 (whose default would be f16 states) are refused in Gale.
TEST(LowPrecisionOutputs, MambaTrainingSsmStatesDtype) {
  EXPECT_EQ(config_of(hybrid({})).hybrid.training_ssm_states, DType::kF32);
  EXPECT_EQ(config_of(hybrid({"--bf16"})).hybrid.training_ssm_states, DType::kBF16);
  EXPECT_EQ(config_of(hybrid({"--bf16", "--mamba-training-ssm-states-dtype", "fp32"})).hybrid.training_ssm_states,
            DType::kF32);
  EXPECT_EQ(config_of(hybrid({"--mamba-training-ssm-states-dtype", "bf16"})).hybrid.training_ssm_states,
            DType::kBF16);
  EXPECT_EQ(config_of(hybrid({})).hybrid.chunk_size, 128);  // Megatron's MambaMixer chunk_size
}

// Megatron's choices: bf16 or fp32 only.
TEST(LowPrecisionOutputs, OtherValuesRefused) {
  expect_one_line_error({{"--output-logit-dtype", "fp16"}, 1, "--output-logit-dtype"});
  expect_one_line_error({{"--mamba-training-ssm-states-dtype", "fp16"}, 1, "--mamba-training-ssm-states-dtype"});
}

}  // namespace
}  // namespace gale
