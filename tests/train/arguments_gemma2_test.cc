// Gemma-2's flags (train/arguments_gemma2.cc): MindSpeed-LLM's names and defaults (None / False), the
// ModelConfig they give (--interleave-sliding-window as --sliding-window W with --window-attn-skip-freq
// 2), the checkpoint args round trip, and the values and combinations refused (whole messages).
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(Gemma2Arguments, DefaultsAreOff) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({}).ok());
  cli.args.model.padded_vocab_size = 128;
  const ModelConfig c = model_config_from_args(cli.args);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0f);
  EXPECT_EQ(c.output_logit_softcapping, 0.0f);
  EXPECT_EQ(c.query_pre_attn_scalar, 0);
  EXPECT_FALSE(c.post_norm);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FLOAT_EQ(c.softmax_scale(), 1.0f / 4.0f);  // 1/√(64/4)
  const nlohmann::json j = model_flags_json(cli.args.model);
  for (const char* key : {"output_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar", "post_norm"})
    EXPECT_FALSE(j.contains(key)) << key;
}

TEST(Gemma2Arguments, FlagsReachTheModelConfig) {
  Cli cli;
  const Status s = cli.parse_minimal({"--output-logit-softcapping", "30.0", "--attn-logit-softcapping", "50",
                                      "--query-pre-attn-scalar", "256", "--post-norm", "--interleave-sliding-window",
                                      "4", "--num-layers", "5", "--normalization", "RMSNorm"});
  ASSERT_TRUE(s.ok()) << s.to_string();
  cli.args.model.padded_vocab_size = 128;
  const ModelConfig c = model_config_from_args(cli.args);
  EXPECT_EQ(c.output_logit_softcapping, 30.0f);
  EXPECT_EQ(c.attn_logit_softcapping, 50.0f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_FLOAT_EQ(c.softmax_scale(), 1.0f / 16.0f);
  EXPECT_TRUE(c.post_norm);
  // MindSpeed-LLM: layer numbers 1, 3, 5 (0-based 0, 2, 4) windowed, each query seeing 4 keys.
  EXPECT_EQ(c.sliding_window, 4);
  EXPECT_EQ(c.window_layers, (std::vector<int>{1, 0, 1, 0, 1}));
  for (int64_t layer = 0; layer < 5; ++layer) EXPECT_EQ(c.layer_window(layer), layer % 2 == 0 ? 4 : 0) << layer;
  // The same as Megatron's spelling.
  Cli megatron;
  ASSERT_TRUE(megatron.parse_minimal({"--window-size", "3,0", "--window-attn-skip-freq", "2", "--num-layers", "5"}).ok());
  megatron.args.model.padded_vocab_size = 128;
  const ModelConfig m = model_config_from_args(megatron.args);
  EXPECT_EQ(m.sliding_window, c.sliding_window);
  EXPECT_EQ(m.window_layers, c.window_layers);
}

TEST(Gemma2Arguments, CheckpointArgsRoundTrip) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--output-logit-softcapping", "30.0", "--attn-logit-softcapping", "50",
                                 "--query-pre-attn-scalar", "256", "--post-norm"})
                  .ok());
  const nlohmann::json j = model_flags_json(cli.args.model);
  EXPECT_EQ(j["output_logit_softcapping"], 30.0);
  EXPECT_EQ(j["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(j["query_pre_attn_scalar"], 256);
  EXPECT_EQ(j["post_norm"], true);
  StatusOr<ModelArgs> back = model_args_from_json(j, "args");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().output_logit_softcapping, 30.0);
  EXPECT_EQ(back.value().attn_logit_softcapping, 50.0);
  EXPECT_EQ(back.value().query_pre_attn_scalar, 256);
  EXPECT_TRUE(back.value().post_norm);
}

TEST(Gemma2Arguments, RefusedValuesAndCombinations) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--output-logit-softcapping", "0"}, "--output-logit-softcapping: expected a finite number greater than zero, found 0"},
      {{"--attn-logit-softcapping", "-1"}, "--attn-logit-softcapping: expected a finite number greater than zero, found -1"},
      {{"--query-pre-attn-scalar", "0"}, "--query-pre-attn-scalar: expected a positive integer, found 0"},
      {{"--interleave-sliding-window", "0"}, "--interleave-sliding-window: expected a positive window (tokens), found 0"},
      {{"--interleave-sliding-window", "8", "--sliding-window", "8"},
       "--interleave-sliding-window 8 sets the window itself; expected neither --window-size nor --sliding-window "
       "with it, found --sliding-window 8"},
      {{"--interleave-sliding-window", "8", "--window-attn-skip-freq", "3"},
       "--interleave-sliding-window windows every other layer (--window-attn-skip-freq 2), found "
       "--window-attn-skip-freq 3"},
      {{"--attn-logit-softcapping", "50", "--position-embedding-type", "alibi"},
       "--attn-logit-softcapping with --position-embedding-type alibi: not supported (the order of the cap and the "
       "bias is not defined by MindSpeed-LLM)"},
      {{"--query-pre-attn-scalar", "16", "--use-mup"},
       "--query-pre-attn-scalar with --use-mup: both set the attention softmax scale; expected one of them"},
      {{"--post-norm", "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
       "--post-norm with --recompute-granularity full: not supported yet (the post norms' inputs are kept, not "
       "recomputed)"},
      {{"--attn-logit-softcapping", "50", "--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "16",
        "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16"},
       "--attn-logit-softcapping with --multi-latent-attention: not supported (MindSpeed-LLM applies it to Gemma-2's "
       "standard attention)"},
      {{"--output-logit-softcapping", "30", "--qad-enable"},
       "--output-logit-softcapping with --qad-enable: not supported yet (the KL gradient does not go through the "
       "cap)"},
      {{"--output-logit-softcapping", "30", "--logits-load-dir", "/tmp/kd"},
       "--output-logit-softcapping with --logits-load-dir: not supported yet (the distillation hook sees the logits "
       "before the cap)"},
      {{"--output-logit-softcapping", "30", "--logits-save-dir", "/tmp/kd", "--logits-save-top-k", "4"},
       "--output-logit-softcapping with --logits-save-dir: not supported yet (the distillation hook sees the logits "
       "before the cap)"},
  };
  for (const auto& [flags, want] : cases) {
    Cli cli;
    const Status s = cli.parse_minimal(flags);
    ASSERT_FALSE(s.ok()) << want;
    EXPECT_EQ(s.message(), want);
  }
}

}  // namespace
}  // namespace gale
