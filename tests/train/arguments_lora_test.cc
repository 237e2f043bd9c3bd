// The LoRA flags: MindSpeed-LLM's names and defaults, and one-line errors naming the flag.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(LoraArguments, MindSpeedDefaultsAndTheModelConfig) {
  Cli off;
  ASSERT_TRUE(off.parse_minimal({}).ok());
  EXPECT_FALSE(off.args.lora.enabled());
  EXPECT_EQ(off.args.lora.lora_r, 16);
  EXPECT_EQ(off.args.lora.lora_alpha, 32);
  off.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(off.args).lora.enabled());

  Cli on;
  ASSERT_TRUE(on.parse_minimal({"--lora-target-modules", "linear_qkv", "linear_fc2", "--lora-alpha", "8"}).ok());
  on.args.model.padded_vocab_size = 128;
  const LoraConfig c = model_config_from_args(on.args).lora;
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.r, 16);
  EXPECT_FLOAT_EQ(c.scaling(), 0.5f);
  EXPECT_TRUE(c.qkv && c.fc2 && !c.proj && !c.fc1);
  EXPECT_TRUE(c.modules_to_save.empty());

  Cli save;  // MindSpeed-LLM's --lora-modules-to-save (nargs +, default None): into the model config
  ASSERT_TRUE(save.parse_minimal({"--lora-target-modules", "linear_qkv", "--untie-embeddings-and-output-weights",
                                  "--lora-modules-to-save", "word_embeddings", "output_layer"})
                  .ok());
  save.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(save.args).lora.modules_to_save,
            (std::vector<std::string>{"word_embeddings", "output_layer"}));
}

TEST(LoraArguments, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> extra;
    int64_t world;
    std::string message;
  } cases[] = {
      {{"--lora-target-modules", "linear_qkv", "q_proj"}, 1,
       "--lora-target-modules: expected linear_qkv, linear_proj, linear_fc1 or linear_fc2, found q_proj (a Gated "
       "DeltaNet model also takes in_proj, out_proj)"},
      {{"--lora-target-modules", "in_proj"}, 1,
       "--lora-target-modules in_proj: expected a Gated DeltaNet model (--experimental-attention-variant gdn; the "
       "GDN mixer's projection), found none"},
      {{"--lora-r", "-2"}, 1, "--lora-r: expected a positive integer, found -2"},
      {{"--lora-r", "0", "--lora-target-modules", "linear_qkv"}, 1, "--lora-r: expected a positive integer, found 0"},
      {{"--lora-alpha", "0", "--lora-target-modules", "linear_qkv"}, 1,
       "--lora-alpha: expected a positive integer, found 0"},
      {{"--lora-load", "dir"}, 1, "--lora-load needs --lora-target-modules (the adapted linears)"},
      {{"--lora-target-modules", "linear_qkv", "--lora-modules-to-save", "lm_head"}, 1,
       "--lora-modules-to-save: expected word_embeddings, output_layer or final_layernorm, found lm_head"},
      {{"--lora-target-modules", "linear_qkv", "--lora-modules-to-save", "output_layer"}, 1,
       "--lora-modules-to-save output_layer: expected --untie-embeddings-and-output-weights (with tied embeddings "
       "the output layer has no weight of its own; name word_embeddings to train the shared one), found tied "
       "embeddings"},
      {{"--lora-modules-to-save", "word_embeddings"}, 1,
       "--lora-modules-to-save needs --lora-target-modules (LoRA is on when it names a linear)"},
  };
  for (const Case& c : cases) {
    Cli cli;
    const Status st = cli.parse_minimal(c.extra, c.world);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.message(), c.message);
  }
  Cli r0;
  EXPECT_TRUE(r0.parse_minimal({"--lora-r", "0"}).ok()) << "--lora-r 0 without targets: LoRA off";
  Cli dp;
  EXPECT_TRUE(dp.parse_minimal({"--lora-target-modules", "linear_qkv", "--use-distributed-optimizer"}, 2).ok())
      << "data parallelism and the distributed optimizer work with LoRA";
  Cli tp;
  EXPECT_TRUE(tp.parse_minimal({"--lora-target-modules", "linear_qkv", "--tensor-model-parallel-size", "2",
                        "--sequence-parallel", "--pipeline-model-parallel-size", "2"}, 4).ok())
      << "tensor (with sequence) and pipeline parallelism work with LoRA";
  Cli moe;
  EXPECT_TRUE(moe.parse_minimal({"--lora-target-modules", "linear_fc1", "linear_fc2", "--num-experts", "4",
                                 "--expert-model-parallel-size", "2"}, 2).ok())
      << "LoRA on the routed experts, with expert parallelism";
  Cli moe_tp;
  const Status st = moe_tp.parse_minimal({"--lora-target-modules", "linear_fc1", "--num-experts", "4",
                                          "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                          "--expert-tensor-parallel-size", "1"}, 2);
  EXPECT_TRUE(st.ok()) << st.message();
  Cli moe_etp;  // the default expert TP = TP 2: the experts' adapters split as the experts
  EXPECT_TRUE(moe_etp.parse_minimal({"--lora-target-modules", "linear_fc1", "linear_fc2", "--num-experts", "4",
                                     "--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2).ok())
      << "LoRA on the routed experts with expert tensor parallelism";
  Cli shared;
  EXPECT_TRUE(shared.parse_minimal({"--lora-target-modules", "linear_fc2", "--num-experts", "4",
                                    "--moe-shared-expert-intermediate-size", "8", "--disable-bias-linear"}).ok())
      << "LoRA on the shared experts";
  const std::vector<std::string> overlap = {"--moe-token-dispatcher-type", "alltoall", "--moe-permutation-async-comm",
                                            "--moe-grouped-gemm"};
  Cli extend;
  std::vector<std::string> flags = {"--lora-target-modules", "linear_fc1", "--num-experts", "4",
                                    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-tp-extend-ep"};
  flags.insert(flags.end(), overlap.begin(), overlap.end());
  const Status x = extend.parse_minimal(flags, 2);
  EXPECT_TRUE(x.ok()) << "LoRA on the routed experts with --moe-tp-extend-ep: " << x.message();
  Cli attn_only;  // attention adapters only: the experts' restrictions do not apply
  EXPECT_TRUE(attn_only.parse_minimal({"--lora-target-modules", "linear_qkv", "--num-experts", "4",
                                       "--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2).ok());
}

}  // namespace
}  // namespace gale
