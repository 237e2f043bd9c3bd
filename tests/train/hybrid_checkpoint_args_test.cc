// A hybrid Mamba model's checkpoint args (train/checkpoint_args.h): the layer pattern and the
// ratios are recorded, so --use-checkpoint-args (gale generate / evaluate) rebuilds the same layers
// when the ratios allocated them; older args without the ratios read as ratio 0. A pattern with Gated
// DeltaNet layers ('G') records the --linear-* sizes and reads them back (checked as the flags); args
// saved before Gale recorded them are refused naming the missing key; conversion refuses 'G'.
#include <gtest/gtest.h>

#include "model/hybrid_layers.h"
#include "train/checkpoint_args.h"

namespace gale {
namespace {

TEST(HybridCheckpointArgs, TheRatiosComeBackSoTheLayersDo) {
  ModelArgs m;
  m.num_layers = 8;
  m.hidden_size = 64;
  m.is_hybrid_model = true;
  m.hybrid_attention_ratio = 0.25;
  m.hybrid_mlp_ratio = 0.25;
  m.mamba_state_dim = 16;
  m.mamba_head_dim = 16;
  m.mamba_num_groups = 2;
  std::string want;
  ASSERT_TRUE(allocate_hybrid_layers(8, 0.25, 0.25, "", &want).ok());
  ASSERT_EQ(want.find('*') != std::string::npos && want.find('-') != std::string::npos, true) << want;
  nlohmann::json args = model_flags_json(m);
  StatusOr<ModelArgs> back = model_args_from_json(args, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->hybrid_attention_ratio, 0.25);
  EXPECT_EQ(back->hybrid_mlp_ratio, 0.25);
  std::string got;
  ASSERT_TRUE(allocate_hybrid_layers(back->num_layers, back->hybrid_attention_ratio, back->hybrid_mlp_ratio,
                                     back->hybrid_override_pattern, &got)
                  .ok());
  EXPECT_EQ(got, want);
  args.erase("hybrid_attention_ratio");
  args.erase("hybrid_mlp_ratio");
  back = model_args_from_json(args, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->hybrid_attention_ratio, 0.0);
}

ModelArgs hybrid_gdn_args() {
  ModelArgs m;
  m.num_layers = 4;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.is_hybrid_model = true;
  m.hybrid_override_pattern = "MG-*";
  m.mamba_state_dim = 16;
  m.mamba_head_dim = 16;
  m.mamba_num_groups = 2;
  m.swiglu = true;
  m.normalization = "RMSNorm";
  m.linear_conv_kernel_dim = 3;
  m.linear_key_head_dim = 8;
  m.linear_value_head_dim = 6;
  m.linear_num_key_heads = 2;
  m.linear_num_value_heads = 4;
  return m;
}

TEST(HybridCheckpointArgs, GatedDeltaNetLayersSizesComeBack) {
  const nlohmann::json args = model_flags_json(hybrid_gdn_args());
  EXPECT_EQ(args.at("linear_num_value_heads"), 4);
  StatusOr<ModelArgs> back = model_args_from_json(args, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->linear_conv_kernel_dim, 3);
  EXPECT_EQ(back->linear_key_head_dim, 8);
  EXPECT_EQ(back->linear_value_head_dim, 6);
  EXPECT_EQ(back->linear_num_key_heads, 2);
  EXPECT_EQ(back->linear_num_value_heads, 4);
  EXPECT_TRUE(back->experimental_attention_variant.empty());  // 'G' layers, not the gdn variant
  // A pattern without 'G' records none of them.
  ModelArgs mamba = hybrid_gdn_args();
  mamba.hybrid_override_pattern = "MM-*";
  EXPECT_FALSE(model_flags_json(mamba).contains("linear_num_key_heads"));
}

TEST(HybridCheckpointArgs, ArgsWithoutTheGatedDeltaNetSizesAreRefused) {
  nlohmann::json args = model_flags_json(hybrid_gdn_args());
  args.erase("linear_key_head_dim");
  StatusOr<ModelArgs> back = model_args_from_json(args, "ckpt/metadata.json");
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("ckpt/metadata.json: args has no 'linear_key_head_dim' for the Gated "
                                         "DeltaNet layers ('G') of hybrid_override_pattern 'MG-*'"),
            std::string::npos)
      << back.status().to_string();
  // Recorded sizes are checked as the flags: NV a multiple of NK.
  args = model_flags_json(hybrid_gdn_args());
  args["linear_num_value_heads"] = 3;
  back = model_args_from_json(args, "x");
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("--linear-num-value-heads: expected a multiple of --linear-num-key-heads"),
            std::string::npos)
      << back.status().to_string();
}

TEST(HybridCheckpointArgs, ConversionRefusesGatedDeltaNetLayers) {
  const Status s = refuse_variant_conversion(hybrid_gdn_args(), "ckpt/metadata.json");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("ckpt/metadata.json: a hybrid model with Gated DeltaNet layers ('G' in "
                             "hybrid_override_pattern 'MG-*'): conversion to or from Megatron's and Hugging Face's "
                             "formats is not supported yet"),
            std::string::npos)
      << s.to_string();
  ModelArgs mamba = hybrid_gdn_args();
  mamba.hybrid_override_pattern = "MM-*";
  EXPECT_TRUE(refuse_variant_conversion(mamba, "x").ok());
}

}  // namespace
}  // namespace gale
