// MindSpeed-LLM's Gemma flags (train/arguments_gemma.cc): what they resolve to in the model config,
// what the checkpoint args record, and the command lines they refuse.
#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"
#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing::FlagErrorCase;
using testing::PretrainCli;

ModelConfig config_of(const std::vector<std::string>& extra) {
  PretrainCli c;
  const Status st = c.parse_minimal(extra);
  EXPECT_TRUE(st.ok()) << st.message();
  c.args.model.padded_vocab_size = 128;
  return model_config_from_args(c.args);
}

// Gemma-7B's flags: a tanh (or erf) GeGLU with fc1 = [gate; up], the RMSNorm offset and √H, which
// under --bf16 is rounded to bf16 as MindSpeed-LLM's torch.tensor(h ** 0.5, dtype=bf16) is.
TEST(GemmaArguments, FlagsReachTheModelConfig) {
  const std::vector<std::string> gemma = {"--normalization", "RMSNorm", "--add-rmsnorm-offset", "--input-embeds-norm",
                                          "--kv-channels", "32"};
  std::vector<std::string> tanh = gemma;
  tanh.push_back("--gelu-tanh");
  const ModelConfig t = config_of(tanh);
  EXPECT_TRUE(t.geglu && t.openai_gelu && t.gated() && !t.swiglu && !t.quick_geglu);
  EXPECT_EQ(t.fc1_out(), 2 * t.ffn);
  EXPECT_EQ(t.ffn, 4 * 64);  // MindSpeed-LLM keeps Megatron's 4h default (not SwiGLU's 8h/3)
  EXPECT_TRUE(t.rmsnorm_offset && !t.norm_weight_1p && t.rms_norm);
  EXPECT_EQ(t.input_embeds_scale, 8.0f);  // √64
  EXPECT_EQ(t.head_dim, 32);
  std::vector<std::string> erf = gemma;
  erf.push_back("--geglu");
  const ModelConfig e = config_of(erf);
  EXPECT_TRUE(e.geglu && !e.openai_gelu);

  // √3072 = 55.4256...: bf16 keeps 8 significant bits (55.5), fp16 11 (55.4375), f32 all.
  std::vector<std::string> h3072 = {"--hidden-size", "3072", "--num-attention-heads", "16", "--input-embeds-norm"};
  EXPECT_EQ(config_of(h3072).input_embeds_scale, static_cast<float>(std::sqrt(3072.0)));
  h3072.push_back("--bf16");
  EXPECT_EQ(config_of(h3072).input_embeds_scale, 55.5f);
  h3072.back() = "--fp16";
  EXPECT_EQ(config_of(h3072).input_embeds_scale, 55.4375f);

  const ModelConfig plain = config_of({});
  EXPECT_FALSE(plain.geglu || plain.rmsnorm_offset);
  EXPECT_EQ(plain.input_embeds_scale, 1.0f);
}

TEST(GemmaArguments, CheckpointArgsRecordTheFlagsOnlyWhenSet) {
  PretrainCli c;
  ASSERT_TRUE(c.parse_minimal({"--normalization", "RMSNorm", "--add-rmsnorm-offset", "--input-embeds-norm",
                               "--gelu-tanh"})
                  .ok());
  c.args.model.padded_vocab_size = 128;
  const nlohmann::json args = model_flags_json(c.args.model);
  EXPECT_EQ(args["gelu_tanh"], true);
  EXPECT_EQ(args["add_rmsnorm_offset"], true);
  EXPECT_EQ(args["input_embeds_norm"], true);
  EXPECT_FALSE(args.contains("geglu"));
  const ModelArgs back = model_args_from_json(args, "x").value();
  EXPECT_TRUE(back.gelu_tanh && back.add_rmsnorm_offset && back.input_embeds_norm && !back.geglu);
  const nlohmann::json section = checkpoint_model_section(model_config_from_args(c.args));
  EXPECT_EQ(section["gelu_tanh"], true);
  EXPECT_FALSE(section.contains("openai_gelu"));
  EXPECT_EQ(section["add_rmsnorm_offset"], true);
  EXPECT_EQ(section["input_embeds_norm"], true);
  PretrainCli plain;
  ASSERT_TRUE(plain.parse_minimal({}).ok());
  plain.args.model.padded_vocab_size = 128;
  const nlohmann::json none = model_flags_json(plain.args.model);
  for (const char* key : {"geglu", "gelu_tanh", "add_rmsnorm_offset", "input_embeds_norm"})
    EXPECT_FALSE(none.contains(key)) << key;
}

class GemmaArgumentErrors : public ::testing::TestWithParam<FlagErrorCase> {};

TEST_P(GemmaArgumentErrors, OneLineNamingTheFlags) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, GemmaArgumentErrors,
    ::testing::Values(
        FlagErrorCase{{"--geglu", "--gelu-tanh"}, 1,
                      "--geglu with --gelu-tanh: the GeGLU MLP has one GeLU (exact with --geglu, tanh with --gelu-tanh)"},
        FlagErrorCase{{"--geglu", "--swiglu"}, 1, "--geglu with --swiglu: the gated MLP has one activation (GeLU or SiLU)"},
        FlagErrorCase{{"--gelu-tanh", "--swiglu"}, 1, "--gelu-tanh with --swiglu: the gated MLP has one activation"},
        FlagErrorCase{{"--geglu", "--quick-geglu"}, 1, "--geglu with --quick-geglu: the gated MLP has one activation"},
        FlagErrorCase{{"--gelu-tanh", "--squared-relu"}, 1,
                      "--gelu-tanh with --squared-relu: the MLP has one activation (GeGLU or squared ReLU)"},
        FlagErrorCase{{"--geglu", "--openai-gelu"}, 1,
                      "--geglu with --openai-gelu: --geglu gates through the exact GeLU; use --gelu-tanh for the tanh GeLU"},
        FlagErrorCase{{"--geglu", "--glu-linear-offset", "1"}, 1,
                      "--glu-linear-offset 1 with --geglu: expected --swiglu or --quick-geglu"},
        FlagErrorCase{{"--gelu-tanh", "--activation-func-clamp-value", "7"}, 1,
                      "--activation-func-clamp-value 7 with --gelu-tanh: expected --swiglu or --quick-geglu"},
        FlagErrorCase{{"--add-rmsnorm-offset"}, 1,
                      "--add-rmsnorm-offset needs --normalization RMSNorm (MindSpeed-LLM offsets only RMSNorm), found "
                      "LayerNorm"},
        FlagErrorCase{{"--normalization", "RMSNorm", "--add-rmsnorm-offset", "--apply-layernorm-1p"}, 1,
                      "--add-rmsnorm-offset with --apply-layernorm-1p: both make the norm scale 1 + weight"},
        FlagErrorCase{{"--input-embeds-norm", "--mtp-num-layers", "1", "--position-embedding-type", "rope"}, 1,
                      "--input-embeds-norm with --mtp-num-layers 1: MindSpeed-LLM scales only the decoder's input"},
        FlagErrorCase{{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "4", "--gelu-tanh"}, 1,
                      "--moe-use-upcycling with --gelu-tanh: upcycling a GeGLU MLP is not supported yet"}));

}  // namespace
}  // namespace gale
