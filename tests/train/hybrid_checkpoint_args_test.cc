// A hybrid Mamba model's checkpoint args (train/checkpoint_args.h): the layer pattern and the
// ratios are recorded, so --use-checkpoint-args (gale generate / evaluate) rebuilds the same layers
// when the ratios allocated them; older args without the ratios read as ratio 0.
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

}  // namespace
}  // namespace gale
