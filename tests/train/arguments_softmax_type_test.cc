// --softmax-type: Megatron's choices and default, the model type they give, the checkpoint args
// (Megatron's softmax_type string), and the combinations refused (whole messages).
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(SoftmaxTypeArguments, ChoicesAndDefaultAsMegatron) {
  for (const auto& [flags, type] :
       {std::pair{std::vector<std::string>{}, SoftmaxType::kVanilla},
        std::pair{std::vector<std::string>{"--softmax-type", "vanilla"}, SoftmaxType::kVanilla},
        std::pair{std::vector<std::string>{"--softmax-type", "off-by-one"}, SoftmaxType::kOffByOne},
        std::pair{std::vector<std::string>{"--softmax-type", "learnable"}, SoftmaxType::kLearnable}}) {
    Cli cli;
    const Status s = cli.parse_minimal(flags);
    ASSERT_TRUE(s.ok()) << s.to_string();
    cli.args.model.padded_vocab_size = 128;
    EXPECT_EQ(model_config_from_args(cli.args).softmax_type, type);
  }
  Cli mla;  // multi-latent attention takes it too
  const Status sm = mla.parse_minimal({"--softmax-type", "learnable", "--multi-latent-attention", "--kv-lora-rank", "16",
                                       "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16"});
  EXPECT_TRUE(sm.ok()) << sm.to_string();
  Cli gdn;  // a Gated DeltaNet model's attention layers take it too
  const Status sg = gdn.parse_minimal({"--softmax-type", "learnable", "--experimental-attention-variant", "gdn",
                                       "--linear-attention-freq", "2", "--normalization", "RMSNorm", "--swiglu"});
  EXPECT_TRUE(sg.ok()) << sg.to_string();
  Cli hybrid;  // a hybrid model's attention layers take it too
  const Status s = hybrid.parse_minimal({"--softmax-type", "learnable", "--is-hybrid-model", "--hybrid-override-pattern",
                                         "M*", "--mamba-head-dim", "16", "--mamba-num-groups", "1"});
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(SoftmaxTypeArguments, CheckpointArgsHoldTheTypeAndMegatronsStringReadsBack) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--softmax-type", "learnable"}).ok());
  nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["softmax_type"], "learnable");
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().softmax_type, "learnable");
  j["softmax_type"] = "vanilla";  // a Megatron checkpoint's args always hold it
  back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().softmax_type, "vanilla");
  j["softmax_type"] = "sparsemax";
  back = model_args_from_json(j, "args");
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().message(),
            "args: args 'softmax_type' is 'sparsemax', expected 'vanilla', 'off-by-one' or 'learnable'");
  Cli plain;
  ASSERT_TRUE(plain.parse_minimal({}).ok());
  EXPECT_FALSE(model_flags_json(plain.args.model).contains("softmax_type"));  // absent: vanilla
}

struct Case {
  std::vector<std::string> flags;
  int64_t world;
  std::string message;  // the whole message
};

class SoftmaxTypeArgumentErrors : public ::testing::TestWithParam<Case> {};

TEST_P(SoftmaxTypeArgumentErrors, WholeMessage) {
  Cli cli;
  const Status s = cli.parse_minimal(GetParam().flags, GetParam().world);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SoftmaxTypeArgumentErrors,
    ::testing::Values(
        Case{{"--softmax-type", "softmax"}, 1, "--softmax-type: softmax not in {vanilla,off-by-one,learnable}"},
        Case{{"--softmax-type", "off-by-one", "--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "16",
              "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--experimental-attention-variant", "dsa",
              "--dsa-indexer-n-heads", "2", "--dsa-indexer-head-dim", "8", "--dsa-indexer-topk", "4"},
             1,
             "--softmax-type off-by-one with --experimental-attention-variant dsa: not supported yet (DeepSeek "
             "sparse attention's kernels)"},
        Case{{"--softmax-type", "learnable", "--tp-2d", "--tp-x", "2", "--tp-y", "2", "--tensor-model-parallel-size",
              "4"},
             4, "--softmax-type learnable with --tp-2d: not supported yet (the 2-D attention layer's head split)"}));

}  // namespace
}  // namespace gale
